"""lerobot pretrained_model/ folders: save/load round trip, layout, strict errors, no pickle, revision digest."""
import ast
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from runtime_fixtures import make_observation, tiny_checkpoints  # noqa: F401
from vla_policy_node.cache.key import weights_digest
from vla_policy_node.policy.checkpoint import CheckpointError
from vla_policy_node.policy.families import family_class, load_checkpoint, save_checkpoint
from vla_policy_node.policy.tiny_default import random_model, statistics
from vla_policy_node.policy.families.pi0.tiny_tokenizer import build_test_tokenizer
from vla_policy_node.runtime import PolicyRuntime

PACKAGE = Path(__file__).resolve().parents[1] / 'vla_policy_node'
CPU = torch.device('cpu')
LM_HEADS = ('model.paligemma_with_expert.paligemma.lm_head.weight',
            'model.paligemma_with_expert.gemma_expert.lm_head.weight')


@pytest.fixture(params=['pi0', 'pi05'])
def policy_type(request):
    return request.param


@pytest.fixture
def folder(tmp_path, tiny_checkpoints, policy_type) -> Path:
    """A private copy of the tiny checkpoint that a test may damage."""
    return Path(shutil.copytree(tiny_checkpoints[policy_type], tmp_path / 'pretrained_model'))


def model_inputs(config, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, w = config.image_resolution
    n = len(config.all_camera_names)
    images = torch.rand(1, n, 3, h, w, generator=g) * 2 - 1
    masks = torch.ones(1, n, dtype=torch.bool)
    tokens = torch.randint(0, 100, (1, config.tokenizer_max_length), generator=g)
    token_masks = torch.ones_like(tokens, dtype=torch.bool)
    state = torch.randn(1, config.max_state_dim, generator=g)
    noise = torch.randn(1, config.chunk_size, config.max_action_dim, generator=g)
    return images, masks, tokens, token_masks, state, noise


def rewrite_weights(folder: Path, edit) -> None:
    path = folder / 'model.safetensors'
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={'format': 'pt'})


# ---- round trip -------------------------------------------------------------------------------

def test_round_trip_state_dict_and_actions(tmp_path, policy_type):
    config = family_class(policy_type).tiny_config()
    model = random_model(config, seed=3)
    tokenizer = build_test_tokenizer(tmp_path / 'tok', vocab_size=512)
    save_checkpoint(tmp_path / 'ckpt', model, statistics(config.state_dim, 0.5), statistics(config.action_dim, 0.2),
                    tokenizer_file=tokenizer)
    loaded = load_checkpoint(tmp_path / 'ckpt', CPU, torch.float32)
    assert loaded.config == config
    ours, theirs = model.state_dict(), loaded.model.state_dict()
    assert set(ours) == set(theirs)
    for name in ours:
        assert theirs[name].dtype == ours[name].dtype, name
        assert torch.equal(theirs[name], ours[name]), name
    inputs = model_inputs(config)
    with torch.no_grad():
        expected = model.sample_actions(*inputs[:5], noise=inputs[5])
        got = loaded.model.sample_actions(*inputs[:5], noise=inputs[5])
        # Tensors straight from safetensors are only 8-byte aligned on the CPU, which makes oneDNN/BLAS take
        # other SIMD paths than for the freshly allocated originals: equal to the last ulp or so, not bitwise.
        torch.testing.assert_close(got, expected, atol=2e-6, rtol=0)
        # With the same memory layout the loaded weights give bit-identical actions.
        for param in loaded.model.parameters():
            param.data = param.data.clone()
        assert torch.equal(loaded.model.sample_actions(*inputs[:5], noise=inputs[5]), expected)
    # Statistics survive too.
    np.testing.assert_array_equal(loaded.state_normalizer.stats['std'], np.full(config.state_dim, 0.5, np.float32))
    np.testing.assert_array_equal(loaded.action_normalizer.stats['q99'],
                                  statistics(config.action_dim, 0.2)['q99'])
    assert loaded.tokenizer_path == tmp_path / 'ckpt' / 'tokenizer' / 'tokenizer.model'
    assert loaded.tokenizer_path.read_bytes() == tokenizer.read_bytes()


def test_bf16_load_keeps_the_fp32_modules(tiny_checkpoints):
    loaded = load_checkpoint(tiny_checkpoints['pi05'], CPU, torch.bfloat16)
    params = dict(loaded.model.named_parameters())
    assert params['paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight'].dtype \
        == torch.bfloat16
    for name in ('paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight',
                 'paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight',
                 'paligemma_with_expert.paligemma.model.language_model.layers.0.input_layernorm.weight',
                 'paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.weight',
                 'paligemma_with_expert.gemma_expert.model.norm.dense.weight',
                 'action_in_proj.weight', 'action_out_proj.weight', 'time_mlp_in.weight'):
        assert params[name].dtype == torch.float32, name


# ---- folder layout ----------------------------------------------------------------------------------

def test_folder_has_the_lerobot_files(tiny_checkpoints, policy_type):
    folder = tiny_checkpoints[policy_type]
    config = json.loads((folder / 'config.json').read_text())
    assert config['type'] == policy_type
    assert 'observation.state' in config['input_features'] and 'action' in config['output_features']
    assert any(k.startswith('observation.images.') for k in config['input_features'])
    with safe_open(str(folder / 'model.safetensors'), framework='pt') as handle:
        keys = list(handle.keys())
        assert (handle.metadata() or {}).get('format') == 'pt'
    assert keys and all(k.startswith('model.') for k in keys)
    assert all(head in keys for head in LM_HEADS)
    assert 'model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight' in keys
    for name, step_name in (('policy_preprocessor.json', 'normalizer_processor'),
                            ('policy_postprocessor.json', 'unnormalizer_processor')):
        processor = json.loads((folder / name).read_text())
        steps = [s for s in processor['steps'] if s['registry_name'] == step_name]
        assert len(steps) == 1, f'{name} must have one {step_name} step'
        stats_file = folder / steps[0]['state_file']
        assert stats_file.is_file() and stats_file.suffix == '.safetensors'
        with safe_open(str(stats_file), framework='np') as handle:
            stats_keys = set(handle.keys())
        assert 'action.mean' in stats_keys or 'action.q01' in stats_keys
    pre = json.loads((folder / 'policy_preprocessor.json').read_text())
    assert any(s['registry_name'] == 'tokenizer_processor' for s in pre['steps'])
    assert (folder / 'tokenizer' / 'tokenizer.model').is_file()


# ---- strict errors --------------------------------------------------------------------------------

def load(folder):
    return load_checkpoint(folder, CPU, torch.float32)


def test_missing_tensor_is_named(folder):
    name = 'model.action_out_proj.bias'
    rewrite_weights(folder, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match='missing') as info:
        load(folder)
    assert 'action_out_proj.bias' in str(info.value)


def test_unexpected_tensor_is_named(folder):
    rewrite_weights(folder, lambda t: t.__setitem__('model.some_extra_head.weight', torch.zeros(2, 2)))
    with pytest.raises(CheckpointError, match='unexpected') as info:
        load(folder)
    assert 'some_extra_head.weight' in str(info.value)


def test_misshaped_tensor_is_named(folder):
    name = 'model.action_in_proj.weight'

    def edit(tensors):
        tensors[name] = torch.zeros(tensors[name].shape[0], tensors[name].shape[1] + 1)
    rewrite_weights(folder, edit)
    with pytest.raises(CheckpointError) as info:
        load(folder)
    assert 'action_in_proj.weight' in str(info.value) and 'shape' in str(info.value)


def test_misshaped_layer_tensor_is_named(folder):
    name = 'model.paligemma_with_expert.paligemma.model.language_model.layers.1.mlp.up_proj.weight'

    def edit(tensors):
        tensors[name] = tensors[name][:-1].clone()
    rewrite_weights(folder, edit)
    with pytest.raises(CheckpointError) as info:
        load(folder)
    assert 'layers.1.mlp.up_proj.weight' in str(info.value)


def test_keys_without_model_prefix_load(folder):
    reference = load(folder).model.state_dict()

    def edit(tensors):
        for key in list(tensors):
            tensors[key[len('model.'):]] = tensors.pop(key)
    rewrite_weights(folder, edit)
    loaded = load(folder).model.state_dict()
    assert set(loaded) == set(reference)
    assert all(torch.equal(loaded[k], reference[k]) for k in reference)


def test_lm_head_only_export_loads_the_tied_embedding(folder):
    embed = 'model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight'
    reference = load(folder).model.state_dict()
    rewrite_weights(folder, lambda t: t.pop(embed))
    loaded = load(folder).model.state_dict()
    key = embed[len('model.'):]
    assert torch.equal(loaded[key], reference[key])


def test_missing_config(folder):
    (folder / 'config.json').unlink()
    with pytest.raises(CheckpointError, match='config.json'):
        load(folder)


def test_corrupt_config_json(folder):
    (folder / 'config.json').write_text('{"type": "pi0", ')
    with pytest.raises(CheckpointError, match='JSON'):
        load(folder)


def test_unknown_policy_type(folder):
    raw = json.loads((folder / 'config.json').read_text())
    raw['type'] = 'act'
    (folder / 'config.json').write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="'act'"):
        load(folder)


def test_missing_stats_file_is_named(folder):
    pre = json.loads((folder / 'policy_preprocessor.json').read_text())
    stats_name = next(s['state_file'] for s in pre['steps'] if s['registry_name'] == 'normalizer_processor')
    (folder / stats_name).unlink()
    with pytest.raises(CheckpointError) as info:
        load(folder)
    assert stats_name in str(info.value)


def test_missing_weights_file(folder):
    (folder / 'model.safetensors').unlink()
    with pytest.raises(CheckpointError, match='model.safetensors'):
        load(folder)


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError):
        load(tmp_path / 'nope')


# ---- no pickle ----------------------------------------------------------------------------------------

PICKLE_MODULES = {'pickle', 'cPickle', '_pickle', 'dill', 'joblib', 'cloudpickle', 'shelve', 'marshal'}


def _pickle_uses(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split('.')[0] in PICKLE_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split('.')[0] in PICKLE_MODULES:
            found.append(node.module)
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func in ('torch.load', 'torch.serialization.load'):
                found.append(func)
            if func.endswith('pickle.load') or func.endswith('pickle.loads'):
                found.append(func)
            for kw in node.keywords:
                if kw.arg == 'allow_pickle' and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    found.append(f'{func}(allow_pickle=...)')
        elif isinstance(node, ast.Attribute) and ast.unparse(node) in ('torch.load', 'torch.serialization.load'):
            found.append(ast.unparse(node))
    return found


def test_package_never_unpickles():
    sources = sorted(PACKAGE.rglob('*.py'))
    assert len(sources) > 10
    offenders = {str(p.relative_to(PACKAGE)): uses for p in sources if (uses := _pickle_uses(p))}
    assert not offenders, f'pickle-based loading in the package: {offenders}'
    # Plain text check too: no torch.load anywhere, and "pickle" only in prose (docstrings/comments).
    for path in sources:
        text = path.read_text()
        assert 'torch.load(' not in text, path
        code_lines = [line for line in text.splitlines() if 'import' in line and 'pickle' in line]
        assert not code_lines, (path, code_lines)


def test_pickle_detector_detects():
    """The AST check above must be able to fail."""
    import tempfile
    with tempfile.NamedTemporaryFile('w', suffix='.py', delete=False) as handle:
        handle.write('import pickle\nimport torch\nx = torch.load("a")\nimport numpy as np\n'
                     'np.load("b", allow_pickle=True)\n')
    uses = _pickle_uses(Path(handle.name))
    Path(handle.name).unlink()
    assert 'pickle' in uses and 'torch.load' in uses and any('allow_pickle' in u for u in uses)


# ---- model revision --------------------------------------------------------------------------------

def test_weights_digest_tracks_content_not_location(folder, tmp_path):
    original = weights_digest(str(folder / 'model.safetensors'))
    runtime = PolicyRuntime.from_pretrained(folder, device='cpu', dtype='float32')
    assert runtime.model_revision == original
    key = runtime.prefix_key(make_observation())

    renamed = folder.rename(tmp_path / 'renamed_checkpoint')
    assert weights_digest(str(renamed / 'model.safetensors')) == original
    moved = PolicyRuntime.from_pretrained(renamed, device='cpu', dtype='float32')
    assert moved.model_revision == original
    assert moved.prefix_key(make_observation()) == key

    name = 'model.paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.k_proj.weight'

    def edit(tensors):
        tensors[name] = tensors[name].clone()
        tensors[name][0, 0] += 1e-3
    rewrite_weights(renamed, edit)
    changed = weights_digest(str(renamed / 'model.safetensors'))
    assert changed != original
    edited = PolicyRuntime.from_pretrained(renamed, device='cpu', dtype='float32')
    assert edited.model_revision == changed
    assert edited.prefix_key(make_observation()) != key
