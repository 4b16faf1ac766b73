"""Runtime benchmark: per-stage latency of a cache miss and a cache hit, efficiency, cache entry size, key hashing.

    python bench/bench_runtime.py                      # tiny + pi0_shallow on CPU (about a minute)
    python bench/bench_runtime.py --presets pi0 --device cuda --dtype bfloat16   # full pi0 on a GPU
    python bench/bench_runtime.py --presets smolvla_tiny,smolvla   # SmolVLA: tiny and the real shape, 2 cameras
    python bench/bench_runtime.py --quick              # tiny only, 2 runs, a small peak GEMM (seconds; a smoke run)

Weights are random (timing does not depend on their values); observations are
three 640x480 rgb8 frames, an instruction and a state. A "miss" changes one
image byte per run so the prefix is recomputed; a "hit" repeats one
observation. Medians over --runs runs after --warmup runs. Prints a table;
--json writes the figures too. Not a test: nothing here asserts a time.

Efficiency (issue 13 targets, printed as ratios): each model stage's FLOP count
(bench/flops.py, from the config) over its median time, against a large square
GEMM in the compute dtype measured in the same run (the machine's practical
peak): denoise >= 60%, prefix >= 75%. For pi0_shallow (full widths, --depth
layers) the full-depth pi0 figures follow: every layer has the full shape, so
a stage's achieved rate carries over and its time scales with its FLOP count.
The hit path's stages outside the model (validation, key, noise, unnormalise,
trajectory) are timed one by one: target under 1 ms in total.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch
import xxhash

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / 'bench'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from vla_policy_node.cache import PrefixKeyBuilder  # noqa: E402
from vla_policy_node.images import RawImage  # noqa: E402
from vla_policy_node.policy.families import family_class, preset_config  # noqa: E402
from vla_policy_node.policy.layers import LlamaRMSNorm  # noqa: E402
from vla_policy_node.policy.normalize import FeatureNormalizer  # noqa: E402
from vla_policy_node.policy.tiny_default import statistics as norm_statistics  # noqa: E402
from vla_policy_node.observation import Observation  # noqa: E402
from vla_policy_node.runtime import STAGES, PolicyRuntime, resolve_device, resolve_dtype  # noqa: E402
from vla_policy_node.runtime.denoise_inputs import noise_tensor  # noqa: E402
from vla_policy_node.trajectory import build_plan  # noqa: E402
from flops import stage_flops  # noqa: E402  (bench/ is on sys.path when run as a script)

FRAME_HEIGHT, FRAME_WIDTH = 480, 640
INSTRUCTION = 'pick up the red block and put it in the bin'
# Square GEMM for the practical peak: big enough to saturate the device (2048 is plenty for a CPU).
PEAK_GEMM_SIZE = {'cpu': 2048, 'cuda': 8192}
TARGETS = {'prefix': 0.75, 'denoise': 0.60}


def camera_frames(names, seed: int) -> Dict[str, RawImage]:
    rng = np.random.default_rng(seed)
    return {name: RawImage(FRAME_HEIGHT, FRAME_WIDTH, 'rgb8', FRAME_WIDTH * 3, False,
                           rng.integers(0, 256, FRAME_HEIGHT * FRAME_WIDTH * 3, dtype=np.uint8).tobytes())
            for name in names}


def bench_config(preset_name: str, depth: int):
    """The config of a preset of any registered family (PolicyFamily.preset_names: tiny, pi0_shallow, pi0, pi05,
    smolvla_tiny, smolvla ...); ``depth``: layers per tower where the preset is cut in depth."""
    return preset_config(preset_name, depth)


def random_runtime(preset_name: str, device: torch.device, dtype: torch.dtype, scratch: Path,
                   depth: int, quantization: str = 'none') -> PolicyRuntime:
    """A runtime over a randomly initialised model, built on the device directly (no checkpoint file); the same
    weights for every dtype and ``quantization`` (generator seeded 0)."""
    config = bench_config(preset_name, depth)
    family = family_class(config.policy_type)
    tokenizer = family.tokenizer_class.from_path(family.build_test_tokenizer(scratch / preset_name, 512))
    with torch.device('meta'):
        model = family.model_class(config)
    model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if 'norm' in name and param.dim() == 1:
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=generator)
        for module in model.modules():
            # x * w (Llama's, Qwen's RMSNorm): a zero weight would silence the stream
            if isinstance(module, LlamaRMSNorm) or type(module).__name__ == 'QwenRMSNorm':
                module.weight.fill_(1.0)
    model.set_compute_dtype(dtype).eval()
    _fuse(model)
    state = FeatureNormalizer('observation.state', 'MEAN_STD', norm_statistics(config.state_dim, 0.5))
    action = FeatureNormalizer('action', 'MEAN_STD', norm_statistics(config.action_dim, 0.2))
    policy = family(config, model, state, action, tokenizer, Path('random'))
    return PolicyRuntime(policy, model_revision=f'random-{preset_name}', quantization=quantization)


def _fuse(model: torch.nn.Module) -> None:
    """What the checkpoint loader does after loading (absent on code older than issue 13)."""
    try:
        from vla_policy_node.policy.layers import fuse_projections
    except ImportError:
        return
    fuse_projections(model)


def _times_ms(fn, repeats: int) -> List[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _median_ms(fn, repeats: int) -> float:
    return statistics.median(_times_ms(fn, repeats))


def peak_gemm_gflops(device: torch.device, dtype: torch.dtype, size: int,
                     repeats: int = 20) -> float:
    """GFLOP/s of a square [size x size] GEMM in the compute dtype, best of ``repeats``.

    The best run, not the median: the practical peak is what the machine reaches
    when nothing else competes for its cores (other processes only ever slow it).
    """
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)

    def gemm() -> None:
        torch.mm(a, b)
        if device.type == 'cuda':
            torch.cuda.synchronize()

    for _ in range(3):
        gemm()
    return 2 * size ** 3 / (min(_times_ms(gemm, repeats)) * 1e-3) / 1e9


def hit_overhead_ms(runtime: PolicyRuntime, repeats: int = 200) -> Dict[str, float]:
    """The hit path outside the model, stage by stage, for three 640x480 rgb8 cameras."""
    config = runtime.config
    observation = Observation(camera_frames(config.camera_names, seed=4), np.zeros(config.state_dim), INSTRUCTION)
    prepared = runtime._prepare(observation)
    slots, tokens, token_mask = prepared.slots, prepared.tokens, prepared.token_mask
    key = runtime._keys.key(slots, tokens, token_mask)
    actions = np.zeros((config.chunk_size, config.action_dim), dtype=np.float32)
    joints = [f'joint_{i}' for i in range(config.action_dim)]
    figures = {
        'validate+tokenize': _median_ms(lambda: runtime._prepare(observation), repeats),
        'key': _median_ms(lambda: runtime._keys.key(slots, tokens, token_mask), repeats),
        'lookup': _median_ms(lambda: runtime.cache.get(key), repeats),
        'noise': _median_ms(lambda: noise_tensor(None, 0, (1, config.chunk_size, config.max_action_dim),
                                                 runtime.device), repeats),
        'unnormalize': _median_ms(lambda: runtime.action_normalizer.unnormalize(actions), repeats),
        'trajectory': _median_ms(lambda: build_plan(actions, joints, 0.02, 0, 0), repeats),
    }
    figures['total'] = sum(figures.values())
    return figures


def efficiency(config, num_steps: int, stages: Dict[str, Dict[str, float]], peak: float) -> Dict[str, Dict]:
    """FLOPs per model stage, achieved GFLOP/s (median run) and the fraction of the measured peak (median, best)."""
    flops = stage_flops(config, num_steps)
    out = {}
    for stage, count in flops.items():
        ms = stages['miss'][stage]
        rate = count / (ms * 1e-3) / 1e9
        best_rate = count / (stages['best miss'][stage] * 1e-3) / 1e9
        out[stage] = {'gflop': count / 1e9, 'ms': ms, 'gflop_per_s': rate, 'of_peak': rate / peak,
                      'best_of_peak': best_rate / peak}
    return out


def full_depth_estimate(miss: Dict[str, float], hit: Dict[str, float], config,
                        num_steps: int) -> Dict[str, float]:
    """pi0_shallow -> full pi0: each model stage at the rate measured here, over the full-depth FLOP count.

    Every layer of pi0_shallow has pi0's full shape, so per-layer efficiency carries over; only the
    number of layers (and so the FLOPs) changes. The stages outside the model are taken as measured.
    """
    shallow, full = stage_flops(config, num_steps), stage_flops(preset_config(config.policy_type), num_steps)
    prefix_ms = miss['prefix'] * full['prefix'] / shallow['prefix']
    denoise_ms = miss['denoise'] * full['denoise'] / shallow['denoise']
    return {'prefix_ms': prefix_ms, 'denoise_ms': denoise_ms,
            'miss_over_hit': (miss['hash'] + miss['preprocess'] + prefix_ms + denoise_ms)
            / (hit['hash'] + hit['denoise'] * full['denoise'] / shallow['denoise']),
            'flop_miss_over_hit': (full['prefix'] + full['denoise']) / full['denoise']}


def bench_stages(runtime: PolicyRuntime, runs: int, warmup: int) -> Dict[str, Dict[str, float]]:
    config = runtime.config
    frames = camera_frames(config.camera_names, seed=1)
    state = np.zeros(config.state_dim)
    results: Dict[str, List[Dict[str, float]]] = {'miss': [], 'hit': []}
    for i in range(warmup + runs):
        # Miss: a fresh first byte in one camera, so the key and the prefix are new.
        name = config.camera_names[0]
        data = bytearray(frames[name].data)
        data[0] = (i * 7 + 1) % 256
        miss_frames = dict(frames)
        miss_frames[name] = RawImage(FRAME_HEIGHT, FRAME_WIDTH, 'rgb8', FRAME_WIDTH * 3, False, bytes(data))
        observation = Observation(miss_frames, state, INSTRUCTION)
        runtime.cache.clear()
        miss = runtime.infer(observation, seed=0)
        hit = runtime.infer(observation, seed=0)
        assert not miss.cache_hit and hit.cache_hit
        if not np.array_equal(miss.actions, hit.actions):
            raise SystemExit('a hit returned different actions from the miss: the cache is broken')
        if i >= warmup:
            results['miss'].append(dict(miss.timings_ms, total=miss.total_ms))
            results['hit'].append(dict(hit.timings_ms, total=hit.total_ms))
    # Medians, plus each stage's best run ('best_miss'): other processes on a shared machine only ever slow a run.
    figures = {kind: {stage: statistics.median(run[stage] for run in runs_) for stage in STAGES + ('total',)}
               for kind, runs_ in results.items()}
    for kind, runs_ in list(results.items()):
        figures['best ' + kind] = {stage: min(run[stage] for run in runs_) for stage in STAGES + ('total',)}
    return figures


def bench_hash(repeats: int = 200) -> Dict[str, float]:
    """Key of three 640x480 rgb8 frames + 48 tokens, and raw xxh3-128 throughput."""
    frames = camera_frames(('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb'), seed=2)
    builder = PrefixKeyBuilder('revision', 'tokenizer', 'float32')
    slots = list(frames.items())
    tokens, mask = np.zeros(48, dtype=np.int64), np.ones(48, dtype=bool)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        builder.key(slots, tokens, mask)
        times.append((time.perf_counter() - start) * 1e3)
    blob = b''.join(bytes(f.data) for f in frames.values())
    start = time.perf_counter()
    for _ in range(20):
        xxhash.xxh3_128(blob).digest()
    seconds = (time.perf_counter() - start) / 20
    return {'key_three_frames_ms': statistics.median(times), 'bytes': len(blob),
            'xxh3_gb_per_s': len(blob) / seconds / 1e9}


def entry_bytes(runtime: PolicyRuntime) -> Dict[str, int]:
    """Measured bytes of one cached prefix (K/V and the family's extra K/V) against the config's analytic count."""
    config = runtime.config
    observation = Observation(camera_frames(config.camera_names, seed=3), np.zeros(config.state_dim), INSTRUCTION)
    runtime.cache.clear()
    runtime.infer(observation, seed=0)
    context = runtime.cache.get(runtime.prefix_key(observation))
    element = context['kv'].element_size()
    pad_bytes = context['pad_mask'].numel() * context['pad_mask'].element_size()
    return {'measured_kv': context.nbytes - pad_bytes, 'measured_total': context.nbytes,
            'analytic': config.kv_entry_bytes(element), 'analytic_total': config.cache_entry_bytes(element),
            'prefix_len': config.prefix_len}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--presets', default='tiny,pi0_shallow',
                        help='comma list of tiny, pi0_shallow, pi0 (full size: use a GPU), smolvla_tiny, smolvla '
                        '(the real shape with random weights, 2 cameras)')
    parser.add_argument('--depth', type=int, default=2, help='layers per tower for pi0_shallow')
    parser.add_argument('--device', default='auto')
    parser.add_argument('--dtype', default='auto')
    parser.add_argument('--runs', type=int, default=5)
    parser.add_argument('--warmup', type=int, default=2)
    parser.add_argument('--threads', type=int, default=0, help='torch CPU threads (0: torch default)')
    parser.add_argument('--peak-size', type=int, default=0, help='square GEMM size for the peak (0: 2048 on a CPU, '
                        '8192 on a GPU)')
    parser.add_argument('--json', type=Path, help='also write the figures here')
    parser.add_argument('--quick', action='store_true', help='tiny only, 2 runs after 1, a 512 GEMM peak, fewer '
                        'repeats of the small timings (figures too coarse to quote)')
    args = parser.parse_args(argv)
    repeats = 200
    if args.quick:
        args.presets, args.runs, args.warmup, args.peak_size, repeats = 'tiny', 2, 1, args.peak_size or 512, 10
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    report: Dict[str, object] = {'device': str(device), 'dtype': str(dtype).replace('torch.', ''),
                                 'torch': torch.__version__, 'threads': torch.get_num_threads(),
                                 'hash': bench_hash(repeats)}
    hashing = report['hash']
    peak_size = args.peak_size or PEAK_GEMM_SIZE.get(device.type, 2048)
    peak = peak_gemm_gflops(device, dtype, peak_size)
    print(f"device {device}, dtype {report['dtype']}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f'peak: square {peak_size} GEMM {peak:.1f} GFLOP/s')
    print(f"key of three 640x480 rgb8 frames: median {hashing['key_three_frames_ms']:.3f} ms "
          f"({hashing['bytes'] / 1e6:.2f} MB, xxh3-128 {hashing['xxh3_gb_per_s']:.1f} GB/s)")
    with tempfile.TemporaryDirectory() as scratch:
        for name in [p.strip() for p in args.presets.split(',') if p.strip()]:
            runtime = random_runtime(name, device, dtype, Path(scratch), args.depth)
            stages = bench_stages(runtime, args.runs, args.warmup)
            # Measured again right after the stages, in the same conditions; the larger figure counts.
            peak = max(peak, peak_gemm_gflops(device, dtype, peak_size))
            sizes = entry_bytes(runtime)
            ratio = stages['miss']['total'] / stages['hit']['total']
            layers = runtime.config.num_prefix_layers
            report[name] = {'stages_ms': stages, 'miss_over_hit': ratio, 'entry_bytes': sizes,
                            'config': {'layers': layers, 'prefix_len': sizes['prefix_len'],
                                       'cameras': len(runtime.config.camera_names),
                                       'chunk': runtime.config.chunk_size, 'num_steps': runtime.num_steps}}
            print(f'\n{name}: {layers} layers, prefix {sizes["prefix_len"]} tokens, '
                  f'chunk {runtime.config.chunk_size}, {runtime.num_steps} steps, medians of {args.runs} runs')
            print(f"  {'':9}" + ''.join(f'{stage:>12}' for stage in STAGES + ('total',)))
            for kind in ('miss', 'hit', 'best miss', 'best hit'):
                print(f'  {kind:9}' + ''.join(f'{stages[kind][stage]:>10.2f}ms' for stage in STAGES + ('total',)))
            best_ratio = stages['best miss']['total'] / stages['best hit']['total']
            print(f'  miss / hit = {ratio:.2f}x (medians), {best_ratio:.2f}x (best runs)')
            print(f"  cache entry: {sizes['measured_kv']} bytes K/V (analytic {sizes['analytic']}), "
                  f"{sizes['measured_total']} with the pad mask (analytic {sizes['analytic_total']})")
            eff = efficiency(runtime.config, runtime.num_steps, stages, peak)
            report[name]['efficiency'] = eff
            for stage, fig in eff.items():
                print(f"  {stage:8} {fig['gflop']:9.2f} GFLOP in {fig['ms']:9.2f} ms = "
                      f"{fig['gflop_per_s']:7.1f} GFLOP/s = {fig['of_peak'] * 100:5.1f}% of peak "
                      f"(best run {fig['best_of_peak'] * 100:5.1f}%; target {TARGETS[stage] * 100:.0f}%)")
            if name == 'pi0_shallow':
                report[name]['full_depth_estimate'] = {}
                for label, miss_key, hit_key in (('medians', 'miss', 'hit'), ('best runs', 'best miss', 'best hit')):
                    est = full_depth_estimate(stages[miss_key], stages[hit_key], runtime.config, runtime.num_steps)
                    report[name]['full_depth_estimate'][label] = est
                    print(f"  full pi0 from the {label}: prefix {est['prefix_ms']:.0f} ms, denoise "
                          f"{est['denoise_ms']:.0f} ms, miss / hit = {est['miss_over_hit']:.2f}x "
                          f"(target 10x; FLOPs alone allow {est['flop_miss_over_hit']:.2f}x)")
            overhead = hit_overhead_ms(runtime, repeats)
            report[name]['hit_overhead_ms'] = overhead
            print('  hit path outside the model, 3 x 640x480 rgb8: '
                  + ', '.join(f'{stage} {ms:.3f}' for stage, ms in overhead.items()) + ' ms (target total < 1 ms)')
            del runtime
    report['peak_gemm_gflop_per_s'] = peak
    print(f'\npeak at the end of the run: square {peak_size} GEMM {peak:.1f} GFLOP/s (fractions above use the '
          'peak known when each preset finished)')
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
