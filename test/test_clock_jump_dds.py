"""Playing a bag a second time into a running node (use_sim_time): ROS time jumps back to the bag's start.

Without handling, the frames and joint state of the first pass are stamped in the second pass's future:
every tick skipped as camera_future / camera_skew until each input was replaced. The node instead holds
once at the jump (holds_clock_jump), drops the old inputs, and follows the second pass.
"""
import time

import pytest

from dds_helpers import (JOINTS, NS, NodeProcess, TestRig, base_params, check_jtc, diag_int, is_hold, isolate,
                         pick_domain_id)

DOMAIN_ID = pick_domain_id()
isolate(DOMAIN_ID)

rclpy = pytest.importorskip('rclpy')
pytestmark = pytest.mark.dds

from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402
from vla_policy_node.replay.make_bag import SampleBagSpec, write_sample_bag  # noqa: E402
from vla_policy_node.replay.play import play  # noqa: E402


@pytest.mark.timeout(180)
def test_a_second_pass_of_the_bag_holds_once_and_is_followed(tmp_path):
    checkpoint = write_tiny_default(tmp_path / 'tiny', 'pi0')
    bag = write_sample_bag(tmp_path / 'bag', SampleBagSpec(duration_sec=2.5))
    rig = TestRig(DOMAIN_ID)
    proc = NodeProcess(tmp_path / 'node', base_params(checkpoint, use_sim_time=True, execute_steps=10,
                                                      max_camera_skew_sec=0.25), DOMAIN_ID).start()
    try:
        proc.wait_for_state(rig, 'active', timeout=60)
        assert play(bag, rate=0.5, context=rig.context, node_name='first_pass', wait_for_subscribers=10.0) > 0
        first = rig.wait_for_diagnostics(lambda d: diag_int(d, 'chunks_published') > 0, timeout=30)
        assert first is not None, proc.log_tail()
        before = rig.trajectory_count()
        assert play(bag, rate=0.5, context=rig.context, node_name='second_pass', wait_for_subscribers=10.0) > 0
        time.sleep(0.5)
        values = rig.wait_for_diagnostics(lambda d: diag_int(d, 'holds_clock_jump') >= 1, timeout=30)
        assert values is not None, f'{rig.last_diagnostics()}\n{proc.log_tail()}'
        assert diag_int(values, 'holds_clock_jump') == 1
        # The second pass is not read against the first one's stamps.
        for reason in ('camera_future', 'camera_skew'):
            assert diag_int(values, f'skipped_{reason}') == diag_int(first, f'skipped_{reason}'), values
        second = rig.trajectories_since(before)
        assert is_hold(second[0]), 'the first thing after the jump is a hold'
        check_jtc(second[0], JOINTS, points=1, zero_stamp=True)
        assert any(not is_hold(m) for m in second[1:]), 'no policy trajectory in the second pass'
        assert diag_int(values, 'chunks_published') > diag_int(first, 'chunks_published')
        assert proc.wait_for_log(lambda line: 'ROS time jumped back by' in line, timeout=10), proc.log_tail()
    finally:
        proc.stop()
        proc.print_log()             # shown for a failing test only
        rig.close()


@pytest.mark.timeout(180)
def test_clock_back_before_new_frames_drops_the_old_ones(tmp_path):
    """As `ros2 bag play --clock` starts a second pass: /clock is back at the start before the first new frame.
    The old frames are then stamped in the future; the node drops them instead of skipping on them."""
    checkpoint = write_tiny_default(tmp_path / 'tiny', 'pi0')
    rig = TestRig(DOMAIN_ID)
    proc = NodeProcess(tmp_path / 'node', base_params(checkpoint, use_sim_time=True, execute_steps=10), DOMAIN_ID)
    try:
        start_ns = 1000 * NS
        rig.frozen_stamp_ns = start_ns
        rig.start_streaming()
        proc.start()
        rig.start_clock(start_ns)
        proc.wait_for_state(rig, 'active', timeout=60)
        rig.wait_for_trajectories(3, timeout=30)
        rig.stop_streaming()
        rig.stop_clock()
        before = rig.wait_for_diagnostics(lambda d: diag_int(d, 'chunks_published') > 0, timeout=30)
        count = rig.trajectory_count()
        rig.start_clock(start_ns - 20 * NS)          # 20 s back; the frames of the old timeline are 20 s ahead
        time.sleep(2.0)                               # ticks run on the new clock without new frames
        rig.start_streaming()
        rig.wait_for_trajectories(3, timeout=30, since=count)
        values = rig.wait_for_diagnostics(lambda d: diag_int(d, 'chunks_published') > diag_int(before,
                                                                                               'chunks_published'),
                                          timeout=20)
        assert values is not None, proc.log_tail()
        assert diag_int(values, "holds_clock_jump") == 1, str(values) + proc.log_tail()
        for reason in ('camera_future', 'camera_skew', 'joint_state_stale'):
            assert diag_int(values, f'skipped_{reason}') == 0, values
        after = rig.trajectories_since(count)
        assert is_hold(after[0]) and list(after[0].points[0].positions) == pytest.approx(rig.joint_positions)
    finally:
        rig.stop_streaming()
        rig.stop_clock()
        proc.stop()
        proc.print_log()             # shown for a failing test only
        rig.close()
