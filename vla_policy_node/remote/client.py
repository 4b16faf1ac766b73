"""RemoteBackend: PolicyRuntime's ``infer`` answered by a server on the openpi WebSocket wire.

    tick thread:  checks + frames + encode --Connection.exchange, <= remote_timeout_sec--> reply checks
                  (error frame, form, shape, dtype, finite) -> unnormalise (profiles that want it) -> ActionChunk

The connection (connection.py) lives on its own event loop; what the server expects is wire/profiles.py's.
The wire is openpi's (packages/openpi-client/src/openpi_client/websocket_client_policy.py, openpi 15a9616):
one observation in, one reply out, a *text* frame is an error. Every fault is a RemoteError with its own
SkipReason: the tick is skipped and the safety supervisor holds.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Mapping, Optional, Tuple

import numpy as np

from ..images import DEFAULT_MAX_PIXELS
from ..observation import MAX_INSTRUCTION_CHARS, Observation, ObservationError, SkipReason
from ..observation_checks import checked_instruction, checked_state
from ..runtime import ActionChunk
from ..wire import codec
from .connection import Connection, public_url
from ..wire.errors import BAD_REPLY, ERROR_FRAME, KINDS, RemoteError
from .frames import wire_frame
from ..wire.profiles import PROFILES, KeyMap, observation_message, reply_actions

__all__ = ['RemoteBackend', 'RemoteSettings', 'public_url']
LATENCY_WINDOW = 200


@dataclass(frozen=True)
class RemoteSettings:
    url: str
    profile: str = 'openpi'
    api_key: str = field(default='', repr=False)       # never printed
    timeout_sec: float = 1.0
    image_size: int = 224                               # 0: raw frames
    max_reply_bytes: int = 8 << 20


@dataclass
class _Counters:
    cache_hits: int = 0                 # as the server reports them (vla_policy_serve's cache_hit)
    cache_misses: int = 0
    errors: Dict[str, int] = field(default_factory=lambda: {kind.value: 0 for kind in KINDS})
    latency_ms: Deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_WINDOW))


class RemoteBackend:
    """The backend seam (docs/architecture.md, backends.py): ``infer``, ``config``, ``warmup``, ``close``,
    ``describe``, ``summary``."""

    def __init__(self, settings: RemoteSettings, config: Any, key_map: KeyMap,
                 normalizers: Optional[Tuple[Any, Any]] = None) -> None:
        self.settings = settings
        self.config = config
        self.key_map = key_map
        self.profile = PROFILES[settings.profile]
        self.normalizers = normalizers                  # (state, action) for profiles that want them
        self._counters = _Counters()
        self._stats_lock = threading.Lock()
        self._request_lock = threading.Lock()
        self.connection = Connection(settings.url, settings.api_key, settings.timeout_sec, settings.max_reply_bytes)
        self.url = self.connection.public_url

    @property
    def metadata(self) -> Dict[str, Any]:
        """The server's metadata frame (empty until connected; openpi's is often empty)."""
        return self.connection.metadata

    @property
    def connected(self) -> bool:
        return self.connection.connected

    def wait_connected(self, timeout_sec: float) -> bool:
        return self.connection.wait_connected(timeout_sec)

    # ---- one request (tick thread) ---------------------------------------------------------------
    def infer(self, observation: Observation, noise: Optional[np.ndarray] = None,
              seed: Optional[int] = None, num_steps: Optional[int] = None,
              use_cache: Optional[bool] = None,
              max_instruction_length: int = MAX_INSTRUCTION_CHARS, *, max_image_pixels: int = DEFAULT_MAX_PIXELS,
              prev_chunk_left_over: Optional[np.ndarray] = None, prev_actions: Optional[np.ndarray] = None,
              inference_delay: int = 0, execution_horizon: Optional[int] = None,
              rtc: Any = None) -> ActionChunk:
        """PolicyRuntime.infer's signature; ObservationError for bad input, RemoteError for remote faults.

        ``use_cache`` is the server's business. The RTC leftover (``prev_actions``, robot units) and
        ``inference_delay`` go out only to a server whose metadata lists the ``prev_actions`` extension
        (vla_policy_serve); elsewhere the chunk is independent (``continued`` False)."""
        del use_cache, execution_horizon, prev_chunk_left_over
        with self._request_lock:
            start = time.perf_counter()
            message, continued = self._message(observation, noise, seed, num_steps,
                                               min(int(max_instruction_length), MAX_INSTRUCTION_CHARS),
                                               int(max_image_pixels), prev_actions, inference_delay, rtc)
            try:
                payload = codec.packb(message)
            except codec.CodecError as exc:
                raise ObservationError('remote', f'cannot encode the observation: {exc}') from exc
            sent = time.perf_counter()
            try:
                frame = self.connection.exchange(payload, self.settings.timeout_sec)
                received = time.perf_counter()
                actions, reply = self._actions(frame)
            except RemoteError as exc:
                with self._stats_lock:
                    self._counters.errors[exc.reason.value] += 1
                raise
            done = time.perf_counter()
            with self._stats_lock:
                self._counters.latency_ms.append((received - sent) * 1e3)
        # Stages as the tick reports them: client work before the wire is 'preprocess', the round trip
        # (the server's whole inference) 'denoise', the reply checks 'hash'.
        timings = {'hash': (done - received) * 1e3, 'preprocess': (sent - start) * 1e3, 'prefix': 0.0,
                   'denoise': (received - sent) * 1e3}
        server_ms = _server_ms(reply)
        if server_ms is not None:           # beside the stages (not in total_ms): the wire is denoise - server_ms
            timings['server_ms'] = server_ms
        reported = reply.get('cache_hit') if isinstance(reply, Mapping) else None
        hit = bool(reported)
        if reported is not None:
            with self._stats_lock:
                self._counters.cache_hits += int(hit)
                self._counters.cache_misses += int(not hit)
        return ActionChunk(actions=actions, cache_hit=hit, timings_ms=timings, key=None,
                           num_steps=int(num_steps or self.config.num_inference_steps),
                           camera_slots=tuple(name for name, _ in self.key_map.cameras), normalized=None,
                           continued=continued)

    def _message(self, observation: Observation, noise, seed, num_steps, max_instruction_length: int,
                 max_image_pixels: int, prev_actions, inference_delay: int, rtc) -> Tuple[Dict[str, Any], bool]:
        state = checked_state(observation.state, self.config.state_dim)
        prompt = checked_instruction(observation.instruction, max_instruction_length)
        unknown = sorted(set(observation.images) - {camera for camera, _ in self.key_map.cameras})
        if unknown:
            raise ObservationError('images', f'unknown camera(s) {unknown}; the key map has '
                                   f'{[camera for camera, _ in self.key_map.cameras]}', SkipReason.BAD_IMAGE)
        frames = {}
        for camera, _ in self.key_map.cameras:
            frame = observation.images.get(camera)
            if frame is not None:
                frames[camera] = wire_frame(camera, frame, self.settings.image_size, self.key_map.channels_first,
                                            max_image_pixels)
        if not frames:
            raise ObservationError('images', 'no camera image at all; at least one is needed', SkipReason.BAD_IMAGE)
        if self.normalizers is not None:
            state = np.asarray(self.normalizers[0].normalize(state), dtype=np.float32)
        message = observation_message(self.key_map, frames, state, prompt)
        extensions = set(self.metadata.get('extensions') or ())
        if seed is not None and (self.profile.seed or 'seed' in extensions):
            message['seed'] = int(seed)
        if noise is not None and 'noise' in extensions:
            message['noise'] = np.asarray(noise, dtype=np.float32)
        if num_steps and 'num_steps' in extensions:          # 0 / None: the server's checkpoint's own
            message['num_steps'] = int(num_steps)
        continued = False
        if rtc is not None and prev_actions is not None and 'prev_actions' in extensions:
            message['prev_actions'] = np.asarray(prev_actions, dtype=np.float64)
            message['inference_delay'] = int(inference_delay)
            message['rtc'] = {'mode': rtc.mode, 'schedule': rtc.schedule,
                              'max_guidance_weight': float(rtc.max_guidance_weight),
                              'execution_horizon': int(rtc.execution_horizon)}
            continued = len(prev_actions) > 0
        return message, continued

    def _actions(self, frame: Any) -> Tuple[np.ndarray, Any]:
        if isinstance(frame, str):      # openpi: the traceback as text, then close 1011
            raise RemoteError(ERROR_FRAME, f'server error: {frame.strip().splitlines()[-1] if frame.strip() else ""}'
                              f' ({len(frame)} characters of traceback)')
        try:
            reply = codec.unpackb(frame, self.settings.max_reply_bytes)
        except codec.CodecError as exc:
            raise RemoteError(BAD_REPLY, f'reply refused: {exc}') from exc
        max_horizon = int(getattr(self.config, 'chunk_size', 1000) or 1000)
        actions = reply_actions(self.profile, reply, self.config.action_dim, max_horizon)
        if self.normalizers is not None:
            actions = np.asarray(self.normalizers[1].unnormalize(actions), dtype=np.float64)
            if not np.all(np.isfinite(actions)):
                raise RemoteError(BAD_REPLY, 'actions are non-finite after unnormalising')
        return actions, reply

    # ---- the rest of the seam --------------------------------------------------------------------
    def warmup(self) -> Optional[ActionChunk]:
        """Nothing to warm on this side; the server warms its own model."""
        return None

    def close(self) -> None:
        self.connection.close()

    def describe(self) -> Dict[str, Any]:
        """What /diagnostics and the replay summary show (never the API key, never URL credentials)."""
        with self._stats_lock:
            counters = self._counters
            latency = np.asarray(counters.latency_ms) if counters.latency_ms else None
            info: Dict[str, Any] = {
                'backend': 'remote', 'remote_url': self.url, 'remote_profile': self.settings.profile,
                'remote_server': str(self.metadata.get('server', 'unknown'))[:80],
                'remote_connected': self.connected, 'policy_type': self.config.policy_type,
                'remote_reconnects': max(0, self.connection.connects - 1),
                'remote_connect_failures': self.connection.connect_failures}
            if latency is not None:
                info['remote_latency_p50_ms'] = float(np.percentile(latency, 50))
                info['remote_latency_p95_ms'] = float(np.percentile(latency, 95))
            served = counters.cache_hits + counters.cache_misses
            if served:
                info.update(cache_hits=counters.cache_hits, cache_misses=counters.cache_misses,
                            cache_hit_rate=counters.cache_hits / served)
            info.update({f'remote_errors_{kind[len("remote_"):]}': count for kind, count in counters.errors.items()})
        return info

    def summary(self) -> str:
        """The configure log line's backend part: the server, never the key nor URL credentials."""
        return (f'remote {self.settings.profile} server at {self.url} '
                f'({"connected" if self.connected else "not connected yet"})')


def _server_ms(reply: Any) -> Optional[float]:
    """The server's own inference time (openpi's ``server_timing.infer_ms``), when it says."""
    timing = reply.get('server_timing') if isinstance(reply, Mapping) else None
    value = timing.get('infer_ms') if isinstance(timing, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else None
