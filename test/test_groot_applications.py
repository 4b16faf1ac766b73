"""A tiny GR00T N1.7 checkpoint through the applications, none of which has a GR00T branch: the offline replay
(chunking rtc: the family's own inpainting through rtc_mode auto, hits while the frames repeat), the dataset
bridge (the checkpoint's cameras and sizes from its folder, its own processor files) and the dataset replay. The
doctor's GR00T case is in test_doctor.py, vla_policy_serve's batching in test_batching.py, the demo in
test_demo_runs.py, the node over DDS in test_state_free_cache_dds.py."""
from pathlib import Path

import numpy as np
import pytest

import dataset_reading as dr
from sample_bag_params import write_sample_bag_params
from vla_policy_node.policy.tiny_default import write_tiny_default
from vla_policy_node.replay.make_bag import SampleBagSpec, in_hold_window, write_sample_bag
from vla_policy_node.replay.offline import replay

NS = 1_000_000_000


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    return write_tiny_default(tmp_path_factory.mktemp('groot') / 'tiny_groot', 'groot')


@pytest.fixture(scope='module')
def bag(tmp_path_factory):
    spec = SampleBagSpec(duration_sec=3.0, compressed_cameras=('left_wrist_0_rgb',))
    return write_sample_bag(tmp_path_factory.mktemp('bag') / 'bag', spec), spec


def params_file(folder: Path, **extra) -> Path:
    """The robot's params: the sample bag's joints, its two cameras the tiny GR00T names (one compressed)."""
    return write_sample_bag_params(folder, **{'camera_types': ['raw', 'compressed'], **extra})


def test_the_replay_runs_a_groot_checkpoint_with_its_own_rtc_and_hits_while_the_frames_repeat(
        checkpoint, bag, tmp_path):
    bag_path, spec = bag
    result = replay(bag_path, params_file(tmp_path, chunking='rtc'), tmp_path / 'out', checkpoint=str(checkpoint),
                    seed=3)
    summary = result.summary
    assert summary['published'] > 0.7 * summary['ticks'] and summary['cache']['hits'] > 0
    assert summary['policy_type'] == 'groot'
    continued = [record for record in result.records if record.continued]
    assert continued, 'chunking rtc continues chunks in the family\'s own mode (rtc_mode auto: inpainting)'
    hits_in_hold = [record for record in result.records if record.cache_hit
                    and in_hold_window(spec, (record.time_ns - spec.start_time_ns) / NS - 0.25)]
    assert len(hits_in_hold) >= 3
    assert all(np.isfinite(v['rmse']) for v in summary['command_error'].values())


def test_the_dataset_bridge_and_its_replay_take_a_groot_checkpoint(checkpoint, bag, tmp_path):
    from vla_policy_node.dataset.convert import convert
    from vla_policy_node.replay.dataset_replay import replay_dataset
    bag_path, _ = bag
    params = params_file(tmp_path)
    out = tmp_path / 'dataset'
    convert(out, [bag_path], params, checkpoint=str(checkpoint), log=lambda *args: None)
    features = dr.info(out)['features']
    cameras = sorted(name for name in features if name.startswith('observation.images.'))
    assert cameras == ['observation.images.base_0_rgb', 'observation.images.left_wrist_0_rgb']
    assert features['observation.state']['shape'] == [6] and features['action']['shape'] == [6]
    result = replay_dataset(out, None, params, tmp_path / 'replayed', checkpoint=str(checkpoint), seed=1)
    assert result.summary['published'] > 0 and result.summary['policy_type'] == 'groot'
