"""One policy replica of the fleet: a batching vla_policy_serve (remote/server.PolicyServer) as a Serve deployment.

The ingress (fleet/ingress.py) calls ``infer(robot, frame)`` with a robot's raw request frame; the reply is what
vla_policy_serve would send (the actions frame, or a text frame naming the problem), plus ``replica`` in the
actions map so a client can see which replica answered. ``robot`` is only for the request router
(fleet/router.py): the replica answers every request from the request alone, so no state of one robot can reach
another. Statistics go out as Ray Serve metrics (``vla_fleet_*``, tagged with deployment, replica and
application by Serve), and ``check_health`` lets Serve replace a replica whose worker is gone.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Mapping, Union

from ray import serve
from ray.serve import metrics

from ..policy.builtin import checkpoint_folder
from ..remote.server import PolicyServer
from ..runtime import PolicyRuntime, set_cpu_threads
from .config import FleetConfig

BATCH_SIZE_BOUNDARIES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
LATENCY_MS_BOUNDARIES = [5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
RECENT_ROBOT_SEC = 2.0          # a robot heard from this recently may send the next request of a batch


class PolicyReplica:
    """Serve deployment class (fleet/app.py applies the options): the checkpoint loaded and warmed once."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        cfg = FleetConfig(**config)
        set_cpu_threads(max(1, int(cfg.cpus_per_replica)))
        options: Dict[str, Any] = {}
        if cfg.cache_max_bytes is not None:
            options['cache_max_bytes'] = int(cfg.cache_max_bytes)
        runtime = PolicyRuntime.from_pretrained(checkpoint_folder(cfg.checkpoint), device=cfg.device, dtype=cfg.dtype,
                                                tokenizer_path=cfg.tokenizer, **options)
        runtime.warmup()
        self.server = PolicyServer(runtime, max_message_bytes=cfg.max_message_bytes, max_queue=cfg.max_queue,
                                   max_batch=cfg.max_batch, batch_window_ms=cfg.batch_window_ms)
        self.name = serve.get_replica_context().replica_id.unique_id
        self.server.reply_fields = {'replica': self.name}
        self._metrics = _ReplicaMetrics()
        self.server.queue.on_batch = self._metrics.batch_size.observe
        # The robots that could join a batch: those heard from lately (the ingress holds their connections, each
        # with one request in flight at most), so a lone robot never waits out the batch window.
        self._robots_seen: Dict[str, float] = {}
        self.server.queue.clients = self._recent_robots
        self._metrics.update(self.server.statistics(), healthy=True)

    async def metadata(self) -> Dict[str, Any]:
        """vla_policy_serve's metadata frame (the fleet's ingress sends it to each robot first)."""
        return self.server.metadata()

    async def infer(self, robot: str, frame: Union[bytes, str]) -> Union[bytes, str]:
        """One robot's request frame -> the reply frame. ``robot`` routes the request (fleet/router.py) and counts
        the robots a batch may wait for; the answer never reads it."""
        start = time.perf_counter()
        self._robots_seen[robot] = time.monotonic()
        reply = await self.server.answer(frame)
        outcome = 'actions' if isinstance(reply, bytes) else ('busy' if reply.startswith('error: busy') else 'error')
        self._metrics.requests.inc(tags={'outcome': outcome})
        self._metrics.latency_ms.observe((time.perf_counter() - start) * 1e3)
        self._metrics.update(self.server.statistics(), healthy=True)
        return reply

    def _recent_robots(self) -> int:
        now = time.monotonic()
        for robot in [r for r, seen in self._robots_seen.items() if now - seen > RECENT_ROBOT_SEC]:
            del self._robots_seen[robot]
        return len(self._robots_seen)

    async def statistics(self) -> Dict[str, Any]:
        """Served requests, cache and batch figures of this replica."""
        return dict(self.server.statistics(), replica=self.name)

    def check_health(self) -> None:
        """Serve calls this periodically; raising makes it replace the replica."""
        if self.server.runtime.model is None:
            self._metrics.healthy.set(0)
            raise RuntimeError('the policy runtime was closed')
        self._metrics.update(self.server.statistics(), healthy=True)

    def __del__(self) -> None:
        server = getattr(self, 'server', None)
        if server is not None:
            server.queue.close()
            server.runtime.close()


class _ReplicaMetrics:
    """The replica's Ray Serve metrics: counters of requests by outcome, histograms of batch sizes and request
    latency, gauges of the cache, the queue and health."""

    def __init__(self) -> None:
        self.requests = metrics.Counter('vla_fleet_requests', description='robot requests answered, by outcome',
                                        tag_keys=('outcome',))
        self.batch_size = metrics.Histogram('vla_fleet_batch_size', description='robots per batch',
                                            boundaries=BATCH_SIZE_BOUNDARIES)
        self.latency_ms = metrics.Histogram('vla_fleet_request_ms', description='request time in the replica (ms)',
                                            boundaries=LATENCY_MS_BOUNDARIES)
        self.healthy = metrics.Gauge('vla_fleet_replica_healthy', description='1 while the replica serves')
        self.gauges = {name: metrics.Gauge(f'vla_fleet_{name}', description=description) for name, description in (
            ('cache_hits', 'prefix cache hits served'), ('served', 'chunks served'),
            ('cache_entries', 'prefix cache entries'), ('cache_bytes', 'prefix cache bytes'),
            ('pending', 'requests waiting or running'), ('mean_batch', 'mean robots per batch'))}

    def update(self, statistics: Mapping[str, float], healthy: bool) -> None:
        self.healthy.set(1 if healthy else 0)
        for name, gauge in self.gauges.items():
            if name in statistics:
                gauge.set(float(statistics[name]))
