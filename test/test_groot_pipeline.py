"""GR00T N1.7 from raw inputs equals lerobot's own pipeline: against real lerobot's results (stored by
bench/compare_lerobot_groot.py in test/fixtures/groot_lerobot.npz, lerobot 0.6.2 = 7427f318, transformers 5.5.4)
and against the independent reference (test/lerobot_groot_reference.py) on inputs no fixture holds.

Stages compared: the prompt ids, the patches (as uint8), lerobot's backbone features (pre-vlln), the processed
features, the state token, the normalised actions and the robot actions. fp32 within 1e-4; the bf16 recipe by its
error against fp32, the same scale as lerobot's (CPU bf16 kernels differ, so no bit equality is asserted)."""
from pathlib import Path

import numpy as np
import pytest
import torch

from groot_fixtures import (CAMERAS, FIXTURE_FILE, PARITY_CASES, case_folder, case_inputs, fixture_inputs,
                            leftover)
from lerobot_groot_reference import LerobotGrootReference
from vla_policy_node.observation import Observation
from vla_policy_node.policy.families.groot.adapter import GrootFamily
from vla_policy_node.policy.families.groot.images import patchify
from vla_policy_node.policy.preprocess import image_to_unit_tensor
from vla_policy_node.policy.rtc import RTCSettings
from vla_policy_node.runtime import PolicyRuntime

CPU = torch.device('cpu')
FP32_CASES = [case for case, spec in PARITY_CASES.items() if not spec.get('bf16')]


@pytest.fixture(scope='module')
def lerobot():
    stored = np.load(FIXTURE_FILE)
    return {key: stored[key] for key in stored.files}


@pytest.fixture(scope='module')
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp('groot_parity')


@pytest.fixture(scope='module')
def runtimes(root):
    """One runtime per fixture folder and dtype, made on first use."""
    made = {}

    def get(case: str, dtype=torch.float32) -> PolicyRuntime:
        folder = case_folder(root, case)
        key = (str(folder), dtype)
        if key not in made:
            made[key] = PolicyRuntime(GrootFamily.load(folder, CPU, dtype), f'test:{folder}:{dtype}')
        return made[key]
    return get


def frames_of(inputs):
    return {name: inputs[f'frame.{name}'] for name in CAMERAS}


def rtc_arguments(case: str):
    spec = PARITY_CASES[case]
    if 'rtc' not in spec:
        return {}
    delay, horizon = spec['rtc']
    return dict(prev_chunk_left_over=leftover(), inference_delay=delay, execution_horizon=horizon,
                rtc=RTCSettings(mode='auto'))


def run(runtime: PolicyRuntime, inputs, **extra):
    return runtime.infer(Observation(frames_of(inputs), inputs['state'], str(inputs['task'])),
                         noise=inputs['noise'][0], **extra)


def stages(runtime: PolicyRuntime, inputs):
    policy, cfg = runtime.policy, runtime.config
    ids, mask = policy.prompt_tokens(str(inputs['task']), None)
    images = torch.stack([policy.image_to_model(image_to_unit_tensor(inputs[f'frame.{n}'], CPU))
                          for n in cfg.camera_names])
    pixels = patchify(images, cfg.geometry)
    tokens, valid = torch.from_numpy(ids[mask])[None], torch.from_numpy(mask[mask])[None]
    with torch.no_grad(), policy.model._autocast():
        backbone = policy.model.backbone_features(images[None], tokens, valid)[0]
    context = policy.fill_prefix(images[None], tokens, valid)
    return {'input_ids': ids[mask][None],
            'pixels': np.round(pixels.reshape(-1, pixels.shape[-1]).numpy() * 127.5 + 127.5),
            'backbone': backbone.float().numpy(), 'processed': context['features'].numpy()}


@pytest.mark.parametrize('case', FP32_CASES)
def test_fp32_equals_real_lerobot_stage_by_stage(lerobot, runtimes, case):
    runtime = runtimes(case)
    inputs = case_inputs(case)
    if 'state_seed' in PARITY_CASES[case]:
        run(runtime, case_inputs('flat'))                 # same frames and task, another state: then a hit
    chunk = run(runtime, inputs, **rtc_arguments(case))
    if 'state_seed' in PARITY_CASES[case]:
        assert chunk.cache_hit, 'only the state changed: the cached prefix serves it'
    horizon, width = runtime.config.n_action_steps, runtime.config.action_dim
    expected = lerobot[f'{case}.normalized_actions'][0]
    assert chunk.normalized[:horizon, :width].shape == expected.shape
    assert np.abs(chunk.normalized[:horizon, :width] - expected).max() < 1e-4
    assert np.abs(chunk.actions[:horizon] - lerobot[f'{case}.actions'][0]).max() < 1e-4
    ours = stages(runtime, inputs)
    assert np.array_equal(ours['input_ids'], lerobot[f'{case}.input_ids'])
    assert np.array_equal(ours['pixels'], lerobot['flat.pixels'])
    for stage in ('backbone', 'processed'):
        assert np.abs(ours[stage] - lerobot[f'{case}.{stage}']).max() < 1e-4, stage


def test_the_rtc_case_keeps_its_frozen_rows(lerobot, runtimes):
    """GR00T's inpainting: the first `delay` actions are the leftover's rows (velocity 0), as lerobot returns them."""
    runtime = runtimes('flat_rtc')
    chunk = run(runtime, case_inputs('flat_rtc'), **rtc_arguments('flat_rtc'))
    delay, horizon = PARITY_CASES['flat_rtc']['rtc']
    rows = leftover()
    rows = rows[:int(np.flatnonzero(np.abs(rows).sum(axis=1))[-1]) + 1]        # trailing zero rows are padding
    overlap = min(len(rows), horizon)
    width = runtime.config.action_dim
    assert np.array_equal(chunk.normalized[:delay], rows[len(rows) - overlap:][:delay, :width])
    plain = run(runtime, case_inputs('flat_rtc'))
    assert np.abs(plain.normalized[delay:overlap] - chunk.normalized[delay:overlap]).max() > 1e-3


def test_bf16_follows_lerobots_autocast_recipe(lerobot, runtimes):
    inputs = case_inputs('flat_bf16')
    ours = run(runtimes('flat_bf16', torch.bfloat16), inputs).normalized[:8, :4]
    fp32 = lerobot['flat.normalized_actions'][0]
    theirs = np.abs(lerobot['flat_bf16.normalized_actions'][0] - fp32).max()
    error = np.abs(ours - fp32).max()
    # bf16 is really in use (an fp32 run is within 1e-6), and its error is the recipe's, not a larger one.
    assert theirs > 1e-4 and error > 1e-4
    assert error < 3 * theirs


def test_the_reference_equals_real_lerobot(lerobot, root):
    """The reference is checked against lerobot here, so it can stand in for lerobot where no fixture exists."""
    for case in ('flat', 'groups_libero', 'raw_task'):
        inputs = case_inputs(case)
        got = LerobotGrootReference(case_folder(root, case))(frames_of(inputs), inputs['state'],
                                                             str(inputs['task']), inputs['noise'])
        assert np.array_equal(got['input_ids'], lerobot[f'{case}.input_ids'])
        for stage in ('backbone', 'processed', 'normalized_actions', 'actions'):
            assert np.abs(got[stage] - lerobot[f'{case}.{stage}']).max() < 1e-5, (case, stage)


def test_other_inputs_and_cameras_of_different_sizes_equal_the_reference(runtimes, root):
    """Each camera is computed as lerobot computes a camera of that size (lerobot itself refuses to stack frames
    of different sizes; the reference processes each frame on its own, as lerobot's geometry does)."""
    runtime = runtimes('flat')
    inputs = fixture_inputs(seed=21)
    rng = np.random.default_rng(3)
    inputs['frame.top'] = rng.integers(0, 256, (72, 30, 3), dtype=np.uint8)
    inputs['task'] = np.array('Wipe the TABLE (twice), then stop.')
    chunk = run(runtime, inputs)
    reference = LerobotGrootReference(case_folder(root, 'flat'))
    reference = reference(frames_of(inputs), inputs['state'], str(inputs['task']), inputs['noise'])
    assert np.abs(chunk.normalized[:8, :4] - reference['normalized_actions'][0]).max() < 1e-4
    assert np.abs(chunk.actions - reference['actions'][0]).max() < 1e-4
