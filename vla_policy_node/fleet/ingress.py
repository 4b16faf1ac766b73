"""The fleet's front door: the openpi wire over WebSocket on a Ray Serve ingress deployment (FastAPI).

Serve's HTTP proxy hands each WebSocket connection to an ingress replica for its whole life (a FastAPI WebSocket
route on an ``@serve.ingress`` deployment); the wire is vla_policy_serve's (remote/server.py), so the node's remote
backend and openpi's client connect unchanged:

- ``GET /healthz`` answers ``OK`` once a policy replica answers, 503 before (no key, as load balancers probe it);
  every other path accepts the WebSocket;
- the API key (``Authorization: Api-Key <key>``) is checked before the handshake: a missing or wrong one is
  refused with HTTP 403, which the node counts as ``remote_auth``;
- the first frame is the policy's metadata (vla_policy_serve's, plus ``fleet``), then one reply per request;
- each request frame goes to a policy replica (fleet/replica.py) through a handle whose request router is
  robot-affine (fleet/router.py). The robot is the connection's ``?robot=<name>`` query parameter, so a robot
  that reconnects keeps its replica; without one, each connection is a robot of its own; a name that is not
  1-128 letters, digits or ``._:@-`` gets an error frame and the connection is closed (1008);
- a replica that dies mid-request, a full queue everywhere (Serve's back-pressure), no reply within
  ``request_timeout_sec``: the robot gets a text error frame, its node holds (``remote_error``) and its next
  request goes to a live replica. The connection stays open.
"""
# No ``from __future__ import annotations``: FastAPI reads the route's parameter types (WebSocket) at runtime, and
# Serve's class-based ingress rebuilds the signature, where string annotations would not resolve.
import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from fastapi import FastAPI, WebSocket
from fastapi.responses import PlainTextResponse
from ray import serve
from ray.exceptions import RayError
from ray.serve import metrics
from ray.serve.exceptions import BackPressureError
from starlette.websockets import WebSocketDisconnect

from ..wire import codec
from ..wire.auth import carries_key
from .affinity import robot_name
from .config import FleetConfig

LOG = logging.getLogger('vla_policy_fleet')
CLOSE_POLICY_VIOLATION = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL_ERROR = 1011
HEALTH_TIMEOUT_SEC = 2.0          # a live replica answers its metadata in milliseconds

app = FastAPI(title='vla_policy_fleet', docs_url=None, redoc_url=None, openapi_url=None)


@serve.ingress(app)
class FleetIngress:
    """Serve deployment class (fleet/app.py applies the options); ``policy``: the PolicyReplica handle."""

    def __init__(self, policy: Any, config: Mapping[str, Any]) -> None:
        cfg = FleetConfig(**config)
        self.policy = policy
        self.config = cfg
        self._api_key = Path(cfg.api_key_file).read_text().strip() if cfg.api_key_file else ''
        if cfg.api_key_file and not self._api_key:
            raise ValueError(f'{cfg.api_key_file} is empty')
        self._metadata: Optional[Dict[str, Any]] = None
        self._connections = metrics.Gauge('vla_fleet_connections', description='robots connected to this ingress')
        self._faults = metrics.Counter('vla_fleet_ingress_faults', description='requests answered with an error '
                                       'frame by the ingress, by kind', tag_keys=('kind',))
        self._open = 0

    @app.get('/healthz')
    async def healthz(self) -> PlainTextResponse:
        """OK once a policy replica answers: Serve accepts connections while the replicas still load and warm up,
        and a load balancer (or a user's script) that sent robots then would see every request time out."""
        try:
            await asyncio.wait_for(self.policy.metadata.remote(), HEALTH_TIMEOUT_SEC)
        except Exception as exc:   # no replica yet (still loading), or none left
            return PlainTextResponse(f'no policy replica is ready ({type(exc).__name__}); try again\n',
                                     status_code=503)
        return PlainTextResponse('OK\n')

    @app.websocket('/{path:path}')
    async def robot(self, websocket: WebSocket, path: str = '') -> None:
        del path                                   # every path is the policy, as on openpi's server
        if self._api_key and not carries_key(websocket.headers.get('authorization'), self._api_key):
            await websocket.close(code=CLOSE_POLICY_VIOLATION)      # before accept: HTTP 403
            return
        await websocket.accept()
        requested = websocket.query_params.get('robot')
        try:
            robot = f'connection-{uuid.uuid4().hex}' if requested is None else robot_name(requested)
        except ValueError as exc:  # said in an error frame (the name is not echoed: it is the client's bytes)
            await websocket.send_text(f'error: bad request: {exc}')
            await websocket.close(code=CLOSE_POLICY_VIOLATION)
            return
        try:
            metadata = await self.metadata()
        except Exception as exc:   # no replica ready: the client sees an error frame instead of metadata
            await websocket.send_text(f'error: no policy replica is ready: {type(exc).__name__}: {exc}')
            await websocket.close(code=CLOSE_INTERNAL_ERROR)
            return
        self._open += 1
        self._connections.set(self._open)
        try:
            await websocket.send_bytes(codec.packb(metadata))
            await self._serve(websocket, robot)
        except WebSocketDisconnect:
            pass
        finally:
            self._open -= 1
            self._connections.set(self._open)

    async def _serve(self, websocket: WebSocket, robot: str) -> None:
        while True:
            message = await websocket.receive()
            if message['type'] == 'websocket.disconnect':
                return
            frame = message.get('bytes')
            if frame is None:
                await websocket.send_text('error: requests are binary msgpack frames, got a text frame')
                continue
            if len(frame) > self.config.max_message_bytes:
                await websocket.close(code=CLOSE_TOO_BIG)
                return
            reply = await self.ask(robot, frame)
            if isinstance(reply, bytes):
                await websocket.send_bytes(reply)
            else:
                await websocket.send_text(reply)

    async def ask(self, robot: str, frame: bytes) -> Any:
        """The replica's reply, or a text error frame the node holds on (the connection stays open)."""
        try:
            return await asyncio.wait_for(self.policy.infer.remote(robot, frame), self.config.request_timeout_sec)
        except BackPressureError as exc:
            kind, text = 'busy', f'every policy replica\'s queue is full ({exc}); try again'
        except asyncio.TimeoutError:
            kind, text = 'busy', f'no policy replica answered within {self.config.request_timeout_sec:g} s; try again'
        except RayError as exc:    # the replica died or became unreachable mid-request
            kind = 'replica_failed'
            text = (f'the policy replica serving this robot failed ({type(exc).__name__}); the next request '
                    'goes to another replica')
        except Exception as exc:   # Serve's own refusals (no replica yet, cancelled): the robot holds and retries
            kind, text = 'unavailable', f'{type(exc).__name__}: {exc}'
        self._faults.inc(tags={'kind': kind})
        LOG.warning('robot %s: %s', robot, text)
        return f'error: {kind}: {text}'

    async def metadata(self) -> Dict[str, Any]:
        """The policy's metadata frame (asked of a replica once; every replica serves the same checkpoint)."""
        if self._metadata is None:
            metadata = await asyncio.wait_for(self.policy.metadata.remote(), self.config.request_timeout_sec)
            self._metadata = dict(metadata, fleet={'routing': self.config.routing})
        return self._metadata
