"""Over real DDS: the node runs a SmolVLA checkpoint; frames that repeat while the joints move are cache hits."""
import pytest

from dds_helpers import isolate, pick_domain_id

DOMAIN_ID = pick_domain_id()
isolate(DOMAIN_ID)

rclpy = pytest.importorskip('rclpy')

from family_dds import check_hits_while_the_joints_move  # noqa: E402
from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402

pytestmark = pytest.mark.dds


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    # The tiny SmolVLA's cameras are the rig's (base_0_rgb, left_wrist_0_rgb, right_wrist_0_rgb).
    return write_tiny_default(tmp_path_factory.mktemp('ckpt') / 'tiny_smolvla', 'smolvla')


@pytest.mark.timeout(120)
def test_the_node_hits_while_the_frames_repeat_and_the_joints_move(tmp_path, checkpoint):
    check_hits_while_the_joints_move(tmp_path / 'node', checkpoint, DOMAIN_ID, 'smolvla')
