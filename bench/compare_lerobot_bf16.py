"""bf16 against fp32 on a pi0 that lerobot itself built and saved: ours vs lerobot's bf16 (issue 25). Prints only.

lerobot is no dependency of the package: this script runs in a venv OUTSIDE the repo that has lerobot with its
``pi`` extra (>= 0.5 needs Python 3.12) and imports the package and test/ from this checkout. Set-up used
(lerobot 0.6.1 from PyPI, whose policies/pi0/ is huggingface/lerobot 7427f318's; transformers 5.5.4, torch 2.11):

    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/scratch/lerobot-venv
    /work/scratch/lerobot-venv/bin/pip install 'torch>=2.7,<2.12' 'lerobot[pi]' xxhash sentencepiece pytest
    /work/scratch/lerobot-venv/bin/python bench/compare_lerobot_bf16.py --work /work/scratch/pi0_bf16

The checkpoint: lerobot's ``PI0Policy(PI0Config(...))`` with ``paligemma_variant`` and ``action_expert_variant``
both ``gemma_300m`` (18 layers each; lerobot's own choice of the smaller PaliGemma stream, so the model fits a
shared 24 GB machine), lerobot's vision tower (SigLIP so400m, 224 px), lerobot's initialisation, 2 cameras,
chunk 50, 10 steps, and one fix (``projector_to_language_width``: lerobot's SigLIP projector is 2048 wide
whatever the language width); written by ``save_pretrained`` with processor files from lerobot's processor
steps (mean/std statistics of 0/1, no tokenizer step: no PaliGemma tokenizer can be downloaded here).
``--checkpoint DIR`` takes a folder written that way instead of building one.

The comparison is at the model's inputs, the same for both sides: 2 camera images of uniform random pixels in
[-1, 1], a prompt of random token ids right-padded to 48, a normalised state (padded to 32), the noise. lerobot:
``PI0Pytorch.sample_actions`` in fp32, then the same model cast as lerobot casts it for ``dtype=bfloat16``
(``to_bfloat16_for_selected_params``: the two Gemma streams bf16, vision tower, projector and norms fp32; the
projections outside PaliGemmaWithExpert fp32). Ours: the folder through ``load_checkpoint`` (fp32, then bf16),
``sample_actions``. Each bf16 is measured against its own fp32; ours fp32 against lerobot's fp32 is the parity.

    --per-layer      the prefix K/V error per layer of both bf16s (case 0): where the error enters the prefix
    --with-recipe    also test_model_parity.ref_sample_actions (our restatement of lerobot's recipe) on our bf16
                     model, against lerobot's bf16 (the restatement is bench/bf16_accuracy.py's "recipe")

Exit 2 when lerobot cannot be imported. CPU, --threads threads. lerobot runs in a child process (the same
python, ``--side lerobot``) that saves its actions beside the checkpoint; ``--reuse`` takes them again.

Figures of one run (2026-12-02, 2-core x86_64 CPU, lerobot 0.6.1 / transformers 5.5.4 / torch 2.11, package at
issue25-bf16; ``--checkpoint <the folder a --work run built> --cases 2 --per-layer``), max / mean over 2 inputs:

    parity ours fp32 vs lerobot fp32     < 5e-5 / < 5e-6 (printed as 0.0000)
    lerobot bf16 vs lerobot fp32         0.0109 / 0.00317
    ours bf16 vs ours fp32               0.0056 / 0.00186   (0.52x / 0.59x lerobot's)
    ours with the tokens rounded at      0.0056 / 0.00187   (0.51x / 0.59x: the code before issue 25)
      entry
    prefix K/V, mean |bf16 - fp32|       lerobot K 1.5e-2 at layer 0 to 2.0e-2 at layer 17, ours 1.4e-3 to 2.5e-3
                                         (lerobot's keys rotated on bf16 RoPE tables); V 2.6e-3 -> 5.2e-3 vs
                                         1.2e-3 -> 2.2e-3
"""
from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / 'test', ROOT / 'bench'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

CAMERAS = ('top', 'wrist')
STATE_DIM = ACTION_DIM = 6
PROMPT_TOKENS = 20          # real tokens of the 48; the rest is right padding


# ---- lerobot's side -----------------------------------------------------------------------------------------
def lerobot_config():
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.pi0.configuration_pi0 import PI0Config
    features = {f'observation.images.{name}': PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224))
                for name in CAMERAS}
    features['observation.state'] = PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,))
    return PI0Config(paligemma_variant='gemma_300m', action_expert_variant='gemma_300m', device='cpu',
                     dtype='float32', input_features=features,
                     output_features={'action': PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))})


def save_processors(config, folder: Path) -> None:
    """lerobot's pi0 processor steps (processor_pi0.py) without the tokenizer step, saved beside the weights."""
    from lerobot.processor import (AbsoluteActionsProcessorStep, RelativeActionsProcessorStep,
                                   make_default_policy_processor_steps, make_policy_processor_pipelines)
    stats = {key: {'mean': torch.zeros(STATE_DIM), 'std': torch.ones(STATE_DIM)}
             for key in ('observation.state', 'action')}
    steps = make_default_policy_processor_steps(config, stats)
    relative = RelativeActionsProcessorStep(enabled=False, exclude_joints=[], action_names=None)
    pre, post = make_policy_processor_pipelines(
        [steps.rename_observations, steps.add_batch_dim, steps.to_device, relative, steps.normalize],
        [steps.unnormalize, AbsoluteActionsProcessorStep(enabled=False, relative_step=relative), steps.to_cpu])
    pre.save_pretrained(folder)
    post.save_pretrained(folder)


def projector_to_language_width() -> None:
    """lerobot sets the SigLIP projector's output to 2048 (``vision_config.projection_dim``, gemma_2b's width)
    whatever ``paligemma_variant`` says, so a gemma_300m PaliGemma stream (width 1024) cannot run
    (``embed_prefix`` fails to concatenate 2048-wide image tokens with 1024-wide text tokens). The one change
    made to lerobot here: the projector's output is the language model's width, before the model is built."""
    from lerobot.policies.pi0 import modeling_pi0 as mp
    base = mp.PaliGemmaForConditionalGenerationWithPiGemma
    if getattr(base, 'projector_fixed', False):
        return

    class PaliGemmaProjectorAtLanguageWidth(base):
        projector_fixed = True

        def __init__(self, config):
            config.vision_config.projection_dim = config.text_config.hidden_size
            super().__init__(config)

    mp.PaliGemmaForConditionalGenerationWithPiGemma = PaliGemmaProjectorAtLanguageWidth


def lerobot_policy(checkpoint: Path, build: bool, seed: int):
    """Build and save (``build``) or rebuild and load key by key (strict) a PI0Policy, fp32."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy
    from safetensors import safe_open
    projector_to_language_width()
    start = time.perf_counter()
    torch.manual_seed(seed)
    config = lerobot_config() if build else PreTrainedConfig.from_pretrained(str(checkpoint))
    policy = PI0Policy(config).eval()
    if build:
        policy.save_pretrained(checkpoint)
        save_processors(config, checkpoint)
        print(f'  lerobot built and saved {checkpoint} in {time.perf_counter() - start:.0f} s')
    else:
        params = dict(policy.named_parameters())
        with safe_open(str(checkpoint / 'model.safetensors'), 'pt') as handle, torch.no_grad():
            keys = set(handle.keys())
            missing, unexpected = sorted(set(params) - keys), sorted(keys - set(params))
            if missing or unexpected:
                raise SystemExit(f'{checkpoint}: missing {missing[:3]}, unexpected {unexpected[:3]}')
            for key in keys:
                params[key].copy_(handle.get_tensor(key))
        print(f'  lerobot loaded {checkpoint} in {time.perf_counter() - start:.0f} s')
    # The two lm heads (257152 x 1024 each) feed nothing in sample_actions: dropped to save 2 GB.
    pwe = policy.model.paligemma_with_expert
    pwe.paligemma.lm_head = torch.nn.Identity()
    pwe.gemma_expert.lm_head = torch.nn.Identity()
    gc.collect()
    return policy


def lerobot_dtypes(policy) -> str:
    counts: Dict[Tuple[str, str], int] = {}
    for name, param in policy.model.named_parameters():
        part = next((p for p in ('vision_tower', 'multi_modal_projector', 'language_model', 'gemma_expert')
                     if p in name), 'projections')
        key = (part, str(param.dtype).replace('torch.', ''))
        counts[key] = counts.get(key, 0) + param.numel()
    return ', '.join(f'{p} {d} {n / 1e6:.0f}M' for (p, d), n in sorted(counts.items()))


def lerobot_lists(case):
    images, image_masks, tokens, token_masks, state, noise = case
    return ([images[:, i] for i in range(images.shape[1])], [image_masks[:, i] for i in range(images.shape[1])],
            tokens, token_masks, state, noise)


@torch.no_grad()
def lerobot_actions(policy, case, steps: int) -> torch.Tensor:
    images, image_masks, tokens, token_masks, state, noise = lerobot_lists(case)
    return policy.model.sample_actions(images, image_masks, tokens, token_masks, state, noise=noise,
                                       num_steps=steps).float()


@torch.no_grad()
def lerobot_prefix_kv(policy, case) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """The prefix K/V per layer, as lerobot's sample_actions computes them (its first half)."""
    from lerobot.policies.pi0 import modeling_pi0 as mp
    images, image_masks, tokens, token_masks, _, _ = lerobot_lists(case)
    model = policy.model
    embs, pad, att = model.embed_prefix(images, image_masks, tokens, token_masks)
    masks = mp.prepare_attention_masks_4d(mp.make_att_2d_masks(pad, att))
    _, cache = model.paligemma_with_expert.forward(attention_mask=masks, position_ids=torch.cumsum(pad, dim=1) - 1,
                                                   past_key_values=None, inputs_embeds=[embs, None], use_cache=True)
    return [(layer.keys.float(), layer.values.float()) for layer in cache.layers]


# ---- ours ---------------------------------------------------------------------------------------------------
def our_model(checkpoint: Path, dtype: torch.dtype):
    from vla_policy_node.policy.families import load_checkpoint
    start = time.perf_counter()
    model = load_checkpoint(checkpoint, torch.device('cpu'), dtype).model
    print(f'  ours loaded ({str(dtype)[6:]}) in {time.perf_counter() - start:.0f} s')
    return model


@torch.no_grad()
def our_actions(model, case, steps: int) -> torch.Tensor:
    images, image_masks, tokens, token_masks, state, noise = case
    return model.sample_actions(images, image_masks, tokens, token_masks, state, noise=noise, num_steps=steps).float()


# ---- inputs and figures -------------------------------------------------------------------------------------
def make_case(seed: int, vocab: int = 257152, length: int = 48, chunk: int = 50, dim: int = 32):
    generator = torch.Generator().manual_seed(1000 + seed)
    pixels = torch.randint(0, 256, (1, len(CAMERAS), 3, 224, 224), generator=generator, dtype=torch.uint8)
    images = pixels.float() / 255.0 * 2.0 - 1.0
    image_masks = torch.ones(1, len(CAMERAS), dtype=torch.bool)
    tokens = torch.zeros(1, length, dtype=torch.long)
    tokens[0, :PROMPT_TOKENS] = torch.randint(3, vocab, (PROMPT_TOKENS,), generator=generator)
    token_masks = tokens != 0
    state = torch.zeros(1, dim)
    state[0, :STATE_DIM] = torch.randn(STATE_DIM, generator=generator)
    noise = torch.randn(1, chunk, dim, generator=generator)
    return images, image_masks, tokens, token_masks, state, noise


def error(a: torch.Tensor, b: torch.Tensor) -> Tuple[float, float]:
    """max and mean |a - b| over the robot's action dims."""
    diff = (a[..., :ACTION_DIM].double() - b[..., :ACTION_DIM].double()).abs()
    return float(diff.max()), float(diff.mean())


def summary(label: str, pairs) -> Tuple[float, float]:
    errs = [error(a, b) for a, b in pairs]
    worst, mean = max(e[0] for e in errs), float(np.mean([e[1] for e in errs]))
    per_case = ', '.join(f'{e[0]:.4f}/{e[1]:.5f}' for e in errs)
    print(f'  {label:44s} max {worst:.4f}  mean {mean:.5f}   (per case max/mean: {per_case})')
    return worst, mean


def lerobot_side(checkpoint: Path, build: bool, cases, args, results: Path) -> int:
    """lerobot's fp32 and bf16 actions (and prefix K/V of case 0 with --per-layer), saved to ``results``."""
    print('\nlerobot (PI0Policy, 2 x gemma_300m)')
    policy = lerobot_policy(checkpoint, build, args.seed)
    out = {'fp32': [lerobot_actions(policy, case, args.steps) for case in cases],
           'kv32': lerobot_prefix_kv(policy, cases[0]) if args.per_layer else None}
    policy.model.paligemma_with_expert.to_bfloat16_for_selected_params('bfloat16')
    print(f'  as lerobot casts it for bf16: {lerobot_dtypes(policy)}')
    out['bf16'] = [lerobot_actions(policy, case, args.steps) for case in cases]
    out['kv16'] = lerobot_prefix_kv(policy, cases[0]) if args.per_layer else None
    torch.save(out, results)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--checkpoint', type=Path, default=None, help='a folder PI0Policy.save_pretrained wrote '
                        '(with processor files); default: build one into --work')
    parser.add_argument('--work', type=Path, default=None, help='where to build the checkpoint (default: temporary)')
    parser.add_argument('--cases', type=int, default=3, help='inputs (images, prompt, state, noise)')
    parser.add_argument('--steps', type=int, default=10)
    parser.add_argument('--seed', type=int, default=0, help="torch seed of lerobot's initialisation")
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--per-layer', action='store_true')
    parser.add_argument('--with-recipe', action='store_true')
    parser.add_argument('--quick', action='store_true', help='one case, 3 steps')
    parser.add_argument('--reuse', action='store_true', help="reuse lerobot's saved actions of an earlier run "
                        '(same --work / --checkpoint, cases and steps)')
    parser.add_argument('--side', choices=('lerobot',), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.cases, args.steps = 1, 3
    try:
        import lerobot  # noqa: F401
        import transformers
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy  # noqa: F401
    except ImportError as exc:
        print(f'skipped: needs lerobot with its pi extra ({exc}; run this with the python of a venv that has it, '
              f'see the docstring)')
        return 2
    torch.set_num_threads(args.threads)
    from importlib.metadata import version
    print(f'lerobot {version("lerobot")}, transformers {transformers.__version__}, torch {torch.__version__}, '
          f'{args.threads} thread(s); {args.cases} case(s), {args.steps} steps')
    scratch = None
    if args.checkpoint is None:
        if args.side is None and args.work is None:
            scratch = tempfile.TemporaryDirectory(prefix='compare_bf16.')
            args.work = Path(scratch.name)
        checkpoint, build = args.work / 'pi0_lerobot', True
    else:
        checkpoint, build = args.checkpoint, False
    try:
        cases = [make_case(i) for i in range(args.cases)]
        results = (args.work or checkpoint.parent) / f'lerobot_actions_{args.cases}x{args.steps}.pt'
        if args.side == 'lerobot':
            return lerobot_side(checkpoint, build, cases, args, results)
        if not (args.reuse and results.exists()):
            # lerobot in its own process: its memory is back before ours loads (one 24 GB machine, shared).
            command = [sys.executable, __file__, '--side', 'lerobot', '--cases', str(args.cases), '--steps',
                       str(args.steps), '--seed', str(args.seed), '--threads', str(args.threads)]
            command += ['--work', str(args.work)] if build else ['--checkpoint', str(checkpoint)]
            command += ['--per-layer'] if args.per_layer else []
            subprocess.run(command, check=True)
        theirs = torch.load(results)
        theirs32, theirs16, kv32, kv16 = (theirs[key] for key in ('fp32', 'bf16', 'kv32', 'kv16'))
        print('\nours (load_checkpoint of that folder)')
        model = our_model(checkpoint, torch.float32)
        ours32 = [our_actions(model, case, args.steps) for case in cases]
        our_kv32 = model.fill_prefix(*cases[0][:4])['kv'].float() if args.per_layer else None
        del model
        gc.collect()
        model = our_model(checkpoint, torch.bfloat16)
        ours16 = [our_actions(model, case, args.steps) for case in cases]
        from bf16_accuracy import patched
        with patched(round_inputs=True):            # the code before issue 25
            before16 = [our_actions(model, case, args.steps) for case in cases]
        our_kv16 = model.fill_prefix(*cases[0][:4])['kv'].float() if args.per_layer else None
        recipe = None
        if args.with_recipe:
            import test_model_parity as parity
            recipe = [parity.ref_sample_actions(model, *case[:5], case[5], args.steps).float() for case in cases]
        del model
        gc.collect()

        print(f'\nactions |a - b| over the {ACTION_DIM} action dims (normalised units), chunk 50')
        summary('parity: ours fp32 vs lerobot fp32', zip(ours32, theirs32))
        lr = summary('lerobot bf16 vs lerobot fp32', zip(theirs16, theirs32))
        us = summary('ours bf16 vs ours fp32', zip(ours16, ours32))
        be = summary('ours before issue 25 (tokens rounded at entry)', zip(before16, ours32))
        summary('ours bf16 vs lerobot fp32', zip(ours16, theirs32))
        summary('ours bf16 vs lerobot bf16', zip(ours16, theirs16))
        if recipe is not None:
            summary('restated recipe vs lerobot bf16', zip(recipe, theirs16))
            summary('restated recipe vs ours fp32', zip(recipe, ours32))
        print(f'  ours / lerobot: {us[0] / lr[0]:.2f}x max, {us[1] / lr[1]:.2f}x mean; before issue 25: '
              f'{be[0] / lr[0]:.2f}x max, {be[1] / lr[1]:.2f}x mean')
        if args.per_layer:
            print('\nprefix K/V per layer, case 0, mean |bf16 - fp32| (lerobot | ours)')
            for i, ((k32, v32), (k16, v16)) in enumerate(zip(kv32, kv16)):
                lk, lv = (float((a - b).abs().mean()) for a, b in ((k16, k32), (v16, v32)))
                ok, ov = (float((our_kv16[i, j] - our_kv32[i, j]).abs().mean()) for j in (0, 1))
                print(f'  layer {i:2d}: K {lk:.2e} | {ok:.2e}   V {lv:.2e} | {ov:.2e}')
    finally:
        if scratch is not None:
            scratch.cleanup()
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
