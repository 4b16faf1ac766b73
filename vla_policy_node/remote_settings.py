"""Parameter values -> a connected RemoteBackend: what ``settings.configure`` calls for ``backend: remote``.

Configure code, like settings.py beside it (the backend registry, backends.py, names this module's
``load_remote``): it reads the parameter table and builds the remote backend of remote/.

The policy-level config the params table and the tick read comes from the robot's own parameters
(joints, cameras), refined by what the server says of itself (vla_policy_serve's metadata frame: chunk
size, dimensions, cameras) and by ``remote_stats_path`` (a checkpoint's config.json and processor files,
no weights) where the profile needs client-side normalisation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from .params import ParameterError, effective
from .policy.checkpoint import CheckpointError
from .policy.config_fields import ConfigError
from .policy.families import folder_statistics
from .policy.family import PolicyLevelFields
from .remote.client import RemoteBackend, RemoteSettings, public_url
from .wire.profiles import PROFILES, KeyMapError, default_cameras, resolve_key_map

MAX_REMOTE_HORIZON = 1000           # the most actions a reply may carry when nothing says the chunk size
MAX_KEY_FILE_BYTES = 4096


@dataclass(frozen=True, kw_only=True)
class RemoteConfig(PolicyLevelFields):
    """The policy-level fields (policy/family.py PolicyLevelFields) for a policy that runs elsewhere: the robot's
    cameras and dimensions, the server's chunk size. Nothing is padded here (max_state_dim / max_action_dim
    default to the robot's) and every action of a chunk may run (n_action_steps defaults to chunk_size)."""

    policy_type: str = 'remote'
    image_resolution: Tuple[int, int] = (224, 224)
    chunk_size: int = MAX_REMOTE_HORIZON
    normalization_mapping: Mapping[str, str] = field(default_factory=dict)
    n_action_steps: int = 0        # 0: chunk_size
    max_state_dim: int = 0         # 0: state_dim
    max_action_dim: int = 0        # 0: action_dim

    def __post_init__(self) -> None:
        for name, default in (('n_action_steps', 'chunk_size'), ('max_state_dim', 'state_dim'),
                              ('max_action_dim', 'action_dim')):
            if not getattr(self, name):
                object.__setattr__(self, name, getattr(self, default))


def check_url(url: str) -> None:
    # A space or a control character cannot travel in the handshake's request line: the server would answer a
    # malformed request, which reads as an unreachable server.
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7f for c in url):
        raise ParameterError(f'remote_url {public_url(url)!r} holds a space or a control character (the query too): '
                             'percent-encode it (a space is %20)')
    parts = urlsplit(url)
    if parts.scheme not in ('ws', 'wss') or not parts.hostname:
        raise ParameterError(f'remote_url must be ws://host[:port]/path or wss://..., got {public_url(url)!r}')


def _stats(values: Mapping[str, Any]) -> Tuple[Optional[Any], Optional[Tuple[Any, Any]]]:
    path = values['remote_stats_path']
    if not path:
        return None, None
    folder = Path(path)
    try:
        config, *normalizers = folder_statistics(folder)      # any family's statistics, by its own processor steps
    except (ConfigError, CheckpointError, OSError) as exc:
        raise ParameterError(f'remote_stats_path {path}: {exc}') from exc
    if config.use_relative_actions:
        raise ParameterError(f'remote_stats_path {path}: relative-action checkpoints are not supported remotely')
    return config, tuple(normalizers)


def remote_config(values: Mapping[str, Any], metadata: Mapping[str, Any],
                  stats_config: Optional[Any]) -> RemoteConfig:
    joints = list(effective(values, 'joint_names') or ())
    state_joints = list(effective(values, 'state_joint_names') or ())
    policy = metadata.get('policy') if isinstance(metadata.get('policy'), Mapping) else {}
    cameras = (values['camera_names'] or policy.get('camera_names')
               or (stats_config.camera_names if stats_config is not None else None)
               or default_cameras(values['remote_profile'], values['remote_key_layout']))
    chunk = policy.get('chunk_size') or (stats_config.chunk_size if stats_config is not None else None)
    config = RemoteConfig(camera_names=tuple(str(name) for name in cameras), state_dim=len(state_joints),
                          action_dim=len(joints), chunk_size=int(chunk or MAX_REMOTE_HORIZON),
                          policy_type=str(policy.get('policy_type', 'remote')),
                          rtc_training_max_delay=int(policy.get('rtc_training_max_delay', 0) or 0))
    for name, ours in (('action_dim', config.action_dim), ('state_dim', config.state_dim)):
        theirs = policy.get(name, getattr(stats_config, name, None))
        if theirs is not None and int(theirs) != ours:
            source = 'the server' if name in policy else 'remote_stats_path'
            raise ParameterError(f'{source} has {name} {theirs}, the parameters give {ours} '
                                 f'({"joint_names" if name == "action_dim" else "state_joint_names"})')
    return config


def api_key(values: Mapping[str, Any], warn: Callable[[str], None]) -> str:
    """The API key: remote_api_key_file's one line (the recommended way: the key stays off the ROS graph), or
    remote_api_key. Errors name the file, never what it holds."""
    path, inline = values['remote_api_key_file'], values['remote_api_key']
    if not path:
        return inline
    if inline:
        raise ParameterError('set remote_api_key_file or remote_api_key, not both')
    file = Path(path).expanduser()
    try:
        with open(file, 'rb') as stream:
            data = stream.read(MAX_KEY_FILE_BYTES + 1)
        if file.stat().st_mode & 0o077:
            warn(f'remote_api_key_file {path} can be read by other users (chmod 600 it)')
    except OSError as exc:
        raise ParameterError(f'remote_api_key_file {path}: cannot read it ({exc.strerror or type(exc).__name__})') \
            from None
    try:
        key = data.decode('ascii').strip()
    except UnicodeDecodeError:
        key = None
    if len(data) > MAX_KEY_FILE_BYTES or not key or not all(' ' <= char <= '~' for char in key):
        raise ParameterError(f'remote_api_key_file {path} must hold the key alone: one line of printable ASCII '
                             f'of at most {MAX_KEY_FILE_BYTES} bytes')
    return key


def load_remote(values: Mapping[str, Any], info: Callable[[str], None] = lambda message: None,
                warn: Optional[Callable[[str], None]] = None) -> RemoteBackend:
    """Connect (waiting at most remote_timeout_sec; a server that is not up yet is retried in the
    background), then the config and the key map."""
    url = values['remote_url']
    check_url(url)
    stats_config, normalizers = _stats(values)
    if PROFILES[values['remote_profile']].normalized and normalizers is None:
        raise ParameterError(f'remote_profile {values["remote_profile"]} sends a normalised state and gets '
                             'normalised actions: set remote_stats_path to the checkpoint folder (its config.json '
                             'and processor files)')
    settings = RemoteSettings(url=url, profile=values['remote_profile'], api_key=api_key(values, warn or info),
                              timeout_sec=values['remote_timeout_sec'], image_size=values['remote_image_size'],
                              max_reply_bytes=values['remote_max_reply_bytes'])
    loopback = urlsplit(url).hostname in ('127.0.0.1', 'localhost', '::1')
    if settings.api_key and urlsplit(url).scheme == 'ws' and not loopback:
        (warn or info)('the API key travels in clear text over ws://; use wss:// (a TLS proxy) off this machine')
    placeholder = RemoteConfig(camera_names=(), state_dim=0, action_dim=0)
    backend = RemoteBackend(settings, placeholder, key_map=None, normalizers=normalizers)
    try:
        if not backend.wait_connected(settings.timeout_sec):
            (warn or info)(f'remote server {backend.url} is not reachable yet; ticks are skipped (and the arm held) '
                           'until it is, reconnecting in the background')
        config = remote_config(values, backend.metadata, stats_config)
        backend.config = config
        backend.key_map = resolve_key_map(values['remote_profile'], values['remote_key_layout'],
                                          config.camera_names, config.state_dim, values['remote_image_keys'],
                                          values['remote_state_keys'], values['remote_prompt_key'])
    except KeyMapError as exc:
        backend.close()
        raise ParameterError(str(exc)) from exc
    except BaseException:
        backend.close()
        raise
    return backend
