"""Reading and writing lerobot ``pretrained_model/`` folders, strictly and without pickle.

    pretrained_model/
      config.json                       PolicyConfig (+ our optional model_sizes block)
      model.safetensors                 weights, keys "model.<module path>"
      policy_preprocessor.json          steps; the normalizer step names its stats file
      policy_preprocessor_step_<k>_normalizer_processor.safetensors
      policy_postprocessor.json
      policy_postprocessor_step_0_unnormalizer_processor.safetensors
      tokenizer/tokenizer.model         when saved locally (PaliGemma SentencePiece)

Strict means: a missing, unexpected or mis-shaped tensor is an error that
names it. Tensors that real checkpoints carry but inference never reads
(the two ``lm_head`` matrices, pi0.5's legacy ``state_proj``) are known and
skipped, not loaded to the device.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as load_numpy_file
from safetensors.numpy import save_file as save_numpy_file
from safetensors.torch import save_file as save_torch_file

from .config import ACTION_FEATURE, STATE_FEATURE, ConfigError, PolicyConfig
from .layers import fuse_projections
from .normalize import DEFAULT_EPS, FeatureNormalizer, NormalizationError, flatten_stats, split_flat_stats
from .pi0 import PiZeroModel, param_dtype

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
PREPROCESSOR_FILE = 'policy_preprocessor.json'
POSTPROCESSOR_FILE = 'policy_postprocessor.json'
TOKENIZER_DIR = 'tokenizer'
NORMALIZER_STEP = 'normalizer_processor'
UNNORMALIZER_STEP = 'unnormalizer_processor'
RELATIVE_STEP = 'relative_actions_processor'
ABSOLUTE_STEP = 'absolute_actions_processor'
# RelativeActionsProcessorStep's field defaults (lerobot 7427f318, processor/relative_action_processor.py).
_RELATIVE_STEP_DEFAULTS = {'enabled': False, 'exclude_joints': [], 'action_names': None}
HUB_TOKENIZER_NAME = 'google/paligemma-3b-pt-224'

_LM_HEAD_KEYS = ('paligemma_with_expert.paligemma.lm_head.weight',
                 'paligemma_with_expert.gemma_expert.lm_head.weight')
_EMBED_KEY = 'paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight'
# Key spellings written by other transformers versions and exports -> ours.
_KEY_RENAMES: Tuple[Tuple[str, str], ...] = (
    (r'^paligemma_with_expert\.paligemma\.(language_model|vision_tower|multi_modal_projector)\.',
     r'paligemma_with_expert.paligemma.model.\1.'),
    (r'\.vision_tower\.(embeddings|encoder|post_layernorm)', r'.vision_tower.vision_model.\1'),
)


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded as it is."""


@dataclass
class LoadedCheckpoint:
    model: PiZeroModel
    config: PolicyConfig
    state_normalizer: FeatureNormalizer
    action_normalizer: FeatureNormalizer
    weights_path: Path
    tokenizer_path: Optional[Path]


# ---- weights -----------------------------------------------------------------------

def canonical_key(file_key: str, policy_type: str) -> str:
    key = file_key[len('model.'):] if file_key.startswith('model.') else file_key
    for pattern, replacement in _KEY_RENAMES:
        key = re.sub(pattern, replacement, key)
    # lerobot renamed the time MLPs between releases; each type has one spelling.
    if policy_type == 'pi05':
        key = re.sub(r'^action_time_mlp_(in|out)\.', r'time_mlp_\1.', key)
    return key


def _known_unused(key: str, policy_type: str) -> bool:
    if key in _LM_HEAD_KEYS:
        return True
    if policy_type == 'pi05':
        # pi0.5 takes the state through the prompt; its expert norms are adaptive.
        return key.startswith('state_proj.') or bool(
            re.match(r'^paligemma_with_expert\.gemma_expert\.model\.'
                     r'(layers\.\d+\.(input|post_attention)_layernorm|norm)\.weight$', key))
    return False


def _describe(names: Iterable[str], limit: int = 8) -> str:
    names = sorted(names)
    shown = ', '.join(names[:limit])
    return shown + (f' and {len(names) - limit} more' if len(names) > limit else '')


def load_weights(model: PiZeroModel, weights_path: Path, device: torch.device,
                 compute_dtype: torch.dtype) -> None:
    """Strictly load ``model.safetensors`` into a (meta-device) model, straight to ``device``."""
    policy_type = model.config.policy_type
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    try:
        handle = safe_open(str(weights_path), framework='pt', device='cpu')
    except FileNotFoundError:
        raise CheckpointError(f'no {WEIGHTS_FILE} at {weights_path}') from None
    except Exception as exc:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f'{weights_path} is not a readable safetensors file: {exc}') from exc
    with handle:
        file_keys: Dict[str, str] = {}
        unexpected: List[str] = []
        for file_key in handle.keys():
            key = canonical_key(file_key, policy_type)
            if key in expected:
                if key in file_keys:
                    raise CheckpointError(f'{weights_path}: tensors {file_keys[key]} and {file_key} both map to {key}')
                file_keys[key] = file_key
            elif not _known_unused(key, policy_type):
                unexpected.append(file_key)
        # Tied embeddings: some exports keep only the LM head.
        if _EMBED_KEY not in file_keys:
            for file_key in handle.keys():
                if canonical_key(file_key, policy_type) == _LM_HEAD_KEYS[0]:
                    file_keys[_EMBED_KEY] = file_key
        missing = sorted(set(expected) - set(file_keys))
        if missing or unexpected:
            parts = []
            if missing:
                parts.append(f'missing {len(missing)} tensor(s): {_describe(missing)}')
            if unexpected:
                parts.append(f'unexpected {len(unexpected)} tensor(s): {_describe(unexpected)}')
            raise CheckpointError(f'{weights_path} does not match a {policy_type} model with this config.json: '
                                  + '; '.join(parts))
        for key, file_key in file_keys.items():
            shape = tuple(handle.get_slice(file_key).get_shape())
            if shape != expected[key]:
                raise CheckpointError(f'{weights_path}: tensor {file_key} has shape {list(shape)}, '
                                      f'the config expects {list(expected[key])}')
        # copy=True: the model owns freshly allocated (aligned) memory, not a view of the file buffer.
        state = {key: handle.get_tensor(file_key).to(device=device, dtype=param_dtype(key, compute_dtype), copy=True)
                 for key, file_key in file_keys.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.compute_dtype = compute_dtype


def build_model(config: PolicyConfig, weights_path: Path, device: torch.device,
                compute_dtype: torch.dtype) -> PiZeroModel:
    """Allocate nothing until the tensors arrive: build on 'meta', assign loaded tensors, fuse projections."""
    with torch.device('meta'):
        model = PiZeroModel(config)
    load_weights(model, weights_path, device, compute_dtype)
    fuse_projections(model)
    return model.eval()


# ---- normalisation statistics ------------------------------------------------------------

def _processor_steps(folder: Path, json_name: str) -> List[Mapping]:
    path = folder / json_name
    try:
        return json.loads(path.read_text()).get('steps', [])
    except FileNotFoundError:
        raise CheckpointError(f'no {json_name} in {folder}: cannot read normalisation statistics') from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f'{path} is not valid JSON: {exc}') from exc


def _processor_stats(folder: Path, json_name: str, step_name: str) -> Tuple[Dict[str, np.ndarray], Mapping]:
    path = folder / json_name
    steps = _processor_steps(folder, json_name)
    for index, step in enumerate(steps):
        if step.get('registry_name') != step_name:
            continue
        stats_name = step.get('state_file') or f'{path.stem}_step_{index}_{step_name}.safetensors'
        stats_path = folder / stats_name
        if not stats_path.exists():
            raise CheckpointError(f'{json_name} names {stats_name} for {step_name}, but it is not in {folder}')
        return load_numpy_file(str(stats_path)), step.get('config', {})
    raise CheckpointError(f'{path} has no {step_name!r} step')


def load_normalizers(folder: Path, config: PolicyConfig) -> Tuple[FeatureNormalizer, FeatureNormalizer]:
    mapping = config.normalization_mapping
    pre_stats, pre_cfg = _processor_stats(folder, PREPROCESSOR_FILE, NORMALIZER_STEP)
    post_stats, post_cfg = _processor_stats(folder, POSTPROCESSOR_FILE, UNNORMALIZER_STEP)
    try:
        state = FeatureNormalizer(STATE_FEATURE, mapping.get('STATE', 'IDENTITY'),
                                  split_flat_stats(pre_stats, STATE_FEATURE), float(pre_cfg.get('eps', DEFAULT_EPS)))
        action = FeatureNormalizer(ACTION_FEATURE, mapping.get('ACTION', 'IDENTITY'),
                                   split_flat_stats(post_stats, ACTION_FEATURE),
                                   float(post_cfg.get('eps', DEFAULT_EPS)))
    except NormalizationError as exc:
        raise CheckpointError(f'{folder}: {exc}') from exc
    for normalizer, dim in ((state, config.state_dim), (action, config.action_dim)):
        if normalizer.dim not in (-1, dim):
            raise CheckpointError(f'{folder}: {normalizer.feature} statistics have {normalizer.dim} values, '
                                  f'config.json says {dim}')
    return state, action


def _relative_step_configs(config: PolicyConfig) -> Dict[str, Dict]:
    """What lerobot's training saves for the relative/absolute steps of this config (processor_pi0/pi05.py)."""
    names = None if config.action_feature_names is None else list(config.action_feature_names)
    return {RELATIVE_STEP: {'enabled': config.use_relative_actions,
                            'exclude_joints': list(config.relative_exclude_joints), 'action_names': names},
            ABSOLUTE_STEP: {'enabled': config.use_relative_actions}}


def check_relative_action_steps(folder: Path, config: PolicyConfig) -> None:
    """Refuse a folder whose processor files and config.json disagree about relative actions.

    lerobot's inference takes the relative/absolute steps from the processor files
    (``policies/factory.py::make_pre_post_processors``), we take config.json; lerobot's training writes
    both from the same values, so a disagreement is a damaged or hand-edited checkpoint.
    """
    for json_name, (step_name, wanted) in zip((PREPROCESSOR_FILE, POSTPROCESSOR_FILE),
                                              _relative_step_configs(config).items()):
        step = next((s for s in _processor_steps(folder, json_name) if s.get('registry_name') == step_name), None)
        # A file without the step (lerobot before #2970) applies none; missing keys take the step's defaults.
        saved = dict(_RELATIVE_STEP_DEFAULTS, **(step.get('config', {}) if step is not None else {}))
        # The joint lists only matter when the step is on.
        checked = wanted if config.use_relative_actions else {'enabled': wanted['enabled']}
        for key, value in checked.items():
            if saved[key] != value:
                raise CheckpointError(f'{folder}: {json_name} {step_name} has {key} = {json.dumps(saved[key])} '
                                      f'but config.json says {json.dumps(value)}; lerobot would follow '
                                      f'{json_name}, so this checkpoint is ambiguous')


# ---- whole folder --------------------------------------------------------------------------

def find_tokenizer(folder: Path) -> Optional[Path]:
    for candidate in (folder / TOKENIZER_DIR / 'tokenizer.model', folder / TOKENIZER_DIR / 'tokenizer.json',
                      folder / 'tokenizer.model', folder / 'tokenizer.json'):
        if candidate.is_file():
            return candidate
    return None


def load_checkpoint(folder: Path, device: torch.device, compute_dtype: torch.dtype) -> LoadedCheckpoint:
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    try:
        config = PolicyConfig.from_json_file(folder / CONFIG_FILE)
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from exc
    state_norm, action_norm = load_normalizers(folder, config)
    check_relative_action_steps(folder, config)
    weights = folder / WEIGHTS_FILE
    model = build_model(config, weights, device, compute_dtype)
    return LoadedCheckpoint(model=model, config=config, state_normalizer=state_norm, action_normalizer=action_norm,
                            weights_path=weights, tokenizer_path=find_tokenizer(folder))


def _preprocessor_steps(config: PolicyConfig, stats_file: str, features: Mapping) -> List[Dict]:
    tokenizer_step = {'registry_name': 'tokenizer_processor',
                      'config': {'max_length': config.tokenizer_max_length, 'task_key': 'task',
                                 'padding_side': 'right', 'padding': 'max_length', 'truncation': True,
                                 'tokenizer_name': HUB_TOKENIZER_NAME}}
    normalizer_step = {'registry_name': NORMALIZER_STEP,
                       'config': {'eps': DEFAULT_EPS, 'features': features,
                                  'norm_map': dict(config.normalization_mapping)},
                       'state_file': stats_file}
    common = [{'registry_name': 'rename_observations_processor', 'config': {'rename_map': {}}},
              {'registry_name': 'to_batch_processor', 'config': {}}]
    relative = {'registry_name': RELATIVE_STEP, 'config': _relative_step_configs(config)[RELATIVE_STEP]}
    device = {'registry_name': 'device_processor', 'config': {'device': 'cpu', 'float_dtype': None}}
    if config.policy_type == 'pi0':
        return common + [{'registry_name': 'pi0_new_line_processor', 'config': {}}, tokenizer_step, device,
                         relative, normalizer_step]
    return common + [relative, normalizer_step,
                     {'registry_name': 'pi05_prepare_state_tokenizer_processor_step', 'config': {}},
                     tokenizer_step, device]


def save_checkpoint(folder: Path, model: PiZeroModel, state_stats: Mapping[str, np.ndarray],
                    action_stats: Mapping[str, np.ndarray], tokenizer_file: Optional[Path] = None) -> Path:
    """Write ``model`` and its statistics as a lerobot ``pretrained_model/`` folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config
    (folder / CONFIG_FILE).write_text(json.dumps(config.to_lerobot_dict(), indent=2) + '\n')
    tensors = {'model.' + key: value.detach().to('cpu').contiguous() for key, value in model.state_dict().items()}
    # Real folders carry both LM heads (the PaliGemma one tied to the embedding).
    tensors['model.' + _LM_HEAD_KEYS[0]] = tensors['model.' + _EMBED_KEY].clone()
    tensors['model.' + _LM_HEAD_KEYS[1]] = torch.zeros(config.vocab_size, config.expert.width)
    save_torch_file(tensors, str(folder / WEIGHTS_FILE), metadata={'format': 'pt'})

    features = {STATE_FEATURE: {'type': 'STATE', 'shape': [config.state_dim]},
                ACTION_FEATURE: {'type': 'ACTION', 'shape': [config.action_dim]}}
    steps = _preprocessor_steps(config, '', features)
    normalizer_index = next(i for i, s in enumerate(steps) if s['registry_name'] == NORMALIZER_STEP)
    pre_stats_file = f'policy_preprocessor_step_{normalizer_index}_{NORMALIZER_STEP}.safetensors'
    steps[normalizer_index]['state_file'] = pre_stats_file
    flat = flatten_stats({STATE_FEATURE: state_stats, ACTION_FEATURE: action_stats})
    save_numpy_file(flat, str(folder / pre_stats_file))
    (folder / PREPROCESSOR_FILE).write_text(json.dumps({'name': 'policy_preprocessor', 'steps': steps}, indent=2))

    post_stats_file = f'policy_postprocessor_step_0_{UNNORMALIZER_STEP}.safetensors'
    save_numpy_file(flatten_stats({ACTION_FEATURE: action_stats}), str(folder / post_stats_file))
    post_steps = [{'registry_name': UNNORMALIZER_STEP,
                   'config': {'eps': DEFAULT_EPS, 'features': {ACTION_FEATURE: features[ACTION_FEATURE]},
                              'norm_map': dict(config.normalization_mapping)},
                   'state_file': post_stats_file},
                  {'registry_name': ABSOLUTE_STEP, 'config': _relative_step_configs(config)[ABSOLUTE_STEP]},
                  {'registry_name': 'device_processor', 'config': {'device': 'cpu', 'float_dtype': None}}]
    (folder / POSTPROCESSOR_FILE).write_text(json.dumps({'name': 'policy_postprocessor', 'steps': post_steps},
                                                        indent=2))
    if tokenizer_file is not None:
        (folder / TOKENIZER_DIR).mkdir(exist_ok=True)
        target = folder / TOKENIZER_DIR / Path(tokenizer_file).name
        target.write_bytes(Path(tokenizer_file).read_bytes())
    return folder
