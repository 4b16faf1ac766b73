"""Classifying a lerobot config.json field by field, for any policy family.

Nothing in a config.json is ignored silently: each family keeps a table that says
for every field of its lerobot config class whether we implement it, accept it
because only training reads it, accept it as metadata, or load it only at the
values we reproduce. Any other key, and a field we do not implement set to
something else, refuses the checkpoint with the field and its value named.

The fields of lerobot's ``PreTrainedConfig`` (src/lerobot/configs/policies.py at
huggingface/lerobot 7427f31801f944f5ec9ce53cda02862ce7d1638b) are common to every
family: ``PRETRAINED_CONFIG_FIELDS``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from .normalize import NORM_MODES

IMAGE_FEATURE_PREFIX = 'observation.images.'
STATE_FEATURE = 'observation.state'
ACTION_FEATURE = 'action'

IMPLEMENTED = 'implemented'      # read and reproduced
TRAINING = 'training'            # only training reads it: accepted with any value
METADATA = 'metadata'            # bookkeeping or another component's setting: accepted with any value
DEFAULT_ONLY = 'default_only'    # changes inference and is not implemented: loads only at `accepted` values


class ConfigError(ValueError):
    """A config.json or preset that cannot describe a model."""


@dataclass(frozen=True)
class ConfigField:
    name: str
    handling: str
    why: str
    accepted: Tuple[Any, ...] = ()               # DEFAULT_ONLY: the values that load (JSON values)


PRETRAINED_CONFIG_FIELDS: Tuple[ConfigField, ...] = (
    ConfigField('n_obs_steps', DEFAULT_ONLY, 'observation history is not implemented (one observation per chunk)',
                accepted=(1,)),
    ConfigField('input_features', IMPLEMENTED, 'camera names and order, state dimension'),
    ConfigField('output_features', IMPLEMENTED, 'action dimension'),
    ConfigField('device', METADATA, "where lerobot ran; the node's device parameter decides"),
    ConfigField('use_amp', METADATA, "lerobot's autocast switch; the node's dtype parameter sets the precision"),
    ConfigField('use_peft', DEFAULT_ONLY,
                'PEFT adapters are not loaded (merge the adapter into model.safetensors first)', accepted=(False,)),
    ConfigField('push_to_hub', METADATA, 'Hub upload'),
    ConfigField('repo_id', METADATA, 'Hub upload'),
    ConfigField('private', METADATA, 'Hub upload'),
    ConfigField('tags', METADATA, 'Hub upload'),
    ConfigField('license', METADATA, 'Hub upload'),
    ConfigField('pretrained_path', METADATA, 'where training started from'),
    ConfigField('pretrained_revision', METADATA, 'where training started from'),
)

# The training presets lerobot's VLA config classes each declare alike (PI0Config, PI05Config, SmolVLAConfig:
# what their get_optimizer_preset / get_scheduler_preset read, and torch.compile): only training reads them.
TRAINING_PRESET_FIELDS: Tuple[ConfigField, ...] = (
    ConfigField('compile_model', TRAINING, 'torch.compile (speed only)'),
    ConfigField('compile_mode', TRAINING, 'torch.compile (speed only)'),
    ConfigField('optimizer_lr', TRAINING, 'optimizer'),
    ConfigField('optimizer_betas', TRAINING, 'optimizer'),
    ConfigField('optimizer_eps', TRAINING, 'optimizer'),
    ConfigField('optimizer_weight_decay', TRAINING, 'optimizer'),
    ConfigField('optimizer_grad_clip_norm', TRAINING, 'optimizer'),
    ConfigField('scheduler_warmup_steps', TRAINING, 'learning-rate schedule'),
    ConfigField('scheduler_decay_steps', TRAINING, 'learning-rate schedule'),
    ConfigField('scheduler_decay_lr', TRAINING, 'learning-rate schedule'),
)


def table(entries: Iterable[ConfigField]) -> Dict[str, ConfigField]:
    """name -> entry; a name twice is a programming error."""
    result: Dict[str, ConfigField] = {}
    for entry in entries:
        if entry.name in result:
            raise ValueError(f'config field {entry.name} classified twice')
        result[entry.name] = entry
    return result


def check_fields(raw: Mapping[str, Any], fields: Mapping[str, ConfigField], type_name: str,
                 lerobot_class: str) -> None:
    """Refuse keys ``fields`` does not know, and unimplemented fields away from their accepted values."""
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f'config.json has field(s) {unknown} that a lerobot {type_name} config '
                          f'({lerobot_class}, lerobot 7427f318) does not have; refusing rather than ignoring them')
    for name, value in raw.items():
        entry = fields[name]
        if entry.handling == DEFAULT_ONLY and not any(_same_json(value, ok) for ok in entry.accepted):
            allowed = ' or '.join(json.dumps(ok) for ok in entry.accepted)
            raise ConfigError(f'config.json sets {name} = {json.dumps(value)}: {entry.why}; vla_policy_node '
                              f'loads it only with {name} = {allowed}')


def _same_json(value: Any, accepted: Any) -> bool:
    # 1 == True in Python; a config value must also have the accepted value's JSON type.
    return type(value) is type(accepted) and value == accepted


# ---- readers shared by the families --------------------------------------------------------------

def normalization_mapping(raw: Any) -> Dict[str, str]:
    """lerobot's normalization_mapping, refused where we would compute something else."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f'config.json normalization_mapping must be an object, got {json.dumps(raw)}')
    for feature_type, mode in raw.items():
        if mode not in NORM_MODES:
            raise ConfigError(f'config.json normalization_mapping.{feature_type} = {json.dumps(mode)} is not '
                              f'implemented (known modes: {", ".join(NORM_MODES)})')
        if feature_type == 'VISUAL' and mode != 'IDENTITY':
            # Images go to the vision tower as [-1, 1] pixels; no image statistics are applied.
            raise ConfigError(f'config.json normalization_mapping.VISUAL = {json.dumps(mode)} is not '
                              'implemented (only IDENTITY)')
    return dict(raw)


def bool_field(raw: Mapping[str, Any], name: str, default: bool) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise ConfigError(f'config.json {name} must be true or false, got {json.dumps(value)}')
    return value


def names_field(raw: Mapping[str, Any], name: str,
                default: Optional[Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
    value = raw.get(name, default)
    if value is None or isinstance(value, tuple):
        return value
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f'config.json {name} must be a list of strings or null, got {json.dumps(value)}')
    return tuple(value)


def features(raw: Mapping[str, Any], empty_camera_prefix: str) -> Tuple[List[str], int, int]:
    """(camera names in config order, state_dim, action_dim) from input_features / output_features."""
    inputs = raw.get('input_features') or {}
    cameras = [key[len(IMAGE_FEATURE_PREFIX):] for key, feat in inputs.items()
               if key.startswith(IMAGE_FEATURE_PREFIX) and feat.get('type') == 'VISUAL'
               and not key[len(IMAGE_FEATURE_PREFIX):].startswith(empty_camera_prefix)]
    if not cameras:
        raise ConfigError('config.json input_features lists no VISUAL observation.images.* camera')
    state_feat = inputs.get(STATE_FEATURE)
    action_feat = (raw.get('output_features') or {}).get(ACTION_FEATURE)
    if state_feat is None or action_feat is None:
        raise ConfigError('config.json needs input_features.observation.state and output_features.action')
    try:
        return cameras, int(state_feat['shape'][0]), int(action_feat['shape'][0])
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise ConfigError(f'config.json is malformed: {exc!r}') from exc


def feature_documents(camera_names: Iterable[str], image_shape: Tuple[int, int], state_dim: int,
                      action_dim: int) -> Dict[str, Any]:
    """input_features / output_features as lerobot writes them."""
    height, width = image_shape
    inputs: Dict[str, Any] = {IMAGE_FEATURE_PREFIX + name: {'type': 'VISUAL', 'shape': [3, height, width]}
                              for name in camera_names}
    inputs[STATE_FEATURE] = {'type': 'STATE', 'shape': [state_dim]}
    return {'input_features': inputs, 'output_features': {ACTION_FEATURE: {'type': 'ACTION', 'shape': [action_dim]}}}
