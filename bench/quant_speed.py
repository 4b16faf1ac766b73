"""CPU speed of the ``quantization`` modes: miss and hit of fp32 against int8_weights (and any --modes), the
runtimes interleaved run by run so that the load of a shared machine falls on all of them alike; plus the
int8 kernels torch offers on the CPU, one GEMM each (--kernels).

    python bench/quant_speed.py                          # tiny, pi0_shallow (full widths, --depth layers), smolvla
    python bench/quant_speed.py --quick                  # tiny and smolvla_tiny, 3 runs
    python bench/quant_speed.py --presets smolvla --modes none,int8_weights,fp8 --kernels

Weights random (bench_runtime.random_runtime: the same weights for every mode), three 640x480 rgb8 frames; a
miss changes one image byte, a hit repeats the observation (and must equal its miss: checked). Prints medians
and the ratio to fp32's. Not a test: nothing is asserted about time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / 'bench'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from bench_runtime import FRAME_HEIGHT, FRAME_WIDTH, INSTRUCTION, camera_frames, random_runtime  # noqa: E402
from vla_policy_node.images import RawImage  # noqa: E402
from vla_policy_node.observation import Observation  # noqa: E402
from vla_policy_node.policy.quant import int8_rows  # noqa: E402


def miss_and_hit(runtime, i: int) -> Dict[str, float]:
    config = runtime.config
    frames = camera_frames(config.camera_names, seed=1)
    name = config.camera_names[0]
    data = bytearray(frames[name].data)
    data[0] = (i * 7 + 1) % 256
    frames[name] = RawImage(FRAME_HEIGHT, FRAME_WIDTH, 'rgb8', FRAME_WIDTH * 3, False, bytes(data))
    observation = Observation(frames, np.zeros(config.state_dim), INSTRUCTION)
    runtime.cache.clear()
    miss = runtime.infer(observation, seed=0)
    hit = runtime.infer(observation, seed=0)
    if miss.cache_hit or not hit.cache_hit or not np.array_equal(miss.actions, hit.actions):
        raise SystemExit('a hit returned different actions from its miss: the cache is broken')
    return {'miss': miss.total_ms, 'hit': hit.total_ms}


def bench_preset(preset: str, modes: List[str], depth: int, runs: int, warmup: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        runtimes = {mode: random_runtime(preset, torch.device('cpu'), torch.float32, Path(scratch), depth,
                                         quantization=mode) for mode in modes}
        times: Dict[str, Dict[str, List[float]]] = {mode: {'miss': [], 'hit': []} for mode in modes}
        for i in range(warmup + runs):
            for mode, runtime in runtimes.items():          # interleaved: run i of every mode back to back
                figures = miss_and_hit(runtime, i)
                if i >= warmup:
                    for kind, value in figures.items():
                        times[mode][kind].append(value)
        config = runtimes[modes[0]].config
        print(f'\n{preset}: {config.num_prefix_layers} prefix layers, {len(config.camera_names)} cameras, chunk '
              f'{config.chunk_size}, {runtimes[modes[0]].num_steps} steps; median of {runs} runs')
        base = {kind: statistics.median(times[modes[0]][kind]) for kind in ('miss', 'hit')}
        for mode in modes:
            described = runtimes[mode].describe()
            line = ', '.join(f'{kind} {statistics.median(times[mode][kind]):8.1f} ms '
                             f'({statistics.median(times[mode][kind]) / base[kind]:.2f}x)' for kind in ('miss', 'hit'))
            print(f'  {mode:13} {line}; weights {described["weight_bytes"] / 2**20:,.1f} MiB '
                  f'({described["quantization_kernel"]})')


def _median_ms(fn, repeats: int = 15) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def bench_kernels() -> None:
    """One GEMM per kernel at SmolVLA's expert shape (50 rows) and a prefix-like shape; error relative to fp32."""
    print('\nint8 kernels on this CPU, one GEMM, median ms (max |err| / max |fp32 out|):')
    for rows, k, n in ((50, 720, 2048), (50, 960, 2560), (256, 1024, 4096)):
        generator = torch.Generator().manual_seed(0)
        x, w = torch.randn(rows, k, generator=generator), torch.randn(n, k, generator=generator)
        q, scale = int8_rows(w)                   # one scale per row: what torch's packed kernels take
        scale = scale[:, 0]
        reference = F.linear(x, w)
        kernels = {
            'fp32 F.linear': lambda: F.linear(x, w),
            'int8 dequantize + F.linear (per row)': lambda: F.linear(x, q * scale[:, None]),
            'bf16 F.linear': lambda: F.linear(x.bfloat16(), w.bfloat16()),
            'torch._weight_int8pack_mm (bf16 act.)':
                lambda: torch._weight_int8pack_mm(x.bfloat16(), q, scale.bfloat16()),
        }
        if rows <= 64:
            kernels['torch._weight_int8pack_mm (fp32 act.)'] = lambda: torch._weight_int8pack_mm(x, q, scale)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')
                zero_points = torch.zeros(n, dtype=torch.long)
                quantized = torch._make_per_channel_quantized_tensor(q, scale.double(), zero_points, 0)
                packed = torch.ops.quantized.linear_prepack(quantized, None)
            kernels['quantized.linear_dynamic (int8 act./tensor)'] = (
                lambda: torch.ops.quantized.linear_dynamic(x, packed, True))
        except (RuntimeError, AttributeError) as exc:
            print(f'  quantized.linear_dynamic unavailable: {exc}')
        print(f'  [{rows} x {k}] @ [{k} x {n}]')
        for label, kernel in kernels.items():
            error = float((kernel().float() - reference).abs().max() / reference.abs().max())
            print(f'    {label:44} {_median_ms(kernel):8.2f} ms   {error:.2e}')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--presets', default='tiny,pi0_shallow,smolvla')
    parser.add_argument('--modes', default='none,int8_weights')
    parser.add_argument('--depth', type=int, default=2, help='layers per tower for pi0_shallow')
    parser.add_argument('--runs', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--kernels', action='store_true', help='also time the int8 GEMM kernels one by one')
    parser.add_argument('--quick', action='store_true', help='tiny and smolvla_tiny, 3 runs')
    args = parser.parse_args(argv)
    if args.quick:
        args.presets, args.runs = 'tiny,smolvla_tiny', 3
    torch.set_num_threads(args.threads)
    modes = [mode.strip() for mode in args.modes.split(',') if mode.strip()]
    print(f'torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, fp32 compute; modes {modes} '
          f'(ratios against {modes[0]})')
    for preset in [p.strip() for p in args.presets.split(',') if p.strip()]:
        bench_preset(preset, modes, args.depth, args.runs, args.warmup)
    if args.kernels:
        bench_kernels()
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
