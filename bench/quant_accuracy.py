"""Accuracy of the ``quantization`` modes against fp32, on CPU: max / mean action error of bf16, lerobot's bf16
recipe, int8_weights and fp8 (the CPU reference of the CUDA kernel), plus which parts of the model carry it.

    python bench/quant_accuracy.py                  # pi0 + pi0.5 (gemma_300m x 2, 18 layers, 2 cameras, 10 steps)
                                                    # and SmolVLA at its real shape
    python bench/quant_accuracy.py --quick          # 4 layers at 1/4 width, one seed, tiny SmolVLA (a minute)
    python bench/quant_accuracy.py --types smolvla --ablation

The family says which model is measured (``recipe_restated``): a family whose model class is pi0's
(pi0, pi0.5) runs on bench/bf16_accuracy.py's deep model (random weights at 1/sqrt(fan_in), small SigLIP, the
same inputs and noise for every variant), where "recipe" is lerobot's bf16 (test_model_parity.ref_sample_actions
on the bf16-cast model). Any other family (SmolVLA) runs bench_runtime.random_runtime's model at the last of
its ``preset_names`` (the real shape; the first under --quick: SmolVLM2-500M cut to 16 layers, expert 0.75,
chunk 50, weights N(0, 0.02)), two 640x480 frames, through PolicyRuntime (no recipe here:
bench/compare_lerobot_smolvla.py has lerobot's, it needs lerobot). Errors in the model's normalised
action space. int8 / fp8 "(fp32)" compute in fp32 (what the CPU runs), "(bf16)" in bf16 (what a GPU runs).

--ablation: int8_weights' numbers (nothing kept) on one part only (vision, language model, action expert, token
table, each projection kind of the language model), and int8_weights plus the small projections every mode
keeps (state / action / time / vision->language).

--options: int8_weights' alternatives (scale group, scale dtype, which projections stay in the compute dtype),
each with its action error and the full-size pi0 / pi0.5 weight bytes (the doctor's count, meta device).

Not a test: nothing is asserted (test/test_quantization.py pins the errors of a small model).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / 'test', ROOT / 'bench'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from vla_policy_node.policy import quant  # noqa: E402
from vla_policy_node.policy.families import family_class, known_types  # noqa: E402
from vla_policy_node.policy.families.pi0.model import PiZeroModel  # noqa: E402
from vla_policy_node.policy.quant import int8_dequantize, int8_weights, quantize_model  # noqa: E402
import bf16_accuracy  # noqa: E402  (bench/ is on sys.path)
import test_model_parity as parity  # noqa: E402  (test/ is on sys.path)

Variant = Tuple[str, Optional[torch.dtype], str, Optional[Callable[[str], bool]]]   # label, dtype, mode, only
VARIANTS: List[Variant] = [
    ('bf16', torch.bfloat16, 'none', None),
    ('int8_weights (fp32)', torch.float32, 'int8_weights', None),
    ('int8_weights (bf16)', torch.bfloat16, 'int8_weights', None),
    ('fp8 (fp32)', torch.float32, 'fp8', None),
    ('fp8 (bf16)', torch.bfloat16, 'fp8', None),
]
PARTS: Dict[str, Callable[[str], bool]] = {
    'vision tower': lambda name: 'vision' in name,
    'language model': lambda name: ('language_model' in name or 'text_model' in name) and 'embed' not in name,
    'action expert': lambda name: '.gemma_expert.' in name or '.lm_expert.' in name,
    'token table': lambda name: 'embed_tokens' in name,
}
LM_KINDS = ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj')   # --ablation's rows
for _kind in LM_KINDS:
    PARTS[f'language model {_kind}'] = (lambda name, kind=_kind: PARTS['language model'](name)
                                        and name.endswith(kind))
ALSO_SMALL = 'int8 everything (+ small projections)'


def ablation_variants() -> List[Variant]:
    return ([(f'int8 {part} only (fp32)', torch.float32, 'int8_weights', only) for part, only in PARTS.items()]
            + [(ALSO_SMALL, torch.float32, 'int8_weights', None)])


def quantize_small_too(model: nn.Module) -> None:
    """The ablation's extra step: every nn.Linear the mode keeps rounded to its int8 rows in place (the numbers
    of int8_weights in fp32; the families read some of these weights directly, so they stay nn.Linear)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(int8_dequantize(*int8_weights(module.weight)))


# label -> policy/quant.py settings (INT8_GROUP, INT8_SCALE_DTYPE, KEEP_ACTION_EXPERT, KEEP_ATTENTION_OUTPUT,
# KEEP_SHARED_KV); the last one is the mode's own.
OPTIONS = {
    'per row, fp32 scales, nothing kept': (None, torch.float32, False, False, False),
    'group 64, bf16 scales, nothing kept': (64, torch.bfloat16, False, False, False),
    'group 32, bf16 scales, nothing kept': (32, torch.bfloat16, False, False, False),
    'group 64, keep shared k/v': (64, torch.bfloat16, False, False, True),
    'group 64, keep o_proj + shared k/v': (64, torch.bfloat16, False, True, True),
    'group 64, keep expert + shared k/v': (64, torch.bfloat16, True, False, True),
    'group 32, keep expert + shared k/v': (32, torch.bfloat16, True, False, True),
    'group 64, keep expert + o_proj + shared k/v': (64, torch.bfloat16, True, True, True),
}
SETTINGS = ('INT8_GROUP', 'INT8_SCALE_DTYPE', 'KEEP_ACTION_EXPERT', 'KEEP_ATTENTION_OUTPUT', 'KEEP_SHARED_KV')


@contextlib.contextmanager
def int8_option(label: str):
    saved = [getattr(quant, name) for name in SETTINGS]
    for name, value in zip(SETTINGS, OPTIONS[label]):
        setattr(quant, name, value)
    try:
        yield
    finally:
        for name, value in zip(SETTINGS, saved):
            setattr(quant, name, value)


def option_bytes(label: str) -> Dict[str, float]:
    """int8_weights bytes / bf16 bytes of the full-size presets under one option (the doctor's count)."""
    from vla_policy_node.doctor import quantized_bytes
    from vla_policy_node.policy.families import family_class, preset_config

    ratios = {}
    with int8_option(label):
        for name in ('pi0', 'pi05'):
            config = preset_config(name)
            figures = quantized_bytes(family_class(config.policy_type), config)
            ratios[name] = figures['int8_weights'] / figures['none']
    return ratios


def print_options(types: List[str], depth: int, width_scale: int, steps: int, seeds: int,
                  rows: Optional[List[int]] = None) -> None:
    print(f'\nint8_weights options: max action error / lerobot bf16 recipe max (fp32 | bf16 compute), summed over '
          f'{seeds} seed(s), gemma_300m/{width_scale} x 2 streams, {depth} layers; full-size bytes / bf16 bytes')
    for row, label in enumerate(OPTIONS):
        if rows and row not in rows:
            continue
        cells = []
        for policy_type in types:
            totals = [0.0, 0.0, 0.0]
            for seed in range(seeds):
                with int8_option(label):
                    found = paligemma_errors(policy_type, depth, width_scale, steps, seed,
                                             [('fp32', torch.float32, 'int8_weights', None),
                                              ('bf16', torch.bfloat16, 'int8_weights', None)], True)
                totals = [totals[0] + found['lerobot bf16 recipe'][0], totals[1] + found['fp32'][0],
                          totals[2] + found['bf16'][0]]
            cells.append(f'{policy_type} {totals[1] / totals[0]:4.2f}x | {totals[2] / totals[0]:4.2f}x')
        ratios = option_bytes(label)
        print(f'  {label:46} {"   ".join(cells)}   bytes pi0 {ratios["pi0"]:.3f}x, pi05 {ratios["pi05"]:.3f}x',
              flush=True)


def apply(model: nn.Module, dtype: torch.dtype, mode: str, only, label: str) -> nn.Module:
    model.set_compute_dtype(dtype)
    if only is None:
        quantize_model(model, mode, torch.device('cpu'))
    else:       # one part at a time: the mode's numbers with nothing kept, so that every part can be measured
        with int8_option('group 64, bf16 scales, nothing kept'):
            quantize_model(model, mode, torch.device('cpu'), only=only)
    if label == ALSO_SMALL:
        quantize_small_too(model)
    return model


def error(a, b) -> Tuple[float, float]:
    diff = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
    return float(diff.max()), float(diff.mean())


# ---- pi0 / pi0.5 ---------------------------------------------------------------------------------------------

def paligemma_errors(policy_type: str, depth: int, width_scale: int, steps: int, seed: int,
                     variants: List[Variant], recipe: bool) -> Dict[str, Tuple[float, float]]:
    config = bf16_accuracy.deep_config(policy_type, depth, 2, width_scale)
    images, image_masks, tokens, token_masks, state, noise = bf16_accuracy.inputs(config, seed)

    def model() -> PiZeroModel:
        torch.manual_seed(0)
        built = PiZeroModel(config).eval()
        bf16_accuracy.randomize(built, seed)
        return built

    def actions(m: PiZeroModel) -> np.ndarray:
        with torch.no_grad():
            context = m.fill_prefix(images, image_masks, tokens, token_masks)
            return m.denoise(context, state, noise, steps)[0].double().numpy()

    reference = actions(model())
    found = {}
    if recipe:
        bf16 = model().set_compute_dtype(torch.bfloat16)
        with torch.no_grad():
            found['lerobot bf16 recipe'] = error(parity.ref_sample_actions(
                bf16, images, image_masks, tokens, token_masks, state, noise, steps)[0].double().numpy(), reference)
    for label, dtype, mode, only in variants:
        found[label] = error(actions(apply(model(), dtype, mode, only, label)), reference)
    return found


def recipe_restated(policy_type: str) -> bool:
    """Whether lerobot's bf16 recipe is restated for this family's model, so the deep model and the recipe
    apply: the family answers by the model class it builds (test_model_parity.ref_sample_actions and
    bf16_accuracy.deep_config are written for PiZeroModel)."""
    return issubclass(family_class(policy_type).model_class, PiZeroModel)


def measured_preset(policy_type: str, quick: bool) -> str:
    """A family measured through its runtime: its smallest preset under --quick, else its real shape (the
    family lists ``preset_names`` smallest first, the real shape last)."""
    names = family_class(policy_type).preset_names
    return names[0] if quick else names[-1]


# ---- any other family, through its runtime -------------------------------------------------------------------

def runtime_errors(preset_name: str, seed: int, variants: List[Variant]) -> Dict[str, Tuple[float, float]]:
    from bench_runtime import camera_frames, random_runtime
    from vla_policy_node.observation import Observation

    found = {}
    with tempfile.TemporaryDirectory() as scratch:
        def actions(runtime) -> np.ndarray:
            config = runtime.config
            rng = np.random.default_rng(seed)
            observation = Observation(camera_frames(config.camera_names, seed), rng.normal(0, 0.5, config.state_dim),
                                      'pick up the red block and put it in the bin')
            noise = rng.standard_normal((config.chunk_size, config.max_action_dim)).astype(np.float32)
            return runtime.infer(observation, noise=noise, use_cache=False).normalized

        cpu = torch.device('cpu')
        reference = actions(random_runtime(preset_name, cpu, torch.float32, Path(scratch), 0))
        for label, dtype, mode, only in variants:
            plain = only is None and label != ALSO_SMALL          # the runtime's own quantization
            runtime = random_runtime(preset_name, cpu, dtype, Path(scratch), 0, quantization=mode if plain else 'none')
            if not plain:
                apply(runtime.model, dtype, mode, only, label)
            found[label] = error(actions(runtime), reference)
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--types', default=','.join(known_types()), help='policy types (default: every family)')
    parser.add_argument('--depth', type=int, default=18)
    parser.add_argument('--width-scale', type=int, default=1)
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--seeds', type=int, default=2)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--ablation', action='store_true')
    parser.add_argument('--no-recipe', action='store_true')
    parser.add_argument('--options', action='store_true', help="only int8_weights' alternatives (pi0 / pi0.5)")
    parser.add_argument('--option-rows', default='', help='with --options: the row numbers to run (0-based, '
                                                          'comma-separated; default all)')
    parser.add_argument('--quick', action='store_true', help='--depth 4 --width-scale 4 --seeds 1, tiny SmolVLA')
    args = parser.parse_args(argv)
    if args.quick:
        args.depth, args.width_scale, args.seeds = 4, 4, 1
    torch.set_num_threads(args.threads)
    if args.options:
        print_options([t.strip() for t in args.types.split(',') if t.strip() and recipe_restated(t.strip())],
                      args.depth,
                      args.width_scale, args.steps, args.seeds,
                      [int(row) for row in args.option_rows.split(',') if row.strip()])
        return 0
    variants = VARIANTS + (ablation_variants() if args.ablation else [])
    print(f'torch {torch.__version__}, CPU, {args.threads} threads; errors |mode - fp32| in normalised action units, '
          f'max / mean, summed over {args.seeds} seed(s)')
    for policy_type in [t.strip() for t in args.types.split(',') if t.strip()]:
        started = time.perf_counter()
        totals: Dict[str, List[float]] = {}
        for seed in range(args.seeds):
            if not recipe_restated(policy_type):
                found = runtime_errors(measured_preset(policy_type, args.quick), seed, variants)
            else:
                found = paligemma_errors(policy_type, args.depth, args.width_scale, args.steps, seed, variants,
                                         not args.no_recipe)
            for label, (e_max, e_mean) in found.items():
                total = totals.setdefault(label, [0.0, 0.0])
                total[0] += e_max
                total[1] += e_mean
        if not recipe_restated(policy_type):
            shape = f'{policy_type}, preset {measured_preset(policy_type, args.quick)}' + \
                ('' if args.quick else ' (the real shape)')
        else:
            shape = (f'{policy_type}, gemma_300m/{args.width_scale} x 2 streams, {args.depth} layers, 2 cameras, '
                     f'{args.steps} steps')
        print(f'\n{shape} ({time.perf_counter() - started:.0f} s)')
        base = totals.get('lerobot bf16 recipe') or totals.get('bf16')
        base_name = 'recipe' if 'lerobot bf16 recipe' in totals else 'bf16'
        for label, (e_max, e_mean) in totals.items():
            print(f'  {label:44} {e_max:.4f} / {e_mean:.5f}   {e_max / base[0]:5.2f}x {base_name} max, '
                  f'{e_mean / base[1]:5.2f}x mean')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
