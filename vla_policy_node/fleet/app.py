"""The fleet as a Ray Serve application: ``FleetIngress`` (the wire) in front of ``PolicyReplica`` (the batching
server), built from one FleetConfig.

    vla_policy_fleet up --checkpoint DIR ...              (fleet/cli.py; starts or joins Ray, runs this)
    serve run vla_policy_node.fleet.app:app_builder checkpoint=DIR replicas=2 ...
    serve run fleet.yaml                                  (``vla_policy_fleet config ... > fleet.yaml``)

Replica options: one per GPU (``gpus_per_replica`` 1) or per CPU share (``cpus_per_replica``);
``max_ongoing_requests`` is the replica's queue bound, so Serve queues no more than that on a replica and
refuses past ``max_queued_requests`` per ingress with back-pressure (an error frame, a hold on the robot);
autoscaling follows the queue length (Serve's ``target_ongoing_requests``); the request router is
fleet/router.RobotAffinityRouter (or Serve's default power-of-two choices).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from ray import serve
from ray.serve.config import RequestRouterConfig

from .config import FleetConfig
from .ingress import FleetIngress
from .replica import PolicyReplica
from .router import RobotAffinityRouter

# How often Serve asks a replica whether it is healthy, and how long it waits (a replica warming a model on a
# loaded machine answers late).
HEALTH_CHECK_PERIOD_SEC = 5.0
HEALTH_CHECK_TIMEOUT_SEC = 60.0


def replica_options(cfg: FleetConfig) -> Dict[str, Any]:
    """The PolicyReplica deployment's options (what ``serve.deployment`` takes)."""
    options: Dict[str, Any] = dict(
        name='PolicyReplica',
        ray_actor_options={'num_cpus': cfg.cpus_per_replica, 'num_gpus': cfg.gpus_per_replica},
        max_ongoing_requests=cfg.max_queue, max_queued_requests=cfg.max_queue,
        health_check_period_s=HEALTH_CHECK_PERIOD_SEC, health_check_timeout_s=HEALTH_CHECK_TIMEOUT_SEC,
        graceful_shutdown_timeout_s=10.0)
    if cfg.autoscaling:
        options['autoscaling_config'] = {'min_replicas': cfg.min_replicas, 'max_replicas': cfg.max_replicas,
                                         'initial_replicas': max(cfg.min_replicas, 1),
                                         'target_ongoing_requests': cfg.target_queue}
    else:
        options['num_replicas'] = cfg.replicas
    if cfg.routing == 'affinity':
        options['request_router_config'] = RequestRouterConfig(
            request_router_class=RobotAffinityRouter,
            request_router_kwargs={'load_guard': cfg.load_guard, 'idle_sec': cfg.robot_idle_sec})
    return options


def ingress_options(cfg: FleetConfig) -> Dict[str, Any]:
    """The FleetIngress deployment's options: each robot's connection is one long request to it."""
    return dict(name='FleetIngress', num_replicas=1, ray_actor_options={'num_cpus': cfg.ingress_cpus},
                max_ongoing_requests=cfg.max_connections)


def build_app(cfg: FleetConfig) -> Any:
    """The bound application (``serve.run`` it, with route_prefix '/')."""
    config = {name: getattr(cfg, name) for name in cfg.__dataclass_fields__}
    replica = serve.deployment(**replica_options(cfg))(PolicyReplica)
    ingress = serve.deployment(**ingress_options(cfg))(FleetIngress)
    return ingress.bind(replica.bind(config), config)


def app_builder(args: Mapping[str, Any]) -> Any:
    """``serve run vla_policy_node.fleet.app:app_builder key=value ...`` / a Serve config's ``args``."""
    return build_app(FleetConfig.from_args(args))
