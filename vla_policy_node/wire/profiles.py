"""What each server expects on the openpi wire: observation keys, reply form, error frames.

Sources (read for facts, openpi 15a9616):
- openpi ``src/openpi/policies/droid_policy.py`` (DroidInputs): ``observation/exterior_image_1_left``,
  ``observation/wrist_image_left`` (HWC uint8), ``observation/joint_position`` (7) and
  ``observation/gripper_position`` (1) sent apart, ``prompt``.
- ``libero_policy.py`` (LiberoInputs): ``observation/image``, ``observation/wrist_image``,
  ``observation/state``, ``prompt``.
- ``aloha_policy.py`` (AlohaInputs): ``images: {cam_high, cam_low, cam_left_wrist, cam_right_wrist}`` as
  CHW uint8, ``state`` (14), ``prompt``.
- openpi's server (``src/openpi/serving/websocket_policy_server.py``) answers ``{"actions": ...}`` plus
  timings, and on an exception sends the traceback as a *text* frame and closes with 1011.
- sglang's ``/openpi/policy`` takes the model's camera names under ``observation.images`` and the state as
  ``observation.state``, expects a normalised state and returns normalised actions, and reports errors as
  msgpack ``{"error": traceback}`` (shared/reference/remote-inference.md, sglang ``action/protocol.py``,
  ``action/ws_utils.py``).
- vLLM-Omni's ``/v1/realtime/robot/openpi`` replies with a bare ndarray and reports errors as msgpack
  ``{"type": "error", "message": ...}``, keeping the connection open (``vllm_omni/entrypoints/openpi``).

A wire key is a path: dots nest maps (``images.cam_high`` is ``{"images": {"cam_high": ...}}``), slashes are
part of openpi's flat key names. A state key may carry a count (``observation/gripper_position:1``); one
entry without a count takes the rest of the state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .errors import BAD_REPLY, ERROR_FRAME, RemoteError


@dataclass(frozen=True)
class KeyLayout:
    """Default observation keys of one server configuration."""

    name: str
    cameras: Tuple[Tuple[str, str], ...]      # (node camera name, wire key); empty: ``camera_prefix + name``
    state: Tuple[str, ...]
    prompt: str = 'prompt'
    camera_prefix: str = ''
    channels_first: bool = False              # CHW frames (ALOHA) instead of HWC


LAYOUTS: Dict[str, KeyLayout] = {layout.name: layout for layout in (
    KeyLayout('droid', (('base_0_rgb', 'observation/exterior_image_1_left'),
                        ('left_wrist_0_rgb', 'observation/wrist_image_left')),
              ('observation/joint_position', 'observation/gripper_position:1')),
    KeyLayout('libero', (('base_0_rgb', 'observation/image'), ('left_wrist_0_rgb', 'observation/wrist_image')),
              ('observation/state',)),
    KeyLayout('aloha', tuple((name, f'images.{name}') for name in
                             ('cam_high', 'cam_low', 'cam_left_wrist', 'cam_right_wrist')), ('state',),
              channels_first=True),
    KeyLayout('cameras', (), ('state',), camera_prefix='images.'),              # vla_policy_serve
    KeyLayout('sglang', (), ('observation.state',), camera_prefix='observation.images.'),
)}
KEY_LAYOUTS = ('auto',) + tuple(LAYOUTS)
DEFAULT_CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')     # pi0's, for prefix layouts


@dataclass(frozen=True)
class Profile:
    name: str
    layout: str                 # the key layout 'auto' means
    reply: str                  # 'dict': {"actions": ...}; 'array': a bare ndarray
    normalized: bool            # the server takes a normalised state and returns normalised actions
    seed: bool                  # the server takes a ``seed`` field (others only where its metadata says so)


PROFILES: Dict[str, Profile] = {profile.name: profile for profile in (
    Profile('openpi', 'droid', 'dict', normalized=False, seed=False),
    Profile('sglang', 'sglang', 'dict', normalized=True, seed=True),
    Profile('vllm_omni', 'droid', 'array', normalized=False, seed=True),
)}


class KeyMapError(ValueError):
    """A key map that cannot describe this robot's observation (the message names the parameter)."""


@dataclass(frozen=True)
class KeyMap:
    """Where each part of an observation goes on the wire, resolved for one robot."""

    cameras: Tuple[Tuple[str, str], ...]          # (camera name, wire key), camera order
    state: Tuple[Tuple[str, int], ...]            # (wire key, number of state values), in state order
    prompt: str
    channels_first: bool = False


def layout_of(profile: str, layout: str) -> KeyLayout:
    return LAYOUTS[PROFILES[profile].layout if layout == 'auto' else layout]


def default_cameras(profile: str, layout: str) -> Tuple[str, ...]:
    """The node camera names a layout names (prefix layouts: pi0's three)."""
    chosen = layout_of(profile, layout)
    return tuple(name for name, _ in chosen.cameras) or DEFAULT_CAMERAS


def resolve_key_map(profile: str, layout: str, cameras: Sequence[str], state_dim: int,
                    image_keys: Optional[Sequence[str]] = None, state_keys: Optional[Sequence[str]] = None,
                    prompt_key: str = '') -> KeyMap:
    """The key map from the parameters, with the layout's defaults where a parameter is unset."""
    chosen = layout_of(profile, layout)
    if image_keys:
        if len(image_keys) != len(cameras):
            raise KeyMapError(f'remote_image_keys has {len(image_keys)} entries for {len(cameras)} cameras')
        wire = list(image_keys)
    else:
        known = dict(chosen.cameras)
        unknown = [name for name in cameras if chosen.cameras and name not in known]
        if unknown:
            raise KeyMapError(f'cameras {unknown} have no key in the {chosen.name} layout (it names '
                              f'{list(known)}); set remote_image_keys')
        wire = [known[name] if chosen.cameras else chosen.camera_prefix + name for name in cameras]
    if len(set(wire)) != len(wire):
        raise KeyMapError(f'remote_image_keys repeat a key: {wire}')
    return KeyMap(tuple(zip(cameras, wire)), _state_split(list(state_keys or chosen.state), state_dim),
                  prompt_key or chosen.prompt, chosen.channels_first)


def _state_split(entries: List[str], state_dim: int) -> Tuple[Tuple[str, int], ...]:
    parsed: List[Tuple[str, Optional[int]]] = []
    for entry in entries:
        key, _, count = entry.rpartition(':')
        if key and count.isdigit() and int(count) > 0:
            parsed.append((key, int(count)))
        else:
            parsed.append((entry, None))
    open_entries = [key for key, count in parsed if count is None]
    given = sum(count for _, count in parsed if count is not None)
    if len(open_entries) > 1:
        raise KeyMapError(f'remote_state_keys {entries}: at most one entry may go without a count (key:N)')
    rest = state_dim - given
    if (open_entries and rest < 1) or (not open_entries and rest != 0):
        raise KeyMapError(f'remote_state_keys {entries} split {given} values, but the state has {state_dim} '
                          '(state_joint_names)')
    return tuple((key, rest if count is None else count) for key, count in parsed)


def set_path(message: Dict[str, Any], path: str, value: Any) -> None:
    """Put ``value`` at a dotted path, creating the nested maps."""
    *parents, leaf = path.split('.')
    node = message
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def get_path(message: Mapping[str, Any], path: str) -> Any:
    node: Any = message
    for part in path.split('.'):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def observation_message(key_map: KeyMap, frames: Mapping[str, np.ndarray], state: np.ndarray,
                        prompt: str) -> Dict[str, Any]:
    """One observation in the server's layout (frames already as the wire carries them)."""
    message: Dict[str, Any] = {}
    for camera, key in key_map.cameras:
        if frames.get(camera) is not None:
            set_path(message, key, frames[camera])
    start = 0
    for key, count in key_map.state:
        set_path(message, key, np.ascontiguousarray(state[start:start + count]))
        start += count
    set_path(message, key_map.prompt, prompt)
    return message


def error_text(message: Any) -> Optional[str]:
    """The error a decoded reply carries (sglang ``{"error"}``, vLLM-Omni ``{"type": "error"}``), or None."""
    if not isinstance(message, Mapping):
        return None
    if message.get('type') == 'error':
        return str(message.get('message', 'error'))
    if 'error' in message and 'actions' not in message:
        return str(message['error'])
    return None


def reply_actions(profile: Profile, message: Any, action_dim: int, max_horizon: int) -> np.ndarray:
    """The action chunk [H, action_dim] (float64, finite) of a decoded reply, or RemoteError."""
    text = error_text(message)
    if text is not None:
        raise RemoteError(ERROR_FRAME, f'server error: {text}')
    if profile.reply == 'dict':
        if not isinstance(message, Mapping) or not isinstance(message.get('actions'), np.ndarray):
            raise RemoteError(BAD_REPLY, f'expected a map with an "actions" array ({profile.name}), got '
                              f'{_kind(message)}')
        actions = message['actions']
    else:
        if not isinstance(message, np.ndarray):
            raise RemoteError(BAD_REPLY, f'expected a bare actions array ({profile.name}), got {_kind(message)}')
        actions = message
    if actions.dtype.kind != 'f':
        raise RemoteError(BAD_REPLY, f'actions must be floating point, got {actions.dtype}')
    if actions.ndim != 2 or actions.shape[1] != action_dim or not 1 <= actions.shape[0] <= max_horizon:
        raise RemoteError(BAD_REPLY, f'actions must be [1..{max_horizon}, {action_dim}], got {list(actions.shape)}')
    actions = actions.astype(np.float64)
    if not np.all(np.isfinite(actions)):
        raise RemoteError(BAD_REPLY, f'actions have {int(np.sum(~np.isfinite(actions)))} non-finite value(s)')
    return actions


def _kind(message: Any) -> str:
    if isinstance(message, Mapping):
        return f'a map with keys {sorted(map(str, message))[:8]}'
    if isinstance(message, np.ndarray):
        return f'an array {message.dtype} {list(message.shape)}'
    return type(message).__name__
