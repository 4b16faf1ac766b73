"""Side by side with REAL lerobot for GR00T N1.7 (issue 32). Needs a scratch venv; prints, never asserts.

lerobot is no dependency of the package: this script runs in a venv OUTSIDE the repo that has lerobot's current
source (Python 3.12) and imports the package and test/ from this checkout. Set-up used (lerobot 0.6.2 =
huggingface/lerobot 7427f318, transformers 5.5.4, diffusers 0.39.0, torch 2.11.0; download.pytorch.org was not
reachable, so pip took torch's default wheel):

    git -C <lerobot git dir> archive HEAD | tar -x -C /work/scratch/lerobot-src
    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/scratch/lerobot-venv
    /work/scratch/lerobot-venv/bin/pip install 'torch>=2.7,<2.12' 'torchvision>=0.22,<0.27'
    /work/scratch/lerobot-venv/bin/pip install '/work/scratch/lerobot-src[groot]' xxhash sentencepiece
    /work/scratch/lerobot-venv/bin/python bench/compare_lerobot_groot.py                    # from the repo root
    /work/scratch/lerobot-venv/bin/python bench/compare_lerobot_groot.py --write-fixtures   # + test/fixtures/
    /work/scratch/lerobot-venv/bin/python bench/compare_lerobot_groot.py --skip-timing
    /work/scratch/lerobot-venv/bin/python bench/compare_lerobot_groot.py --quick           # (a) alone
    /work/scratch/lerobot-venv/bin/python bench/compare_lerobot_groot.py --only-timing --shape half --repeats 5
    .venv/bin/python bench/compare_lerobot_groot.py --ours-only --shape real    # our miss and hit alone

Without lerobot it prints ``skipped: needs lerobot`` and exits with status 2.

lerobot's GR00T is built offline as it would be for a user's fine-tune: ``base_model_path`` is the base model folder
(absolute path); its ``model_name`` a local folder with a Qwen3-VL config.json (a small backbone); the VLM-encode
step's ``model_name`` the processor folder (tokenizer.json, tokenizer_config.json with the chat template and Qwen's
special tokens at 151643-151656, preprocessor_config.json: patch 16, merge 2, temporal 2, mean/std 0.5). The Cosmos
chat template sits in a gated repository: the test template has Qwen3-VL's structure (chat_template.py), unverified
against Cosmos'. lerobot draws its noise inside get_action_with_features; here torch.randn returns the given noise.

    (f) format: lerobot loads the fixture folder (test/groot_fixtures.py) and saves it again: same files, config.json,
        tensor keys and processor files; it also loads the package's own writer's folder
    (a) the tiny fixtures, every case of groot_fixtures.PARITY_CASES: lerobot vs ours (PolicyRuntime) vs the test
        reference, stage by stage (prompt ids, pixels, backbone features, processed features, state token,
        normalised and robot actions); the state change is a cache hit on our side
    (w) --write-fixtures: lerobot's results of (a) to test/fixtures/groot_lerobot.npz (test_groot_pipeline.py)
    (c) bf16 against fp32, max abs action error: lerobot's autocast recipe vs ours, tiny and the small shape
    (b) timing, --threads CPU threads: lerobot's full pipeline (pre-processor, predict_action_chunk,
        post-processor) vs our miss (a camera byte changes) and hit (only the state changes), interleaved, fp32, at
        --shape (a depth cut of the real GR00T N1.7 widths that fits beside lerobot in memory; ``real`` is the whole
        3.1B) and at the small shape

Figures of runs on 2026-12-05 (2-core shared x86_64 CPU, lerobot 0.6.2 / transformers 5.5.4 / torch 2.11, package
at issue32-groot on the family seam: the text cross K/V padded to the prompt bucket, the DiT's time terms made once
per step count):

    (f) --skip-timing: the fixture folder equals lerobot's own re-save (files, config.json, tensor keys and metadata,
        both processor files); lerobot loads the package writer's folder (normalised actions within 3.6e-7)
    (a) fp32, every case: prompt ids and patches identical, backbone features <= 4.3e-6, processed features
        <= 1.7e-6, actions <= 7.2e-7 (the state change a hit on our side); reference vs lerobot: 0 (bit for bit)
    (c) bf16 vs fp32, max abs normalised-action error: tiny lerobot 3.3e-3 / ours 3.3e-3 (ours = lerobot's bf16
        bit for bit); small shape lerobot 4.0e-4 / ours 4.0e-4
    (b) --only-timing --threads 1 --repeats 3:
          small (1.04B): lerobot 2090 ms, ours miss 1159 ms (0.55x), hit 351 ms (0.30x our miss)
          half  (2.02B): lerobot 5359 ms, ours miss 3812 ms (0.71x), hit 1289 ms (0.34x our miss)
    (b) --ours-only --shape real --threads 1 --repeats 3 (in the package venv; lerobot not run):
          real  (3.14B): ours miss 8447 ms, hit 2992 ms (0.35x our miss)
        The real 3.1B shape does not fit beside lerobot in that machine's 23 GB. A hit is the 4 DiT steps alone
        (its denoise stage is the whole hit): their FLOP share of a miss is 0.24 at small, 0.27 at half, 0.29 at
        the real shape (GrootFamily.stage_flops), and their 41-row GEMMs run about a third less efficiently per FLOP
        than the prefix's. Making the time terms once per step count instead of per chunk saved 1.3% of a hit at
        half (1332 vs 1350 ms, interleaved A/B of 5 hits); the miss saves lerobot's language-model head over every
        token and its cross K/V at every step.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / 'test'):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from groot_fixtures import (CAMERAS, FIXTURE_FILE, PARITY_CASES, case_folder, case_inputs,  # noqa: E402
                            leftover)
from lerobot_groot_reference import LerobotGrootReference  # noqa: E402

STAGES = ('input_ids', 'pixels', 'backbone', 'processed', 'state_features', 'normalized_actions', 'actions')
# Depth cuts of the real widths (ViT layers, select_layer, DiT layers, vl_self_attention layers).
SHAPES = {'real': (24, 16, 32, 4), 'half': (12, 8, 16, 4), 'third': (8, 6, 12, 4), 'small': (4, 2, 4, 1)}


# ---- lerobot's side -------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def given_noise(noise: torch.Tensor):
    """lerobot draws x0 with torch.randn(size=(B, H, A)) in get_action_with_features: return ``noise`` there."""
    real = torch.randn

    def randn(*args, **kwargs):
        size = kwargs.get('size', args[0] if args else None)
        if size is not None and tuple(size) == tuple(noise.shape):
            return noise.clone().to(kwargs.get('dtype') or noise.dtype)
        return real(*args, **kwargs)
    torch.randn = randn
    try:
        yield
    finally:
        torch.randn = real


class Lerobot:
    """lerobot's GrootPolicy and its processors for one folder, as lerobot's inference loads them."""

    def __init__(self, folder: Path) -> None:
        from lerobot.policies.groot.modeling_groot import GrootPolicy
        from lerobot.policies.groot.processor_groot import make_groot_pre_post_processors_from_pretrained
        self.policy = GrootPolicy.from_pretrained(str(folder)).eval()
        self.pre, self.post = make_groot_pre_post_processors_from_pretrained(self.policy.config, str(folder))

    def batch(self, frames, state, task) -> Dict:
        """prepare_observation_for_inference: uint8 HWC -> float CHW / 255."""
        batch = {f'observation.images.{k}': torch.from_numpy(np.ascontiguousarray(v)).permute(2, 0, 1).float() / 255
                 for k, v in frames.items()}
        batch['observation.state'] = torch.from_numpy(np.asarray(state, np.float32))
        batch['task'] = task
        return batch

    def run(self, frames, state, task, noise, bf16=False, rtc=None, capture=False) -> Dict[str, np.ndarray]:
        self.policy.config.use_bf16 = bf16
        model = self.policy._groot_model
        captured: Dict[str, torch.Tensor] = {}
        hooks = []
        if capture:
            hooks = [model.backbone.register_forward_hook(
                         lambda m, i, o: captured.__setitem__('backbone', o['backbone_features'].detach().clone())),
                     model.action_head.vl_self_attention.register_forward_hook(
                         lambda m, i, o: captured.__setitem__('processed', o.detach().clone())),
                     model.action_head.state_encoder.register_forward_hook(
                         lambda m, i, o: captured.__setitem__('state_features', o.detach().clone()))]
        kwargs = {}
        if rtc is not None:
            from types import SimpleNamespace
            prev, delay, horizon = rtc
            self.policy.config.rtc_config = SimpleNamespace(execution_horizon=horizon)
            kwargs = dict(prev_chunk_left_over=torch.from_numpy(prev), inference_delay=delay)
        try:
            processed = self.pre(self.batch(frames, state, task))
            with given_noise(torch.from_numpy(np.asarray(noise, np.float32))):
                actions = self.policy.predict_action_chunk(processed, **kwargs)
            out = self.post(actions)
        finally:
            for hook in hooks:
                hook.remove()
            self.policy.config.rtc_config = None
        result = {k: v.float().numpy() for k, v in captured.items()}
        result['input_ids'] = processed['input_ids'].numpy()
        result['pixels'] = np.round(processed['pixel_values'].float().numpy() * 127.5 + 127.5).astype(np.uint8)
        result['normalized_actions'] = actions.float().numpy()
        result['actions'] = out.float().numpy()
        return result


# ---- our side -------------------------------------------------------------------------------------------------------

class Ours:
    def __init__(self, folder: Path, dtype=torch.float32) -> None:
        from vla_policy_node.policy.families.groot.adapter import GrootFamily
        from vla_policy_node.runtime import PolicyRuntime
        self.policy = GrootFamily.load(folder, torch.device('cpu'), dtype)
        self.runtime = PolicyRuntime(self.policy, f'bench:{folder}')

    def run(self, frames, state, task, noise, rtc=None, capture=False) -> Dict[str, np.ndarray]:
        from vla_policy_node.observation import Observation
        from vla_policy_node.policy.rtc import RTCSettings
        kwargs = {}
        if rtc is not None:
            prev, delay, horizon = rtc
            kwargs = dict(prev_chunk_left_over=prev, inference_delay=delay, execution_horizon=horizon,
                          rtc=RTCSettings(mode='inpainting'))
        chunk = self.runtime.infer(Observation(dict(frames), np.asarray(state, np.float32), task),
                                   noise=np.asarray(noise)[0], **kwargs)
        cfg = self.policy.config
        horizon = cfg.n_action_steps
        result = {'normalized_actions': chunk.normalized[None, :horizon, :cfg.action_dim],
                  'actions': chunk.actions[None, :horizon], 'hit': np.array(chunk.cache_hit)}
        if capture:
            result.update(self.stages(frames, state, task))
        return result

    def stages(self, frames, state, task) -> Dict[str, np.ndarray]:
        from vla_policy_node.policy.families.groot.images import patchify
        from vla_policy_node.policy.preprocess import image_to_unit_tensor
        policy, cfg = self.policy, self.policy.config
        device = torch.device('cpu')
        ids, mask = policy.prompt_tokens(task, None)
        images = torch.stack([policy.image_to_model(image_to_unit_tensor(frames[n], device))
                              for n in cfg.camera_names])
        pixels = patchify(images, cfg.geometry)
        pixels = pixels.reshape(-1, pixels.shape[-1])
        ids = ids[mask]                                  # the prompt's own tokens (lerobot's unpadded batch of one)
        tokens, valid = torch.from_numpy(ids)[None], torch.ones(1, len(ids), dtype=torch.bool)
        model = policy.model
        with torch.no_grad(), model._autocast():
            backbone = model.backbone_features(images[None], tokens, valid)[0]
        context = policy.fill_prefix(images[None], tokens, valid)
        normalized = policy.state_normalizer.normalize(np.asarray(state, np.float32))
        row = torch.zeros(1, 1, cfg.max_state_dim)
        row[0, 0, :len(normalized)] = torch.from_numpy(normalized)
        with torch.no_grad(), model._autocast():
            state_features = model.action_head.state_encoder(row, torch.full((1,), cfg.embodiment_id))
        return {'input_ids': ids[None], 'pixels': np.round(pixels.numpy() * 127.5 + 127.5).astype(np.uint8),
                'backbone': backbone.float().numpy(), 'processed': context['features'].numpy(),
                'state_features': state_features.float().numpy()}


def frames_of(inputs) -> Dict[str, np.ndarray]:
    return {name: inputs[f'frame.{name}'] for name in CAMERAS}


def diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float('nan')
    return float(np.abs(a - b).max()) if a.size else 0.0


# ---- (f) format --------------------------------------------------------------------------------------------------

def check_format(root: Path) -> None:
    from safetensors import safe_open
    folder = case_folder(root, 'flat')
    saved = root / 'resaved'
    lerobot = Lerobot(folder)
    lerobot.policy.save_pretrained(saved)
    lerobot.pre.save_pretrained(saved)
    lerobot.post.save_pretrained(saved)
    ours_files, their_files = sorted(p.name for p in folder.iterdir()), sorted(p.name for p in saved.iterdir())
    print(f'(f) files: fixture {ours_files}\n    lerobot re-save {their_files}  same: {ours_files == their_files}')
    ours_cfg, their_cfg = (json.loads((f / 'config.json').read_text()) for f in (folder, saved))
    differ = sorted(k for k in set(ours_cfg) | set(their_cfg) if ours_cfg.get(k) != their_cfg.get(k))
    print(f'    config.json same keys and values: {not differ}' + (f' (differ: {differ})' if differ else ''))
    keys = []
    for f in (folder, saved):
        with safe_open(str(f / 'model.safetensors'), 'pt') as handle:
            keys.append((sorted(handle.keys()), handle.metadata()))
    print(f'    model.safetensors keys same: {keys[0][0] == keys[1][0]}, metadata same: {keys[0][1] == keys[1][1]}')
    for name in ('policy_preprocessor.json', 'policy_postprocessor.json'):
        same = json.loads((folder / name).read_text()) == json.loads((saved / name).read_text())
        print(f'    {name} same: {same}')
    # The package's own writer: lerobot loads what GrootFamily.save_checkpoint writes, and agrees with it.
    from vla_policy_node.policy.families.groot.adapter import GrootFamily
    from vla_policy_node.policy.tiny_default import statistics as stats
    torch.manual_seed(0)
    written = GrootFamily.save_checkpoint(root / 'package_writer', GrootFamily.model_class(GrootFamily.tiny_config()),
                                          stats(6, 0.5), stats(6, 0.2),
                                          GrootFamily.build_test_tokenizer(root / 'package_tokenizer', 512))
    rng = np.random.default_rng(5)
    cfg = GrootFamily.tiny_config()
    frames = {n: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for n in cfg.camera_names}
    noise_shape = (1, cfg.chunk_size, cfg.max_action_dim)
    state, noise = rng.normal(size=6).astype(np.float32), rng.normal(size=noise_shape).astype(np.float32)
    theirs = Lerobot(written).run(frames, state, 'stack the cubes', noise)
    ours = Ours(written).run(frames, state, 'stack the cubes', noise)
    print(f'    package writer\'s folder: lerobot loads it; normalised actions lerobot-ours '
          f'{diff(theirs["normalized_actions"], ours["normalized_actions"]):.2e}')


# ---- (a) parity --------------------------------------------------------------------------------------------------

def parity(root: Path, write: bool) -> Dict[str, Dict[str, np.ndarray]]:
    stored: Dict[str, np.ndarray] = {}
    ours_by_folder: Dict[str, Ours] = {}
    results: Dict[str, Dict[str, np.ndarray]] = {}
    worst = 0.0
    print('(a) tiny fixtures: max abs difference per stage (lerobot-ours | lerobot-reference | ours-reference)')
    for case, spec in PARITY_CASES.items():
        folder = case_folder(root, case)
        inputs = case_inputs(case)
        frames, task = frames_of(inputs), str(inputs['task'])
        rtc = None
        if 'rtc' in spec:
            rtc = (leftover(), spec['rtc'][0], spec['rtc'][1])
        bf16 = spec.get('bf16', False)
        theirs = Lerobot(folder).run(frames, inputs['state'], task, inputs['noise'], bf16=bf16, rtc=rtc, capture=True)
        key = f'{folder}:{bf16}'
        if key not in ours_by_folder:
            ours_by_folder[key] = Ours(folder, torch.bfloat16 if bf16 else torch.float32)
        runner = ours_by_folder[key]
        if 'state_seed' in spec:          # the same frames and task first (a miss), then this state: a hit
            base = case_inputs('flat')
            runner.run(frames, base['state'], task, base['noise'])
        ours = runner.run(frames, inputs['state'], task, inputs['noise'], rtc=rtc, capture=True)
        reference = LerobotGrootReference(folder)(
            frames, inputs['state'], task, inputs['noise'], bf16=bf16, leftover=None if rtc is None else rtc[0],
            delay=0 if rtc is None else rtc[1], execution_horizon=None if rtc is None else rtc[2])
        reference['pixels'] = np.round(reference['pixel_values'] * 127.5 + 127.5).astype(np.uint8)
        cells = []
        for stage in STAGES:
            cells.append(f'{stage} {diff(theirs[stage], ours[stage]):.1e}|{diff(theirs[stage], reference[stage]):.1e}'
                         f'|{diff(ours[stage], reference[stage]):.1e}')
        print(f'    {case:18s} hit={bool(ours["hit"])}  ' + '  '.join(cells))
        results[case] = {'lerobot': theirs, 'ours': ours}
        if not bf16:
            worst = max(worst, diff(theirs['normalized_actions'], ours['normalized_actions']),
                        diff(theirs['actions'], ours['actions']))
        for stage in STAGES:
            if stage == 'pixels' and case != 'flat':
                continue                  # the same frames in every case: stored once
            stored[f'{case}.{stage}'] = theirs[stage]
    print(f'    lerobot vs ours, fp32 cases: actions within {worst:.1e}')
    if write:
        import lerobot
        import transformers
        FIXTURE_FILE.parent.mkdir(exist_ok=True)
        meta = {'lerobot': lerobot.__version__, 'commit': '7427f31801f944f5ec9ce53cda02862ce7d1638b',
                'transformers': transformers.__version__, 'torch': torch.__version__,
                'written_by': 'bench/compare_lerobot_groot.py --write-fixtures'}
        np.savez_compressed(FIXTURE_FILE, meta=np.array(json.dumps(meta)), **stored)
        print(f'(w) wrote {FIXTURE_FILE} ({FIXTURE_FILE.stat().st_size // 1024} KiB)')
    return results


# ---- shapes for (b) and (c) --------------------------------------------------------------------------------------

def shape_config(name: str):
    from dataclasses import replace
    from vla_policy_node.policy.families.groot.presets import groot_preset
    vit, layers, dit, vlsa = SHAPES[name]
    config = groot_preset('groot')
    taps = tuple(i for i in (5, 11, 17) if i < vit) or (0,)
    vision = replace(config.backbone.vision, depth=vit, deepstack_indexes=taps)
    backbone = replace(config.backbone, vision=vision, text=replace(config.backbone.text, depth=layers))
    head = replace(config.head, model_name='vla_policy_node/bench-qwen3-vl', select_layer=layers,
                   dit=replace(config.head.dit, num_layers=dit),
                   vl_self_attention=replace(config.head.vl_self_attention, num_layers=vlsa))
    return replace(config, backbone=backbone, head=head, state_dim=7, action_dim=7)


def write_shape(root: Path, name: str) -> Path:
    """A random-weight checkpoint at a shape, written in bf16 (both loaders hold fp32 parameters), the base model
    folder without weights (the fine-tune's file holds them all)."""
    from vla_policy_node.policy.families.groot.adapter import GrootFamily
    from vla_policy_node.policy.families.groot.folder import write_groot_folder
    from vla_policy_node.policy.tiny_default import statistics as stats
    folder = root / f'shape_{name}'
    if (folder / 'model.safetensors').is_file():
        return folder
    config = shape_config(name)
    with torch.device('meta'):
        model = GrootFamily.model_class(config)
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, value in model.state_dict().items():
        if value.dim() == 1:
            tensor = torch.ones(value.shape) if 'norm' in key and key.endswith('weight') else torch.zeros(value.shape)
        elif key.endswith(('embed_tokens.weight', 'pos_embed.weight', 'position_embedding.weight')):
            tensor = 0.5 * torch.randn(value.shape, generator=generator)
        else:               # unit-variance activations; the velocity's last layer small (actions mostly unclipped)
            fan_in = value.shape[1] if key.endswith('.W') else int(np.prod(value.shape[1:]))
            scale = 0.05 if key.endswith('action_decoder.layer2.W') else 1.0
            tensor = torch.randn(value.shape, generator=generator) * (scale / fan_in ** 0.5)
        state[key] = tensor.to(torch.bfloat16)
    del model
    tokenizer = GrootFamily.build_test_tokenizer(root / 'shape_tokenizer', 512)
    write_groot_folder(folder, config, state, stats(7, 0.5), stats(7, 0.2), tokenizer, base_weights=False)
    del state
    gc.collect()
    return folder


def timing_inputs(seed: int):
    rng = np.random.default_rng(seed)
    frames = {name: rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for name in ('front', 'wrist')}
    return frames, rng.normal(size=7).astype(np.float32), rng.normal(size=(1, 40, 132)).astype(np.float32)


# ---- (c) bf16 ----------------------------------------------------------------------------------------------------

def bf16_errors(results, root: Path, shape: str) -> None:
    fp32 = results['flat']['lerobot']['normalized_actions']
    tiny_ours = diff(results['flat_bf16']['ours']['normalized_actions'], fp32)
    tiny_theirs = diff(results['flat_bf16']['lerobot']['normalized_actions'], fp32)
    print(f'(c) bf16 vs fp32, max abs normalised-action error: tiny lerobot {tiny_theirs:.2e} / ours {tiny_ours:.2e}')
    folder = write_shape(root, shape)
    frames, state, noise = timing_inputs(1)
    task = 'pick up the red cube and put it in the bin'
    lerobot = Lerobot(folder)
    fp32 = lerobot.run(frames, state, task, noise)['normalized_actions']
    theirs = lerobot.run(frames, state, task, noise, bf16=True)['normalized_actions']
    del lerobot
    gc.collect()
    ours32 = Ours(folder).run(frames, state, task, noise)['normalized_actions']
    ours16 = Ours(folder, torch.bfloat16).run(frames, state, task, noise)['normalized_actions']
    print(f'    {shape} shape: lerobot {diff(theirs, fp32):.2e} / ours {diff(ours16, ours32):.2e} (ours bf16 vs '
          f'lerobot fp32 {diff(ours16, fp32):.2e}; fp32 lerobot-ours {diff(ours32, fp32):.2e}; actions up to '
          f'{np.abs(fp32).max():.2f})')


# ---- (b) timing --------------------------------------------------------------------------------------------------

def median_ms(samples: List[float]) -> float:
    return 1000 * statistics.median(samples)


def timing(root: Path, shape: str, repeats: int, with_lerobot: bool = True) -> None:
    """Interleaved miss / hit (and lerobot's whole pipeline unless ``with_lerobot`` is False: ``--ours-only``
    measures our own hit against our own miss at a shape that does not fit twice, the real 3.1B)."""
    from vla_policy_node.observation import Observation
    folder = write_shape(root, shape)
    config = shape_config(shape)
    params = sum(int(np.prod(v.shape)) for v in _meta_state(config).values())
    frames, state, noise = timing_inputs(2)
    task = 'pick up the red cube and put it in the bin'
    lerobot = Lerobot(folder) if with_lerobot else None     # first: its load holds a second copy for a while
    gc.collect()
    ours = Ours(folder)
    check = ours.run(frames, state, task, noise)['normalized_actions']
    first = lerobot.run(frames, state, task, noise)['normalized_actions'] if lerobot else None
    agreement = f'; actions lerobot-ours {diff(first, check):.1e}' if lerobot else ''
    runtime = ours.runtime
    samples = {'lerobot': [], 'miss': [], 'hit': []}
    stages = {'prefix': [], 'denoise_hit': []}
    for repeat in range(repeats):
        changed = {k: v.copy() for k, v in frames.items()}
        changed['front'][0, 0, 0] = (int(changed['front'][0, 0, 0]) + 1 + repeat) % 256
        if lerobot is not None:
            start = time.perf_counter()
            lerobot.run(changed, state, task, noise)
            samples['lerobot'].append(time.perf_counter() - start)
        start = time.perf_counter()
        miss = runtime.infer(Observation(changed, state, task), noise=noise[0])
        samples['miss'].append(time.perf_counter() - start)
        start = time.perf_counter()
        hit = runtime.infer(Observation(changed, state + 0.01 * (repeat + 1), task), noise=noise[0])
        samples['hit'].append(time.perf_counter() - start)
        assert not miss.cache_hit and hit.cache_hit
        stages['prefix'].append(miss.timings_ms.get('prefix', 0.0) / 1000)
        stages['denoise_hit'].append(hit.timings_ms.get('denoise', 0.0) / 1000)
    miss_ms, hit_ms = median_ms(samples['miss']), median_ms(samples['hit'])
    theirs = (f'lerobot {median_ms(samples["lerobot"]):.0f} ms, ours miss {miss_ms:.0f} ms '
              f'({miss_ms / median_ms(samples["lerobot"]):.2f}x)' if lerobot else
              f'lerobot not run, ours miss {miss_ms:.0f} ms')
    prompt = int(runtime.policy.prompt_tokens(task, None)[1].sum())          # its real tokens (padded to a bucket)
    print(f'(b) {shape} shape ({params / 1e9:.2f}B parameters, prompt {prompt} tokens, 2 cameras 640x480, fp32, '
          f'{torch.get_num_threads()} threads, {repeats} repeats): {theirs}, hit {hit_ms:.0f} ms '
          f'({hit_ms / miss_ms:.2f}x our miss; stages: prefix '
          f'{median_ms(stages["prefix"]):.0f} ms, denoise {median_ms(stages["denoise_hit"]):.0f} ms){agreement}; '
          f'entry {runtime.prefix_bytes() / 2 ** 20:.1f} MiB max')
    del ours, lerobot, runtime
    gc.collect()


def _meta_state(config):
    from vla_policy_node.policy.families.groot.adapter import GrootFamily
    with torch.device('meta'):
        return GrootFamily.model_class(config).state_dict()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--write-fixtures', action='store_true', help='write test/fixtures/groot_lerobot.npz')
    parser.add_argument('--skip-timing', action='store_true')
    parser.add_argument('--only-timing', action='store_true', help='(b) alone')
    parser.add_argument('--quick', action='store_true', help='(a) alone: the tiny fixtures')
    parser.add_argument('--shape', choices=sorted(SHAPES), default='half', help='the timing shape (b)')
    parser.add_argument('--small-shape', choices=sorted(SHAPES), default='small')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--workdir', type=Path, default=None, help='keep the written checkpoints here')
    parser.add_argument('--ours-only', action='store_true',
                        help='(b) at --shape without lerobot: our hit against our miss (runs in the package venv)')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.ours_only:
        with contextlib.ExitStack() as stack:
            root = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
            root.mkdir(parents=True, exist_ok=True)
            timing(root, args.shape, args.repeats, with_lerobot=False)
        return 0
    try:
        import lerobot.policies.groot.modeling_groot  # noqa: F401
    except ImportError as exc:
        print(f'skipped: needs lerobot with its groot extra ({exc})')
        return 2
    os.environ.setdefault('HF_HUB_OFFLINE', '1')
    with contextlib.ExitStack() as stack:
        root = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        root.mkdir(parents=True, exist_ok=True)
        if args.quick:
            parity(root, args.write_fixtures)
            return 0
        if not args.only_timing:
            check_format(root)
            results = parity(root, args.write_fixtures)
            bf16_errors(results, root, args.small_shape)
        if not args.skip_timing:
            timing(root, args.small_shape, args.repeats)
            timing(root, args.shape, args.repeats)
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
