"""Over real DDS: the node runs a GR00T N1.7 checkpoint with its defaults (num_steps 0: the checkpoint's 4 Euler
steps; chunking rtc with rtc_mode auto: GR00T's own inpainting); frames that repeat while the joints move are cache
hits."""
import time

import numpy as np
import pytest

from dds_helpers import (CAMERAS, LOADED_MACHINE_WAIT_SEC, NodeProcess, TestRig, base_params, diag_int, isolate,
                         make_frame, pick_domain_id, positions_of)

DOMAIN_ID = pick_domain_id()
isolate(DOMAIN_ID)

rclpy = pytest.importorskip('rclpy')

from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402

pytestmark = pytest.mark.dds


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    # The tiny GR00T's cameras are two of the rig's (base_0_rgb, left_wrist_0_rgb): the node subscribes to those.
    return write_tiny_default(tmp_path_factory.mktemp('ckpt') / 'tiny_groot', 'groot')


@pytest.fixture
def rig():
    test_rig = TestRig(DOMAIN_ID)
    yield test_rig
    test_rig.stop_streaming()
    test_rig.close()


@pytest.mark.timeout(120)
def test_the_node_hits_while_the_frames_repeat_and_the_joints_move(tmp_path, rig, checkpoint):
    proc = NodeProcess(tmp_path / 'node', base_params(checkpoint, execute_steps=5, chunking='rtc'), DOMAIN_ID).start()
    try:
        proc.wait_for_state(rig, 'active', timeout=60)
        rig.set_inputs(frames={c: make_frame(2000 + i) for i, c in enumerate(CAMERAS)})
        rig.start_streaming()
        rig.wait_for_trajectories(2, timeout=LOADED_MACHINE_WAIT_SEC)
        before = rig.wait_for_diagnostics(lambda d: 'cache_hits' in d)
        assert before['policy_type'] == 'groot'
        assert int(before['cache_entry_bytes']) > int(before['prefix_entry_bytes']) > 0
        since = rig.trajectory_count()
        # Same frames and instruction, the joints moving a little every 50 ms (until four chunks are in, however
        # long a loaded machine takes): every new chunk should hit.
        deadline = time.monotonic() + LOADED_MACHINE_WAIT_SEC
        step = 0
        while time.monotonic() < deadline and rig.trajectory_count() - since < 4:
            step += 1
            rig.set_inputs(joint_positions=[0.1 + 0.02 * step, -0.2, 0.3 - 0.01 * step, -0.1, 0.2, 0.0])
            time.sleep(0.05)
        received = rig.wait_for_trajectories(4, timeout=1, since=since)
        after = rig.wait_for_diagnostics(lambda d: diag_int(d, 'cache_hits') >= diag_int(before, 'cache_hits') + 3,
                                         timeout=LOADED_MACHINE_WAIT_SEC)
        assert diag_int(after, 'cache_misses') == diag_int(before, 'cache_misses'), 'a joint move is never a miss'
        assert diag_int(after, 'cache_hits') - diag_int(before, 'cache_hits') >= 3
        # The joint state reaches the actions: the plans differ as the joints move.
        plans = [positions_of(msg) for msg in received]
        assert any(not np.allclose(plans[0][-1], plan[-1]) for plan in plans[1:])
        assert diag_int(after, 'skipped_bad_input') == 0, 'no tick refused its RTC mode (rtc_mode auto: inpainting)'
        assert proc.alive(), proc.log_tail()
    finally:
        proc.stop()
        proc.print_log()
