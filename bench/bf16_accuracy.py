"""bf16 accuracy on a deep model: ours and lerobot's bf16 recipe against fp32, per stage and per layer.

    python bench/bf16_accuracy.py                      # gemma_300m x 2 streams, 18 layers, 2 cameras, 10 steps
    python bench/bf16_accuracy.py --depth 6 --seeds 1  # quicker
    python bench/bf16_accuracy.py --quick              # 2 layers, 1 model, widths / 8, 1 camera, 2 steps (a smoke run)
    python bench/bf16_accuracy.py --init lerobot --seeds 16 --width-scale 4 --variants ours,before
                                                       # the claim docs/precision.md quotes: 16 models

The model is pi0 (or --type pi05) with gemma_300m-sized language and expert streams (width 1024, 18
layers, 8 heads, 1 kv head, head dim 256) and a small SigLIP (the vision path runs in fp32 in both
recipes, so its size does not enter the bf16 error). Random weights at 1/sqrt(fan_in), norms N(0, 0.1),
the same inputs and noise for every variant. "recipe" is test_model_parity.ref_sample_actions on the
bf16-cast model (lerobot 7427f318: bf16 scores rounded before an fp32 softmax, RoPE on bf16 tables, the
residual stream in bf16). Prints:

- actions |bf16 - fp32| max / mean for ours and the recipe, and the ratio ours / recipe;
- the prefix K/V error per layer (ours, recipe), the expert's hidden-state error per layer at step 0;
- ablations: each stage of ours switched to another precision, with the action error it gives;
- over the seeds: each variant's mean and max of the per-seed max / mean error, and the per-seed ratio
  ours / recipe of the mean error (median, range, how many seeds ours is below the recipe). One model's
  ratio scatters by about +-15%, and which way depends on the CPU's bf16 kernels (AMX, AVX512_BF16,
  AVX2): quote the mean over many seeds, not one seed's verdict.

Not a test: nothing is asserted. CPU, torch on --threads threads.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / 'test'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from vla_policy_node.policy import gemma, layers  # noqa: E402
from vla_policy_node.policy.families import family_class  # noqa: E402
from vla_policy_node.policy.families.pi0.config import GEMMA_VARIANTS  # noqa: E402
from vla_policy_node.policy.siglip import VisionSize  # noqa: E402
from vla_policy_node.policy.families.pi0.model import PiZeroModel  # noqa: E402
import test_model_parity as parity  # noqa: E402  (test/ is on sys.path)

SMALL_VISION = VisionSize(width=128, depth=1, mlp_dim=256, num_heads=2, patch_size=14)


def deep_config(policy_type: str, depth: int, cameras: int, width_scale: int = 1):
    size = GEMMA_VARIANTS['gemma_300m']
    size = dataclasses.replace(size, depth=depth, width=size.width // width_scale,
                               mlp_dim=size.mlp_dim // width_scale)
    names = ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')[:cameras]
    return dataclasses.replace(family_class(policy_type).preset(policy_type), vision=SMALL_VISION, language=size,
                               expert=size, vocab_size=4096, camera_names=names)


def randomize(model: torch.nn.Module, seed: int, init: str = 'scaled') -> None:
    """'scaled': weights at 1/sqrt(fan_in) (activations of order one at every depth), biases N(0, 0.02), norms
    N(0, 0.1). 'lerobot': as lerobot's ``PI0Policy(config)`` initialises pi0 (test_model_parity's
    ``randomize_like_lerobot_``)."""
    if init == 'lerobot':
        parity.randomize_like_lerobot_(model, seed)
        return
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                fan_in = param[0].numel() if 'embed' not in name else 1
                param.copy_(torch.randn(param.shape, generator=generator) / fan_in ** 0.5)
            elif 'norm' in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)


def inputs(config, seed: int):
    """One sample: every camera present, a 20-token prompt (the rest padding), state and noise."""
    images, image_masks, tokens, token_masks, state, noise = parity.model_inputs(config, batch=2, seed=seed)
    image_masks[:] = True
    images = torch.rand(images.shape, generator=torch.Generator().manual_seed(seed + 100)) * 2 - 1
    token_masks[:, :20] = True
    token_masks[:, 20:] = False
    tokens[~token_masks] = 0
    return images[:1], image_masks[:1], tokens[:1], token_masks[:1], state[:1], noise[:1]


def error(a: torch.Tensor, b: torch.Tensor) -> Tuple[float, float]:
    diff = (a.double() - b.double()).abs()
    return float(diff.max()), float(diff.mean())


# ---- stage variants of ours (monkeypatched for the ablation only) -------------------------------------------

def _attention_recipe(q, k, v, folded_mask):
    """bf16 scores, fp32 softmax rounded to bf16, bf16 probs @ v (lerobot eager attention)."""
    batch, heads, seq, dim = q.shape
    kv_heads = k.shape[1]
    qf = q.reshape(batch, kv_heads, (heads // kv_heads) * seq, dim)
    scores = (qf @ k.transpose(-1, -2)) * dim ** -0.5
    if folded_mask is not None:
        scores = scores + folded_mask.float()
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    return (probs @ v).reshape(batch, heads, seq, dim)


def _attention_fp32(q, k, v, folded_mask):
    out = ORIGINAL['attention'](q.float(), k.float(), v.float(),
                                None if folded_mask is None else folded_mask.float())
    return out.to(q.dtype)


def _rope_bf16(x, cos, sin):
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s


ORIGINAL = {'attention': layers.grouped_query_attention, 'rope': layers.apply_rope}


def _rounded_stream_input(self, x, dtype):
    """Tokens rounded to the compute dtype before they enter the fp32 residual stream (the code before issue 25)."""
    return x.to(dtype).float() if self.residual_fp32 else x.to(dtype)


ORIGINAL['stream_input'] = gemma.GemmaStack.stream_input


@contextlib.contextmanager
def patched(attention: Callable = None, rope: Callable = None, residual_fp32: bool = True,
            round_inputs: bool = False) -> Iterator[None]:
    default = gemma.GemmaStack.residual_fp32
    try:
        if attention is not None:
            gemma.grouped_query_attention = attention
        if rope is not None:
            gemma.apply_rope = rope
        if round_inputs:
            gemma.GemmaStack.stream_input = _rounded_stream_input
        gemma.GemmaStack.residual_fp32 = residual_fp32
        yield
    finally:
        gemma.grouped_query_attention = ORIGINAL['attention']
        gemma.apply_rope = ORIGINAL['rope']
        gemma.GemmaStack.stream_input = ORIGINAL['stream_input']
        gemma.GemmaStack.residual_fp32 = default


# 'ours' is the current code; 'before' is it with the residual stream rounded to bf16 after every add, as
# before issue 17 (and as lerobot does); 'tokens rounded at entry' is it with the tokens made outside the stacks
# rounded to bf16 before they enter the fp32 stream, as before issue 25. The others switch one stage of 'ours'
# to another precision.
VARIANTS: Dict[str, Dict[str, object]] = {
    'ours': {},
    'tokens rounded at entry': {'round_inputs': True},
    'before (bf16 residual stream)': {'residual_fp32': False},
    'before, attention as the recipe': {'residual_fp32': False, 'attention': _attention_recipe},
    'before, attention in fp32': {'residual_fp32': False, 'attention': _attention_fp32},
    'before, RoPE on bf16 tables': {'residual_fp32': False, 'rope': _rope_bf16},
}
# --variants names them by these keys.
VARIANT_KEYS = dict(zip(('ours', 'entry', 'before', 'before-attention-recipe', 'before-attention-fp32',
                         'before-rope-bf16'), VARIANTS))


# ---- per layer -----------------------------------------------------------------------------------------------

def expert_hidden_per_layer(model: PiZeroModel, context, state, noise) -> List[torch.Tensor]:
    """The expert's hidden states after each layer at step 0 (forward hooks on our path)."""
    outputs: List[torch.Tensor] = []
    handles = [layer.register_forward_hook(lambda _m, _i, out: outputs.append(out.float().clone()))
               for layer in model._expert.layers]
    try:
        model.denoise(context, state, noise, 1)
    finally:
        for handle in handles:
            handle.remove()
    depth = len(model._expert.layers)
    return outputs[-depth:]     # pi0: the state token's pass comes first


def fixed_stages(model: PiZeroModel, state: torch.Tensor, steps: int) -> Dict[str, torch.Tensor]:
    """The stages outside the two Gemma stacks: time terms (pi0: the time half of the action-time MLP; pi0.5:
    the adaptive-norm condition) and pi0's state projection, as the loop uses them."""
    stages = {'time terms': model._time_terms(steps).float().clone()}
    if hasattr(model, 'state_proj'):
        stages['state projection'] = model.state_proj(state.float()).float().clone()
    return stages


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--type', default='pi0', choices=('pi0', 'pi05'))   # the PaliGemma types PiZeroModel runs
    parser.add_argument('--depth', type=int, default=18)
    parser.add_argument('--cameras', type=int, default=2)
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--seeds', type=int, default=2, help='random models (errors summed over them)')
    parser.add_argument('--width-scale', type=int, default=1, help='divide the stream widths (CPU time only)')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--init', default='scaled', choices=('scaled', 'lerobot'),
                        help='random weights (see randomize)')
    parser.add_argument('--checkpoint', type=Path, default=None,
                        help='a pi0 / pi0.5 folder (e.g. the one bench/compare_lerobot_bf16.py has lerobot write) '
                        'instead of random models: its weights, --seeds inputs')
    parser.add_argument('--no-recipe', action='store_true', help='skip the recipe (it recomputes the prefix '
                        'every step)')
    parser.add_argument('--per-layer', action='store_true', help='print the per-layer tables')
    parser.add_argument('--variants', default=','.join(VARIANT_KEYS), help='comma-separated variants of ours to '
                        'run (default all): ' + ', '.join(f'{key} = {name}' for key, name in VARIANT_KEYS.items()))
    parser.add_argument('--quick', action='store_true', help='2 layers, 1 model, widths / 8, 1 camera, 2 steps')
    args = parser.parse_args(argv)
    keys = [key for key in args.variants.split(',') if key]
    if 'ours' not in keys or set(keys) - set(VARIANT_KEYS):
        parser.error(f'--variants {args.variants}: "ours" and any of {", ".join(VARIANT_KEYS)}')
    variants = {VARIANT_KEYS[key]: VARIANTS[VARIANT_KEYS[key]] for key in keys}
    if args.quick:
        args.depth, args.seeds, args.width_scale, args.cameras, args.steps = 2, 1, 8, 1, 2
    torch.set_num_threads(args.threads)
    if args.checkpoint is not None:
        from vla_policy_node.policy.families import load_checkpoint
        loaded_model = load_checkpoint(args.checkpoint, torch.device('cpu'), torch.float32).model
        config = loaded_model.config
        source = f'{args.checkpoint}, {args.seeds} input(s)'
    else:
        config = deep_config(args.type, args.depth, args.cameras, args.width_scale)
        source = f'{args.seeds} model(s), init {args.init}'
    print(f'{config.policy_type}: streams of width {config.language.width} / {config.expert.width}, '
          f'{config.language.depth} layers, {len(config.all_camera_names)} cameras, prefix {config.prefix_len} '
          f'tokens, {args.steps} steps, {source}, torch {torch.__version__}')
    per_seed: Dict[str, List[Tuple[float, float]]] = {}    # variant -> (max, mean) per seed
    for seed in range(args.seeds):
        started = time.perf_counter()
        if args.checkpoint is not None:    # fresh fp32 weights for each input (bf16 rounded the last ones)
            model = None
            model = loaded_model if seed == 0 else load_checkpoint(args.checkpoint, torch.device('cpu'),
                                                                   torch.float32).model
            loaded_model = None
        else:
            torch.manual_seed(0)
            model = PiZeroModel(config).eval()
            randomize(model, seed, args.init)
        images, image_masks, tokens, token_masks, state, noise = inputs(config, seed)
        prefix_inputs = (images, image_masks, tokens, token_masks)
        recipe = not args.no_recipe
        with torch.no_grad():
            context32 = model.fill_prefix(*prefix_inputs)
            fp32 = model.denoise(context32, state, noise, args.steps)
            if args.per_layer:
                hidden32 = expert_hidden_per_layer(model, context32, state, noise)
                recipe32: List[Tuple[torch.Tensor, ...]] = []
                if recipe:
                    parity.ref_sample_actions(model, *prefix_inputs, state, noise, 1, record=recipe32)
            fp32_stages = fixed_stages(model, state, args.steps)
            model.set_compute_dtype(torch.bfloat16)
            bf16_stages = fixed_stages(model, state, args.steps)
            print(f'  seed {seed}: stages kept in fp32 under bf16, max |bf16 - fp32| (both recipes alike): '
                  + ', '.join(f'{name} {error(bf16_stages[name], fp32_stages[name])[0]:.1e}' for name in fp32_stages)
                  + '; the Euler update x + dt v runs in fp32')
            results = {}
            for name, patches in variants.items():
                with patched(**patches):
                    context = model.fill_prefix(*prefix_inputs)
                    results[name] = model.denoise(context, state, noise, args.steps)
                    if args.per_layer and name in ('ours', 'before (bf16 residual stream)'):
                        hidden = expert_hidden_per_layer(model, context, state, noise)
                        print(f'  seed {seed}, {name}: prefix K/V and step-0 expert hidden per layer, '
                              'mean |bf16 - fp32|')
                        for i in range(config.language.depth):
                            print(f'    layer {i:2d}: K {error(context["kv"][i, 0], context32["kv"][i, 0])[1]:.2e} '
                                  f'V {error(context["kv"][i, 1], context32["kv"][i, 1])[1]:.2e} '
                                  f'hidden {error(hidden[i], hidden32[i])[1]:.2e}')
            if recipe:
                if args.per_layer:
                    recorded: List[Tuple[torch.Tensor, ...]] = []
                    parity.ref_sample_actions(model, *prefix_inputs, state, noise, 1, record=recorded)
                    prefix = context32.prefix_len
                    print(f'  seed {seed}, recipe: prefix K/V and step-0 expert hidden per layer, mean |bf16 - fp32|')
                    for i, (got, want) in enumerate(zip(recorded, recipe32)):
                        print(f'    layer {i:2d}: K {error(got[0][..., :prefix, :], want[0][..., :prefix, :])[1]:.2e} '
                              f'V {error(got[1][..., :prefix, :], want[1][..., :prefix, :])[1]:.2e} '
                              f'hidden {error(got[2], want[2])[1]:.2e}')
                results['recipe'] = parity.ref_sample_actions(model, *prefix_inputs, state, noise, args.steps)
        line = []
        for name, actions in results.items():
            per_seed.setdefault(name, []).append(error(actions, fp32))
            line.append(f'{name} {per_seed[name][-1][0]:.4f}/{per_seed[name][-1][1]:.5f}')
        print(f'  seed {seed} ({time.perf_counter() - started:.0f} s): ' + ', '.join(line))
    print_summary(per_seed, args.seeds)
    return 0


def print_summary(per_seed: Dict[str, List[Tuple[float, float]]], seeds: int) -> None:
    """Each variant's error over the seeds, and its ratio to the recipe as the mean over seeds (the figure to
    quote) beside the per-seed spread (what one model would have said)."""
    def mean(values):
        return sum(values) / len(values)

    print(f'\nactions |bf16 - fp32| over {seeds} model(s) / input(s): the per-seed max and mean error, '
          'each as mean over the seeds / worst seed')
    base = per_seed.get('recipe')
    for name, rows in per_seed.items():
        maxes, means = [r[0] for r in rows], [r[1] for r in rows]
        ratio = ''
        if base and name != 'recipe':
            ratio = (f'   / recipe (means over seeds) = {mean(maxes) / mean([r[0] for r in base]):.2f}x max, '
                     f'{mean(means) / mean([r[1] for r in base]):.2f}x mean')
        print(f'  {name:34} max {mean(maxes):.4f} / {max(maxes):.4f}   mean {mean(means):.5f} / '
              f'{max(means):.5f}{ratio}')
    if base:
        ratios = sorted(o[1] / r[1] for o, r in zip(per_seed['ours'], base))
        below = sum(ratio <= 1 for ratio in ratios)
        print(f'  per seed, ours / recipe mean error: median {ratios[len(ratios) // 2]:.2f}, range '
              f'{ratios[0]:.2f} .. {ratios[-1]:.2f}, ours below the recipe on {below} of {len(ratios)} seeds')
    before = per_seed.get('before (bf16 residual stream)')
    if before:
        ours = per_seed['ours']
        print(f'  ours / before = {mean([r[0] for r in ours]) / mean([r[0] for r in before]):.2f}x max, '
              f'{mean([r[1] for r in ours]) / mean([r[1] for r in before]):.2f}x mean')


if __name__ == '__main__':
    raise SystemExit(main())
