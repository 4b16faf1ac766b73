"""Raw frames, a raw state and a task in, the actions lerobot's whole pipeline gives out (lerobot_reference.py)."""
import numpy as np
import pytest

from lerobot_reference import LerobotReference
from runtime_fixtures import CAMERAS, rgb_image
from vla_policy_node.observation import Observation
from vla_policy_node.policy.tiny_default import write_tiny_default
from vla_policy_node.runtime import PolicyRuntime

TASK = 'pick_up the red cube\n'
# Frames of other sizes than the model's 32x32 (one wider, one taller); the third camera is absent (masked).
FRAMES = {CAMERAS[0]: rgb_image(1, height=24, width=40), CAMERAS[1]: rgb_image(2, height=48, width=30)}
# A state that reaches the bins at and beyond the ends of the normalised range.
STATE = np.array([0.31, -1.2, 0.05, 2.5, -0.44, 0.9])
KINDS = {'pi0': ('pi0', False), 'pi05': ('pi05', False), 'pi0_relative': ('pi0', True),
         'pi05_relative': ('pi05', True)}


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp('pipeline')
    return {name: write_tiny_default(root / name, policy_type, relative_actions=relative)
            for name, (policy_type, relative) in KINDS.items()}


def noise(seed: int, runtime: PolicyRuntime) -> np.ndarray:
    cfg = runtime.config
    return np.random.default_rng(seed).standard_normal((cfg.chunk_size, cfg.max_action_dim)).astype(np.float32)


@pytest.mark.parametrize('kind', list(KINDS))
def test_runtime_returns_what_lerobots_pipeline_returns(folders, kind):
    runtime = PolicyRuntime.from_pretrained(folders[kind], device='cpu', dtype='float32')
    reference = LerobotReference(folders[kind])
    for seed in range(2):
        eps = noise(seed, runtime)
        ours = runtime.infer(Observation(FRAMES, STATE, TASK), noise=eps).actions
        theirs = reference.actions(FRAMES, STATE, TASK, eps)
        assert ours.shape == theirs.shape == (runtime.config.chunk_size, runtime.config.action_dim)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=2e-6)


def test_the_legacy_padded_pi05_prompt_matches_lerobot_of_that_time(folders):
    runtime = PolicyRuntime.from_pretrained(folders['pi05'], device='cpu', dtype='float32',
                                            pi05_padded_state_prompt=True)
    eps = noise(0, runtime)
    ours = runtime.infer(Observation(FRAMES, STATE, TASK), noise=eps).actions
    np.testing.assert_allclose(ours, LerobotReference(folders['pi05'], padded_state_prompt=True).actions(
        FRAMES, STATE, TASK, eps), rtol=0, atol=2e-6)
    # ... and it is another prompt: current lerobot gives other actions for the same checkpoint.
    current = LerobotReference(folders['pi05']).actions(FRAMES, STATE, TASK, eps)
    assert np.abs(ours - current).max() > 1e-3


def test_the_reference_sees_what_the_runtime_must_get_right(folders):
    """The comparison can fail: the reference differs when a pre- or post-processing step is left out."""
    runtime = PolicyRuntime.from_pretrained(folders['pi0_relative'], device='cpu', dtype='float32')
    eps = noise(0, runtime)
    ours = runtime.infer(Observation(FRAMES, STATE, TASK), noise=eps).actions
    reference = LerobotReference(folders['pi0_relative'])
    reference.raw['use_relative_actions'] = False
    assert np.abs(ours - reference.actions(FRAMES, STATE, TASK, eps)).max() > 0.1
    reference.raw['use_relative_actions'] = True
    swapped = {CAMERAS[0]: FRAMES[CAMERAS[1]], CAMERAS[1]: FRAMES[CAMERAS[0]]}
    assert np.abs(ours - reference.actions(swapped, STATE, TASK, eps)).max() > 1e-4


@pytest.mark.parametrize('padded', [False, True])
def test_the_pi05_prompt_the_runtime_feeds_the_model(folders, padded):
    runtime = PolicyRuntime.from_pretrained(folders['pi05'], device='cpu', dtype='float32',
                                            pi05_padded_state_prompt=padded)
    # The tiny checkpoint's QUANTILES statistics normalise x to x / 1.165 (q01, q99 = -/+1.165).
    normalized = np.array([-0.8, 0.3, 0.0, -1.5, 0.6, 1.3])
    # floor((y + 1) * 128), clamped to [-1, 255]: 25 166 128 -1 204 255, then 26 padding zeros -> 128.
    bins = '25 166 128 -1 204 255' + (' 128' * 26 if padded else '')
    prompt = f'Task: pick up the red cube, State: {bins};\nAction: '
    prepared = runtime._prepare(Observation(FRAMES, normalized * 1.165, TASK))
    ids = [runtime.tokenizer.bos_id] + runtime.tokenizer.encode_text(prompt)
    assert prepared.tokens[prepared.token_mask].tolist() == ids
