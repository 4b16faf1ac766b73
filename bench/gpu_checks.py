"""Every GPU check of issue 17 in one run, for a machine with a CUDA device: what the CPU suite cannot show.

    python bench/gpu_checks.py                        # everything, a few minutes on an H200
    python bench/gpu_checks.py --quick                # fewer runs, no full-size presets
    python bench/gpu_checks.py --device cpu --quick   # the CPU-runnable parts (static workspace, no graphs)

Without a CUDA device (and without --device cpu) it prints ``skipped: needs a CUDA device`` and exits with 2.

Correctness, on the tiny pi0 / pi0.5 / SmolVLA checkpoints in fp32 and bf16 (exit status 1 when one fails):
- graph vs eager: max |actions| difference between cuda_graphs on and off, plain and with RTC;
- hit == miss (bit for bit) through the graphs, plain and with RTC;
- the stored prefix untouched after 100 chunks replayed against it;
- A/B/A alternation of two entries through the graph's workspace == fresh eager misses (no stale K/V);
- bf16 error vs fp32 through the graphs not larger than eager's;
- prompt buckets: max difference of a bucketed prompt against the unpadded one (reported).
Figures (printed, never asserted):
- p50/p95 latency table (CUDA events: ActionChunk.timings_ms with timings_clock 'cuda_events'), miss and hit,
  eager and graph, for tiny, pi0 and pi0.5 (random weights, full size) at 3 cameras and SmolVLA (its preset's
  2 cameras), 10 steps; issue 17
  targets on an H200 in bf16 for pi0: hit <= 8 ms, miss <= 25 ms;
- the denoise's achieved GB/s (expert weights + K/V read per step) and its ratio to the H200 floor
  (1.3 ms for pi0, ../shared/reference/gpu-fast-path.md);
- kernel lever: the hit's denoise with torch.backends.cuda.preferred_blas_library('cublaslt') against the
  default (what pays is reported, including what does not).
--json writes everything.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / 'bench'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from vla_policy_node.observation import Observation  # noqa: E402
from vla_policy_node.policy.families import known_types  # noqa: E402
from vla_policy_node.policy.rtc import RTCSettings  # noqa: E402
from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402
from vla_policy_node.runtime import PolicyRuntime  # noqa: E402

H200_BYTES_PER_S = 4.8e12
RTC = RTCSettings(execution_horizon=6)


def observation(config, seed: int, instruction: str = 'pick up the red block') -> Observation:
    rng = np.random.default_rng(seed)
    images = {name: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for name in config.camera_names}
    return Observation(images, rng.normal(0, 0.3, config.state_dim), instruction)


def leftover(config) -> np.ndarray:
    return np.linspace(-0.3, 0.3, 8 * config.action_dim).reshape(8, -1)


def fast_options(device: str) -> Dict[str, object]:
    """The fast path as this device runs it: graphs on CUDA, the static workspace eagerly elsewhere."""
    return {'cuda_graphs': 'auto'} if device == 'cuda' else {'static_workspace': True}


class Checks:
    def __init__(self) -> None:
        self.failures: List[str] = []
        self.figures: Dict[str, object] = {}

    def check(self, name: str, ok: bool, detail: str = '') -> None:
        print(f'  [{"ok" if ok else "FAIL"}] {name}' + (f': {detail}' if detail else ''))
        if not ok:
            self.failures.append(name)


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def correctness(checks: Checks, device: str, scratch: Path) -> None:
    for policy_type in known_types():
        folder = write_tiny_default(scratch / policy_type, policy_type)
        errors: Dict[str, Dict[str, float]] = {}
        for dtype in ('float32', 'bfloat16'):
            print(f'{policy_type} {dtype} on {device}:')
            eager = PolicyRuntime.from_pretrained(folder, device=device, dtype=dtype)
            fast = PolicyRuntime.from_pretrained(folder, device=device, dtype=dtype, **fast_options(device))
            cfg = fast.config
            obs_a, obs_b = observation(cfg, 1), observation(cfg, 2, 'put the cube in the box')
            rtc = dict(prev_actions=leftover(cfg), inference_delay=2, rtc=RTC)
            ref = {(name, mode): eager.infer(obs, seed=3, use_cache=False, **extra).actions
                   for name, obs in (('A', obs_a), ('B', obs_b)) for mode, extra in (('plain', {}), ('rtc', rtc))}
            # graph vs eager, hit == miss
            for mode, extra in (('plain', {}), ('rtc', rtc)):
                fast.cache.clear()
                miss = fast.infer(obs_a, seed=3, **extra)
                hit = fast.infer(obs_a, seed=3, **extra)
                diff = max_diff(miss.actions, ref[('A', mode)])
                checks.figures[f'{policy_type}/{dtype}/{mode}/graph_vs_eager_max_diff'] = diff
                checks.check(f'graph vs eager ({mode})', diff <= (1e-5 if dtype == 'float32' else 2e-2),
                             f'max |diff| {diff:.3g}')
                checks.check(f'hit == miss ({mode})', hit.cache_hit and np.array_equal(hit.actions, miss.actions))
            # prefix untouched after 100 chunks
            fast.cache.clear()
            first = fast.infer(obs_a, seed=3)
            stored = fast.cache.get(first.key)['kv'].clone()
            for i in range(100):
                fast.infer(obs_a, seed=i, **(rtc if i % 2 else {}))
            checks.check('prefix untouched after 100 chunks', torch.equal(stored, fast.cache.get(first.key)['kv']))
            # A/B/A alternation == fresh eager
            ok = True
            for name, obs in (('A', obs_a), ('B', obs_b), ('A', obs_a), ('B', obs_b), ('A', obs_a)):
                for mode, extra in (('plain', {}), ('rtc', rtc)):
                    got = fast.infer(obs, seed=3, **extra).actions
                    ok &= max_diff(got, ref[(name, mode)]) <= (1e-5 if dtype == 'float32' else 2e-2)
            checks.check('A/B/A alternation through the workspace == fresh misses', ok)
            errors[dtype] = {'eager': ref[('A', 'plain')], 'graph': fast.infer(obs_a, seed=3).actions}
            # prompt buckets: the bucketed prompt against the unpadded one
            valid = int(fast._prepare(obs_a).token_mask.sum())
            bucketed = PolicyRuntime.from_pretrained(folder, device=device, dtype=dtype, prompt_buckets=[valid],
                                                     **fast_options(device))
            bucket_diff = max_diff(bucketed.infer(obs_a, seed=3).actions, ref[('A', 'plain')])
            checks.figures[f'{policy_type}/{dtype}/bucket_max_diff'] = bucket_diff
            print(f'  prompt bucket {valid} of {cfg.tokenizer_max_length}: max |diff| vs unpadded {bucket_diff:.3g}')
            summary = fast.fast_path_summary()
            checks.figures[f'{policy_type}/{dtype}/fast_path'] = summary
            print(f'  fast path: {summary}')
            if device == 'cuda':
                checks.check('the graphs were captured and replayed (no eager fallback)',
                             summary['graph_replays'] > 0 and summary['graph_capture_failures'] == 0
                             and summary['prefix_capture_failures'] == 0)
        eager_err = max_diff(errors['bfloat16']['eager'], errors['float32']['eager'])
        graph_err = max_diff(errors['bfloat16']['graph'], errors['float32']['eager'])
        checks.figures[f'{policy_type}/bf16_error'] = {'eager': eager_err, 'graph': graph_err}
        checks.check(f'{policy_type}: bf16 error vs fp32 through the graph <= eager\'s',
                     graph_err <= eager_err * 1.0001 + 1e-7, f'graph {graph_err:.3g}, eager {eager_err:.3g}')


def percentiles(values: List[float]) -> Dict[str, float]:
    return {'p50': float(np.percentile(values, 50)), 'p95': float(np.percentile(values, 95))}


def latency(runtime: PolicyRuntime, runs: int, warmup: int) -> Dict[str, Dict[str, Dict[str, float]]]:
    """Per stage p50/p95 (the chunk's own timings: CUDA events on CUDA), miss and hit."""
    from bench_runtime import camera_frames, INSTRUCTION   # bench/ is on sys.path
    cfg = runtime.config
    state = np.zeros(cfg.state_dim)
    samples: Dict[str, List[Dict[str, float]]] = {'miss': [], 'hit': []}
    for i in range(warmup + runs):
        # New 640x480 frames each run: a miss, then the same observation again: a hit.
        obs = Observation(camera_frames(cfg.camera_names, seed=100 + i), state, INSTRUCTION)
        miss = runtime.infer(obs, seed=0)
        hit = runtime.infer(obs, seed=0)
        if i >= warmup:
            samples['miss'].append(dict(miss.timings_ms, total=miss.total_ms))
            samples['hit'].append(dict(hit.timings_ms, total=hit.total_ms))
    return {kind: {stage: percentiles([s[stage] for s in runs_]) for stage in runs_[0]}
            for kind, runs_ in samples.items()}


# Parameters the Euler loop reads every step (pi0/pi0.5: gemma_expert; SmolVLA: lm_expert), by name.
DENOISE_PARAMETERS = ('gemma_expert', 'lm_expert', 'action_in_proj', 'action_out_proj', 'action_time_mlp',
                      'time_mlp')


def denoise_bytes(runtime: PolicyRuntime, num_steps: int) -> int:
    """Bytes one denoise must read: the expert's and the action projections' parameters and the prefix K/V,
    once per step (the floor)."""
    weights = sum(p.numel() * p.element_size() for name, p in runtime.model.named_parameters()
                  if any(part in name for part in DENOISE_PARAMETERS))
    return num_steps * (weights + runtime.prefix_bytes())


def latency_table(checks: Checks, device: str, presets: List[str], runs: int, warmup: int) -> None:
    from bench_runtime import random_runtime
    torch_device = torch.device(device)
    dtype = torch.bfloat16 if device == 'cuda' else torch.float32
    print(f'\nlatency, {dtype}, 3 cameras, 10 steps, {runs} runs after {warmup} (ms, p50 / p95; clock: '
          f'{"CUDA events" if device == "cuda" else "host"}):')
    print(f"  {'preset':8} {'path':6} {'miss total':>16} {'miss prefix':>16} {'hit total':>16} {'hit denoise':>16}")
    with tempfile.TemporaryDirectory() as scratch:
        for name in presets:
            base = random_runtime(name, torch_device, dtype, Path(scratch), 2)
            fast_path = 'graph' if device == 'cuda' else 'static'
            for path, options in (('eager', {}), (fast_path, fast_options(device))):
                runtime = PolicyRuntime(base.policy, base.model_revision, **options)
                table = latency(runtime, runs, warmup)
                checks.figures[f'latency/{name}/{path}'] = table
                cells = [table['miss']['total'], table['miss']['prefix'], table['hit']['total'],
                         table['hit']['denoise']]
                print(f'  {name:8} {path:6} ' + ' '.join(f"{c['p50']:7.2f} / {c['p95']:6.2f}" for c in cells))
                nbytes = denoise_bytes(runtime, runtime.num_steps)
                rate = nbytes / (table['hit']['denoise']['p50'] * 1e-3)
                floor_ms = nbytes / H200_BYTES_PER_S * 1e3
                checks.figures[f'bandwidth/{name}/{path}'] = {'bytes': nbytes, 'gb_per_s': rate / 1e9,
                                                              'h200_floor_ms': floor_ms}
                print(f'  {"":8} {path:6} denoise reads {nbytes / 1e9:.3f} GB: {rate / 1e9:.1f} GB/s achieved; '
                      f'H200 floor {floor_ms:.2f} ms = {floor_ms / table["hit"]["denoise"]["p50"] * 100:.1f}% '
                      'of the hit denoise')
                runtime.close()
            if device == 'cuda' and name != 'tiny':
                blas_lever(checks, base, name, runs, warmup)
            del base
            if device == 'cuda':
                torch.cuda.empty_cache()


def blas_lever(checks: Checks, base: PolicyRuntime, name: str, runs: int, warmup: int) -> None:
    """Item 4's first lever: cuBLASLt for the skinny (~50-row) GEMMs of the denoise, graph path, hit denoise."""
    backends = getattr(torch.backends.cuda, 'preferred_blas_library', None)
    if backends is None:
        print('  preferred_blas_library: not in this torch')
        return
    default = backends()
    for library in ('cublaslt', 'cublas'):
        try:
            backends(library)
            runtime = PolicyRuntime(base.policy, base.model_revision, **fast_options('cuda'))
            table = latency(runtime, runs, warmup)
            runtime.close()
        except Exception as exc:  # noqa: BLE001 - a lever that fails is reported, not fatal
            print(f'  {name} preferred_blas_library({library}): failed ({exc})')
            continue
        finally:
            backends(default)
        hit = table['hit']['denoise']
        checks.figures[f'blas/{name}/{library}'] = hit
        print(f'  {name} graph, preferred_blas_library({library}): hit denoise {hit["p50"]:.2f} / {hit["p95"]:.2f} ms')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda', choices=('cuda', 'cpu'))
    parser.add_argument('--quick', action='store_true', help='tiny only in the latency table, fewer runs')
    parser.add_argument('--presets', default='', help='latency presets (default: tiny,pi0,pi05,smolvla; '
                        '--quick: tiny)')
    parser.add_argument('--runs', type=int, default=0)
    parser.add_argument('--json', type=Path)
    args = parser.parse_args(argv)
    if args.device == 'cuda' and not torch.cuda.is_available():
        print('skipped: needs a CUDA device (no CUDA device here; --device cpu runs the CPU-runnable parts)')
        return 2
    if args.device == 'cpu':
        torch.set_num_threads(min(torch.get_num_threads(), 2))
    started = time.perf_counter()
    checks = Checks()
    print(f'torch {torch.__version__}, device {args.device}'
          + (f' ({torch.cuda.get_device_name()})' if args.device == 'cuda' else ''))
    with tempfile.TemporaryDirectory() as scratch:
        correctness(checks, args.device, Path(scratch))
    presets = [p for p in (args.presets or ('tiny' if args.quick else 'tiny,pi0,pi05,smolvla')).split(',') if p]
    runs = args.runs or (5 if args.quick else 30)
    latency_table(checks, args.device, presets, runs, warmup=2 if args.quick else 5)
    print(f'\n{len(checks.failures)} check(s) failed: {checks.failures}' if checks.failures else '\nall checks passed')
    print(f'({time.perf_counter() - started:.0f} s)')
    if args.json:
        args.json.write_text(json.dumps({'failures': checks.failures, 'figures': checks.figures}, indent=2,
                                        default=str) + '\n')
    return 1 if checks.failures else 0


if __name__ == '__main__':
    raise SystemExit(main())
