"""The checks of the CUDA-graph fast path that only a CUDA device can answer, in one run, through the node's path.

    python bench/gpu_checks.py                          # a CUDA machine: every check, then the latency table
    python bench/gpu_checks.py --quick                  # the same checks, fewer timed runs, tiny models only
    python bench/gpu_checks.py --device cpu --dry-run   # the whole script on the CPU, through the strict capture
                                                        # stand-in (test/capture_standin.py): proves the script,
                                                        # not a GPU (under 2 minutes on a 2-core CPU)

Without a CUDA device (and without --dry-run) it prints "skipped: needs a CUDA device" and exits 2; a failed
check exits 1. The results go to --output as JSON (default artifacts/gpu_checks/<device>-<time>.json).

For each family (pi0, pi0.5, SmolVLA: their tiny checkpoints, trained RTC where the family has it) and dtype
(float32, bfloat16):
1. configure: settings.configure, the node's configure path (validate, load, warm-up), with cuda_graphs "on":
   the warm-up captures the prefix and every chunking mode's denoise, and any capture failure fails here;
2. every prompt bucket: a runtime with three buckets, warmed up as the node warms up: a prefix graph per
   bucket and a denoise graph per bucket and chunking mode, and ticks in each bucket replay them (no eager
   fallback), each equal to the eager runtime (max |diff|: 0 expected in float32, on a GPU rounding only);
3. graph vs eager (max |actions| difference, plain and RTC), hit == miss bit for bit through the graphs;
4. the stored prefix untouched after 100 chunks replayed against it; A/B/A/B alternation of two entries
   through the graph's workspace == fresh eager results (no stale K/V);
5. bf16 error vs fp32 through the graphs not larger than eager's;
6. the configured runtime's figures at the end: graphs replayed, no capture failure, no eager fallback.
Then the latency table (printed, never asserted): per stage p50 / p95 of ActionChunk.timings_ms (CUDA events
on CUDA), miss and hit, eager and graph, for pi0, pi0.5 and SmolVLA at their real sizes (random weights, 10
steps); --quick and --dry-run time the tiny checkpoints. With the device's name, and the denoise's achieved
GB/s against its memory-bandwidth floor only for a device listed in BANDWIDTH (no floor is printed for others).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / 'bench'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from vla_policy_node.observation import Observation  # noqa: E402
from vla_policy_node.params import resolve_values  # noqa: E402
from vla_policy_node.policy.families import family_class, known_types  # noqa: E402
from vla_policy_node.policy.rtc import RTCSettings  # noqa: E402
from vla_policy_node.policy.tiny_default import write_random_checkpoint  # noqa: E402
from vla_policy_node.runtime import PolicyRuntime  # noqa: E402
from vla_policy_node.settings import configure  # noqa: E402

# Memory bandwidth (bytes/s) of the devices whose floor this script prints, matched in the device's name:
# NVIDIA's H200 specification (4.8 TB/s). The denoise streams the action expert's weights and the prefix K/V once
# per step, so bytes / bandwidth is its floor; on any other device no floor is printed.
BANDWIDTH = {'H200': 4.8e12}
FULL_PRESETS = ('pi0', 'pi05', 'smolvla', 'groot')
DTYPES = ('float32', 'bfloat16')
RTC = RTCSettings(mode='auto', execution_horizon=6)         # the family's own mode
# Parameters the Euler loop reads every step (pi0/pi0.5: gemma_expert; SmolVLA: lm_expert; GR00T: the DiT and the
# action head's encoders and decoder), by name.
DENOISE_PARAMETERS = ('gemma_expert', 'lm_expert', 'action_in_proj', 'action_out_proj', 'action_time_mlp',
                      'time_mlp', 'action_head.model.', 'action_head.state_encoder', 'action_head.action_encoder',
                      'action_head.action_decoder', 'action_head.position_embedding')


class Checks:
    def __init__(self) -> None:
        self.results: List[Dict[str, Any]] = []
        self.figures: Dict[str, Any] = {}

    @property
    def failures(self) -> List[str]:
        return [result['name'] for result in self.results if not result['ok']]

    def check(self, name: str, ok: bool, detail: str = '') -> None:
        print(f'  [{"ok" if ok else "FAIL"}] {name}' + (f': {detail}' if detail else ''))
        self.results.append({'name': name, 'ok': bool(ok), 'detail': detail})


def observation(config, seed: int, instruction: str = 'pick up the red block') -> Observation:
    rng = np.random.default_rng(seed)
    images = {name: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for name in config.camera_names}
    return Observation(images, rng.normal(0, 0.3, config.state_dim), instruction)


def continuations(config) -> Dict[str, Dict[str, Any]]:
    """Every chunking mode a tick can ask for: plain, RTC in the family's own mode (rtc_mode auto), trained RTC for
    a checkpoint trained for it."""
    leftover = np.linspace(-0.3, 0.3, 8 * config.action_dim).reshape(8, -1)
    modes = {'plain': {}, 'rtc': dict(prev_actions=leftover, inference_delay=2, rtc=RTC)}
    if config.rtc_training_max_delay > 0:
        modes['trained'] = dict(prev_actions=leftover, inference_delay=2, rtc=RTCSettings(mode='trained'))
    return modes


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


def tolerance(dtype: str) -> float:
    return 1e-5 if dtype == 'float32' else 2e-2


def node_values(folder: Path, device: str, dtype: str, config) -> Dict[str, Any]:
    """The parameters a node would run this checkpoint with, cuda_graphs on."""
    return resolve_values({'checkpoint_path': str(folder), 'device': device, 'dtype': dtype, 'cuda_graphs': 'on',
                           'joint_names': [f'joint_{i}' for i in range(config.state_dim)], 'warmup': True})


def instruction_for(runtime: PolicyRuntime, bucket: int) -> Optional[str]:
    """A real instruction whose prompt lands in ``bucket`` (None where none does)."""
    state = runtime.state_normalizer.normalize(np.zeros(runtime.config.state_dim))
    for words in range(1, runtime.config.tokenizer_max_length + 2):
        text = ' '.join(['pick'] * words)
        valid = int(runtime.policy.prompt_tokens(text, state)[1].sum())
        if min(b for b in runtime.prompt_buckets if b >= valid) == bucket:
            return text
    return None


def three_buckets(runtime: PolicyRuntime) -> List[int]:
    shortest = int(runtime.policy.prompt_tokens('a', np.zeros(runtime.config.state_dim))[1].sum())
    longest = runtime.config.tokenizer_max_length
    return sorted({shortest + (longest - shortest) // 3, shortest + 2 * (longest - shortest) // 3, longest})


def check_family(checks: Checks, folder: Path, device: str, dtype: str, chunks: int) -> Dict[str, np.ndarray]:
    """Every correctness check of one family and dtype; returns actions for the bf16-vs-fp32 comparison."""
    eager = PolicyRuntime.from_pretrained(folder, device=device, dtype=dtype)
    cfg = eager.config
    try:
        runtime = configure(node_values(folder, device, dtype, cfg)).runtime
    except Exception as exc:  # noqa: BLE001 - a failed configure is the check's result
        checks.check('configure with cuda_graphs on (warm-up captures every shape)', False,
                     f'{type(exc).__name__}: {exc}')
        return {}
    checks.check('configure with cuda_graphs on (warm-up captures every shape)', True,
                 f'{runtime.fast_path_summary()["graphs_cached"]} denoise + '
                 f'{runtime.fast_path_summary()["prefix_graphs"]} prefix graphs')
    modes = continuations(cfg)
    obs_a, obs_b = observation(cfg, 1), observation(cfg, 2, 'put the cube in the box')
    reference = {(name, mode): eager.infer(obs, seed=3, use_cache=False, **extra).actions
                 for name, obs in (('A', obs_a), ('B', obs_b)) for mode, extra in modes.items()}
    for mode, extra in modes.items():                                   # graph vs eager, hit == miss
        runtime.cache.clear()
        miss = runtime.infer(obs_a, seed=3, **extra)
        hit = runtime.infer(obs_a, seed=3, **extra)
        diff = max_diff(miss.actions, reference[('A', mode)])
        checks.figures[f'{cfg.policy_type}/{dtype}/{mode}/graph_vs_eager_max_diff'] = diff
        checks.check(f'graph vs eager ({mode})', diff <= tolerance(dtype), f'max |diff| {diff:.3g}')
        checks.check(f'hit == miss ({mode})', hit.cache_hit and np.array_equal(hit.actions, miss.actions))
    runtime.cache.clear()                                               # the stored prefix after 100 chunks
    first = runtime.infer(obs_a, seed=3)
    stored = {name: tensor.clone() for name, tensor in runtime.cache.get(first.key).items()}
    mode_list = list(modes.values())
    for i in range(chunks):
        runtime.infer(obs_a, seed=i, **mode_list[i % len(mode_list)])
    entry = runtime.cache.get(first.key)
    checks.check(f'the stored prefix untouched after {chunks} chunks',
                 all(torch.equal(tensor, entry[name]) for name, tensor in stored.items()))
    ok = True                                                           # A/B/A/B through the workspace
    for name, obs in (('A', obs_a), ('B', obs_b), ('A', obs_a), ('B', obs_b)):
        for mode, extra in modes.items():
            ok &= max_diff(runtime.infer(obs, seed=3, **extra).actions, reference[(name, mode)]) <= tolerance(dtype)
    checks.check('A/B/A/B entries through the workspace == fresh eager results', ok)
    check_buckets(checks, folder, device, dtype, eager)
    figures = runtime.fast_path_summary()
    checks.figures[f'{cfg.policy_type}/{dtype}/fast_path'] = figures
    prefix_graphs = runtime.policy.capabilities.capturable_prefix       # else the prefix runs eagerly by design
    checks.check('graphs replayed, no capture failure, no eager fallback',
                 figures['graph_replays'] > 0 and (figures['prefix_replays'] > 0) == prefix_graphs
                 and figures['graph_capture_failures'] == figures['prefix_capture_failures'] == 0
                 and figures['eager_fallbacks'] == figures['prefix_eager_fallbacks'] == 0,
                 f'{figures["graph_replays"]} denoise / {figures["prefix_replays"]} prefix replays, '
                 f'{figures["fast_path_bytes"]} bytes; fallbacks: {figures["eager_fallback_reasons"]} / '
                 f'{figures["prefix_eager_fallback_reasons"]}')
    return {'eager': reference[('A', 'plain')], 'graph': runtime.infer(obs_a, seed=3).actions}


def check_buckets(checks: Checks, folder: Path, device: str, dtype: str, eager: PolicyRuntime) -> None:
    buckets = three_buckets(eager)
    options = dict(device=device, dtype=dtype, prompt_buckets=buckets)
    graphs = PolicyRuntime.from_pretrained(folder, cuda_graphs='on', **options)
    bucketed_eager = PolicyRuntime.from_pretrained(folder, **options)
    graphs.warmup()
    modes = continuations(graphs.config)
    figures = graphs.fast_path_summary()
    prefix_graphs = len(buckets) if graphs.policy.capabilities.capturable_prefix else 0
    checks.check(f'warm-up captured every bucket {buckets} x {len(modes)} chunking modes',
                 figures['prefix_graphs'] == prefix_graphs and figures['graphs_cached'] == len(buckets) * len(modes),
                 f'{figures["prefix_graphs"]} prefix, {figures["graphs_cached"]} denoise graphs')
    worst = 0.0
    for bucket in buckets:
        instruction = instruction_for(graphs, bucket)
        for extra in modes.values():
            obs = observation(graphs.config, 4, instruction)
            worst = max(worst, max_diff(graphs.infer(obs, seed=5, use_cache=False, **extra).actions,
                                        bucketed_eager.infer(obs, seed=5, use_cache=False, **extra).actions))
    figures = graphs.fast_path_summary()
    checks.figures[f'{graphs.config.policy_type}/{dtype}/buckets_graph_vs_eager_max_diff'] = worst
    checks.check('every bucket replays its graphs == eager', worst <= tolerance(dtype)
                 and figures['eager_fallbacks'] == figures['prefix_eager_fallbacks'] == 0, f'max |diff| {worst:.3g}')


def correctness(checks: Checks, device: str, scratch: Path, chunks: int) -> Dict[str, Path]:
    folders = {}
    for kind in known_types():
        config = family_class(kind).tiny_config(rtc_training_max_delay=3)
        folders[kind] = folder = write_random_checkpoint(scratch / kind, config)
        actions = {}
        for dtype in DTYPES:
            print(f'{kind} {dtype} on {device}:')
            actions[dtype] = check_family(checks, folder, device, dtype, chunks)
        if all(actions.values()):
            eager_err = max_diff(actions['bfloat16']['eager'], actions['float32']['eager'])
            graph_err = max_diff(actions['bfloat16']['graph'], actions['float32']['eager'])
            checks.figures[f'{kind}/bf16_error'] = {'eager': eager_err, 'graph': graph_err}
            checks.check(f'{kind}: bf16 error vs fp32 through the graph <= eager\'s',
                         graph_err <= eager_err * 1.0001 + 1e-7, f'graph {graph_err:.3g}, eager {eager_err:.3g}')
    return folders


# ---- the latency table -----------------------------------------------------------------------------------

def percentiles(values: List[float]) -> Dict[str, float]:
    return {'p50': float(np.percentile(values, 50)), 'p95': float(np.percentile(values, 95))}


def latency(runtime: PolicyRuntime, runs: int, warmup: int) -> Dict[str, Dict[str, Dict[str, float]]]:
    """Per stage p50/p95 (the chunk's own timings: CUDA events on CUDA), miss and hit."""
    from bench_runtime import INSTRUCTION, camera_frames   # bench/ is on sys.path
    cfg = runtime.config
    state = np.zeros(cfg.state_dim)
    samples: Dict[str, List[Dict[str, float]]] = {'miss': [], 'hit': []}
    for i in range(warmup + runs):
        obs = Observation(camera_frames(cfg.camera_names, seed=100 + i), state, INSTRUCTION)
        miss = runtime.infer(obs, seed=0)           # new 640x480 frames: a miss, then the same observation: a hit
        hit = runtime.infer(obs, seed=0)
        if i >= warmup:
            samples['miss'].append(dict(miss.timings_ms, total=miss.total_ms))
            samples['hit'].append(dict(hit.timings_ms, total=hit.total_ms))
    return {kind: {stage: percentiles([s[stage] for s in taken]) for stage in taken[0]}
            for kind, taken in samples.items()}


def denoise_bytes(runtime: PolicyRuntime, num_steps: int) -> int:
    """Bytes one denoise must read: the expert's and the action projections' parameters and the prefix K/V,
    once per step (the floor)."""
    weights = sum(p.numel() * p.element_size() for name, p in runtime.model.named_parameters()
                  if any(part in name for part in DENOISE_PARAMETERS))
    return num_steps * (weights + runtime.prefix_bytes())


def known_bandwidth(device_name: str) -> Optional[float]:
    return next((rate for name, rate in BANDWIDTH.items() if name in device_name), None)


def latency_table(checks: Checks, device: str, device_name: str, runtimes: Dict[str, Callable[[], PolicyRuntime]],
                  runs: int, warmup: int) -> None:
    clock = 'CUDA events' if device == 'cuda' else 'host timer'
    print(f'\nlatency on {device_name}, {runs} runs after {warmup} (ms, p50 / p95; clock: {clock}):')
    print(f"  {'model':12} {'path':6} {'miss total':>16} {'miss prefix':>16} {'hit total':>16} {'hit denoise':>16}")
    bandwidth = known_bandwidth(device_name)
    for name, build in runtimes.items():
        base = build()
        for path, mode in (('eager', 'off'), ('graph', 'on')):
            runtime = PolicyRuntime(base.policy, base.model_revision, cuda_graphs=mode)
            runtime.warmup()                        # graph: captured here, as the node's configure does
            table = latency(runtime, runs, warmup)
            checks.figures[f'latency/{name}/{path}'] = table
            cells = [table['miss']['total'], table['miss']['prefix'], table['hit']['total'], table['hit']['denoise']]
            print(f'  {name:12} {path:6} ' + ' '.join(f"{c['p50']:7.2f} / {c['p95']:6.2f}" for c in cells))
            nbytes = denoise_bytes(runtime, runtime.num_steps)
            rate = nbytes / (table['hit']['denoise']['p50'] * 1e-3)
            figures: Dict[str, Any] = {'bytes': nbytes, 'gb_per_s': rate / 1e9}
            line = f'denoise reads {nbytes / 1e9:.3f} GB: {rate / 1e9:.1f} GB/s achieved'
            if bandwidth is not None:
                floor_ms = nbytes / bandwidth * 1e3
                figures['floor_ms'] = floor_ms
                line += (f'; floor at {bandwidth / 1e12:.1f} TB/s {floor_ms:.2f} ms = '
                         f'{floor_ms / table["hit"]["denoise"]["p50"] * 100:.1f}% of the hit denoise')
            checks.figures[f'bandwidth/{name}/{path}'] = figures
            print(f'  {"":12} {path:6} {line}')
            runtime.close()
        del base
        if device == 'cuda':
            torch.cuda.empty_cache()
    if bandwidth is None:
        print(f'  (no bandwidth floor for {device_name}: BANDWIDTH in bench/gpu_checks.py lists the devices it knows)')


def full_size_runtimes(device: str, scratch: Path) -> Dict[str, Callable[[], PolicyRuntime]]:
    from bench_runtime import random_runtime
    dtype = torch.bfloat16 if device == 'cuda' else torch.float32
    return {name: (lambda name=name: random_runtime(name, torch.device(device), dtype, scratch, 2))
            for name in FULL_PRESETS}


def tiny_runtimes(device: str, folders: Dict[str, Path]) -> Dict[str, Callable[[], PolicyRuntime]]:
    dtype = 'bfloat16' if device == 'cuda' else 'float32'
    return {f'{kind} tiny': (lambda folder=folder: PolicyRuntime.from_pretrained(folder, device=device, dtype=dtype))
            for kind, folder in folders.items()}


# ---- the run ----------------------------------------------------------------------------------------------

def capture_standin(dry_run: bool):
    """The strict CUDA-capture stand-in of the CPU test suite, installed for a dry run; nothing otherwise."""
    if not dry_run:
        return contextlib.nullcontext()
    sys.path.insert(0, str(ROOT / 'test'))
    from capture_standin import CaptureStandIn
    return CaptureStandIn()


def default_output(device_name: str) -> Path:
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    slug = ''.join(c if c.isalnum() else '_' for c in device_name).strip('_').lower()
    return Path('artifacts') / 'gpu_checks' / f'{slug}-{stamp}.json'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda', choices=('cuda', 'cpu'))
    parser.add_argument('--dry-run', action='store_true', help='on the CPU through the strict capture stand-in: '
                        'checks that the script runs, not a GPU')
    parser.add_argument('--quick', action='store_true', help='fewer timed runs, the tiny checkpoints only')
    parser.add_argument('--runs', type=int, default=0, help='timed runs per row (default 30; --quick, --dry-run: 3)')
    parser.add_argument('--chunks', type=int, default=100, help='chunks replayed against one stored prefix')
    parser.add_argument('--output', type=Path, help='the JSON results (default artifacts/gpu_checks/...)')
    args = parser.parse_args(argv)
    if args.device == 'cpu' and not args.dry_run:
        parser.error('--device cpu runs only as --dry-run (CUDA graphs need a CUDA device; the dry run captures '
                     'through the CPU stand-in)')
    if args.device == 'cuda' and not torch.cuda.is_available():
        print('skipped: needs a CUDA device (none here; --device cpu --dry-run runs the script on the CPU)')
        return 2
    if args.device == 'cpu':
        torch.set_num_threads(min(torch.get_num_threads(), 2))
    device_name = torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU (dry run, capture stand-in)'
    started = time.perf_counter()
    checks = Checks()
    print(f'torch {torch.__version__}, {device_name}')
    small = args.quick or args.dry_run
    runs = args.runs or (3 if small else 30)
    with capture_standin(args.dry_run), tempfile.TemporaryDirectory() as scratch:
        folders = correctness(checks, args.device, Path(scratch), args.chunks)
        runtimes = tiny_runtimes(args.device, folders) if small else full_size_runtimes(args.device, Path(scratch))
        latency_table(checks, args.device, device_name, runtimes, runs, warmup=1 if small else 5)
    seconds = time.perf_counter() - started
    failures = checks.failures
    print(f'\n{len(failures)} check(s) failed: {failures}' if failures else '\nall checks passed')
    output = args.output or default_output(device_name)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({
        'device': device_name, 'dry_run': args.dry_run, 'torch': torch.__version__,
        'date': datetime.datetime.now().isoformat(timespec='seconds'), 'command': ['bench/gpu_checks.py'] + list(
            argv if argv is not None else sys.argv[1:]), 'seconds': round(seconds, 1), 'failures': failures,
        'checks': checks.results, 'figures': checks.figures}, indent=2, default=str) + '\n')
    print(f'({seconds:.0f} s; results in {output})')
    return 1 if failures else 0


if __name__ == '__main__':
    raise SystemExit(main())
