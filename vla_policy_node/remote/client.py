"""RemoteBackend: PolicyRuntime's ``infer`` answered by a server on the openpi WebSocket wire.

    tick thread:  check + frames + encode --send/recv on the client loop, wait <= remote_timeout_sec--> reply
                  checks (form, shape, dtype, finite) -> (un)normalise -> ActionChunk
    client loop:  connect (Authorization: Api-Key), read the metadata frame, keep the connection; when it
                  drops, reconnect with bounded backoff. Nothing here ever runs on the ROS executor.

The wire is openpi's (packages/openpi-client/src/openpi_client/websocket_client_policy.py, openpi 15a9616):
connect with ``compression=None``, the server's first frame is its metadata, then one observation in and
one reply out; a *text* frame is an error. Unlike openpi's client, every wait is bounded (connect,
metadata, reply), the reply size is bounded, and a dropped connection is reopened in the background.
Every fault is a RemoteError with its own SkipReason: the tick is skipped and the safety supervisor holds.

There is no request id on the wire, so after a timeout the connection is closed: a late reply can never
answer the next request.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Mapping, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import websockets
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from ..observation import MAX_INSTRUCTION_CHARS, Observation, ObservationError, SkipReason
from ..images import DEFAULT_MAX_PIXELS
from ..runtime import ActionChunk, checked_instruction, checked_state
from . import codec
from .errors import AUTH, BAD_REPLY, DISCONNECTED, ERROR_FRAME, KINDS, TIMEOUT, UNREACHABLE, RemoteError
from .frames import wire_frame
from .logs import websockets_logger
from .profiles import PROFILES, KeyMap, observation_message, reply_actions

LOG = logging.getLogger(__name__)
BACKOFF_MIN_SEC = 0.1
BACKOFF_MAX_SEC = 2.0               # bounded: a server that comes back is in use within ~2 s
LATENCY_WINDOW = 200
CLOSE_MESSAGE_TOO_BIG = 1009
WS_OPTIONS: Dict[str, Any] = {'compression': None}
if int(websockets.__version__.split('.')[0]) >= 15:
    WS_OPTIONS['proxy'] = None      # websockets >= 15 reads proxy variables; a robot LAN is never proxied


def public_url(url: str) -> str:
    """The URL without credentials or query (what logs and /diagnostics show)."""
    parts = urlsplit(url)
    host = parts.hostname or ''
    if ':' in host:                 # IPv6 literal
        host = f'[{host}]'
    if parts.port is not None:
        host = f'{host}:{parts.port}'
    return urlunsplit((parts.scheme, host, parts.path, '', ''))


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
    connects: int = 0
    connect_failures: int = 0
    cache_hits: int = 0                 # as the server reports them (vla_policy_serve's cache_hit)
    cache_misses: int = 0
    errors: Dict[str, int] = field(default_factory=lambda: {kind.value: 0 for kind in KINDS})
    latency_ms: Deque[float] = field(default_factory=lambda: collections.deque(maxlen=LATENCY_WINDOW))


class RemoteBackend:
    """The backend seam (SEAM.md section 2): ``infer``, ``config``, ``warmup``, ``close``, ``describe``."""

    def __init__(self, settings: RemoteSettings, config: Any, key_map: KeyMap,
                 normalizers: Optional[Tuple[Any, Any]] = None) -> None:
        self.settings = settings
        self.config = config
        self.key_map = key_map
        self.profile = PROFILES[settings.profile]
        self.normalizers = normalizers                  # (state, action) for profiles that want them
        self.url = public_url(settings.url)
        self.metadata: Dict[str, Any] = {}
        self._counters = _Counters()
        self._stats_lock = threading.Lock()
        self._request_lock = threading.Lock()
        self._ws = None
        self._connected = threading.Event()
        self._last_failure: Tuple[SkipReason, str] = (UNREACHABLE, 'not connected yet')
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name='vla_remote_client', daemon=True)
        self._thread.start()
        self._wake: Optional[asyncio.Event] = None
        self._maintainer = asyncio.run_coroutine_threadsafe(self._maintain(), self._loop)

    # ---- the connection (client loop thread) -------------------------------------------------------
    async def _maintain(self) -> None:
        self._wake = asyncio.Event()
        failures = 0
        headers = {'Authorization': f'Api-Key {self.settings.api_key}'} if self.settings.api_key else None
        while not self._closing:
            try:
                ws = await connect(self.settings.url, additional_headers=headers,
                                   open_timeout=self.settings.timeout_sec, max_size=self.settings.max_reply_bytes,
                                   logger=websockets_logger('vla_policy_node.remote.websockets'), **WS_OPTIONS)
            except Exception as exc:   # refused, DNS, TLS, HTTP status, timeout: all retried
                failures += 1
                self._failed_connect(*_connect_fault(exc))
                await self._backoff(failures)
                continue
            try:
                self.metadata = await self._read_metadata(ws)
            except RemoteError as exc:
                failures += 1
                self._failed_connect(exc.reason, str(exc))
                await ws.close()
                await self._backoff(failures)
                continue
            failures = 0
            with self._stats_lock:
                self._counters.connects += 1
            self._ws = ws
            self._connected.set()
            LOG.info('connected to %s (%s)', self.url, self.metadata.get('server', self.settings.profile))
            await ws.wait_closed()
            self._connected.clear()
            self._ws = None
            self._last_failure = (UNREACHABLE, f'the connection to {self.url} closed; reconnecting')

    async def _read_metadata(self, ws) -> Dict[str, Any]:
        try:
            frame = await asyncio.wait_for(ws.recv(), self.settings.timeout_sec)
        except asyncio.TimeoutError:
            raise RemoteError(TIMEOUT, f'no metadata frame from {self.url} within {self.settings.timeout_sec} s')
        except ConnectionClosed as exc:
            raise RemoteError(DISCONNECTED, f'{self.url} closed before its metadata frame: {exc}')
        if isinstance(frame, str):
            raise RemoteError(ERROR_FRAME, f'server error instead of metadata: {frame}')
        try:
            metadata = codec.unpackb(frame, self.settings.max_reply_bytes)
        except codec.CodecError as exc:
            raise RemoteError(BAD_REPLY, f'metadata frame: {exc}')
        if not isinstance(metadata, dict):
            raise RemoteError(BAD_REPLY, f'metadata must be a map, got {type(metadata).__name__}')
        return metadata

    def _failed_connect(self, kind: SkipReason, message: str) -> None:
        self._last_failure = (kind, message)
        with self._stats_lock:
            self._counters.connect_failures += 1

    async def _backoff(self, failures: int) -> None:
        delay = min(BACKOFF_MAX_SEC, BACKOFF_MIN_SEC * 2 ** min(failures - 1, 16))
        try:
            await asyncio.wait_for(self._wake.wait(), delay)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

    async def _exchange(self, ws, payload: bytes) -> Any:
        try:
            await ws.send(payload)
            return await ws.recv()
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == CLOSE_MESSAGE_TOO_BIG:
                raise RemoteError(BAD_REPLY, f'reply larger than the limit of {self.settings.max_reply_bytes} '
                                  'bytes (remote_max_reply_bytes)')
            raise RemoteError(DISCONNECTED, f'the connection to {self.url} dropped mid-request: {exc}')

    def wait_connected(self, timeout_sec: float) -> bool:
        return self._connected.wait(timeout_sec)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

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
                frame = self._round_trip(payload)
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
        if num_steps is not None and 'num_steps' in extensions:
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

    def _round_trip(self, payload: bytes) -> Any:
        ws = self._ws
        if ws is None or not self._connected.is_set():
            kind, message = self._last_failure
            self._poke()
            raise RemoteError(kind, message)
        future = asyncio.run_coroutine_threadsafe(self._exchange(ws, payload), self._loop)
        try:
            return future.result(self.settings.timeout_sec)
        except concurrent.futures.TimeoutError:
            future.cancel()
            self._drop(ws)
            raise RemoteError(TIMEOUT, f'no reply from {self.url} within {self.settings.timeout_sec} s '
                              '(remote_timeout_sec); reconnecting') from None
        except RemoteError:
            raise
        except Exception as exc:  # anything else the socket raises is a dropped connection
            self._drop(ws)
            raise RemoteError(DISCONNECTED, f'{type(exc).__name__}: {exc}') from exc

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

    def _drop(self, ws) -> None:
        """Close a connection whose state is unknown (the client loop then reconnects)."""
        self._connected.clear()
        self._last_failure = (UNREACHABLE, f'reconnecting to {self.url}')
        asyncio.run_coroutine_threadsafe(ws.close(), self._loop)

    def _poke(self) -> None:
        if self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # ---- the rest of the seam --------------------------------------------------------------------
    def warmup(self) -> Optional[ActionChunk]:
        """Nothing to warm on this side; the server warms its own model."""
        return None

    def close(self) -> None:
        self._closing = True
        self._poke()
        ws = self._ws
        if ws is not None:
            try:
                asyncio.run_coroutine_threadsafe(ws.close(), self._loop).result(2.0)
            except Exception:  # noqa: S110 - closing a connection that is already gone
                pass
        try:
            self._maintainer.result(3.0)
        except Exception:  # noqa: S110 - cancelled or failed at shutdown: nothing left to do
            self._maintainer.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(3.0)
        if not self._thread.is_alive():
            self._loop.close()

    def describe(self) -> Dict[str, Any]:
        """What /diagnostics and the replay summary show (never the API key, never URL credentials)."""
        with self._stats_lock:
            counters = self._counters
            latency = np.asarray(counters.latency_ms) if counters.latency_ms else None
            info: Dict[str, Any] = {
                'backend': 'remote', 'remote_url': self.url, 'remote_profile': self.settings.profile,
                'remote_server': str(self.metadata.get('server', 'unknown'))[:80],
                'remote_connected': self.connected, 'policy_type': self.config.policy_type,
                'remote_reconnects': max(0, counters.connects - 1),
                'remote_connect_failures': counters.connect_failures}
            if latency is not None:
                info['remote_latency_p50_ms'] = float(np.percentile(latency, 50))
                info['remote_latency_p95_ms'] = float(np.percentile(latency, 95))
            served = counters.cache_hits + counters.cache_misses
            if served:
                info.update(cache_hits=counters.cache_hits, cache_misses=counters.cache_misses,
                            cache_hit_rate=counters.cache_hits / served)
            info.update({f'remote_errors_{kind[len("remote_"):]}': count for kind, count in counters.errors.items()})
        return info


def _connect_fault(exc: BaseException) -> Tuple[SkipReason, str]:
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if status in (401, 403):
            return AUTH, f'the server refused the API key (HTTP {status})'
        return UNREACHABLE, f'the server answered the handshake with HTTP {status}'
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return TIMEOUT, 'connecting timed out (remote_timeout_sec)'
    return UNREACHABLE, f'cannot connect: {type(exc).__name__}: {exc}'


def _server_ms(reply: Any) -> Optional[float]:
    """The server's own inference time (openpi's ``server_timing.infer_ms``), when it says."""
    timing = reply.get('server_timing') if isinstance(reply, Mapping) else None
    value = timing.get('infer_ms') if isinstance(timing, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else None
