"""Over real DDS: the node runs a GR00T N1.7 checkpoint with its defaults (num_steps 0: the checkpoint's 4 Euler
steps; chunking rtc with rtc_mode auto: GR00T's own inpainting); frames that repeat while the joints move are cache
hits."""
import pytest

from dds_helpers import diag_int, isolate, pick_domain_id

DOMAIN_ID = pick_domain_id()
isolate(DOMAIN_ID)

rclpy = pytest.importorskip('rclpy')

from family_dds import check_hits_while_the_joints_move  # noqa: E402
from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402

pytestmark = pytest.mark.dds


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    # The tiny GR00T's cameras are two of the rig's (base_0_rgb, left_wrist_0_rgb): the node subscribes to those.
    return write_tiny_default(tmp_path_factory.mktemp('ckpt') / 'tiny_groot', 'groot')


@pytest.mark.timeout(120)
def test_the_node_hits_while_the_frames_repeat_and_the_joints_move(tmp_path, checkpoint):
    after = check_hits_while_the_joints_move(tmp_path / 'node', checkpoint, DOMAIN_ID, 'groot', chunking='rtc')
    assert diag_int(after, 'skipped_bad_input') == 0, 'no tick refused its RTC mode (rtc_mode auto: inpainting)'
