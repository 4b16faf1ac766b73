"""The safety layer over real DDS, against the node as its own process: holds, e-stop, deadman, limits, ramp-in.

One node serves the module (safety parameters are live); every test restores what it changed. Every
message the rig receives, hold or policy, is checked against the controller's rules at the end.
"""
import time

import numpy as np
import pytest

from dds_helpers import (CAMERAS, JOINTS, LOADED_MACHINE_WAIT_SEC, NodeProcess, TestRig, assert_no_policy_after_hold,
                         base_params, check_jtc, diag_int, is_hold, isolate, pick_domain_id, positions_of, times_of,
                         wait_for_policy_trajectories)

DOMAIN_ID = pick_domain_id()
isolate(DOMAIN_ID)

rclpy = pytest.importorskip('rclpy')

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402

from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402

CHUNK = 10
MAX_IMAGE_AGE = 0.5
WAIT = LOADED_MACHINE_WAIT_SEC


@pytest.fixture(scope='module')
def rig():
    test_rig = TestRig(DOMAIN_ID)
    yield test_rig
    # Every message of the module, hold or policy, is one a joint_trajectory_controller accepts.
    for msg in test_rig.trajectories_since(0):
        check_jtc(msg, JOINTS)
    test_rig.close()


@pytest.fixture(scope='module')
def node(tmp_path_factory, rig):
    workdir = tmp_path_factory.mktemp('safety_node')
    checkpoint = write_tiny_default(workdir / 'tiny_pi0', 'pi0')
    params = base_params(checkpoint, execute_steps=CHUNK, max_image_age_sec=MAX_IMAGE_AGE)
    proc = NodeProcess(workdir / 'node', params, DOMAIN_ID).start()
    try:
        proc.wait_for_state(rig, 'active', timeout=60)
    except BaseException:
        proc.stop()
        proc.print_log()
        raise
    yield proc
    proc.stop()
    proc.print_log('safety node log')


@pytest.fixture
def live(node, rig):
    rig.reset_inputs()
    rig.start_streaming()
    wait_for_policy_trajectories(rig, 2, timeout=WAIT, since=rig.trajectory_count())
    yield node, rig
    rig.stop_streaming()
    assert node.alive(), node.log_tail()


def wait_for_hold(rig, since, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for msg, received_at in zip(rig.trajectories_since(since), rig.trajectory_times[since:]):
            if is_hold(msg):
                return msg, received_at
        time.sleep(0.02)
    raise AssertionError(f'no hold trajectory in {timeout} s')


def assert_holds_at(msg, positions):
    check_jtc(msg, JOINTS, points=1, zero_stamp=True)
    assert positions_of(msg)[0].tolist() == pytest.approx(list(positions))
    assert times_of(msg)[0] > 0


@pytest.mark.timeout(60)
def test_a_camera_that_stops_holds_the_arm_until_it_returns(live):
    node, rig = live
    since = rig.trajectory_count()
    rig.set_inputs(paused_cameras={CAMERAS[2]})
    # How soon is the tick's business (max_image_age_sec, then the next tick); that it holds is checked here.
    hold, _ = wait_for_hold(rig, since)
    assert_holds_at(hold, rig.joint_positions)
    rig.wait_for_diagnostics(lambda d: diag_int(d, 'skipped_camera_stale') > 0, timeout=WAIT)
    # No policy trajectory after the hold while the camera is away.
    assert_no_policy_after_hold(rig, since, 1.0)
    rig.wait_for_diagnostics(lambda d: d.get('supervisor_state') == 'held: input_fault'
                             and d['level'] == DiagnosticStatus.WARN)
    rig.set_inputs(paused_cameras=set())
    wait_for_policy_trajectories(rig, 2, timeout=WAIT, since=rig.trajectory_count())
    assert node.wait_for_log(lambda line: 'supervisor active -> held: input_fault' in line)


@pytest.mark.timeout(60)
def test_estop_latches_survives_good_inputs_and_resets_only_through_the_service(live):
    node, rig = live
    try:
        since = rig.trajectory_count()
        rig.publish_estop(True)
        assert_holds_at(wait_for_hold(rig, since)[0], rig.joint_positions)
        values = rig.wait_for_diagnostics(lambda d: d.get('supervisor_state') == 'estop')
        assert values['level'] == DiagnosticStatus.ERROR and diag_int(values, 'holds_estop') >= 1
        # Inputs are all good, and still nothing moves.
        assert_no_policy_after_hold(rig, since, 1.0)
        refused = rig.reset_estop()
        assert not refused.success and 'still true' in refused.message
        rig.publish_estop(False)
        assert_no_policy_after_hold(rig, since, 0.6)         # releasing the input is not a reset
        reset = rig.reset_estop()
        assert reset.success, reset.message
        wait_for_policy_trajectories(rig, 2, timeout=WAIT, since=rig.trajectory_count())
        assert not rig.reset_estop().success                  # nothing latched any more
    finally:
        rig.publish_estop(False)
        rig.reset_estop()


@pytest.mark.timeout(60)
def test_the_deadman_holds_without_enable_and_times_out(live):
    node, rig = live
    try:
        since = rig.trajectory_count()
        assert rig.set_parameters(require_enable=True, enable_timeout_sec=0.3)[0].successful
        assert_holds_at(wait_for_hold(rig, since)[0], rig.joint_positions)
        rig.wait_for_diagnostics(lambda d: d.get('supervisor_state') == 'held: deadman')
        rig.set_inputs(enable=True)                               # streamed at 20 Hz
        wait_for_policy_trajectories(rig, 2, timeout=WAIT, since=rig.trajectory_count())
        since = rig.trajectory_count()
        rig.set_inputs(enable=None)                               # the operator lets go
        # How soon is enable_timeout_sec's and the control timer's (every period, stuck ticks or not).
        assert_holds_at(wait_for_hold(rig, since)[0], rig.joint_positions)
        rig.wait_for_diagnostics(lambda d: d.get('supervisor_state') == 'held: deadman', timeout=WAIT)
    finally:
        rig.set_parameters(require_enable=False)
        rig.set_inputs(enable=None)


@pytest.mark.timeout(60)
def test_a_point_past_max_position_step_is_clamped_or_refused(live):
    node, rig = live
    measured = np.array(rig.joint_positions)
    try:
        assert rig.set_parameters(max_position_step=[0.01] * 6, limit_mode='clamp')[0].successful
        for msg in wait_for_policy_trajectories(rig, 3, timeout=WAIT, since=rig.trajectory_count() + 1):
            steps = np.abs(np.diff(np.vstack([measured, positions_of(msg)]), axis=0))
            assert steps.max() <= 0.01 + 1e-9, steps.max()
        rig.wait_for_diagnostics(lambda d: any(k.startswith('intervention_step_clamped_') for k in d))
        since = rig.trajectory_count()
        assert rig.set_parameters(limit_mode='hold')[0].successful
        assert_holds_at(wait_for_hold(rig, since)[0], measured)
        rig.wait_for_diagnostics(lambda d: d.get('supervisor_state') == 'held: limit')
        assert_no_policy_after_hold(rig, since, 0.8)
    finally:
        rig.set_parameters(max_position_step=[1e6] * 6, limit_mode='clamp')
    wait_for_policy_trajectories(rig, 1, timeout=WAIT, since=rig.trajectory_count())


@pytest.mark.timeout(90)
def test_deactivate_holds_and_ramp_in_starts_at_the_measured_position(live):
    node, rig = live
    try:
        assert rig.set_parameters(ramp_in_sec=1.0)[0].successful
        since = rig.trajectory_count()
        assert rig.change_state('deactivate')
        held = [m for m in rig.trajectories_since(since) if is_hold(m)]
        deadline = time.monotonic() + WAIT
        while not held and time.monotonic() < deadline:
            time.sleep(0.05)
            held = [m for m in rig.trajectories_since(since) if is_hold(m)]
        assert held, 'deactivate published no hold'
        assert_holds_at(held[-1], rig.joint_positions)
        assert_no_policy_after_hold(rig, since, 0.6)
        rig.set_inputs(joint_positions=[0.4, 0.1, -0.2, 0.3, -0.3, 0.05])    # the arm was moved meanwhile
        time.sleep(0.3)
        since = rig.trajectory_count()
        assert rig.change_state('activate')
        first, second = wait_for_policy_trajectories(rig, 2, timeout=WAIT, since=since)
        np.testing.assert_array_equal(positions_of(first)[0], rig.joint_positions)
    finally:
        rig.set_parameters(ramp_in_sec=0.0)
