"""Parameter values -> camera layout and tick settings, for the node and the replay tool alike.

The live node reads values from its ROS parameters; the replay tool reads the
same params YAML file. Both go through these functions, so a params file
means the same thing on the robot and in a replay.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Sequence, Tuple

import yaml

from .observation import AssemblySettings
from .policy.tiny_default import builtin_tiny_checkpoint
from .ros.params import BUILTIN_TINY, CAMERA_TYPES, PARAMETERS, SPECS, validate_value
from .runtime import PolicyRuntime, set_cpu_threads
from .tick import TickSettings

NODE_NAME = 'vla_policy'


class SettingsError(ValueError):
    """A params file or value set that cannot configure the node."""


def default_camera_topic(name: str, kind: str = 'raw') -> str:
    return f'/cameras/{name}/image_raw' + ('/compressed' if kind == 'compressed' else '')


def resolve_values(overrides: Mapping[str, Any]) -> Dict[str, Any]:
    """Every parameter's value: the override where given, else the table default (None = unset)."""
    unknown = sorted(set(overrides) - set(SPECS) - {'use_sim_time'})
    if unknown:
        raise SettingsError(f'unknown parameter(s) {unknown}')
    values = {spec.name: overrides.get(spec.name, spec.default) for spec in PARAMETERS}
    for name, value in values.items():
        reason = validate_value(SPECS[name], value) if value is not None else None
        if reason:
            raise SettingsError(reason)
    return values


def load_params_file(path: Path, node_name: str = NODE_NAME) -> Dict[str, Any]:
    """ros__parameters for ``node_name`` from a ROS 2 params YAML (wildcard sections first)."""
    try:
        document = yaml.safe_load(Path(path).read_text()) or {}
    except FileNotFoundError:
        raise SettingsError(f'params file {path} does not exist') from None
    except yaml.YAMLError as exc:
        raise SettingsError(f'params file {path} is not valid YAML: {exc}') from exc
    merged: Dict[str, Any] = {}
    for section in ('/**', f'/**/{node_name}', node_name, f'/{node_name}'):
        block = document.get(section)
        if isinstance(block, dict):
            merged.update(block.get('ros__parameters') or {})
    return merged


def camera_layout(values: Mapping[str, Any], checkpoint_cameras: Sequence[str]) -> Dict[str, Tuple[str, str]]:
    """camera name -> (topic, 'raw'|'compressed'), in camera order."""
    names = list(values.get('camera_names') or checkpoint_cameras)
    if len(set(names)) != len(names):
        raise SettingsError(f'camera_names has duplicates: {names}')
    kinds = list(values.get('camera_types') or ['raw'] * len(names))
    if len(kinds) != len(names):
        raise SettingsError(f'camera_types has {len(kinds)} entries for {len(names)} cameras')
    topics = list(values.get('camera_topics') or [default_camera_topic(n, k) for n, k in zip(names, kinds)])
    if len(topics) != len(names):
        raise SettingsError(f'camera_topics has {len(topics)} entries for {len(names)} cameras')
    bad = [kind for kind in kinds if kind not in CAMERA_TYPES]
    if bad:
        raise SettingsError(f'camera_types must be one of {list(CAMERA_TYPES)}, got {bad}')
    return {name: (topic, kind) for name, topic, kind in zip(names, topics, kinds)}


def tick_settings(values: Mapping[str, Any], camera_topics: Mapping[str, str]) -> TickSettings:
    joint_names = tuple(values['joint_names'] or ())
    assembly = AssemblySettings(
        camera_names=tuple(camera_topics), camera_topics=tuple(camera_topics.values()),
        state_joint_names=tuple(values['state_joint_names'] or joint_names),
        joint_states_topic=values['joint_states_topic'], instruction_topic=values['instruction_topic'],
        default_instruction=values['instruction'], max_image_age_sec=values['max_image_age_sec'],
        max_camera_skew_sec=values['max_camera_skew_sec'], max_joint_state_age_sec=values['max_joint_state_age_sec'],
        max_instruction_length=values['max_instruction_length'])
    return TickSettings(assembly=assembly, joint_names=joint_names, action_period_sec=values['action_period_sec'],
                        execute_steps=values['execute_steps'], stamp_mode=values['stamp_mode'],
                        lower_limits=tuple(values['joint_lower_limits'] or ()),
                        upper_limits=tuple(values['joint_upper_limits'] or ()),
                        num_steps=values['num_steps'], seed=None if values['seed'] < 0 else values['seed'],
                        cache_enabled=values['cache_enabled'])


def load_runtime(values: Mapping[str, Any]) -> PolicyRuntime:
    """The runtime a set of parameter values describes (checkpoint, device, dtype, cache, threads)."""
    set_cpu_threads(values['cpu_threads'])
    checkpoint = values['checkpoint_path']
    path = builtin_tiny_checkpoint() if checkpoint == BUILTIN_TINY else Path(checkpoint)
    return PolicyRuntime.from_pretrained(path, device=values['device'], dtype=values['dtype'],
                                         tokenizer_path=values['tokenizer_path'] or None,
                                         cache_max_bytes=values['cache_max_bytes'],
                                         cache_max_entries=values['cache_max_entries'])
