"""GR00T N1.7's processor files as lerobot saves them, read into settings; every step and field classified.

lerobot ``policies/groot/processor_groot.py`` (7427f318) make_groot_pre_post_processors and the steps' get_config /
state_dict; a fine-tune's folder holds

    policy_preprocessor.json    rename_observations_processor, to_batch_processor, groot_n1_7_pack_inputs_v1 (its
                                state file: the flat min/max/mean/std statistics it normalises the state with),
                                groot_n1_7_vlm_encode_v1 (the image geometry and the backbone's processor folder),
                                device_processor
    policy_postprocessor.json   groot_action_unpack_unnormalize_v2 (flat statistics in its state file) or
                                groot_n1_7_action_decode_v1 (the checkpoint's action groups in its config), then
                                device_processor

and config.json's action_decode_transform overrides the decode step's LIBERO switch at load
(_apply_groot_action_decode_transform). A step or field not listed here is refused by name.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
from safetensors.numpy import load_file as load_numpy_file

from ...checkpoint import POSTPROCESSOR_FILE, PREPROCESSOR_FILE, CheckpointError, read_json_object
from ...config_fields import (DEFAULT_ONLY, IMPLEMENTED, METADATA, TRAINING, ConfigError, ConfigField, check_fields,
                              table)
from ...normalize import split_flat_stats

RENAME_STEP = 'rename_observations_processor'
BATCH_STEP = 'to_batch_processor'
DEVICE_STEP = 'device_processor'
PACK_STEP = 'groot_n1_7_pack_inputs_v1'
ENCODE_STEP = 'groot_n1_7_vlm_encode_v1'
FLAT_DECODE_STEP = 'groot_action_unpack_unnormalize_v2'
GROUP_DECODE_STEP = 'groot_n1_7_action_decode_v1'
LIBERO = 'libero'

PACK_FIELDS = table((
    ConfigField('state_horizon', DEFAULT_ONLY, 'one state per observation', accepted=(1,)),
    ConfigField('action_horizon', TRAINING, 'pads training actions'),
    ConfigField('valid_action_horizon', TRAINING, 'the training action mask'),
    ConfigField('video_horizon', DEFAULT_ONLY, 'one frame per camera (a video horizon above 1 is not implemented)',
                accepted=(None, 1)),
    ConfigField('max_state_dim', IMPLEMENTED, 'the state is zero-padded to it'),
    ConfigField('max_action_dim', TRAINING, 'pads training actions'),
    ConfigField('language_key', METADATA, 'where lerobot reads the task; the node gives the instruction'),
    ConfigField('formalize_language', IMPLEMENTED, 'lowercase, letters / digits / whitespace / _ only'),
    ConfigField('embodiment_tag', IMPLEMENTED, 'the embodiment'),
    ConfigField('embodiment_mapping', IMPLEMENTED, 'tag -> embodiment id'),
    ConfigField('normalize_min_max', IMPLEMENTED, 'min/max state normalisation'),
    ConfigField('state_dropout_prob', TRAINING, 'training only'),
    ConfigField('clip_outliers', IMPLEMENTED, 'clip the normalised state to [-1, 1]'),
    ConfigField('use_percentiles', TRAINING, 'grouped training normalisation (the state uses the flat statistics)'),
    ConfigField('video_modality_keys', IMPLEMENTED, 'camera order'),
    ConfigField('raw_stats', METADATA, 'read for relative-action decoding only (refused)'),
    ConfigField('modality_config', METADATA, 'read for relative-action decoding only (refused)'),
))
ENCODE_FIELDS = table((
    ConfigField('model_name', IMPLEMENTED, 'the backbone\'s processor folder (tokenizer, chat template, image '
                'processor); the tokenizer_path parameter overrides'),
    ConfigField('image_crop_size', IMPLEMENTED, 'centre crop'),
    ConfigField('image_target_size', IMPLEMENTED, 'model image size'),
    ConfigField('shortest_image_edge', IMPLEMENTED, 'square resize edge'),
    ConfigField('crop_fraction', IMPLEMENTED, 'centre crop'),
    ConfigField('use_albumentations', DEFAULT_ONLY, "the albumentations (cv2 INTER_AREA) geometry is not "
                'implemented (the base config\'s use_albumentations_transforms is never read by lerobot)',
                accepted=(False,)),
    ConfigField('letter_box_transform', DEFAULT_ONLY, 'letter-boxing is not implemented', accepted=(False,)),
    ConfigField('device', METADATA, "where lerobot ran; the node's device parameter decides"),
))
FLAT_DECODE_FIELDS = table((
    ConfigField('env_action_dim', IMPLEMENTED, 'the robot action width'),
    ConfigField('normalize_min_max', IMPLEMENTED, 'inverse min/max'),
    ConfigField('clip_normalized_action', IMPLEMENTED, 'clip to [-1, 1] first'),
    ConfigField('libero_gripper_action', IMPLEMENTED, 'LIBERO gripper sign (config.json decides, as in lerobot)'),
    ConfigField('libero_gripper_binarize', IMPLEMENTED, 'LIBERO gripper sign binarised'),
))
GROUP_DECODE_FIELDS = table((
    ConfigField('env_action_dim', IMPLEMENTED, 'the robot action width'),
    ConfigField('raw_stats', IMPLEMENTED, 'per-group statistics'),
    ConfigField('modality_config', IMPLEMENTED, 'action groups and their order'),
    ConfigField('use_percentiles', IMPLEMENTED, 'q01/q99 for absolute groups'),
    ConfigField('use_relative_action', IMPLEMENTED, 'relative groups are refused'),
    ConfigField('action_decode_transform', IMPLEMENTED, 'config.json decides, as in lerobot'),
))
STEP_FIELDS = {PACK_STEP: PACK_FIELDS, ENCODE_STEP: ENCODE_FIELDS, FLAT_DECODE_STEP: FLAT_DECODE_FIELDS,
               GROUP_DECODE_STEP: GROUP_DECODE_FIELDS,
               RENAME_STEP: table((ConfigField('rename_map', METADATA, 'the node names inputs by the checkpoint\'s '
                                               'features, which are the renamed keys'),)),
               BATCH_STEP: {}, DEVICE_STEP: table((ConfigField('device', METADATA, 'the node\'s device decides'),
                                                   ConfigField('float_dtype', DEFAULT_ONLY, 'no cast',
                                                               accepted=(None,))))}
PRE_ORDER = (RENAME_STEP, BATCH_STEP, PACK_STEP, ENCODE_STEP, DEVICE_STEP)


@dataclass(frozen=True)
class GrootProcessors:
    """What the processor files say (geometry numbers still raw; config.py builds ImageGeometry)."""

    video_modality_keys: Optional[Tuple[str, ...]]
    formalize_language: bool
    embodiment_tag: str
    embodiment_mapping: Mapping[str, int]
    max_state_dim: int
    normalize_state: bool
    clip_state: bool
    state_stats: Mapping[str, np.ndarray]
    tokenizer_name: str
    target_size: Optional[Tuple[int, int]]
    crop_size: Optional[Tuple[int, int]]
    shortest_image_edge: Optional[int]
    crop_fraction: Optional[float]
    env_action_dim: int
    normalize_action: bool
    clip_action: bool
    action_stats: Mapping[str, np.ndarray]
    libero_binarize: bool
    gripper_group: Optional[Tuple[int, int]]     # grouped decode: the 'gripper' group's [start, end)
    valid_horizon: Optional[int]                 # grouped decode: len(action delta_indices)

    @property
    def embodiment_id(self) -> int:
        if self.embodiment_tag not in self.embodiment_mapping:
            raise ConfigError(f'embodiment_tag {self.embodiment_tag!r} is not in the pre-processor\'s '
                              f'embodiment_mapping ({", ".join(sorted(self.embodiment_mapping))}); lerobot would '
                              'silently use embodiment 0')
        return int(self.embodiment_mapping[self.embodiment_tag])


def _steps(folder: Path, name: str) -> List[Dict[str, Any]]:
    path = folder / name
    steps = read_json_object(path, ': a GR00T checkpoint carries its processors').get('steps')
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        raise CheckpointError(f'{path} has no list of steps')
    for step in steps:
        registry = step.get('registry_name')
        if registry not in STEP_FIELDS:
            raise ConfigError(f'{name} step {registry!r} is not implemented for GR00T (known: '
                              f'{", ".join(sorted(STEP_FIELDS))})')
        config = step.get('config') or {}
        if not isinstance(config, dict):
            raise CheckpointError(f'{name} step {registry} has a malformed config')
        check_fields(config, STEP_FIELDS[registry], f'{registry} step', name)
    return steps


def _state_file(folder: Path, json_name: str, index: int, step: Mapping[str, Any]) -> Dict[str, np.ndarray]:
    name = step.get('state_file') or f'{Path(json_name).stem}_step_{index}_{step["registry_name"]}.safetensors'
    path = folder / name
    if not path.is_file():
        return {}
    return load_numpy_file(str(path))


def _pair(value: Any, name: str) -> Optional[Tuple[int, int]]:
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value)):
        raise ConfigError(f'{ENCODE_STEP} {name} must be [height, width], got {json.dumps(value)}')
    return int(value[0]), int(value[1])


def read_processors(folder: Path) -> GrootProcessors:
    """Both processor files of ``folder``; ConfigError / CheckpointError naming what cannot be run."""
    folder = Path(folder)
    pre = _steps(folder, PREPROCESSOR_FILE)
    names = [step['registry_name'] for step in pre]
    if tuple(names) != PRE_ORDER:
        raise ConfigError(f'{PREPROCESSOR_FILE} steps {names} are not lerobot\'s GR00T N1.7 pre-processor '
                          f'{list(PRE_ORDER)} (relative actions and other inserted steps are not implemented)')
    pack_index = names.index(PACK_STEP)
    pack, encode = pre[pack_index]['config'], pre[names.index(ENCODE_STEP)]['config']
    pack_stats = split_flat_stats(_state_file(folder, PREPROCESSOR_FILE, pack_index, pre[pack_index]),
                                  'observation.state')
    post = _steps(folder, POSTPROCESSOR_FILE)
    post_names = [step['registry_name'] for step in post]
    decoders = [i for i, name in enumerate(post_names) if name in (FLAT_DECODE_STEP, GROUP_DECODE_STEP)]
    if len(decoders) != 1 or post_names[decoders[0] + 1:] != [DEVICE_STEP] or decoders[0] != 0:
        raise ConfigError(f'{POSTPROCESSOR_FILE} steps {post_names} are not lerobot\'s GR00T N1.7 post-processor '
                          f'([{FLAT_DECODE_STEP} or {GROUP_DECODE_STEP}, {DEVICE_STEP}])')
    decode_step = post[0]
    decode = decode_step.get('config') or {}
    mapping = pack.get('embodiment_mapping') or {}
    if not isinstance(mapping, dict):
        raise ConfigError(f'{PACK_STEP} embodiment_mapping must be an object')
    keys = pack.get('video_modality_keys')
    if keys is not None and not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
        raise ConfigError(f'{PACK_STEP} video_modality_keys must be a list of names')
    common = dict(
        video_modality_keys=tuple(keys) if keys else None,
        formalize_language=bool(pack.get('formalize_language', True)),
        embodiment_tag=str(pack.get('embodiment_tag', 'new_embodiment')),
        embodiment_mapping={str(k): int(v) for k, v in mapping.items()},
        max_state_dim=int(pack.get('max_state_dim', 132)),
        normalize_state=bool(pack.get('normalize_min_max', True)), clip_state=bool(pack.get('clip_outliers', True)),
        state_stats=pack_stats, tokenizer_name=str(encode.get('model_name', 'nvidia/Cosmos-Reason2-2B')),
        target_size=_pair(encode.get('image_target_size'), 'image_target_size'),
        crop_size=_pair(encode.get('image_crop_size'), 'image_crop_size'),
        shortest_image_edge=None if encode.get('shortest_image_edge') is None else int(encode['shortest_image_edge']),
        crop_fraction=None if encode.get('crop_fraction') is None else float(encode['crop_fraction']),
        env_action_dim=int(decode.get('env_action_dim', 0)))
    if decode_step['registry_name'] == FLAT_DECODE_STEP:
        stats = split_flat_stats(_state_file(folder, POSTPROCESSOR_FILE, 0, decode_step), 'action')
        return GrootProcessors(**common, normalize_action=bool(decode.get('normalize_min_max', True)),
                               clip_action=bool(decode.get('clip_normalized_action', False)), action_stats=stats,
                               libero_binarize=bool(decode.get('libero_gripper_binarize', True)), gripper_group=None,
                               valid_horizon=None)
    stats, gripper, horizon = _group_decode(decode)
    return GrootProcessors(**common, normalize_action=True, clip_action=True, action_stats=stats,
                           libero_binarize=True, gripper_group=gripper, valid_horizon=horizon)


def _group_decode(decode: Mapping[str, Any]) -> Tuple[Dict[str, np.ndarray], Optional[Tuple[int, int]], Optional[int]]:
    """GrootN17ActionDecodeStep's absolute groups as flat min/max (its per-group decode is the same arithmetic),
    the 'gripper' group's columns and the valid horizon. Relative groups are refused under use_relative_action
    (without it lerobot decodes them with their absolute statistics, as here)."""
    raw = decode.get('raw_stats') or {}
    modality = decode.get('modality_config') or {}
    action = modality.get('action') or {} if isinstance(modality, dict) else {}
    keys = action.get('modality_keys') or []
    configs = action.get('action_configs') or []
    percentiles = bool(decode.get('use_percentiles', False))
    lows: List[np.ndarray] = []
    highs: List[np.ndarray] = []
    gripper = None
    start = 0
    for index, key in enumerate(keys):
        if not isinstance(key, str):
            continue
        group = (raw.get('action') or {}).get(key)
        if not isinstance(group, dict):
            continue
        cfg = configs[index] if index < len(configs) and isinstance(configs[index], dict) else {}
        rep = str((cfg.get('rep') if not isinstance(cfg.get('rep'), dict) else cfg['rep'].get('value')) or '')
        if 'relative' in rep.lower() and decode.get('use_relative_action', False):
            raise ConfigError(f'{GROUP_DECODE_STEP}: action group {key!r} is relative ({rep}); relative action '
                              'groups are not implemented')
        low_name, high_name = ('q01', 'q99') if percentiles else ('min', 'max')
        if low_name not in group or high_name not in group:
            raise ConfigError(f'{GROUP_DECODE_STEP}: action group {key!r} has no {low_name}/{high_name} statistics')
        low = np.asarray(group[low_name], np.float32).reshape(-1)
        high = np.asarray(group[high_name], np.float32).reshape(-1)
        if low.size == 0:
            continue
        if key == 'gripper':
            gripper = (start, start + low.size)
        lows.append(low)
        highs.append(high)
        start += low.size
    if not lows:
        raise ConfigError(f'{GROUP_DECODE_STEP} has no action group with statistics')
    deltas = action.get('delta_indices')
    horizon = len(deltas) if isinstance(deltas, list) and deltas else None
    return {'min': np.concatenate(lows), 'max': np.concatenate(highs)}, gripper, horizon
