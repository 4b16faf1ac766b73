"""One-off side by side with REAL lerobot for SmolVLA (issue 16). Needs a scratch venv; prints, never asserts.

lerobot is no dependency of the package: this script runs in a venv OUTSIDE the repo that has lerobot's
current source (>= 0.5 needs Python 3.12; PyPI offers only 0.4.x to Python 3.11) and imports the package and
test/ from this checkout. Set-up used (lerobot 0.6.2 = huggingface/lerobot 7427f318, transformers 5.5.4,
torch 2.11.0):

    git -C <lerobot git dir> archive HEAD | tar -x -C /work/scratch/lerobot-src
    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/scratch/lerobot-venv
    /work/scratch/lerobot-venv/bin/pip install 'torch>=2.7,<2.12' '/work/scratch/lerobot-src[smolvla]' \
        xxhash sentencepiece
    /work/scratch/lerobot-venv/bin/python bench/compare_lerobot_smolvla.py            # from the repo root
    /work/scratch/lerobot-venv/bin/python bench/compare_lerobot_smolvla.py --quick    # part a only

Without lerobot it prints ``skipped: needs lerobot`` and exits with status 2.

No weights can be downloaded, so ``vlm_model_name`` points at a local folder holding the checkpoint's
``vlm_config.json`` as ``config.json`` plus the tokenizer and SmolVLM processor files, and
``load_vlm_weights`` is false (lerobot then builds the backbone from that config and loads every tensor from
the checkpoint's model.safetensors, strictly here).

    (a) tiny checkpoint (test/smolvla_fixtures.py): lerobot's SmolVLAPolicy with its own pre/post-processors
        vs ours (PolicyRuntime, fp32) vs the test reference, same raw inputs and noise: max abs diff.
    (b) the REAL SmolVLA shape (SmolVLM2-500M cut to 16 layers, expert 0.75, chunk 50), random weights,
        2 cameras of 640x480, fp32, --threads CPU threads: lerobot's ``model.sample_actions`` median time
        (inputs already prepared) vs our ``infer`` miss (a camera byte changes) and hit (only the state
        changes), interleaved in one run; plus the max abs diff of the actions.
    (c) bf16 error against fp32: lerobot's recipe (as lerobot builds it: text decoder and expert bf16) vs ours
        (dtype bfloat16), each against its own fp32 and against lerobot's fp32, tiny and real shape.

Figures of one run (2026-12-01, this 2-core CPU, lerobot 0.6.2 / transformers 5.5.4 / torch 2.11, package at
issue16 a7922cd; timings move a lot while other jobs load the machine, these are from a quiet moment):

    (a) tiny, 3 cases: lerobot-ours <= 1.8e-7, lerobot-reference <= 1.2e-7, ours-reference <= 1.8e-7
    (v) reference vs lerobot on the 6 test variants: fp32 <= 2.4e-7, bf16 recipe 0 (bit for bit), RTC <= 1.2e-7
    (b) --threads 2 --repeats 5: lerobot sample_actions 2958 ms, ours miss 2923 ms (0.99x), hit 830 ms
        (0.28x our miss; stages: prefix 2104 ms, denoise 813-829 ms); actions lerobot-ours 2.4e-7; entry 10.3 MiB
    (c) bf16 vs fp32, max abs action error: tiny lerobot 3.1e-3 / ours 1.8e-3; real shape lerobot 3.9e-3 /
        ours 2.3e-3 (ours vs lerobot's fp32: 2.3e-3)

fp32 lerobot: the policy as built (bf16 text/expert from the bf16 text_config) moved to float32 and the
checkpoint loaded again, so no weight keeps a bf16 rounding.
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / 'test'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from smolvla_fixtures import PARITY_VARIANTS, write_tiny_smolvla  # noqa: E402
from lerobot_smolvla_reference import LerobotSmolVLAReference  # noqa: E402

REAL_CONFIG = dict(chunk_size=50, n_action_steps=50, resize_imgs_with_padding=[512, 512], empty_cameras=0,
                   num_vlm_layers=16)
# HuggingFaceTB/SmolVLM2-500M-Video-Instruct's config.json (architecture numbers; see shared/reference/smolvla.md).
REAL_VLM = {
    'scale_factor': 4, 'image_token_id': 49190,
    'vision_config': {'hidden_size': 768, 'intermediate_size': 3072, 'num_hidden_layers': 12,
                      'num_attention_heads': 12, 'image_size': 512, 'patch_size': 16},
    'text_config': {'hidden_size': 960, 'intermediate_size': 2560, 'num_hidden_layers': 32,
                    'num_attention_heads': 15, 'num_key_value_heads': 5, 'head_dim': 64, 'vocab_size': 49280},
}
LONG = ('pick up the red cube and put it in the bin, then place the green block on the plate, open the drawer, '
        'close it again and wipe the table with the towel before you fold the shirt in half')


# ---- building lerobot from a checkpoint folder ----------------------------------------------------------------
def backbone_folder(checkpoint: Path, dest: Path) -> Path:
    """What AutoConfig / AutoProcessor.from_pretrained(vlm_model_name) read, made from the checkpoint."""
    dest.mkdir(parents=True, exist_ok=True)
    vlm = json.loads((checkpoint / 'vlm_config.json').read_text())
    (dest / 'config.json').write_text(json.dumps(vlm))
    for item in (checkpoint / 'tokenizer').iterdir():
        shutil.copy(item, dest / item.name)
    edge = vlm['vision_config']['image_size']
    tokens = (edge // vlm['vision_config']['patch_size']) ** 2 // vlm['scale_factor'] ** 2
    (dest / 'preprocessor_config.json').write_text(json.dumps({
        'image_processor_type': 'SmolVLMImageProcessor', 'processor_class': 'SmolVLMProcessor', 'do_resize': True,
        'size': {'longest_edge': edge}, 'max_image_size': {'longest_edge': edge}, 'do_image_splitting': False}))
    (dest / 'processor_config.json').write_text(json.dumps({'processor_class': 'SmolVLMProcessor',
                                                            'image_seq_len': tokens}))
    return dest


def lerobot_folder(checkpoint: Path, dest: Path) -> Path:
    """The checkpoint with config.json's vlm_model_name on the local backbone and load_vlm_weights false."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in checkpoint.iterdir():
        target = dest / item.name
        if item.is_dir():
            shutil.copytree(item, target)
        elif item.name == 'model.safetensors':
            target.symlink_to(item)
        else:
            shutil.copy(item, target)
    config = json.loads((checkpoint / 'config.json').read_text())
    config.update(vlm_model_name=str(backbone_folder(checkpoint, dest / 'backbone')), load_vlm_weights=False,
                  device='cpu')
    (dest / 'config.json').write_text(json.dumps(config, indent=2))
    return dest


class Lerobot:
    """lerobot's SmolVLAPolicy and processors for one folder; ``fp32``: every weight float32."""

    def __init__(self, folder: Path, fp32: bool) -> None:
        from lerobot.policies.factory import make_pre_post_processors
        from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy
        from safetensors.torch import load_file
        self.policy = SmolVLAPolicy.from_pretrained(str(folder), strict=True)
        if fp32:
            self.policy.to(torch.float32)
            self.policy.load_state_dict(load_file(str(folder / 'model.safetensors')), strict=True)
        self.policy.eval()
        self.pre, self.post = make_pre_post_processors(self.policy.config, pretrained_path=str(folder))

    def dtypes(self) -> str:
        """Parameters per part and dtype, in millions."""
        parts = ('vision_model', 'connector', 'text_model', 'lm_head', 'lm_expert')
        counts: Dict[Tuple[str, str], int] = {}
        for name, param in self.policy.named_parameters():
            part = next((p for p in parts if f'.{p}.' in name), 'projections')
            key = (part, str(param.dtype).replace('torch.', ''))
            counts[key] = counts.get(key, 0) + param.numel()
        return ', '.join(f'{p} {d} {n / 1e6:.3g}M' for (p, d), n in sorted(counts.items()))

    def batch(self, frames, state, task):
        from lerobot.policies.utils import prepare_observation_for_inference
        obs = {f'observation.images.{name}': np.array(frame) for name, frame in frames.items()}
        obs['observation.state'] = np.asarray(state, dtype=np.float32).copy()
        return self.pre(prepare_observation_for_inference(obs, torch.device('cpu'), task))

    def set_rtc(self, rtc) -> None:
        """rtc: None, or an RTCConfig as a dict (prefix_attention_schedule, max_guidance_weight, ...)."""
        from lerobot.policies.rtc.configuration_rtc import RTCConfig
        from lerobot.configs.types import RTCAttentionSchedule
        self.policy.config.rtc_config = None if rtc is None else RTCConfig(
            enabled=True, prefix_attention_schedule=RTCAttentionSchedule(rtc['prefix_attention_schedule']),
            max_guidance_weight=rtc['max_guidance_weight'], execution_horizon=rtc['execution_horizon'])
        self.policy.init_rtc_processor()

    @torch.no_grad()
    def actions(self, frames, state, task, noise, **rtc_kwargs) -> np.ndarray:
        self.policy.reset()
        if rtc_kwargs.get('prev_chunk_left_over') is not None:
            rtc_kwargs['prev_chunk_left_over'] = torch.from_numpy(rtc_kwargs['prev_chunk_left_over'])[None]
        out = self.policy.predict_action_chunk(self.batch(frames, state, task), noise=torch.from_numpy(noise)[None],
                                               **rtc_kwargs)
        return self.post(out)[0].float().numpy()

    def model_inputs(self, frames, state, task):
        batch = self.batch(frames, state, task)
        images, img_masks = self.policy.prepare_images(batch)
        return (images, img_masks, batch['observation.language.tokens'],
                batch['observation.language.attention_mask'], self.policy.prepare_state(batch))

    @torch.no_grad()
    def time_sample_actions(self, inputs, noise) -> float:
        start = time.perf_counter()
        self.policy.model.sample_actions(*inputs, noise=torch.from_numpy(noise)[None])
        return time.perf_counter() - start


def ours(folder: Path, dtype: str):
    """Our PolicyRuntime, or None (printed) while the package cannot load SmolVLA."""
    from vla_policy_node.runtime import PolicyRuntime
    try:
        return PolicyRuntime.from_pretrained(folder, device='cpu', dtype=dtype)
    except Exception as exc:   # noqa: BLE001 - a figure script: say why and go on with lerobot's side
        print(f'  ours ({dtype}) unavailable: {type(exc).__name__}: {exc}')
        return None


def our_actions(runtime, frames, state, task, noise) -> np.ndarray:
    from vla_policy_node.observation import Observation
    if runtime is None:
        return np.full((noise.shape[0], 6), np.nan, dtype=np.float32)
    return runtime.infer(Observation(frames, state, task), noise=noise).actions


def frames_of(seed: int, shapes: Dict[str, Tuple[int, int]]) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for name, shape in shapes.items()}


def state_of(seed: int) -> np.ndarray:
    return np.random.default_rng(100 + seed).normal(0.0, 0.5, 6).astype(np.float32)


def noise_of(seed: int, chunk: int, dim: int = 32) -> np.ndarray:
    return np.random.default_rng(200 + seed).standard_normal((chunk, dim)).astype(np.float32)


def maxdiff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())


# ---- the parts ----------------------------------------------------------------------------------------------
def part_a(work: Path) -> Dict[str, List[np.ndarray]]:
    print('\n(a) tiny checkpoint: lerobot SmolVLAPolicy vs ours vs the test reference (fp32, max abs diff)')
    checkpoint = write_tiny_smolvla(work / 'tiny')
    lerobot = Lerobot(lerobot_folder(checkpoint, work / 'tiny_lerobot'), fp32=True)
    reference = LerobotSmolVLAReference(checkpoint)
    runtime = ours(checkpoint, 'float32')
    cases = [(frames_of(1, {'top': (24, 40), 'wrist': (48, 30)}), 'pick up the red cube'),
             (frames_of(2, {'top': (100, 60)}), LONG),
             (frames_of(3, {'top': (32, 32), 'wrist': (480, 640)}), 'stack_the cubes\n')]
    out = {'lerobot': [], 'ours': [], 'inputs': []}
    for i, (frames, task) in enumerate(cases):
        state, noise = state_of(i), noise_of(i, 8)
        theirs = lerobot.actions(frames, state, task, noise)
        ref = reference.actions(frames, state, task, noise)
        mine = our_actions(runtime, frames, state, task, noise)
        print(f'  case {i} ({len(frames)} camera(s), {len(task)} chars): lerobot-ours {maxdiff(theirs, mine):.3g}  '
              f'lerobot-reference {maxdiff(theirs, ref):.3g}  ours-reference {maxdiff(mine, ref):.3g}')
        out['lerobot'].append(theirs)
        out['ours'].append(mine)
        out['inputs'].append((frames, state, task, noise))
    out['checkpoint'] = checkpoint
    out['lerobot_folder'] = work / 'tiny_lerobot'
    return out


def part_v(work: Path) -> None:
    print('\n(v) the test reference vs lerobot on every parity-test checkpoint variant (max abs diff)')
    cases = [(frames_of(1, {'top': (24, 40), 'wrist': (48, 30)}), 'pick up the red cube'),
             (frames_of(2, {'top': (24, 40)}), LONG)]
    for i, (name, overrides) in enumerate(PARITY_VARIANTS.items()):
        checkpoint = write_tiny_smolvla(work / f'variant_{name}', seed=i, **overrides)
        folder = lerobot_folder(checkpoint, work / f'variant_{name}_lerobot')
        pairs = ((Lerobot(folder, fp32=True), LerobotSmolVLAReference(checkpoint)),
                 (Lerobot(folder, fp32=False), LerobotSmolVLAReference(checkpoint, recipe='bfloat16')))
        chunk = pairs[1][1].raw['chunk_size']
        diffs = [[maxdiff(lr.actions(f, state_of(j), t, noise_of(j, chunk)),
                          ref.actions(f, state_of(j), t, noise_of(j, chunk))) for j, (f, t) in enumerate(cases)]
                 for lr, ref in pairs]
        print(f'  {name} {overrides}: fp32 {max(diffs[0]):.3g}, bf16 recipe {max(diffs[1]):.3g}')
        if name != 'default':
            continue
        lerobot, reference = pairs[0]
        leftover = np.random.default_rng(7).normal(0, 1, (5, 6)).astype(np.float32)
        for schedule in ('LINEAR', 'EXP', 'ONES', 'ZEROS'):
            rtc = {'prefix_attention_schedule': schedule, 'max_guidance_weight': 5.0, 'execution_horizon': 6}
            lerobot.set_rtc(rtc)
            kwargs = dict(prev_chunk_left_over=leftover, inference_delay=2)
            frames, task = cases[0]
            theirs = lerobot.actions(frames, state_of(0), task, noise_of(0, 8), **dict(kwargs))
            ref = reference.actions(frames, state_of(0), task, noise_of(0, 8), rtc=rtc, **kwargs)
            print(f'    guided RTC {schedule} (delay 2, horizon 6, leftover 5): fp32 {maxdiff(theirs, ref):.3g}')
        lerobot.set_rtc(None)


def bf16_report(label: str, checkpoint: Path, lerobot_dir: Path, inputs, lerobot_fp32, ours_fp32) -> None:
    lerobot = Lerobot(lerobot_dir, fp32=False)
    print(f'  lerobot as built ({label}): {lerobot.dtypes()}')
    theirs = [lerobot.actions(*args) for args in inputs]
    del lerobot
    gc.collect()
    runtime = ours(checkpoint, 'bfloat16')
    mine = [our_actions(runtime, *args) for args in inputs]
    del runtime
    gc.collect()
    lr = [maxdiff(t, f) for t, f in zip(theirs, lerobot_fp32)]
    us = [maxdiff(m, f) for m, f in zip(mine, ours_fp32)]
    us_lr = [maxdiff(m, f) for m, f in zip(mine, lerobot_fp32)]
    print(f'  {label}: lerobot bf16 recipe vs lerobot fp32: max {max(lr):.3g} mean {np.mean(lr):.3g}')
    print(f'  {label}: ours bf16 vs ours fp32:               max {max(us):.3g} mean {np.mean(us):.3g}')
    print(f'  {label}: ours bf16 vs lerobot fp32:            max {max(us_lr):.3g} mean {np.mean(us_lr):.3g}')


def part_b(work: Path, repeats: int, threads: int, with_bf16: bool, with_reference: bool) -> None:
    print(f'\n(b) real SmolVLA shape, random weights, 2 cameras 640x480, fp32, {threads} thread(s), '
          f'median of {repeats} after 1 warm-up')
    start = time.perf_counter()
    checkpoint = write_tiny_smolvla(work / 'real', cameras=('top', 'wrist'), vlm_overrides=REAL_VLM, **REAL_CONFIG)
    lerobot_dir = lerobot_folder(checkpoint, work / 'real_lerobot')
    print(f'  wrote the checkpoint in {time.perf_counter() - start:.0f} s')
    shapes = {'top': (480, 640), 'wrist': (480, 640)}
    task = 'pick up the red cube and put it in the bin'
    lerobot = Lerobot(lerobot_dir, fp32=True)
    runtime = ours(checkpoint, 'float32')
    noise = noise_of(0, 50)
    base = frames_of(0, shapes)
    inputs = [(base, state_of(0), task, noise)]
    lerobot_fp32 = [lerobot.actions(*args) for args in inputs]
    ours_fp32 = [our_actions(runtime, *args) for args in inputs]
    diffs = ', '.join(f'{maxdiff(a, b):.3g}' for a, b in zip(lerobot_fp32, ours_fp32))
    print(f'  actions, lerobot vs ours (fp32): {diffs}')
    if with_reference:
        t0 = time.perf_counter()
        reference = LerobotSmolVLAReference(checkpoint).actions(*inputs[0])
        print(f'  actions, lerobot vs the test reference (fp32): {maxdiff(lerobot_fp32[0], reference):.3g} '
              f'(reference took {time.perf_counter() - t0:.1f} s)')
    model_inputs = lerobot.model_inputs(base, state_of(0), task)
    from vla_policy_node.observation import Observation
    theirs_t, miss_t, hit_t = [], [], []
    stages: Dict[str, List[Dict[str, float]]] = {'miss': [], 'hit': []}
    for run in range(repeats + 1):
        t_lerobot = lerobot.time_sample_actions(model_inputs, noise)
        t_miss = t_hit = float('nan')
        hit_ok = None
        if runtime is not None:
            frames = {name: frame.copy() for name, frame in base.items()}
            frames['top'][0, 0, 0] = (run + 7) % 256                     # a new frame: a miss
            t0 = time.perf_counter()
            miss = runtime.infer(Observation(frames, state_of(run), task), noise=noise)
            t_miss = time.perf_counter() - t0
            t0 = time.perf_counter()
            hit = runtime.infer(Observation(frames, state_of(run + 50), task), noise=noise)   # only the state moved
            t_hit = time.perf_counter() - t0
            hit_ok = hit.cache_hit and not miss.cache_hit
        if run and runtime is not None:
            stages['miss'].append(miss.timings_ms)
            stages['hit'].append(hit.timings_ms)
        if run:
            theirs_t.append(t_lerobot)
            miss_t.append(t_miss)
            hit_t.append(t_hit)
        note = '' if hit_ok in (None, True) else ' (NOT miss then hit)'
        print(f'  run {run}{" (warm-up)" if not run else ""}: lerobot sample_actions {t_lerobot * 1e3:.0f} ms, '
              f'ours miss {t_miss * 1e3:.0f} ms, hit {t_hit * 1e3:.0f} ms{note}')
    lr, mi, hi = (statistics.median(x) * 1e3 for x in (theirs_t, miss_t, hit_t))
    print(f'  median: lerobot sample_actions {lr:.0f} ms | ours miss {mi:.0f} ms ({mi / lr:.2f}x lerobot) | '
          f'ours hit {hi:.0f} ms ({hi / mi:.3f}x our miss, {hi / lr:.3f}x lerobot)')
    for kind, runs in stages.items():
        if runs:
            names = [name for name in runs[0] if all(name in r for r in runs)]
            print(f'  ours {kind} stages (median ms): ' + ', '.join(
                f'{name} {statistics.median(r[name] for r in runs):.1f}' for name in names))
    if runtime is not None:
        print(f'  our cache entry: {runtime.prefix_bytes()} bytes')
    del lerobot, runtime
    gc.collect()
    if with_bf16:
        print('\n(c, real shape) bf16 error against fp32')
        bf16_report('real shape', checkpoint, lerobot_dir, inputs, lerobot_fp32, ours_fp32)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--parts', default='abc',
                        help='any of a, b, c, v (c: tiny and, with b, real shape; v: the reference on every '
                             'test variant)')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--with-reference', action='store_true',
                        help='(b) also run the test reference on the real shape (about as long as a miss)')
    parser.add_argument('--work', type=Path, default=None, help='scratch folder (default: a temporary one)')
    parser.add_argument('--quick', action='store_true', help='part a only (the tiny checkpoint, seconds)')
    args = parser.parse_args()
    if args.quick:
        args.parts, args.repeats = 'a', 1
    try:
        import lerobot
        import transformers
    except ImportError as exc:
        print(f'skipped: needs lerobot ({exc}; run this with the python of a venv that has lerobot[smolvla], '
              'see the docstring)')
        return 2
    torch.set_num_threads(args.threads)
    print(f'lerobot {lerobot.__version__ if hasattr(lerobot, "__version__") else "?"}, transformers '
          f'{transformers.__version__}, torch {torch.__version__}, {args.threads} thread(s)')
    scratch = tempfile.TemporaryDirectory(prefix='compare_smolvla.') if args.work is None else None
    work = Path(scratch.name) if scratch else args.work
    work.mkdir(parents=True, exist_ok=True)
    try:
        if 'a' in args.parts or 'c' in args.parts:
            tiny = part_a(work)
            if 'c' in args.parts:
                print('\n(c, tiny) bf16 error against fp32')
                bf16_report('tiny', tiny['checkpoint'], tiny['lerobot_folder'], tiny['inputs'], tiny['lerobot'],
                            tiny['ours'])
        if 'v' in args.parts:
            part_v(work)
        if 'b' in args.parts:
            part_b(work, args.repeats, args.threads, with_bf16='c' in args.parts, with_reference=args.with_reference)
    finally:
        if scratch:
            scratch.cleanup()
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
