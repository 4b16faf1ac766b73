"""Reading and writing lerobot ``pretrained_model/`` folders, strictly and without pickle, for any family.

    pretrained_model/
      config.json                       the family config (+ our optional model_sizes block)
      model.safetensors                 weights, keys "model.<module path>"
      policy_preprocessor.json          steps; the normalizer step names its stats file
      policy_preprocessor_step_<k>_normalizer_processor.safetensors
      policy_postprocessor.json
      policy_postprocessor_step_0_unnormalizer_processor.safetensors
      tokenizer/                        when saved locally (the family's tokenizer file)
      train_config.json                 lerobot's training config, when lerobot trained it (read for the fps)
      training.json                     this package's trainer's record (vla_policy_train_demo)

Strict means: a missing, unexpected or mis-shaped tensor is an error that
names it. Tensors that real checkpoints carry but inference never reads are
known to the family (``WeightKeys.known_unused``) and skipped, not loaded to the
device. Which family reads a folder is config.json's ``type``: the registry
(policy/families/__init__.py: ``load_checkpoint``, ``save_checkpoint``) asks it;
this module knows no family.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import load_file as load_numpy_file
from safetensors.numpy import save_file as save_numpy_file
from safetensors.torch import save_file as save_torch_file
from torch import nn

from .config_fields import ACTION_FEATURE, STATE_FEATURE
from .layers import fuse_projections
from .normalize import DEFAULT_EPS, FeatureNormalizer, NormalizationError, flatten_stats, split_flat_stats

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
PREPROCESSOR_FILE = 'policy_preprocessor.json'
POSTPROCESSOR_FILE = 'policy_postprocessor.json'
TOKENIZER_DIR = 'tokenizer'
TRAINING_FILE = 'training.json'           # vla_policy_train_demo's record: command, versions, action_period_sec
TRAIN_CONFIG_FILE = 'train_config.json'   # lerobot's TrainPipelineConfig (lerobot/configs/train.py)
NORMALIZER_STEP = 'normalizer_processor'
UNNORMALIZER_STEP = 'unnormalizer_processor'
RELATIVE_STEP = 'relative_actions_processor'
ABSOLUTE_STEP = 'absolute_actions_processor'
# RelativeActionsProcessorStep's field defaults (lerobot 7427f318, processor/relative_action_processor.py).
_RELATIVE_STEP_DEFAULTS = {'enabled': False, 'exclude_joints': [], 'action_names': None}


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded as it is."""


@dataclass
class LoadedCheckpoint:
    model: nn.Module
    config: Any
    state_normalizer: FeatureNormalizer
    action_normalizer: FeatureNormalizer
    weights_path: Path
    tokenizer_path: Optional[Path]
    # Why no tokenizer was found beside the folder (where the family looked), for the load's refusal; None: the
    # generic message.
    tokenizer_problem: Optional[str] = None


# ---- weights -----------------------------------------------------------------------

@dataclass(frozen=True)
class WeightKeys:
    """How one family's ``model.safetensors`` keys map onto its module names.

    ``renames``: (regex, replacement) applied in order after the leading ``model.`` is dropped
    (spellings of other releases and exports -> ours); ``known_unused``: canonical keys real
    checkpoints carry that inference never reads; ``stand_ins``: key -> a canonical key that may
    stand in when the key itself is absent (tied embeddings). The storage dtype of each parameter
    is the model's (``param_dtype(name, compute_dtype)``, layers.MixedPrecisionPolicy).
    """

    renames: Tuple[Tuple[str, str], ...] = ()
    known_unused: Callable[[str], bool] = field(default=lambda key: False)
    stand_ins: Mapping[str, str] = field(default_factory=dict)

    def canonical(self, file_key: str) -> str:
        key = file_key[len('model.'):] if file_key.startswith('model.') else file_key
        for pattern, replacement in self.renames:
            key = re.sub(pattern, replacement, key)
        return key


def _describe(names: Iterable[str], limit: int = 8) -> str:
    names = sorted(names)
    shown = ', '.join(names[:limit])
    return shown + (f' and {len(names) - limit} more' if len(names) > limit else '')


def load_weights(model: nn.Module, weights_path: Path, device: torch.device, compute_dtype: torch.dtype,
                 keys: WeightKeys) -> None:
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
        canonical = {file_key: keys.canonical(file_key) for file_key in handle.keys()}
        for file_key, key in canonical.items():
            if key in expected:
                if key in file_keys:
                    raise CheckpointError(f'{weights_path}: tensors {file_keys[key]} and {file_key} both map to {key}')
                file_keys[key] = file_key
            elif not keys.known_unused(key):
                unexpected.append(file_key)
        # Tied embeddings: some exports keep only the LM head.
        for key, stand_in in keys.stand_ins.items():
            if key in expected and key not in file_keys:
                file_keys.update({key: file_key for file_key, name in canonical.items() if name == stand_in})
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
        state = {key: handle.get_tensor(file_key).to(device=device, dtype=model.param_dtype(key, compute_dtype),
                                                     copy=True)
                 for key, file_key in file_keys.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.compute_dtype = compute_dtype


def build_model(model_class: Callable[[Any], nn.Module], config: Any, weights_path: Path, device: torch.device,
                compute_dtype: torch.dtype, keys: WeightKeys) -> nn.Module:
    """Allocate nothing until the tensors arrive: build on 'meta', assign loaded tensors, fuse projections."""
    with torch.device('meta'):
        model = model_class(config)
    load_weights(model, weights_path, device, compute_dtype, keys)
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


def load_normalizers(folder: Path, config: Any) -> Tuple[FeatureNormalizer, FeatureNormalizer]:
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


def relative_step_configs(config: Any) -> Dict[str, Dict]:
    """What lerobot's training saves for the relative/absolute steps of this config (processor_pi0/pi05.py)."""
    names = None if config.action_feature_names is None else list(config.action_feature_names)
    return {RELATIVE_STEP: {'enabled': config.use_relative_actions,
                            'exclude_joints': list(config.relative_exclude_joints), 'action_names': names},
            ABSOLUTE_STEP: {'enabled': config.use_relative_actions}}


def check_relative_action_steps(folder: Path, config: Any) -> None:
    """Refuse a folder whose processor files and config.json disagree about relative actions.

    lerobot's inference takes the relative/absolute steps from the processor files
    (``policies/factory.py::make_pre_post_processors``), we take config.json; lerobot's training writes
    both from the same values, so a disagreement is a damaged or hand-edited checkpoint.
    """
    for json_name, (step_name, wanted) in zip((PREPROCESSOR_FILE, POSTPROCESSOR_FILE),
                                              relative_step_configs(config).items()):
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


def _json_object(path: Path) -> Optional[Dict[str, Any]]:
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _positive(value: Any) -> Optional[float]:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def lerobot_home(environ: Mapping[str, str]) -> Path:
    """lerobot's HF_LEROBOT_HOME: $HF_LEROBOT_HOME, else $HF_HOME/lerobot, else ~/.cache/huggingface/lerobot
    (lerobot/utils/constants.py; HF_HOME as huggingface_hub reads it, XDG_CACHE_HOME included)."""
    if environ.get('HF_LEROBOT_HOME'):
        return Path(environ['HF_LEROBOT_HOME']).expanduser()
    cache = Path(environ.get('XDG_CACHE_HOME') or '~/.cache').expanduser()
    return Path(environ.get('HF_HOME') or cache / 'huggingface').expanduser() / 'lerobot'


def recorded_fps(folder: Path, environ: Optional[Mapping[str, str]] = None) -> Optional[Tuple[float, str]]:
    """The frame rate the checkpoint was trained at, and where it is written; None when nothing records it.

    In this order: ``training.json``'s ``action_period_sec`` (vla_policy_train_demo); lerobot's
    ``train_config.json`` (saved beside the policy by lerobot's ``save_checkpoint``,
    lerobot/common/train_utils.py): its ``env.fps`` when it trained in a simulator, else the ``fps`` of its
    dataset's ``meta/info.json`` when that dataset is on this machine (``dataset.root``, else
    ``$HF_LEROBOT_HOME/<repo_id>``, as lerobot/configs/default.py ``DatasetConfig`` looks it up). lerobot's
    policy config.json records no fps.
    """
    folder = Path(folder)
    training = _json_object(folder / TRAINING_FILE) or {}
    period = _positive(training.get('action_period_sec'))
    if period is not None:
        return 1.0 / period, f'{TRAINING_FILE} (action_period_sec {period:g})'
    train_config = _json_object(folder / TRAIN_CONFIG_FILE)
    if train_config is None:
        return None
    env = train_config.get('env')
    fps = _positive(env.get('fps')) if isinstance(env, dict) else None
    if fps is not None:
        return fps, f'{TRAIN_CONFIG_FILE} (env.fps)'
    dataset = train_config.get('dataset')
    if not isinstance(dataset, dict) or not isinstance(dataset.get('repo_id'), str):
        return None
    root = dataset.get('root')
    root = Path(root).expanduser() if isinstance(root, str) and root else \
        lerobot_home(os.environ if environ is None else environ) / dataset['repo_id']
    info = root / 'meta' / 'info.json'
    fps = _positive((_json_object(info) or {}).get('fps'))
    return (fps, f'{info} (fps, the dataset of {TRAIN_CONFIG_FILE})') if fps is not None else None


def read_json_object(path: Path, missing_hint: str = '') -> Dict[str, Any]:
    """A JSON file that holds an object, as a dict; CheckpointError when absent (``missing_hint`` ends that
    message), not JSON or not an object."""
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f'no {path.name} in {path.parent}{missing_hint}') from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f'{path} is not valid JSON: {exc}') from exc
    if not isinstance(document, dict):
        raise CheckpointError(f'{path} is not a JSON object')
    return document


def read_config_json(folder: Path) -> Dict[str, Any]:
    """config.json as a dict; CheckpointError when absent, not JSON or not an object."""
    return read_json_object(Path(folder) / CONFIG_FILE)


def load_parts(folder: Path, config: Any, model_class: Callable[[Any], nn.Module], device: torch.device,
               compute_dtype: torch.dtype, keys: WeightKeys) -> LoadedCheckpoint:
    """What every family loads the same way once its config is parsed: statistics, relative-action steps,
    strict weights, the tokenizer's place."""
    state_norm, action_norm = load_normalizers(folder, config)
    check_relative_action_steps(folder, config)
    weights = folder / WEIGHTS_FILE
    model = build_model(model_class, config, weights, device, compute_dtype, keys)
    return LoadedCheckpoint(model=model, config=config, state_normalizer=state_norm, action_normalizer=action_norm,
                            weights_path=weights, tokenizer_path=find_tokenizer(folder))


def normalizer_step(config: Any) -> Dict[str, Any]:
    """lerobot's NormalizerProcessorStep entry (its state_file is filled in by ``write_folder``)."""
    features = {STATE_FEATURE: {'type': 'STATE', 'shape': [config.state_dim]},
                ACTION_FEATURE: {'type': 'ACTION', 'shape': [config.action_dim]}}
    return {'registry_name': NORMALIZER_STEP,
            'config': {'eps': DEFAULT_EPS, 'features': features, 'norm_map': dict(config.normalization_mapping)},
            'state_file': ''}


def common_steps() -> List[Dict[str, Any]]:
    """The steps every lerobot pre-processor starts with."""
    return [{'registry_name': 'rename_observations_processor', 'config': {'rename_map': {}}},
            {'registry_name': 'to_batch_processor', 'config': {}}]


def relative_step(config: Any) -> Dict[str, Any]:
    return {'registry_name': RELATIVE_STEP, 'config': relative_step_configs(config)[RELATIVE_STEP]}


def device_step() -> Dict[str, Any]:
    return {'registry_name': 'device_processor', 'config': {'device': 'cpu', 'float_dtype': None}}


def write_folder(folder: Path, config: Any, config_document: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
                 pre_steps: List[Dict[str, Any]], state_stats: Mapping[str, np.ndarray],
                 action_stats: Mapping[str, np.ndarray], relative_steps: bool = True,
                 tokenizer_files: Iterable[Path] = ()) -> Path:
    """Write a lerobot ``pretrained_model/`` folder: config.json, weights (keys ``model.<name>``), the two
    processor files with their statistics (the pre-processor's normalizer step is in ``pre_steps``) and
    the tokenizer files under tokenizer/."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(dict(config_document), indent=2) + '\n')
    save_torch_file({'model.' + key: value.detach().to('cpu').contiguous() for key, value in tensors.items()},
                    str(folder / WEIGHTS_FILE), metadata={'format': 'pt'})
    normalizer_index = next(i for i, s in enumerate(pre_steps) if s['registry_name'] == NORMALIZER_STEP)
    pre_stats_file = f'policy_preprocessor_step_{normalizer_index}_{NORMALIZER_STEP}.safetensors'
    pre_steps[normalizer_index]['state_file'] = pre_stats_file
    save_numpy_file(flatten_stats({STATE_FEATURE: state_stats, ACTION_FEATURE: action_stats}),
                    str(folder / pre_stats_file))
    (folder / PREPROCESSOR_FILE).write_text(json.dumps({'name': 'policy_preprocessor', 'steps': pre_steps},
                                                       indent=2))
    post_stats_file = f'policy_postprocessor_step_0_{UNNORMALIZER_STEP}.safetensors'
    save_numpy_file(flatten_stats({ACTION_FEATURE: action_stats}), str(folder / post_stats_file))
    unnormalizer = normalizer_step(config)
    unnormalizer.update(registry_name=UNNORMALIZER_STEP, state_file=post_stats_file)
    unnormalizer['config']['features'] = {ACTION_FEATURE: unnormalizer['config']['features'][ACTION_FEATURE]}
    post_steps = [unnormalizer]
    if relative_steps:
        post_steps.append({'registry_name': ABSOLUTE_STEP, 'config': relative_step_configs(config)[ABSOLUTE_STEP]})
    post_steps.append(device_step())
    (folder / POSTPROCESSOR_FILE).write_text(json.dumps({'name': 'policy_postprocessor', 'steps': post_steps},
                                                        indent=2))
    tokenizer_files = [Path(path) for path in tokenizer_files]
    if tokenizer_files:
        (folder / TOKENIZER_DIR).mkdir(exist_ok=True)
        for path in tokenizer_files:
            (folder / TOKENIZER_DIR / path.name).write_bytes(path.read_bytes())
    return folder
