"""Shared fixtures and helpers for tests that load the tiny checkpoint.

Import the fixtures into a test module (``from runtime_fixtures import tiny_checkpoint``)
so pytest registers them there. The checkpoint folders are written once per session.
"""
from pathlib import Path
from typing import Dict

import numpy as np
import pytest

from vla_policy_node.policy.tiny_default import write_tiny_default
from vla_policy_node.observation import Observation
from vla_policy_node.runtime import PolicyRuntime

POLICY_TYPES = ('pi0', 'pi05')
INSTRUCTION = 'pick up the red cube'
CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')


@pytest.fixture(scope='session')
def tiny_checkpoints(tmp_path_factory) -> Dict[str, Path]:
    """{'pi0': folder, 'pi05': folder}: the embedded tiny default, written through save_checkpoint."""
    root = tmp_path_factory.mktemp('tiny_checkpoints')
    return {kind: write_tiny_default(root / kind, kind) for kind in POLICY_TYPES}


@pytest.fixture(params=POLICY_TYPES)
def tiny_checkpoint(request, tiny_checkpoints) -> Path:
    return tiny_checkpoints[request.param]


@pytest.fixture
def runtime(tiny_checkpoint) -> PolicyRuntime:
    """A fresh fp32 CPU runtime (own empty cache) per test; loading the tiny folder takes milliseconds."""
    return PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')


def rgb_image(seed: int, height: int = 24, width: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def state_vector(seed: int = 0, dim: int = 6) -> np.ndarray:
    return np.random.default_rng(1000 + seed).normal(0.0, 0.3, size=dim)


def make_observation(images=None, state=None, instruction=INSTRUCTION) -> Observation:
    if images is None:
        images = {CAMERAS[0]: rgb_image(1), CAMERAS[1]: rgb_image(2)}
    return Observation(images=images, state=state_vector() if state is None else state, instruction=instruction)


def spy_batch_sizes(policy):
    """Lists that record the batch size of each ``fill_prefix`` (its first prefix input's) and ``euler_loop`` (its
    actions') call of ``policy`` from now on: whether runtime/batch.py really ran robots together."""
    fills, loops = [], []
    fill, loop = policy.fill_prefix, policy.euler_loop

    def spied_fill(*inputs):
        fills.append(inputs[0].shape[0])
        return fill(*inputs)

    def spied_loop(chunk):
        actions = loop(chunk)
        loops.append(actions.shape[0])
        return actions

    policy.fill_prefix, policy.euler_loop = spied_fill, spied_loop
    return fills, loops
