"""What a fleet deployment is made of: one ``FleetConfig``, from ``vla_policy_fleet up``'s options or from a Serve
config file's ``args`` (``app_builder``), checked in one place. No Ray here."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from ..remote.batching import DEFAULT_WINDOW_MS

ROUTINGS = ('affinity', 'power_of_two')


@dataclass(frozen=True)
class FleetConfig:
    """One Serve application: an ingress speaking the openpi wire in front of policy replicas.

    Replicas: ``replicas`` fixed, or autoscaled between ``min_replicas`` and ``max_replicas`` on queue length
    (``target_queue`` requests waiting or running per replica); each takes ``cpus_per_replica`` CPUs and
    ``gpus_per_replica`` GPUs (1: one replica per GPU) and runs a batching server (``max_batch`` robots per
    batch, ``batch_window_ms``, at most ``max_queue`` requests). ``routing``: ``affinity`` (each robot to the
    replica holding its prefixes, fleet/affinity.py, spilling past ``load_guard`` requests of imbalance) or
    ``power_of_two`` (Ray Serve's default); a robot silent for ``robot_idle_sec`` no longer counts in the balance.
    The ingress checks the API key read from ``api_key_file`` (a path on the machine the ingress runs on), holds
    up to ``max_connections`` robots, waits ``request_timeout_sec`` for a replica's reply; Serve's HTTP proxy
    listens on ``host``:``port``."""

    checkpoint: str
    replicas: int = 1
    min_replicas: Optional[int] = None
    max_replicas: Optional[int] = None
    target_queue: float = 4.0
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    device: str = 'auto'
    dtype: str = 'auto'
    tokenizer: Optional[str] = None
    cache_max_bytes: Optional[int] = None
    max_batch: int = 8
    batch_window_ms: float = DEFAULT_WINDOW_MS
    max_queue: int = 16
    max_message_mib: float = 64.0
    routing: str = 'affinity'
    load_guard: int = 8
    robot_idle_sec: float = 30.0
    api_key_file: Optional[str] = None
    max_connections: int = 256
    request_timeout_sec: float = 30.0
    ingress_cpus: float = 0.25
    host: str = '127.0.0.1'
    port: int = 8000
    name: str = 'vla_policy'

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> Optional[str]:
        if self.routing not in ROUTINGS:
            return f'routing must be one of {ROUTINGS}, got {self.routing!r}'
        if (self.min_replicas is None) != (self.max_replicas is None):
            return 'give both min_replicas and max_replicas (autoscaling) or neither (replicas)'
        if self.autoscaling and not (0 <= self.min_replicas <= self.max_replicas and self.max_replicas >= 1):
            return 'autoscaling needs 0 <= min_replicas <= max_replicas and max_replicas >= 1'
        if self.replicas < 1 or self.target_queue <= 0:
            return 'replicas must be >= 1 and target_queue > 0'
        if self.cpus_per_replica <= 0 or self.gpus_per_replica < 0 or self.ingress_cpus < 0:
            return 'cpus_per_replica must be > 0, gpus_per_replica and ingress_cpus >= 0'
        if not 1 <= self.max_batch <= self.max_queue or not 0 <= self.batch_window_ms <= 1000:
            return 'max_batch must be in [1, max_queue] and batch_window_ms in [0, 1000]'
        if not 0 < self.max_message_mib <= 1024 or self.load_guard < 1 or self.max_connections < 1:
            return 'max_message_mib must be in (0, 1024], load_guard and max_connections >= 1'
        if self.request_timeout_sec <= 0 or self.robot_idle_sec <= 0 or not 0 <= self.port < 65536:
            return 'request_timeout_sec and robot_idle_sec must be > 0 and port in [0, 65535]'
        return None

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None

    @property
    def max_message_bytes(self) -> int:
        return int(self.max_message_mib * 2**20)

    def as_args(self) -> Dict[str, Any]:
        """The fields that differ from the defaults (a Serve config file's ``args``)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return {name: value for name, value in dataclasses.asdict(self).items() if value != defaults.get(name)}

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> 'FleetConfig':
        """From a Serve config's ``args`` or ``serve run ... key=value`` (strings converted by the field's type)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(args) - set(fields))
        if unknown:
            raise ValueError(f'unknown fleet option(s) {unknown}; known: {sorted(fields)}')
        values = {}
        for name, value in args.items():
            kind = str(fields[name].type)
            if isinstance(value, str) and value.lower() in ('', 'none', 'null') and 'Optional' in kind:
                value = None
            elif isinstance(value, str) and kind.startswith(('int', 'Optional[int]')):
                value = int(value)
            elif isinstance(value, str) and kind.startswith('float'):
                value = float(value)
            values[name] = value
        return cls(**values)
