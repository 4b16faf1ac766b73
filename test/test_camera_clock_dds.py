"""Camera clocks over real DDS: the node as its own process, a rig whose first camera's stamps jump.

camera_clock auto, stamp_mode observation (every chunk stamped at the observation it was computed from, in the
node's clock). For each case what a user relies on:
- a step (1e6 s ahead or behind, 5 s forward or back) held for good: the node drives the arm on the camera's
  new clock (timed by receipt), and again once the stamps are back; each jump counted on /diagnostics and
  logged, per direction;
- one glitched frame among good ones: an outlier (counted), no jump; the node goes on;
- a slow drift of the cameras' clock: no jump, no refusal for a jump; the node goes on;
- in every case every chunk is stamped at a time the node could have observed (not after it arrived, not so
  long before that the chunk was over), every hold at zero.
How fast the node is back is a figure (bench/bench_camera_clock.py); here the waits are sized for a loaded
machine.
"""
import time

import pytest

from dds_helpers import (CAMERAS, CLOCK_STEPS, NodeProcess, TestRig, base_params, camera_topic, diag_int,
                         first_chunk_observed_since, glitched_once, implausible_stamps, isolate, pick_domain_id,
                         shifted_frames)

DOMAIN_ID = pick_domain_id()
isolate(DOMAIN_ID)

rclpy = pytest.importorskip('rclpy')
pytestmark = pytest.mark.dds

from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402

NS = 1_000_000_000
BASE = CAMERAS[0]
CHUNK_SEC = 1.0                 # execute_steps 10 x action_period_sec 0.1
WAIT = 30.0                     # for the node to be back, on a loaded machine


@pytest.fixture(scope='module')
def running(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('clocks')
    checkpoint = write_tiny_default(tmp / 'tiny', 'pi0')
    rig = TestRig(DOMAIN_ID)
    proc = NodeProcess(tmp / 'node', base_params(checkpoint, execute_steps=10, stamp_mode='observation'),
                       DOMAIN_ID).start()
    try:
        proc.wait_for_state(rig, 'active', timeout=60)
        rig.start_streaming()
        first_chunk_observed_since(rig, rig.now_ns(), WAIT)
        time.sleep(1.0)          # the node has known the camera clocks for a while (not a jump at start-up)
        yield proc, rig
    finally:
        rig.close()
        proc.stop()
        proc.print_log()


@pytest.fixture
def live(running):
    """Good stamps, chunks flowing, records cleared."""
    proc, rig = running
    rig.reset_inputs()
    first_chunk_observed_since(rig, rig.now_ns(), WAIT, since=rig.trajectory_count())
    rig.clear()
    yield proc, rig
    assert proc.alive(), proc.log_tail()
    assert implausible_stamps(rig, CHUNK_SEC) == []


def counters(rig):
    return rig.wait_for_diagnostics(lambda d: 'clock_jumps' in d, timeout=10)


@pytest.mark.timeout(240)
@pytest.mark.parametrize('case', list(CLOCK_STEPS))
def test_a_camera_clock_step_there_and_back(live, case):
    proc, rig = live
    offset = CLOCK_STEPS[case]
    before = counters(rig)
    jumps = f'clock_jumps_{BASE}'
    rig.set_inputs(camera_overrides={BASE: shifted_frames(rig, BASE, lambda stamp: offset)})
    # The jump holds: counted, and the node drives the arm on the camera's new clock.
    rig.wait_for_diagnostics(lambda d: diag_int(d, jumps) > diag_int(before, jumps), timeout=WAIT)
    first_chunk_observed_since(rig, rig.now_ns(), WAIT)
    # Back to the node's clock: counted again, and the node drives the arm on it.
    rig.set_inputs(camera_overrides={})
    back = rig.now_ns()
    after = rig.wait_for_diagnostics(lambda d: diag_int(d, jumps) >= diag_int(before, jumps) + 2, timeout=WAIT)
    first_chunk_observed_since(rig, back, WAIT)
    assert diag_int(after, jumps) == diag_int(before, jumps) + 2, after
    assert diag_int(after, 'clock_jumps') == diag_int(before, 'clock_jumps') + 2, 'another input jumped'
    # Logged once per direction, naming the topic.
    lines = [line for line in proc.log_text().splitlines() if 'jumped' in line and camera_topic(BASE) in line]
    assert any('ahead of' in line for line in lines) and any('behind' in line for line in lines), proc.log_tail()


@pytest.mark.timeout(240)
def test_one_glitched_frame_is_an_outlier_and_the_node_goes_on(live):
    proc, rig = live
    before = counters(rig)
    outliers = f'clock_outliers_{BASE}'
    for offset in (10**6 * NS, -(10**6) * NS, 5 * NS):
        count = diag_int(rig.wait_for_diagnostics(lambda d: outliers in d or 'clock_jumps' in d), outliers)
        rig.set_inputs(camera_overrides={BASE: glitched_once(rig, BASE, offset)})
        rig.wait_for_diagnostics(lambda d: diag_int(d, outliers) > count, timeout=WAIT)
        first_chunk_observed_since(rig, rig.now_ns(), WAIT)
    after = counters(rig)
    assert diag_int(after, 'clock_jumps') == diag_int(before, 'clock_jumps'), after


@pytest.mark.timeout(240)
@pytest.mark.parametrize('rate', [0.05, -0.05], ids=['ahead', 'behind'])
def test_a_slow_drift_of_the_cameras_clock_is_followed(live, rate):
    """The cameras' machine's clock drifts 50 ms a second against the node's (far worse than any crystal)."""
    proc, rig = live
    before = counters(rig)
    start = rig.now_ns()
    drift = {camera: shifted_frames(rig, camera, lambda stamp: int(rate * (stamp - start))) for camera in CAMERAS}
    rig.set_inputs(camera_overrides=drift)
    time.sleep(6.0)
    since = rig.trajectory_count()
    later = rig.now_ns()
    # Still driving the arm, 0.3 s adrift: a chunk of a frame sent from now on (stamped by the drifted clock, or
    # by receipt once auto calls it another clock).
    first_chunk_observed_since(rig, later - int(0.05 * 6 * NS) if rate < 0 else later, WAIT, since=since)
    after = counters(rig)
    assert diag_int(after, 'clock_jumps') == diag_int(before, 'clock_jumps'), after
    assert diag_int(after, 'skipped_camera_clock_jump') == diag_int(before, 'skipped_camera_clock_jump'), after
    rig.set_inputs(camera_overrides={})
