"""vla_policy_serve: this package's PolicyRuntime (with its prefix cache) behind the openpi WebSocket wire.

    vla_policy_serve --checkpoint DIR [--port 8000] [--host 127.0.0.1] [--api-key-file F] [--max-message-mib N]
                     [--max-queue N] [--max-connections N] [--max-batch N --batch-window-ms MS]

The wire is openpi's server's (src/openpi/serving/websocket_policy_server.py, openpi 15a9616): every path
accepts the WebSocket, ``GET /healthz`` answers ``OK``, the first frame is the metadata (msgpack), then one
observation in, one ``{"actions": ...}`` out, and an error is a text frame. Unlike openpi's: the API key
is checked when one is configured (HTTP 401 otherwise), a bad request leaves the connection open, frames
are bounded, inference runs on one worker thread (the event loop keeps serving the other connections)
and requests wait in a bounded queue, refused with a clear message when it is full; at most ``--max-connections``
clients connect (HTTP 503 past that), each with two frames read ahead at most, so what clients can make the server
hold is bounded. With ``--max-batch`` > 1 the requests of several robots that arrive within ``--batch-window-ms``
run as one batch (remote/batching.py collects them, runtime/batch.py runs them: each robot's chunk is its own); by
default one at a time, as before.

Requests: frames per camera name under ``images`` (HWC or CHW uint8; float in [0, 1] is scaled as openpi
does, a float frame with NaN/inf or values outside [0, 1] is refused as bad_image), or openpi's DROID /
LIBERO keys (droid_policy.py, libero_policy.py; the layouts of wire/profiles.py), whose i-th image is the
checkpoint's i-th camera; any size (the runtime resizes with padding); ``state`` (or DROID's joint +
gripper positions, LIBERO's ``observation/state``); ``prompt``.
Extensions (listed in the metadata): ``seed``, ``noise`` [H, max_action_dim], ``num_steps``, and for
real-time chunking ``prev_actions`` [T, action_dim] (robot units) with ``inference_delay`` and ``rtc``.
"""
from __future__ import annotations

import argparse
import asyncio
import http
import logging
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from ..observation import Observation, ObservationError
from ..observation_checks import rgb_from_float
from ..policy.rtc import AUTO, RTCSettings
from ..runtime.batch import infer_batch
from ..wire import codec
from ..wire.auth import carries_key
from ..wire.profiles import LAYOUTS
from .batching import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE, DEFAULT_WINDOW_MS, BatchingQueue, QueueFull
from .logs import websockets_logger

LOG = logging.getLogger('vla_policy_serve')
EXTENSIONS = ('seed', 'noise', 'num_steps', 'prev_actions')
DEFAULT_MAX_CONNECTIONS = 64
RECEIVE_FRAMES = 2               # frames read ahead per connection (the wire has one request in flight)
CLOSE_TRY_AGAIN_LATER = 1013
# The openpi key layouts a request may use besides ``images`` (droid_policy.py DroidInputs, libero_policy.py
# LiberoInputs).
OPENPI_LAYOUTS = ('droid', 'libero')


def openpi_camera_keys(camera_names: Sequence[str]) -> Dict[str, str]:
    """openpi's image keys (the DROID and LIBERO layouts of wire/profiles.py) -> the checkpoint's cameras: a
    layout's i-th image is the i-th of ``camera_names`` (a layout with more images than the checkpoint has
    cameras maps only the first ones)."""
    return {key: camera for layout in OPENPI_LAYOUTS
            for (_, key), camera in zip(LAYOUTS[layout].cameras, camera_names)}


class RequestError(ValueError):
    """A request this server cannot read; sent back as a text frame."""


def _frame(name: str, value: Any) -> np.ndarray:
    """One camera as the runtime takes it: uint8 [H, W, 3] (openpi's _parse_image: floats are scaled by 255
    and a leading 3 is CHW); a float frame outside [0, 1] or not finite: ObservationError bad_image."""
    if not isinstance(value, np.ndarray) or value.ndim != 3:
        raise RequestError(f'images.{name}: expected an image array [H, W, 3] or [3, H, W]')
    if np.issubdtype(value.dtype, np.floating):
        value = rgb_from_float(name, value)
    if value.shape[0] == 3 and value.shape[2] != 3:
        value = value.transpose(1, 2, 0)
    return np.ascontiguousarray(value)


def _state(message: Mapping[str, Any]) -> np.ndarray:
    if 'observation/joint_position' in message:
        gripper = np.asarray(message.get('observation/gripper_position', np.zeros(0)), dtype=np.float64)
        return np.concatenate([np.asarray(message['observation/joint_position'], dtype=np.float64),
                               gripper.reshape(-1)])
    state = message.get('state', message.get('observation/state'))
    if state is None and isinstance(message.get('observation'), Mapping):
        state = message['observation'].get('state')
    if not isinstance(state, (np.ndarray, list)):
        raise RequestError('no state: send "state" (or openpi\'s DROID/LIBERO state keys)')
    return np.asarray(state, dtype=np.float64)


def parse_request(message: Any, camera_keys: Mapping[str, str]) -> Tuple[Observation, Dict[str, Any]]:
    """A decoded request -> the observation and the runtime's infer options; ``camera_keys`` maps openpi's
    image keys to camera names (``openpi_camera_keys``)."""
    if not isinstance(message, Mapping):
        raise RequestError(f'a request is a map, got {type(message).__name__}')
    images = message.get('images')
    if images is None and isinstance(message.get('observation'), Mapping):
        images = message['observation'].get('images')
    frames: Dict[str, np.ndarray] = {}
    if isinstance(images, Mapping):
        frames.update({str(name): _frame(str(name), value) for name, value in images.items()})
    for key, camera in camera_keys.items():
        if key in message:
            frames[camera] = _frame(camera, message[key])
    if not frames:
        raise RequestError('no camera frames: send "images" {camera: frame} or openpi\'s DROID/LIBERO keys')
    prompt = message.get('prompt', '')
    prompt = prompt.decode('utf-8', 'replace') if isinstance(prompt, bytes) else prompt
    if not isinstance(prompt, str):
        raise RequestError('prompt must be text')
    options: Dict[str, Any] = {}
    for name in ('seed', 'num_steps', 'inference_delay'):
        if message.get(name) is not None:
            value = message[name]
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise RequestError(f'{name} must be an integer')
            options[name] = int(value)
    if options.get('num_steps') is not None and not 1 <= options['num_steps'] <= 100:
        raise RequestError('num_steps must be in [1, 100]')
    for name in ('noise', 'prev_actions'):
        if message.get(name) is not None:
            if not isinstance(message[name], np.ndarray):
                raise RequestError(f'{name} must be an array')
            options[name] = message[name]
    rtc = message.get('rtc')
    if isinstance(rtc, Mapping):
        try:
            options['rtc'] = RTCSettings(mode=str(rtc.get('mode', AUTO)),
                                         schedule=str(rtc.get('schedule', 'linear')),
                                         max_guidance_weight=float(rtc.get('max_guidance_weight', 10.0)),
                                         execution_horizon=int(rtc.get('execution_horizon', 10)))
        except (TypeError, ValueError) as exc:
            raise RequestError(f'rtc: {exc}') from exc
    return Observation(images=frames, state=_state(message), instruction=prompt), options


class PolicyServer:
    """One runtime, many connections; requests go through one worker thread, a bounded batching queue in front
    (``max_batch`` 1: one request at a time). ``answer`` is the wire's request -> reply, which the fleet's
    replicas (vla_policy_node/fleet) serve too."""

    def __init__(self, runtime: Any, api_key: str = '', max_message_bytes: int = 64 << 20,
                 max_queue: int = DEFAULT_MAX_QUEUE, max_batch: int = DEFAULT_MAX_BATCH,
                 batch_window_ms: float = DEFAULT_WINDOW_MS, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        self.runtime = runtime
        self._api_key = api_key
        self.max_message_bytes = max_message_bytes
        self.max_queue = max_queue
        self.max_connections = max_connections
        self.connections = 0          # open WebSocket connections: one request in flight each, at most
        self.queue = BatchingQueue(lambda items: infer_batch(runtime, items), max_batch=max_batch,
                                   window_sec=batch_window_ms / 1e3, max_queue=max_queue,
                                   clients=lambda: self.connections or None)   # None: answer() called directly
        self.served = 0
        self.cache_hits = 0
        self.camera_keys = openpi_camera_keys(runtime.config.camera_names)
        self.reply_fields: Dict[str, Any] = {}     # added to every actions reply (a fleet replica's name)

    @property
    def refused_busy(self) -> int:
        return self.queue.stats.refused_busy

    def statistics(self) -> Dict[str, float]:
        """Requests, batches and the prefix cache so far (the fleet exports them as metrics)."""
        queue = self.queue.stats
        figures: Dict[str, float] = {
            'served': self.served, 'cache_hits': self.cache_hits, 'refused_busy': queue.refused_busy,
            'pending': queue.pending, 'batches': queue.batches, 'mean_batch': queue.mean_batch,
            'largest_batch': queue.largest_batch}
        cache = getattr(self.runtime, 'cache', None)
        if cache is not None:
            stats = cache.stats()
            figures.update(cache_entries=stats.entries, cache_bytes=stats.bytes, cache_max_bytes=stats.max_bytes)
        return figures

    def metadata(self) -> Dict[str, Any]:
        cfg = self.runtime.config
        return {'server': 'vla_policy_serve', 'extensions': list(EXTENSIONS),
                'policy': {'policy_type': cfg.policy_type, 'camera_names': list(cfg.camera_names),
                           'all_camera_names': list(cfg.all_camera_names), 'chunk_size': int(cfg.chunk_size),
                           'action_dim': int(cfg.action_dim), 'state_dim': int(cfg.state_dim),
                           'max_action_dim': int(cfg.max_action_dim),
                           'rtc_training_max_delay': int(cfg.rtc_training_max_delay),
                           'model_revision': self.runtime.model_revision},
                'batching': {'max_batch': self.queue.max_batch, 'window_ms': self.queue.window_sec * 1e3,
                             'max_queue': self.max_queue}}

    def process_request(self, connection: ServerConnection, request: Any) -> Any:
        """``/healthz`` (no key needed, as load balancers probe it), then the API key when configured."""
        if request.path == '/healthz':
            return connection.respond(http.HTTPStatus.OK, 'OK\n')
        if self.connections >= self.max_connections:
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                      f'{self.connections} clients connected (max_connections); try again\n')
        if self._api_key:
            if not carries_key(request.headers.get('Authorization'), self._api_key):
                return connection.respond(http.HTTPStatus.UNAUTHORIZED, 'missing or wrong API key\n')
        return None

    async def handler(self, websocket: ServerConnection) -> None:
        if self.connections >= self.max_connections:      # handshakes that raced past process_request's check
            await websocket.close(CLOSE_TRY_AGAIN_LATER, 'max_connections clients connected; try again')
            return
        self.connections += 1
        try:
            await websocket.send(codec.packb(self.metadata()))
            async for frame in websocket:
                await websocket.send(await self.answer(frame))
        except ConnectionClosed:
            pass
        finally:
            self.connections -= 1

    async def answer(self, frame: Union[str, bytes]) -> Union[str, bytes]:
        """The reply to one frame: the actions, or a text frame saying what is wrong."""
        if isinstance(frame, str):
            return 'error: requests are binary msgpack frames, got a text frame'
        try:
            observation, options = parse_request(codec.unpackb(frame, self.max_message_bytes), self.camera_keys)
        except (codec.CodecError, RequestError) as exc:
            return f'error: bad request: {exc}'
        except ObservationError as exc:          # a frame refused while it is read (rgb_from_float)
            return f'error: [{exc.reason}] {exc}'
        start = time.perf_counter()
        try:
            chunk = await self.queue.submit((observation, options))
        except QueueFull as exc:
            return f'error: busy: {exc}; try again'
        except Exception as exc:   # the whole batch failed
            chunk = exc
        if isinstance(chunk, ObservationError):
            return f'error: [{chunk.reason}] {chunk}'
        if isinstance(chunk, Exception):
            # A bug must not take the server down; the client gets the traceback, as openpi's does.
            LOG.error('inference failed', exc_info=chunk)
            return ''.join(traceback.format_exception(type(chunk), chunk, chunk.__traceback__))
        self.served += 1
        self.cache_hits += int(bool(chunk.cache_hit))
        return codec.packb({'actions': np.asarray(chunk.actions), 'cache_hit': bool(chunk.cache_hit),
                            'server_timing': {'infer_ms': (time.perf_counter() - start) * 1e3},
                            **self.reply_fields})

    async def run(self, host: str, port: int, ready: Optional[Any] = None,
                  stop: Optional[asyncio.Event] = None) -> None:
        stop = stop or asyncio.Event()
        # Memory per connection: the frame being answered and RECEIVE_FRAMES read ahead at most (a client that
        # pipelines more waits on TCP), so max_connections bounds what clients can make the server hold.
        async with serve(self.handler, host, port, compression=None, max_size=self.max_message_bytes,
                         max_queue=RECEIVE_FRAMES,
                         process_request=self.process_request,
                         logger=websockets_logger('vla_policy_serve.websockets')) as server:
            bound = server.sockets[0].getsockname()[1] if server.sockets else port
            if ready is not None:
                ready(bound)
            await stop.wait()
        self.queue.close()


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='vla_policy_serve', description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--checkpoint', required=True,
                        help='lerobot pretrained_model folder (or builtin:demo, builtin:tiny)')
    parser.add_argument('--port', type=int, default=8000, help='0: any free port (printed)')
    parser.add_argument('--host', default='127.0.0.1', help='0.0.0.0 to serve other machines (put TLS in front)')
    parser.add_argument('--api-key-file', type=Path, help='file holding the API key clients must send')
    parser.add_argument('--max-message-mib', type=float, default=64.0, help='largest request frame')
    parser.add_argument('--max-queue', type=int, default=DEFAULT_MAX_QUEUE,
                        help='requests waiting or running at most; one more is refused as busy')
    parser.add_argument('--max-connections', type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help='clients connected at once; one more is refused with HTTP 503')
    parser.add_argument('--max-batch', type=int, default=DEFAULT_MAX_BATCH,
                        help='robots\' requests run as one batch at most (1: one at a time)')
    parser.add_argument('--batch-window-ms', type=float, default=DEFAULT_WINDOW_MS,
                        help='how long the first request of a batch waits for others (0: only those already '
                             'waiting join it)')
    parser.add_argument('--device', default='auto', help='auto, cpu, cuda')
    parser.add_argument('--dtype', default='auto', help='auto, float32, bfloat16')
    parser.add_argument('--tokenizer', default=None, help='tokenizer.model / tokenizer.json path')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='[vla_policy_serve] %(message)s')
    from ..runtime import PolicyRuntime
    from ..policy.builtin import checkpoint_folder

    api_key = ''
    if args.api_key_file is not None:
        try:
            api_key = args.api_key_file.read_text().strip()
        except OSError as exc:
            print(f'vla_policy_serve: error: cannot read --api-key-file: {exc}', file=sys.stderr)
            return 2
        if not api_key:
            print(f'vla_policy_serve: error: {args.api_key_file} is empty', file=sys.stderr)
            return 2
    if not 0 < args.max_message_mib <= 1024 or args.max_queue < 1 or args.max_connections < 1:
        print('vla_policy_serve: error: --max-message-mib must be in (0, 1024], --max-queue and --max-connections '
              '>= 1', file=sys.stderr)
        return 2
    if not 1 <= args.max_batch <= args.max_queue or not 0 <= args.batch_window_ms <= 1000:
        print('vla_policy_serve: error: --max-batch must be in [1, --max-queue] and --batch-window-ms in [0, 1000]',
              file=sys.stderr)
        return 2
    path = checkpoint_folder(args.checkpoint)
    try:
        runtime = PolicyRuntime.from_pretrained(path, device=args.device, dtype=args.dtype,
                                                tokenizer_path=args.tokenizer)
    except (ValueError, OSError) as exc:   # CheckpointError, ConfigError, TokenizerError are ValueErrors
        print(f'vla_policy_serve: error: {exc}', file=sys.stderr)
        return 2
    runtime.warmup()
    server = PolicyServer(runtime, api_key, int(args.max_message_mib * 2**20), args.max_queue, args.max_batch,
                          args.batch_window_ms, args.max_connections)

    async def serve_until_signal() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)

        def ready(port: int) -> None:
            print(f'vla_policy_serve: {runtime.config.policy_type} on ws://{args.host}:{port} '
                  f'(API key {"checked" if api_key else "not required"}; /healthz; '
                  f'batches of up to {args.max_batch}, window {args.batch_window_ms:g} ms)', flush=True)

        await server.run(args.host, args.port, ready, stop)

    asyncio.run(serve_until_signal())
    runtime.close()
    return 0


if __name__ == '__main__':
    sys.exit(main())
