"""Helpers for the remote-inference tests: a server on the openpi wire in a thread, vla_policy_serve as a process.

``WireServer`` speaks the wire as openpi's server defines it (src/openpi/serving/websocket_policy_server.py,
openpi 15a9616: metadata frame first, then one reply per request; errors per profile as the servers send
them), with switchable misbehaviour. It is a real WebSocket server on loopback.
"""
from __future__ import annotations

import asyncio
import collections
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional

import numpy as np
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from vla_policy_node.wire import codec
from vla_policy_node.remote.logs import websockets_logger

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def rss_bytes(pid: int) -> int:
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) * 1024
    raise RuntimeError('no VmRSS')


class WireServer:
    """A test server on the openpi wire. ``behaviour``: ok, slow, error, drop, garbage, wrong_shape, nan,
    int_dtype, oversize, wrong_form. Every decoded request lands in ``requests``."""

    def __init__(self, profile: str = 'openpi', metadata: Optional[Dict[str, Any]] = None, api_key: str = '',
                 horizon: int = 10, action_dim: int = 6) -> None:
        self.profile = profile
        self.metadata = metadata if metadata is not None else {}
        self.api_key = api_key
        self.behaviour = 'ok'
        self.delay_sec = 30.0
        self.actions = np.arange(horizon * action_dim, dtype=np.float32).reshape(horizon, action_dim) / 100
        self.requests: Deque[Any] = collections.deque(maxlen=4)     # bounded: memory is measured
        self.headers: List[Dict[str, str]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: Optional[asyncio.Event] = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), 'test server did not start'

    @property
    def url(self) -> str:
        return f'ws://127.0.0.1:{self.port}/'

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    def _process_request(self, connection, request):
        self.headers.append({'Authorization': request.headers.get('Authorization', '')})
        if self.api_key and request.headers.get('Authorization') != f'Api-Key {self.api_key}':
            return connection.respond(401, 'unauthorized\n')
        return None

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with serve(self._handler, '127.0.0.1', 0, compression=None, max_size=None,
                         process_request=self._process_request,
                         logger=websockets_logger('test.wire_server')) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    async def _handler(self, ws) -> None:
        await ws.send(codec.packb(self.metadata))
        try:
            async for frame in ws:
                self.requests.append(codec.unpackb(frame, 1 << 28))
                if not await self._reply(ws):
                    return
        except ConnectionClosed:
            pass

    async def _reply(self, ws) -> bool:
        behaviour, actions = self.behaviour, self.actions
        if behaviour == 'slow':
            await asyncio.sleep(self.delay_sec)
        if behaviour == 'drop':
            ws.transport.abort()          # the TCP connection goes away mid-request
            return False
        if behaviour == 'error':
            if self.profile == 'openpi':      # websocket_policy_server.py: traceback text, then close 1011
                await ws.send('Traceback (most recent call last):\n  ...\nValueError: the model failed\n')
                await ws.close(1011, 'Internal server error. Traceback included in previous frame.')
                return False
            if self.profile == 'sglang':      # action/ws_utils.py: msgpack {"error"}, then close 1011
                await ws.send(codec.packb({'error': 'Traceback ...\nRuntimeError: sglang failed'}))
                await ws.close(1011, 'Internal server error')
                return False
            await ws.send(codec.packb({'type': 'error', 'message': 'vllm failed'}))   # stays open
            return True
        if behaviour == 'garbage':
            await ws.send(os.urandom(4096))
            return True
        if behaviour == 'wrong_shape':
            actions = actions[:, :-1]
        elif behaviour == 'nan':
            actions = actions.copy()
            actions[3, 2] = np.nan
        elif behaviour == 'int_dtype':
            actions = actions.astype(np.int32)
        elif behaviour == 'oversize':
            actions = np.zeros((1 << 16, actions.shape[1]), dtype=np.float64)     # 3 MiB
        if behaviour == 'wrong_form':
            reply: Any = actions if self.profile != 'vllm_omni' else {'actions': actions}
        else:
            reply = actions if self.profile == 'vllm_omni' else {'actions': actions, 'server_timing': {'infer_ms': 1.0}}
        await ws.send(codec.packb(reply))
        return True

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)


def serve_command() -> List[str]:
    exe = shutil.which('vla_policy_serve')
    return [exe] if exe else [sys.executable, '-m', 'vla_policy_node.remote.server']


class ServeProcess:
    """``vla_policy_serve --checkpoint DIR --port P`` as its own process; ``port`` once it listens."""

    def __init__(self, checkpoint: Path, log_path: Path, port: int = 0, extra: Optional[List[str]] = None) -> None:
        self.log_path = Path(log_path)
        self.command = serve_command() + ['--checkpoint', str(checkpoint), '--port', str(port), *(extra or [])]
        env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
        env['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get('PYTHONPATH', '')] if p])
        self._offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log = open(self.log_path, 'ab')
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.port = self._wait_ready()

    def _wait_ready(self, timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        pattern = re.compile(r'vla_policy_serve: \S+ on ws://[^:]+:(\d+) ')
        while time.monotonic() < deadline:
            text = self.log_path.read_bytes()[self._offset:].decode(errors='replace')
            found = pattern.findall(text)
            if found and self.proc.poll() is None:
                return int(found[-1])
            if self.proc.poll() is not None:
                raise AssertionError(f'vla_policy_serve exited with {self.proc.returncode}:\n{text[-3000:]}')
            time.sleep(0.1)
        raise AssertionError(f'vla_policy_serve did not start in {timeout} s')

    @property
    def url(self) -> str:
        return f'ws://127.0.0.1:{self.port}/'

    def kill(self) -> None:
        """SIGKILL: the server dies mid-whatever, as a crashed GPU box would."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
