"""Real-time chunking benchmark: hand-over smoothness on the sample bag, and what guidance costs.

    python bench/bench_rtc.py                 # tiny pi0 + the demo's 6 s sample bag, CPU (about a minute)
    python bench/bench_rtc.py --no-replay --device cuda --dtype bfloat16 --presets pi0   # guidance cost on a GPU
    python bench/bench_rtc.py --quick         # 2 s bag, one latency, tiny only, 3 runs (the suite's smoke run)
    python bench/bench_rtc.py --handover-only # part 1 only: the table docs/control.md shows (deterministic)

1. The demo's sample bag through vla_policy_replay (the node's own tick) with
   chunking independent and rtc, at several simulated latencies: the hand-over
   jump (largest per-joint step between where the old trajectory would be and
   where the new one starts) and the mean disagreement over the overlap, p50/p95,
   in radians.
2. The denoise stage on a cache hit with and without guidance (same observation,
   a leftover of the chunk length): medians and the extra time in percent, for
   the tiny model and the pi0-shaped one (full widths, --depth layers).
Random weights; the figures are about the mechanism, not a task. Not a test.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / 'bench'):       # bench/ too when run other than as a script (test_docs reads --help)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from bench_runtime import camera_frames, random_runtime  # noqa: E402
from vla_policy_node.observation import Observation  # noqa: E402
from vla_policy_node.policy.rtc import RTCSettings  # noqa: E402
from vla_policy_node.runtime import resolve_device, resolve_dtype  # noqa: E402

DEMO_PARAMS = ROOT / 'config' / 'demo.yaml'


def handover_table(work: Path, latencies_ms, duration_sec: float) -> None:
    # The replay needs rosbags; imported here so --no-replay runs where only torch is installed.
    from vla_policy_node.policy.tiny_default import write_tiny_default
    from vla_policy_node.replay.make_bag import SampleBagSpec, write_sample_bag
    from vla_policy_node.replay.offline import replay

    checkpoint = write_tiny_default(work / 'tiny_pi0')
    bag = write_sample_bag(work / 'bag', SampleBagSpec(duration_sec=duration_sec))
    print(f'hand-over on a {duration_sec:g} s sample bag (tiny pi0, 10 Hz ticks, 0.1 s actions, execute_steps 10), '
          'radians:')
    print('| latency | chunking | hand-overs | jump p50 | jump p95 | overlap p50 | overlap p95 | continued |')
    print('|---|---|---|---|---|---|---|---|')
    for latency in latencies_ms:
        for chunking in ('independent', 'rtc'):
            result = replay(bag, DEMO_PARAMS, work / f'out_{chunking}_{latency}', checkpoint=str(checkpoint),
                            overrides={'chunking': chunking, 'execute_steps': 10}, latency_ms=latency)
            handover = result.summary['handover']
            jump, overlap = handover['jump_max'], handover['overlap_mean']
            print(f"| {latency:g} ms | {chunking} | {handover['count']} | {jump['p50']:.4f} | {jump['p95']:.4f} | "
                  f"{overlap['p50']:.4f} | {overlap['p95']:.4f} | {result.summary['chunks_continued']} |")


def guidance_cost(preset_name: str, depth: int, runs: int, scratch: Path, device: torch.device,
                  dtype: torch.dtype) -> None:
    runtime = random_runtime(preset_name, device, dtype, scratch, depth)
    config = runtime.config
    observation = Observation(camera_frames(config.camera_names, seed=1), np.zeros(config.state_dim),
                              'pick up the red block')
    leftover = np.random.default_rng(0).normal(size=(config.chunk_size - 2, config.action_dim))
    rtc = RTCSettings(execution_horizon=10)
    runtime.infer(observation, seed=0)                                    # fill the cache: every run below hits
    plain, guided = [], []
    for _ in range(runs):
        plain.append(runtime.infer(observation, seed=0).timings_ms['denoise'])
        chunk = runtime.infer(observation, seed=0, prev_chunk_left_over=leftover, inference_delay=2, rtc=rtc)
        assert chunk.cache_hit and chunk.continued
        guided.append(chunk.timings_ms['denoise'])
    p, g = statistics.median(plain), statistics.median(guided)
    layers = runtime.config.num_prefix_layers
    print(f'| {preset_name} ({layers} layers) | {p:.2f} ms | {g:.2f} ms | {100 * (g - p) / p:+.1f}% |')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--latencies-ms', default='0,150,250', help='simulated latencies for the replay')
    parser.add_argument('--runs', type=int, default=20, help='denoise timing runs per config')
    parser.add_argument('--depth', type=int, default=2, help='layers of the pi0-shaped config')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--no-replay', action='store_true', help='only the guidance cost (no bag, no rosbags)')
    parser.add_argument('--handover-only', action='store_true', help='only the hand-over table (deterministic: '
                        'test/test_doc_figures.py holds docs/control.md to it)')
    parser.add_argument('--presets', default='tiny,pi0_shallow', help='configs for the guidance cost')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--dtype', default='float32')
    parser.add_argument('--quick', action='store_true', help='a 2 s bag, latency 150 ms only, tiny only, 3 runs')
    args = parser.parse_args(argv)
    duration = 6.0
    if args.quick:
        duration, args.latencies_ms, args.presets, args.runs = 2.0, '150', 'tiny', 3
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        if not args.no_replay:
            handover_table(work, [float(v) for v in args.latencies_ms.split(',')], duration)
        if args.handover_only:
            return 0
        print(f'\ndenoise stage on a cache hit, median of {args.runs} runs ({device}, {dtype}):')
        print('| config | plain | guided | extra |')
        print('|---|---|---|---|')
        for name in args.presets.split(','):
            runs = args.runs if name == 'tiny' or device.type == 'cuda' else max(3, args.runs // 4)
            guidance_cost(name, args.depth, runs, work, device, dtype)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
