"""One WebSocket to a policy server, kept open from a background event loop (never the ROS executor).

openpi's client (packages/openpi-client/src/openpi_client/websocket_client_policy.py, openpi 15a9616)
connects with ``compression=None``, sends ``Authorization: Api-Key <key>`` when it has a key, and reads
the server's metadata frame first. Unlike it, every wait here is bounded (connect and metadata by
``timeout_sec``, each request by the caller), frames are bounded by ``max_bytes``, and a connection that
closes is reopened in the background with bounded backoff (openpi retries only a refused first connect,
every 5 s, and never reconnects).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any, Dict, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

import websockets
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from ..observation import SkipReason
from ..wire import codec
from ..wire.auth import authorization
from ..wire.errors import AUTH, BAD_REPLY, DISCONNECTED, ERROR_FRAME, TIMEOUT, UNREACHABLE, RemoteError
from .logs import websockets_logger

LOG = logging.getLogger(__name__)
BACKOFF_MIN_SEC = 0.1
BACKOFF_MAX_SEC = 2.0               # bounded: a server that comes back is in use within ~2 s
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


class Connection:
    """``exchange(payload)`` sends one frame and returns the reply frame (bytes, or str: an error frame)."""

    def __init__(self, url: str, api_key: str, timeout_sec: float, max_bytes: int) -> None:
        self._url, self._api_key = url, api_key
        self.public_url = public_url(url)
        self.timeout_sec = timeout_sec
        self.max_bytes = max_bytes
        self.metadata: Dict[str, Any] = {}
        self.connects = 0
        self.connect_failures = 0
        self._ws = None
        self._connected = threading.Event()
        self._last_failure: Tuple[SkipReason, str] = (UNREACHABLE, 'not connected yet')
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name='vla_remote_client', daemon=True)
        self._thread.start()
        self._wake: Optional[asyncio.Event] = None
        self._maintainer = asyncio.run_coroutine_threadsafe(self._maintain(), self._loop)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout_sec: float) -> bool:
        return self._connected.wait(timeout_sec)

    # ---- the client loop thread ------------------------------------------------------------------
    async def _maintain(self) -> None:
        self._wake = asyncio.Event()
        failures = 0
        headers = {'Authorization': authorization(self._api_key)} if self._api_key else None
        while not self._closing:
            try:
                ws = await connect(self._url, additional_headers=headers, open_timeout=self.timeout_sec,
                                   max_size=self.max_bytes, logger=websockets_logger(f'{__name__}.websockets'),
                                   **WS_OPTIONS)
            except Exception as exc:   # refused, DNS, TLS, HTTP status, timeout: all retried
                failures += 1
                self._failed(*_connect_fault(exc))
                await self._backoff(failures)
                continue
            try:
                self.metadata = await self._read_metadata(ws)
            except RemoteError as exc:
                failures += 1
                self._failed(exc.reason, str(exc))
                await ws.close()
                await self._backoff(failures)
                continue
            failures = 0
            self.connects += 1
            self._ws = ws
            self._connected.set()
            LOG.info('connected to %s (%s)', self.public_url, self.metadata.get('server', 'server'))
            await ws.wait_closed()
            self._connected.clear()
            self._ws = None
            self._last_failure = (UNREACHABLE, f'the connection to {self.public_url} closed; reconnecting')

    async def _read_metadata(self, ws) -> Dict[str, Any]:
        try:
            frame = await asyncio.wait_for(ws.recv(), self.timeout_sec)
        except asyncio.TimeoutError:
            raise RemoteError(TIMEOUT, f'no metadata frame from {self.public_url} within {self.timeout_sec} s')
        except ConnectionClosed as exc:
            raise RemoteError(DISCONNECTED, f'{self.public_url} closed before its metadata frame: {exc}')
        if isinstance(frame, str):
            raise RemoteError(ERROR_FRAME, f'server error instead of metadata: {frame}')
        try:
            metadata = codec.unpackb(frame, self.max_bytes)
        except codec.CodecError as exc:
            raise RemoteError(BAD_REPLY, f'metadata frame: {exc}')
        if not isinstance(metadata, dict):
            raise RemoteError(BAD_REPLY, f'metadata must be a map, got {type(metadata).__name__}')
        return metadata

    def _failed(self, kind: SkipReason, message: str) -> None:
        self._last_failure = (kind, message)
        self.connect_failures += 1

    async def _backoff(self, failures: int) -> None:
        delay = min(BACKOFF_MAX_SEC, BACKOFF_MIN_SEC * 2 ** min(failures - 1, 16))
        try:
            await asyncio.wait_for(self._wake.wait(), delay)
        except asyncio.TimeoutError:
            pass
        self._wake.clear()

    async def _send_and_receive(self, ws, payload: bytes) -> Any:
        try:
            await ws.send(payload)
            return await ws.recv()
        except ConnectionClosed as exc:
            if exc.sent is not None and exc.sent.code == CLOSE_MESSAGE_TOO_BIG:
                raise RemoteError(BAD_REPLY, f'reply larger than the limit of {self.max_bytes} bytes '
                                  '(remote_max_reply_bytes)')
            raise RemoteError(DISCONNECTED, f'the connection to {self.public_url} dropped mid-request: {exc}')

    # ---- the caller's thread ---------------------------------------------------------------------
    def exchange(self, payload: bytes, timeout_sec: float) -> Any:
        """One request and its reply frame, or RemoteError. There is no request id on the wire, so after a
        timeout the connection is closed and reopened: a late reply can never answer the next request."""
        ws = self._ws
        if ws is None or not self._connected.is_set():
            kind, message = self._last_failure
            self._poke()
            raise RemoteError(kind, message)
        future = asyncio.run_coroutine_threadsafe(self._send_and_receive(ws, payload), self._loop)
        try:
            return future.result(timeout_sec)
        except concurrent.futures.TimeoutError:
            future.cancel()
            self._drop(ws)
            raise RemoteError(TIMEOUT, f'no reply from {self.public_url} within {timeout_sec} s '
                              '(remote_timeout_sec); reconnecting') from None
        except RemoteError:
            raise
        except Exception as exc:  # anything else the socket raises is a dropped connection
            self._drop(ws)
            raise RemoteError(DISCONNECTED, f'{type(exc).__name__}: {exc}') from exc

    def _drop(self, ws) -> None:
        """Close a connection whose state is unknown (the client loop then reconnects)."""
        self._connected.clear()
        self._last_failure = (UNREACHABLE, f'reconnecting to {self.public_url}')
        asyncio.run_coroutine_threadsafe(ws.close(), self._loop)

    def _poke(self) -> None:
        if self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

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


def _connect_fault(exc: BaseException) -> Tuple[SkipReason, str]:
    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if status in (401, 403):
            return AUTH, f'the server refused the API key (HTTP {status})'
        return UNREACHABLE, f'the server answered the handshake with HTTP {status}'
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return TIMEOUT, 'connecting timed out (remote_timeout_sec)'
    return UNREACHABLE, f'cannot connect: {type(exc).__name__}: {exc}'
