"""vla_policy_fleet: many robots, one model, several replicas on Ray Serve (docs/fleet.md).

    vla_policy_fleet up --checkpoint DIR [--replicas N | --min-replicas A --max-replicas B] [--port 8000] ...
        one machine: starts Ray on loopback (every Ray address 127.0.0.1) and serves until Ctrl-C;
        --address auto|HOST:6379: deploys onto a running Ray cluster instead (--detach leaves it there)
    vla_policy_fleet config --checkpoint DIR ... > fleet.yaml
        a Serve config file for `serve run fleet.yaml` / `serve deploy fleet.yaml`

Needs the fleet extra: pip install 'vla_policy_node[fleet]'.
"""
from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
from typing import Any, Dict, Optional, Sequence

from .config import ROUTINGS, FleetConfig

# FleetConfig fields as command-line options: name -> (type, help).
OPTIONS = {
    'checkpoint': (str, 'lerobot pretrained_model folder on every machine that runs a replica (or builtin:demo, '
                        'builtin:tiny)'),
    'replicas': (int, 'policy replicas (fixed count)'),
    'min_replicas': (int, 'autoscaling: fewest replicas (with --max-replicas)'),
    'max_replicas': (int, 'autoscaling: most replicas'),
    'target_queue': (float, 'autoscaling: requests waiting or running per replica to aim for'),
    'cpus_per_replica': (float, 'CPUs each replica reserves (and torch threads)'),
    'gpus_per_replica': (float, 'GPUs each replica reserves (1: one replica per GPU)'),
    'device': (str, 'auto, cpu, cuda'),
    'dtype': (str, 'auto, float32, bfloat16'),
    'tokenizer': (str, 'tokenizer.model / tokenizer.json path'),
    'cache_max_bytes': (int, 'prefix cache budget per replica (bytes)'),
    'max_batch': (int, 'robots per batch in a replica'),
    'batch_window_ms': (float, 'how long a batch waits for more robots (0: only those already waiting)'),
    'max_queue': (int, 'requests waiting or running per replica; more are refused as busy'),
    'max_message_mib': (float, 'largest request frame (Serve\'s proxy also stops at 16 MiB)'),
    'routing': (str, f'one of {", ".join(ROUTINGS)}'),
    'load_guard': (int, 'requests of queue imbalance before a robot\'s request goes to a less loaded replica'),
    'robot_idle_sec': (float, 'a robot silent this long no longer counts when robots are balanced over replicas'),
    'api_key_file': (str, 'file holding the API key robots must send (on the machine running the ingress)'),
    'max_connections': (int, 'robots connected at once'),
    'request_timeout_sec': (float, 'longest wait for a replica\'s reply before an error frame'),
    'ingress_cpus': (float, 'CPUs the ingress reserves'),
    'host': (str, 'where robots connect (0.0.0.0: other machines; put TLS in front)'),
    'port': (int, 'HTTP / WebSocket port of Serve\'s proxy'),
    'name': (str, 'Serve application name'),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='vla_policy_fleet', description=__doc__.split('\n\n')[0])
    commands = parser.add_subparsers(dest='command', required=True)
    up = commands.add_parser('up', help='serve the fleet until Ctrl-C')
    config = commands.add_parser('config', help='print a Serve config file (YAML)')
    defaults = {field.name: field.default for field in dataclasses.fields(FleetConfig)}
    for sub in (up, config):
        for name, (kind, text) in OPTIONS.items():
            flag = '--' + name.replace('_', '-')
            if name == 'checkpoint':
                sub.add_argument(flag, required=True, help=text)
            else:
                sub.add_argument(flag, type=kind, default=defaults[name], help=f'{text} (default: %(default)s)')
    up.add_argument('--address', help='a running Ray cluster (auto, or HOST:6379); default: Ray on this machine, '
                                      'on loopback')
    up.add_argument('--num-cpus', type=float, help='CPUs of the local Ray instance (default: all)')
    up.add_argument('--num-gpus', type=int, help='GPUs of the local Ray instance (default: all)')
    up.add_argument('--detach', action='store_true', help='with --address: deploy and return, leave it running')
    return parser


def fleet_config(args: argparse.Namespace) -> FleetConfig:
    return FleetConfig(**{name: getattr(args, name) for name in OPTIONS})


def serve_config_yaml(cfg: FleetConfig) -> str:
    """A Serve config file (``serve run`` / ``serve deploy``) for this fleet."""
    import yaml

    document: Dict[str, Any] = {
        'proxy_location': 'EveryNode',
        'http_options': {'host': cfg.host, 'port': cfg.port},
        'applications': [{'name': cfg.name, 'route_prefix': '/', 'import_path': 'vla_policy_node.fleet.app:app_builder',
                          'args': dict(cfg.as_args(), checkpoint=cfg.checkpoint)}]}
    return yaml.safe_dump(document, sort_keys=False)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = fleet_config(args)
    except ValueError as exc:
        print(f'vla_policy_fleet: error: {exc}', file=sys.stderr)
        return 2
    if args.command == 'config':
        print(serve_config_yaml(cfg), end='')
        return 0
    if args.detach and not args.address:
        print('vla_policy_fleet: error: --detach needs --address (a cluster that outlives this command)',
              file=sys.stderr)
        return 2
    return up(cfg, args.address, args.num_cpus, args.num_gpus, args.detach)


def up(cfg: FleetConfig, address: Optional[str], num_cpus: Optional[float], num_gpus: Optional[int],
       detach: bool) -> int:
    from .cluster import start_ray, start_serve

    start_ray(address, num_cpus, num_gpus)
    from ray import serve

    from .app import build_app

    start_serve(cfg.host, cfg.port)
    serve.run(build_app(cfg), name=cfg.name, route_prefix='/')
    replicas = (f'{cfg.min_replicas}-{cfg.max_replicas} replicas (autoscaled)' if cfg.autoscaling
                else f'{cfg.replicas} replica(s)')
    print(f'vla_policy_fleet: {replicas} of {cfg.checkpoint} on ws://{cfg.host}:{cfg.port}/ '
          f'(API key {"checked" if cfg.api_key_file else "not required"}; /healthz; {cfg.routing} routing)',
          flush=True)
    if detach:
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    _shutdown(address is None, cfg.name)
    return 0


def _shutdown(own_ray: bool, name: str) -> None:
    import ray
    from ray import serve

    if own_ray:
        serve.shutdown()
        ray.shutdown()
    else:
        serve.delete(name)


if __name__ == '__main__':
    sys.exit(main())
