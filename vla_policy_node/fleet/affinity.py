"""Which replica serves which robot: robot-affine, balanced, with a load guard and failover (no Ray here).

A robot's prefix cache entries live on the replica that computed them, so its requests should keep going there:

- a robot seen for the first time (or whose replica is gone: failover) goes to the live replica serving the
  fewest active robots (ties: the shorter queue, then a hash of robot and replica, so every router agrees);
- then it stays there while that replica lives, for every request (its hits stay hits);
- load guard: when its replica's queue is longer than the shortest queue by more than ``load_guard`` requests,
  this one request goes to the least loaded replica instead (a miss there, but no robot waits behind a
  backlog); the robot keeps its replica;
- robots not seen for ``idle_sec`` no longer count as active and are forgotten; the table holds ``max_robots`` at
  most (the least recently seen go first), however many names clients send.

A robot's name comes from the client (the ingress's ``?robot=``): ``robot_name`` admits short plain names only, so
none can grow the table's memory or forge a log line.

``rank`` answers one request: replica ids best first. The Ray Serve request router (fleet/router.py) asks it;
the benchmark (bench/bench_fleet.py) routes with it as well.
"""
from __future__ import annotations

import collections
import re
import threading
import time
import zlib
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

DEFAULT_LOAD_GUARD = 8
DEFAULT_IDLE_SEC = 30.0      # a node asks every control tick, holding or not: 30 s of silence is a robot gone
MAX_ROBOTS = 100_000
MAX_ROBOT_NAME = 128
_ROBOT_NAME = re.compile(r'[A-Za-z0-9._:@-]+')


def robot_name(requested: str) -> str:
    """``requested`` when it names a robot: 1 to MAX_ROBOT_NAME characters of letters, digits and ``._:@-``;
    ValueError saying so otherwise."""
    if not 0 < len(requested) <= MAX_ROBOT_NAME or not _ROBOT_NAME.fullmatch(requested):
        raise ValueError(f'the robot name (?robot=, {len(requested)} characters) is not 1 to {MAX_ROBOT_NAME} '
                         'letters, digits or ._:@- characters')
    return requested


class AffinityTable:
    """robot -> replica id, as the module docstring says. Thread-safe."""

    def __init__(self, load_guard: int = DEFAULT_LOAD_GUARD, idle_sec: float = DEFAULT_IDLE_SEC,
                 clock: Callable[[], float] = time.monotonic, max_robots: int = MAX_ROBOTS) -> None:
        if load_guard < 1 or idle_sec <= 0 or max_robots < 1:
            raise ValueError('load_guard must be >= 1, idle_sec > 0 and max_robots >= 1')
        self.load_guard = int(load_guard)
        self.idle_sec = float(idle_sec)
        self.max_robots = int(max_robots)
        self._clock = clock
        # robot -> (replica id, last seen); oldest first
        self._robots: 'collections.OrderedDict[str, Tuple[str, float]]' = collections.OrderedDict()
        self._lock = threading.Lock()
        self.spills = 0          # requests the load guard sent elsewhere
        self.failovers = 0       # robots moved because their replica was gone

    def rank(self, robot: str, replicas: Sequence[str],
             queue_lengths: Optional[Mapping[str, Optional[int]]] = None) -> List[str]:
        """The live ``replicas`` for this request of ``robot``, best first. ``queue_lengths``: what the caller
        knows of each replica's queue (None or missing: unknown, taken as empty)."""
        if not replicas:
            return []
        lengths = {replica: int((queue_lengths or {}).get(replica) or 0) for replica in replicas}
        now = self._clock()
        with self._lock:
            self._forget_idle(now)
            assigned = self._robots.get(robot)
            if assigned is not None and assigned[0] in lengths:
                home = assigned[0]
            else:
                if assigned is not None:
                    self.failovers += 1
                home = self._least_robots(robot, replicas, lengths, now)
            self._robots[robot] = (home, now)
            self._robots.move_to_end(robot)
            while len(self._robots) > self.max_robots:
                self._robots.popitem(last=False)
            counts = self._active_counts(now)
        others = sorted((r for r in replicas if r != home), key=lambda r: (lengths[r], counts.get(r, 0),
                                                                           _tiebreak(robot, r)))
        if others and lengths[home] - lengths[others[0]] > self.load_guard:
            self.spills += 1
            return [others[0], home] + others[1:]
        return [home] + others

    def home(self, robot: str) -> Optional[str]:
        """The replica ``robot`` is assigned to, or None."""
        with self._lock:
            entry = self._robots.get(robot)
        return None if entry is None else entry[0]

    def robots_per_replica(self) -> Dict[str, int]:
        """Active robots per replica id."""
        with self._lock:
            return self._active_counts(self._clock())

    def _least_robots(self, robot: str, replicas: Sequence[str], lengths: Mapping[str, int], now: float) -> str:
        counts = self._active_counts(now)
        return min(replicas, key=lambda r: (counts.get(r, 0), lengths[r], _tiebreak(robot, r)))

    def _active_counts(self, now: float) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for replica, seen in self._robots.values():
            if now - seen <= self.idle_sec:
                counts[replica] = counts.get(replica, 0) + 1
        return counts

    def _forget_idle(self, now: float) -> None:
        while self._robots:
            robot, (_, seen) = next(iter(self._robots.items()))
            if now - seen <= self.idle_sec:
                return
            del self._robots[robot]


def _tiebreak(robot: str, replica: str) -> int:
    """A hash of (robot, replica) that every process computes alike (Python's str hash is salted per process)."""
    return zlib.crc32(f'{robot}\0{replica}'.encode())
