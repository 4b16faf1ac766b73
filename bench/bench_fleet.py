"""Many robots, one model: batching in one server, and robot-affine routing over two replicas (prints, never asserts).

    python bench/bench_fleet.py [--robots 1,2,4,8] [--rate-hz 10] [--seconds 10] [--repeats 3] [--new-frames-every 20]
    python bench/bench_fleet.py --quick      # robots 1,8, 2 s each, small frames (a smoke run)

1. Batching. ``vla_policy_serve`` in its own process on 127.0.0.1, serial (``--max-batch 1``, the default) and
   batching (``--max-batch 8 --batch-window-ms 2``). N robots (one asyncio client each, one process) send a new
   state every request (the joints move) with the same frames, new frames every ``--new-frames-every`` requests
   (a miss), one request in flight per robot:
   a. at the control rate (``--rate-hz``, the node's control_rate_hz default 10; each robot at its own phase; a
      robot whose reply is late sends at its next tick): p50/p95 latency (send -> reply);
   b. saturated (each robot sends again as soon as its reply is in): replies per second, the server's capacity.
   Goals at N = 8 (CPU): throughput (b) >= 2x serial; p95 (a) <= 1.5x one robot's (N = 1, same server).
2. Routing. The same traffic (N robots, frames changing as above, robots in a shuffled order every round) over
   two replicas (two runtimes with their own prefix caches, in this process): robot-affine routing
   (fleet/affinity.AffinityTable, what the fleet's Ray Serve request router asks) against round-robin.
   Goal: affine hit rate >= 0.9, round-robin lower.

The model is the tiny pi0 (random weights) in fp32 on the CPU: its chunk costs about what the wire and Python
cost, which is where batching many robots pays on a CPU; on a GPU a real model's denoise batches as well.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vla_policy_node.fleet.affinity import AffinityTable  # noqa: E402
from vla_policy_node.observation import Observation  # noqa: E402
from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402
from vla_policy_node.runtime import PolicyRuntime, set_cpu_threads  # noqa: E402
from vla_policy_node.wire import codec  # noqa: E402
from serve_process import start_server  # noqa: E402

CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb')
STATE_DIM = 6
BATCHING = ['--max-batch', '8', '--batch-window-ms', '2']
QUEUE = ['--max-queue', '16']


class Traffic:
    """Robot ``robot``'s requests: the state moves every request, the frames change every ``every`` requests (to
    frames no server has seen: each run draws from its own ``run`` number, so a warm cache cannot hide a miss)."""

    RUNS = itertools.count()

    def __init__(self, robot: int, size: Sequence[int], every: int) -> None:
        self.rng = np.random.default_rng([robot, next(self.RUNS)])
        self.size, self.every, self.robot = tuple(size), every, robot
        self.count = 0
        self.frames: Dict[str, np.ndarray] = {}

    def next(self) -> Observation:
        if self.count % self.every == 0:
            self.frames = {name: self.rng.integers(0, 256, size=(*self.size, 3), dtype=np.uint8) for name in CAMERAS}
        state = np.sin(0.1 * self.count + np.arange(STATE_DIM) + self.robot) * 0.3
        self.count += 1
        return Observation(self.frames, state, f'task {self.robot}')

    def message(self) -> bytes:
        observation = self.next()
        return codec.packb({'images': observation.images, 'state': observation.state,
                            'prompt': observation.instruction, 'seed': self.robot})


async def robot_loop(port: int, traffic: Traffic, period: float, until: float, warm_until: float,
                     latencies: List[float], hits: List[bool]) -> None:
    """``period`` 0: saturated (the next request as soon as the reply is in)."""
    async with connect(f'ws://127.0.0.1:{port}/', compression=None, max_size=1 << 26) as ws:
        await ws.recv()                                       # metadata
        next_tick = time.monotonic() + random.Random(traffic.robot).random() * period    # the robot's own phase
        while True:
            now = time.monotonic()
            if now >= until:
                return
            if now < next_tick:
                await asyncio.sleep(next_tick - now)
            payload = traffic.message()                      # encoded outside the timed span, as a node does
            sent = time.monotonic()
            await ws.send(payload)
            reply = await ws.recv()
            done = time.monotonic()
            if isinstance(reply, str):
                raise SystemExit(f'server error: {reply[:300]}')
            if sent >= warm_until:
                latencies.append((done - sent) * 1e3)
                hits.append(bool(codec.unpackb(reply, 1 << 26).get('cache_hit')))
            next_tick += period
            if period and done > next_tick:                   # late: the first tick after the reply
                next_tick += np.ceil((done - next_tick) / period) * period


def run_robots(port: int, robots: int, rate_hz: float, seconds: float, size, every: int) -> Dict[str, float]:
    latencies: List[float] = []
    hits: List[bool] = []

    async def main() -> float:
        start = time.monotonic()
        warm_until = start + min(1.0, seconds / 3)
        until = warm_until + seconds
        period = 1.0 / rate_hz if rate_hz > 0 else 0.0
        await asyncio.gather(*(robot_loop(port, Traffic(r, size, every), period, until, warm_until,
                                          latencies, hits) for r in range(robots)))
        return until - warm_until

    span = asyncio.run(main())
    values = np.asarray(latencies)
    return {'throughput': len(values) / span, 'p50': float(np.percentile(values, 50)),
            'p95': float(np.percentile(values, 95)), 'hit_rate': float(np.mean(hits))}


def batching_table(checkpoint: Path, work: Path, counts: Sequence[int], rate_hz: float, seconds: float, size,
                   every: int, repeats: int) -> None:
    print(f'1. one server, N robots (one request in flight each), 2 x {size[0]}x{size[1]} rgb8, new frames every '
          f'{every} requests; tiny pi0 fp32, 10 steps, server 1 thread, CPU; medians of {repeats} run(s) of '
          f'{seconds:g} s, the two servers taking turns')
    print(f'{"N":>3} {"server":<10} {"load":<10} {"replies/s":>10} {"p50 ms":>8} {"p95 ms":>8} {"hit rate":>9}')
    runs: Dict[Tuple[str, str, int], List[Dict[str, float]]] = {}
    loads = ((f'{rate_hz:g} Hz', rate_hz), ('saturated', 0.0))
    servers = {mode: start_server(checkpoint, work / f'serve_{mode}.log', QUEUE + extra)
               for mode, extra in (('serial', []), ('batching', BATCHING))}
    try:
        for load, rate in loads:
            for robots in counts:
                for _ in range(repeats):          # alternating, so a slow spell of the machine hits both
                    for mode, (_, port) in servers.items():
                        runs.setdefault((mode, load, robots), []).append(
                            run_robots(port, robots, rate, seconds, size, every))
                for mode in servers:
                    cells = {name: float(np.median([run[name] for run in runs[(mode, load, robots)]]))
                             for name in ('throughput', 'p50', 'p95', 'hit_rate')}
                    runs[(mode, load, robots)] = [cells]
                    print(f'{robots:>3} {mode:<10} {load:<10} {cells["throughput"]:>10.1f} {cells["p50"]:>8.2f} '
                          f'{cells["p95"]:>8.2f} {cells["hit_rate"]:>9.2f}', flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(10)
    top, one, rated = max(counts), min(counts), loads[0][0]

    def ratio(mode, load, figure, other=None):
        base = runs[(other, load, top)] if other else runs[(mode, load, one)]
        return runs[(mode, load, top)][0][figure] / base[0][figure]

    print(f'N = {top}: throughput (saturated) batching / serial = '
          f'{ratio("batching", "saturated", "throughput", "serial"):.2f}x (goal >= 2x); p95 at {rated} N = {top} '
          f'/ N = {one}: batching {ratio("batching", rated, "p95"):.2f}x (goal <= 1.5x), serial '
          f'{ratio("serial", rated, "p95"):.2f}x')


def routing_table(checkpoint: Path, counts: Sequence[int], rounds: int, size, every: int) -> None:
    print(f'2. two replicas (own prefix caches), N robots in a shuffled order each round, {rounds} rounds, new '
          f'frames every {every} requests')
    print(f'{"N":>3} {"routing":<12} {"hit rate":>9}')
    rates = {}
    for robots in counts:
        for routing in ('affinity', 'round-robin'):
            replicas = {name: PolicyRuntime.from_pretrained(checkpoint, device='cpu', dtype='float32')
                        for name in ('replica-a', 'replica-b')}
            table, turn = AffinityTable(), 0
            traffic = [Traffic(r, size, every) for r in range(robots)]
            order = random.Random(robots)
            hits = []
            for _ in range(rounds):
                robots_now = list(range(robots))
                order.shuffle(robots_now)
                for robot in robots_now:
                    if routing == 'affinity':
                        replica = table.rank(f'robot{robot}', list(replicas))[0]
                    else:
                        replica, turn = list(replicas)[turn % 2], turn + 1
                    hits.append(replicas[replica].infer(traffic[robot].next(), seed=robot, num_steps=1).cache_hit)
            rates[(robots, routing)] = float(np.mean(hits))
            print(f'{robots:>3} {routing:<12} {rates[(robots, routing)]:>9.2f}', flush=True)
    top = max(counts)
    print(f'N = {top}: hit rate affinity {rates[(top, "affinity")]:.2f} (goal >= 0.9), round-robin '
          f'{rates[(top, "round-robin")]:.2f} (goal: lower)')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--robots', default='1,2,4,8', help='robot counts, comma-separated')
    parser.add_argument('--rate-hz', type=float, default=10.0, help='each robot\'s control rate (control_rate_hz)')
    parser.add_argument('--seconds', type=float, default=10.0, help='measured seconds per row (after a warm-up)')
    parser.add_argument('--new-frames-every', type=int, default=20, help='requests between new camera frames')
    parser.add_argument('--repeats', type=int, default=3, help='runs per row (the median is printed)')
    parser.add_argument('--rounds', type=int, default=100, help='routing table: requests per robot')
    parser.add_argument('--size', default='240x320', help='camera frame HxW')
    parser.add_argument('--quick', action='store_true', help='robots 1,8; one 2 s run per row; 48x64 frames; '
                        '40 rounds')
    args = parser.parse_args(argv)
    if args.quick:
        args.robots, args.seconds, args.size, args.rounds, args.repeats = '1,8', 2.0, '48x64', 40, 1
    counts = sorted(int(n) for n in args.robots.split(','))
    size = tuple(int(v) for v in args.size.split('x'))
    set_cpu_threads(1)
    work = Path(tempfile.mkdtemp(prefix='bench_fleet_'))
    checkpoint = write_tiny_default(work / 'tiny_pi0', 'pi0')
    batching_table(checkpoint, work, counts, args.rate_hz, args.seconds, size, args.new_frames_every, args.repeats)
    routing_table(checkpoint, counts, args.rounds, size, args.new_frames_every)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
