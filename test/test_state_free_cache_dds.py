"""Over real DDS: the node runs the checkpoint of each family whose cache key leaves the joint state out (SmolVLA:
the state last in its prefix, where nothing attends to it; GR00T N1.7: the state only in its action head); frames
that repeat while the joints move are cache hits, and the plans follow the joints. GR00T runs with its defaults
(num_steps 0: the checkpoint's 4 Euler steps; chunking rtc with rtc_mode auto: its own inpainting)."""
import time
from pathlib import Path
from typing import Dict

import numpy as np
import pytest

from dds_helpers import (CAMERAS, LOADED_MACHINE_WAIT_SEC, NodeProcess, TestRig, base_params, diag_int,
                         isolate, make_frame, pick_domain_id, positions_of)

DOMAIN_ID = pick_domain_id()
isolate(DOMAIN_ID)

rclpy = pytest.importorskip('rclpy')

from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402

pytestmark = pytest.mark.dds
# The family, and the parameters over the DDS defaults it runs with. The tiny checkpoints' cameras are the rig's
# (SmolVLA: all three; GR00T: base_0_rgb and left_wrist_0_rgb, so the node subscribes to those).
FAMILIES = {'smolvla': {}, 'groot': {'chunking': 'rtc'}}


def check_hits_while_the_joints_move(node_dir: Path, checkpoint: Path, domain_id: int, policy_type: str,
                                     **params) -> Dict[str, object]:
    """Runs the node on ``checkpoint`` (``params`` over the DDS defaults, execute_steps 5) and asserts the family
    serves it live: ``policy_type`` in diagnostics, an entry larger than its prefix, a joint move is never a miss
    and reaches the plans. Returns the diagnostics after the joints moved, for a family's own checks."""
    rig = TestRig(domain_id)
    proc = NodeProcess(node_dir, base_params(checkpoint, execute_steps=5, **params), domain_id).start()
    try:
        proc.wait_for_state(rig, 'active', timeout=60)
        rig.set_inputs(frames={c: make_frame(2000 + i) for i, c in enumerate(CAMERAS)})
        rig.start_streaming()
        rig.wait_for_trajectories(2, timeout=LOADED_MACHINE_WAIT_SEC)
        before = rig.wait_for_diagnostics(lambda d: 'cache_hits' in d)
        assert before['policy_type'] == policy_type
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
        assert proc.alive(), proc.log_tail()
        return after
    finally:
        proc.stop()
        proc.print_log()
        rig.stop_streaming()
        rig.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize('policy_type', sorted(FAMILIES))
def test_the_node_hits_while_the_frames_repeat_and_the_joints_move(tmp_path, policy_type):
    checkpoint = write_tiny_default(tmp_path / f'tiny_{policy_type}', policy_type)
    after = check_hits_while_the_joints_move(tmp_path / 'node', checkpoint, DOMAIN_ID, policy_type,
                                             **FAMILIES[policy_type])
    assert diag_int(after, 'skipped_bad_input') == 0, 'no tick refused (GR00T: rtc_mode auto is its inpainting)'
