"""vla_policy_check_checkpoint, as a user runs it: what a folder is, every refusal, what to fetch, what fits."""
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from vla_policy_node.policy.tiny_default import write_tiny_default

ROOT = Path(__file__).resolve().parents[1]

BIN = Path(sys.executable).parent


def _doctor(*args):
    script = BIN / 'vla_policy_check_checkpoint'
    command = [str(script)] if script.exists() else [sys.executable, '-m', 'vla_policy_node.doctor']
    return subprocess.run(command + [str(a) for a in args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    return write_tiny_default(tmp_path_factory.mktemp('ckpt') / 'tiny_pi0', 'pi0')


def test_a_loadable_checkpoint_is_described(tiny):
    done = _doctor(tiny, '--fps', '10')
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert 'type pi0' in out and "cameras ['base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb']" in out
    assert 'state_dim 6, action_dim 6' in out and 'chunk_size 10, n_action_steps 10' in out
    assert 'normalisation ACTION MEAN_STD, STATE MEAN_STD' in out
    assert 'tokenizer.model (512 tokens)' in out
    assert 'bytes per dtype: F32' in out and '88 tensors match' in out
    # 2 x 2 layers x 1 kv head x 16 dims x 64 tokens x 2 bytes (bf16) + the 64-byte pad mask
    assert 'prefix up to 64 tokens: 3 image slots x 16 + 16 for the prompt' in out
    assert 'one cache entry 8.1 KiB (8,256 B) in bf16' in out
    assert 'GPU, bf16: model' in out
    assert 'action_period_sec: 0.1' in out and 'execute_steps: 10' in out and 'control_rate_hz: 2.0' in out
    assert 'the node would load this checkpoint' in out


def test_every_refusal_is_listed_and_the_tokenizer_fetch_is_given(tiny, tmp_path):
    folder = tmp_path / 'bad'
    shutil.copytree(tiny, folder)
    shutil.rmtree(folder / 'tokenizer')
    config = json.loads((folder / 'config.json').read_text())
    config.update(my_field=3, n_obs_steps=2)
    (folder / 'config.json').write_text(json.dumps(config))
    # Only the header is read: a weights file cut after its header is diagnosed all the same.
    weights = (folder / 'model.safetensors').read_bytes()
    (length,) = struct.unpack('<Q', weights[:8])
    (folder / 'model.safetensors').write_bytes(weights[:8 + length])
    done = _doctor(folder)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert 'REFUSED: config.json field my_field = 3' in out
    assert 'REFUSED: config.json n_obs_steps = 2' in out
    assert f'hf download google/paligemma-3b-pt-224 tokenizer.model --local-dir {folder}/tokenizer' in out
    assert 'gated' in out and 'licence' in out
    assert '88 tensors match' in out
    assert '3 problem(s)' in out


def test_wrong_weights_and_a_missing_folder(tiny, tmp_path):
    folder = tmp_path / 'wrong'
    shutil.copytree(tiny, folder)
    config = json.loads((folder / 'config.json').read_text())
    config['output_features']['action']['shape'] = [7]
    config['model_sizes']['expert']['mlp_dim'] *= 2
    (folder / 'config.json').write_text(json.dumps(config))
    out = _doctor(folder).stdout
    assert 'REFUSED: ' + f'{folder}: action statistics have 6 values, config.json says 7' in out
    assert 'mis-shaped tensor(s)' in out and 'mlp.gate_proj.weight' in out
    assert _doctor(tmp_path / 'nowhere').returncode == 2


def test_the_node_tokenizer_error_points_at_the_doctor(tiny, tmp_path):
    from vla_policy_node.policy.tokenizer import TokenizerError
    from vla_policy_node.runtime import PolicyRuntime
    folder = tmp_path / 'no_tokenizer'
    shutil.copytree(tiny, folder)
    shutil.rmtree(folder / 'tokenizer')
    with pytest.raises(TokenizerError, match=f'vla_policy_check_checkpoint {folder}'):
        PolicyRuntime.from_pretrained(folder, device='cpu')


@pytest.mark.parametrize('policy_type', ['pi05', 'smolvla'])
def test_every_family_of_the_registry_is_covered(policy_type, tmp_path):
    folder = write_tiny_default(tmp_path / policy_type, policy_type)
    done = _doctor(folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'type {policy_type} (family ' in done.stdout and 'tensors match' in done.stdout
    assert 'one cache entry' in done.stdout
    shutil.rmtree(folder / 'tokenizer')
    config = json.loads((folder / 'config.json').read_text())
    config['n_obs_steps'] = 3
    (folder / 'config.json').write_text(json.dumps(config))
    out = _doctor(folder).stdout
    assert 'REFUSED: config.json n_obs_steps = 3' in out
    wanted = 'tokenizer.json' if policy_type == 'smolvla' else 'tokenizer.model'
    assert f' {wanted} --local-dir {folder}/tokenizer' in out


def test_a_groot_folder_through_the_familys_hooks(tmp_path, monkeypatch):
    """GR00T keeps its statistics in its own processor steps and reads a processor folder (tokenizer, chat
    template, image settings) that the pre-processor names: the doctor finds both through the family, and where
    the folder is missing it prints the fetch of every file into <folder>/tokenizer, where the node then finds
    them."""
    folder = write_tiny_default(tmp_path / 'groot', 'groot')
    done = _doctor(folder, '--fps', '10')
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert 'type groot (family ' in out and 'statistics: state MIN_MAX (6 values), action MIN_MAX (6 values)' in out
    assert 'normalisation ' not in out and 'normalization_mapping (' in out and 'processor steps' in out
    assert f'{folder}/processor (' in out and 'tensors match' in out and 'one cache entry' in out
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'empty_hub'))
    processor = tmp_path / 'processor_elsewhere'
    shutil.move(str(folder / 'processor'), processor)
    document = json.loads((folder / 'policy_preprocessor.json').read_text())
    for step in document['steps']:
        if 'model_name' in step['config']:
            step['config']['model_name'] = 'nvidia/Cosmos-Reason2-2B'
    (folder / 'policy_preprocessor.json').write_text(json.dumps(document))
    done = _doctor(folder)
    assert done.returncode == 1 and '1 problem(s)' in done.stdout, done.stdout
    assert (f"hf download nvidia/Cosmos-Reason2-2B --include '*.json' --include '*.jinja' "
            f"--local-dir {folder}/tokenizer") in done.stdout
    shutil.copytree(processor, folder / 'tokenizer')              # what that command fetches
    assert _doctor(folder).returncode == 0
    from vla_policy_node.runtime import PolicyRuntime
    assert PolicyRuntime.from_pretrained(folder, device='cpu').config.image_resolution == (64, 64)


def test_an_unknown_type_names_the_known_ones(tiny, tmp_path):
    folder = tmp_path / 'octo'
    shutil.copytree(tiny, folder)
    config = json.loads((folder / 'config.json').read_text())
    config['type'] = 'octo'
    (folder / 'config.json').write_text(json.dumps(config))
    done = _doctor(folder)
    assert done.returncode == 1 and "'pi0', 'pi05', 'smolvla'" in done.stdout, done.stdout


def test_the_embedded_default_is_named_as_the_node_names_it():
    # checkpoint_path builtin:demo works for the node, the replay and vla_policy_serve, so for the doctor too.
    done = _doctor('builtin:demo')
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'demo_checkpoint' in done.stdout and 'type pi0' in done.stdout
    # Its training.json records the action period it was trained with (0.1 s): no 50 Hz assumed.
    assert 'action_period_sec: 0.1   # 1 / the training data\'s fps: 10 fps, recorded in training.json' in done.stdout
    assert 'ASSUMED' not in done.stdout


def test_the_embedded_default_says_why_the_shipped_config_runs_it_otherwise(tiny):
    """The doctor's block follows the rules of docs/parameters.md (2 Hz, rtc for a 1 s trajectory); the shipped
    params files run builtin:demo at their own rate and chunking, and the doctor says which and why."""
    import yaml
    shipped = yaml.safe_load((ROOT / 'config' / 'vla_policy.yaml').read_text())['/**/vla_policy']['ros__parameters']
    demo = yaml.safe_load((ROOT / 'config' / 'demo.yaml').read_text())['/**']['ros__parameters']
    assert demo['control_rate_hz'] == shipped['control_rate_hz'] and 'chunking' not in demo
    out = _doctor('builtin:demo').stdout
    assert 'control_rate_hz: 2.0' in out and 'chunking: "rtc"' in out
    assert f"control_rate_hz {float(shipped['control_rate_hz'])} and chunking \"{shipped['chunking']}\"" in out
    assert 'replan at every action' in out
    assert 'run builtin:demo otherwise' not in _doctor(str(tiny)).stdout


def _lerobot_trained(tiny, folder, train_config):
    shutil.copytree(tiny, folder)
    (folder / 'train_config.json').write_text(json.dumps(train_config))
    return folder


def _dataset(root, fps):
    (root / 'meta').mkdir(parents=True)
    (root / 'meta' / 'info.json').write_text(json.dumps({'codebase_version': 'v3.0', 'fps': fps}))
    return root


def test_the_action_period_is_the_recorded_one_else_said_to_be_assumed(tiny, tmp_path):
    done = _doctor(tiny)                     # records nothing: the block says it assumed 50 fps
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'ASSUMED 50 fps: the checkpoint records none (pass --fps): action_period_sec 0.02' in done.stdout
    assert 'action_period_sec: 0.02   # 1 / the training data\'s fps: ASSUMED 50 fps' in done.stdout
    # As lerobot saves it: train_config.json beside the policy, naming its dataset's root (meta/info.json fps).
    root = _dataset(tmp_path / 'datasets' / 'pick', 15)
    folder = _lerobot_trained(tiny, tmp_path / 'lerobot_trained',
                              {'dataset': {'repo_id': 'me/pick', 'root': str(root)}})
    done = _doctor(folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f'15 fps, recorded in {root / "meta" / "info.json"}' in done.stdout
    assert 'action_period_sec: 0.06667' in done.stdout and 'ASSUMED' not in done.stdout
    # --fps wins, and a disagreement with the record is pointed out.
    done = _doctor(folder, '--fps', '30')
    assert 'action_period_sec: 0.03333' in done.stdout and 'WARNING: --fps 30, but' in done.stdout


def test_recorded_fps_follows_lerobot_train_config(tiny, tmp_path):
    from vla_policy_node.policy.checkpoint import recorded_fps

    simulated = _lerobot_trained(tiny, tmp_path / 'sim', {'env': {'type': 'aloha', 'fps': 50},
                                                          'dataset': {'repo_id': 'lerobot/aloha_sim'}})
    assert recorded_fps(simulated, {})[0] == 50.0
    # No root: lerobot looks the dataset up under $HF_LEROBOT_HOME/<repo_id>, else $HF_HOME/lerobot/<repo_id>.
    folder = _lerobot_trained(tiny, tmp_path / 'hub', {'env': None, 'dataset': {'repo_id': 'me/pick', 'root': None}})
    _dataset(tmp_path / 'home' / 'me' / 'pick', 30)
    assert recorded_fps(folder, {'HF_LEROBOT_HOME': str(tmp_path / 'home')})[0] == 30.0
    _dataset(tmp_path / 'hf' / 'lerobot' / 'me' / 'pick', 25)
    assert recorded_fps(folder, {'HF_HOME': str(tmp_path / 'hf')})[0] == 25.0
    assert recorded_fps(folder, {'HF_LEROBOT_HOME': str(tmp_path / 'elsewhere')}) is None
    assert recorded_fps(tiny, {}) is None
