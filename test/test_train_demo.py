"""The demo trainer (vla_policy_node/train_demo.py) and the trained embedded default (builtin:demo).

Behaviour, not timing: the training forward is the inference model's, the loss is lerobot's, the samples
are cut from the bag as documented, and the shipped checkpoint follows the recorded command far better
than the random weights. Retraining the shipped weights costs minutes: marked ``slow``.
"""
import hashlib
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from vla_policy_node.observation import Observation
from vla_policy_node.params import BUILTIN_DEMO
from vla_policy_node.policy.families.pi0.config import preset
from vla_policy_node.policy.tiny_default import random_model, write_tiny_default
from vla_policy_node.replay.make_bag import SampleBagSpec, joint_state_at, render_frame, write_sample_bag
from vla_policy_node.replay.offline import replay
from vla_policy_node.runtime import PolicyRuntime
from vla_policy_node.policy.builtin import DEMO_CHECKPOINT, builtin_demo_checkpoint
from vla_policy_node.policy.families.pi0.training import flow_matching_loss, predict_velocity, sample_time, trainable
from vla_policy_node.train_demo import (DEMO_ACTION_PERIOD_SEC, DEMO_BAG_SPEC, TRAINING_FILE, load_demo_data,
                                        statistics_of, train)

ROOT = Path(__file__).resolve().parents[1]
DEMO_PARAMS = ROOT / 'config' / 'demo.yaml'
SHIPPED_PARAMS = ROOT / 'config' / 'vla_policy.yaml'
# The trained default's per-joint RMSE against the recorded command, as a fraction of the random weights'.
RATIO_BOUND = 0.2
# A retrained checkpoint on another torch build / CPU may differ in the last bits; its replay error must
# then stay within this of the shipped one's, per joint (radians). Seeds 0 and 1 differ by at most 0.001
# rad per joint, so the bound is ten times what a wholly different training run moves.
RETRAIN_RMSE_BOUND = 0.01


def _inputs(batch=3, seed=1):
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(batch, 3, 3, 32, 32, generator=generator) * 2 - 1
    image_masks = torch.ones(batch, 3, dtype=torch.bool)
    image_masks[1, 2] = False
    tokens = torch.randint(0, 500, (batch, 16), generator=generator)
    token_masks = torch.ones(batch, 16, dtype=torch.bool)
    token_masks[:, 9:] = False
    state = torch.randn(batch, 32, generator=generator)
    noise = torch.randn(batch, 10, 32, generator=generator)
    return images, image_masks, tokens, token_masks, state, noise


def test_training_forward_is_the_inference_model():
    """At t = 1 one Euler step of the inference path is x - v: the training forward must give the same v."""
    model = random_model(preset('tiny'), seed=0)
    images, image_masks, tokens, token_masks, state, noise = _inputs()
    context = model.fill_prefix(images, image_masks, tokens, token_masks)
    velocity = noise - model.denoise(context, state, noise, num_steps=1)
    with trainable(model):
        trained_path = predict_velocity(model, images, image_masks, tokens, token_masks, state, noise,
                                        torch.ones(images.shape[0]))
    torch.testing.assert_close(trained_path, velocity, atol=2e-5, rtol=1e-4)
    # Back to inference: fused projections again, same result.
    again = noise - model.denoise(model.fill_prefix(images, image_masks, tokens, token_masks), state, noise, 1)
    torch.testing.assert_close(again, velocity, atol=0, rtol=0)


def test_gradients_reach_every_parameter_the_loss_depends_on():
    model = random_model(preset('tiny'), seed=0)
    images, image_masks, tokens, token_masks, state, noise = _inputs()
    actions = torch.zeros_like(noise)
    actions[..., :6] = torch.randn(3, 10, 6)
    with trainable(model):
        loss = flow_matching_loss(model, images, image_masks, tokens, token_masks, state, actions, noise,
                                  sample_time(3), action_dim=6)
        loss.backward()
    untouched = {name for name, p in model.named_parameters() if p.grad is None or not p.grad.any()}
    # pi0 reads only the suffix: of the language model's last layer only K and V matter (its queries,
    # output and the final norm feed nothing the loss reads, in lerobot's forward too).
    last = f'paligemma_with_expert.paligemma.model.language_model.layers.{preset("tiny").language.depth - 1}.'
    expected = {name for name, _ in model.named_parameters()
                if name.startswith(last + 'self_attn.o_proj') or name.startswith(last + 'self_attn.q_proj')
                or name.startswith(last + 'mlp.')
                or name.startswith(last + 'post_attention_layernorm')
                or name.startswith('paligemma_with_expert.paligemma.model.language_model.norm')}
    assert untouched == expected


def test_loss_is_lerobots_flow_matching_on_the_real_action_dims():
    model = random_model(preset('tiny'), seed=0)
    images, image_masks, tokens, token_masks, state, noise = _inputs()
    actions = torch.zeros_like(noise)
    actions[..., :6] = torch.randn(3, 10, 6)
    time_t = torch.tensor([0.2, 0.5, 0.9])
    with trainable(model), torch.no_grad():
        loss = flow_matching_loss(model, images, image_masks, tokens, token_masks, state, actions, noise, time_t, 6)
        x_t = time_t[:, None, None] * noise + (1 - time_t[:, None, None]) * actions
        v_t = predict_velocity(model, images, image_masks, tokens, token_masks, state, x_t, time_t)
    expected = ((v_t - (noise - actions))[..., :6] ** 2).mean()
    torch.testing.assert_close(loss, expected)
    torch.manual_seed(0)
    times = sample_time(20000)
    assert 0.001 <= float(times.min()) and float(times.max()) <= 1.0
    # Beta(1.5, 1) has mean 0.6: 0.6 * 0.999 + 0.001.
    assert abs(float(times.mean()) - 0.6004) < 0.01


def test_samples_are_cut_from_the_bag_as_documented(tmp_path):
    spec = SampleBagSpec(duration_sec=1.2, hold_start_sec=0.4, hold_end_sec=0.6)
    bag = write_sample_bag(tmp_path / 'bag', spec)
    config = preset('tiny')
    data = load_demo_data(bag, config)
    joint_times = np.arange(0, 1.2 - 1e-9, 0.02)
    assert data.size == len(joint_times)                              # one sample per joint state
    assert data.joint_names == spec.joint_names
    for k in (0, 7, 10, 33, 59):
        tau = joint_times[k]
        np.testing.assert_allclose(data.states[k], joint_state_at(spec, tau)[0], atol=1e-12)
        frame = int(np.floor(tau * spec.camera_rate_hz + 1e-9))      # newest frame at or before tau
        assert all(int(i) == frame for i in data.frame_index[k])
        origin = frame / spec.camera_rate_hz
        due = np.minimum(origin + DEMO_ACTION_PERIOD_SEC * np.arange(1, 11), joint_times[-1])
        # The recorded command is the motion 0.1 s ahead, sampled at 50 Hz: interpolated at each due time.
        recorded = np.stack([joint_state_at(spec, t + 0.1)[0] for t in joint_times])
        expected = np.stack([np.interp(due, joint_times, recorded[:, j]) for j in range(6)], axis=1)
        np.testing.assert_allclose(data.targets[k], expected, atol=1e-9)
    stats = statistics_of(data.command_positions)
    np.testing.assert_allclose(stats['mean'], data.command_positions.mean(0), rtol=1e-5, atol=1e-6)
    assert set(stats) == {'mean', 'std', 'min', 'max', 'q01', 'q10', 'q90', 'q99'}


def test_trainer_matches_the_demo():
    demo = yaml.safe_load(DEMO_PARAMS.read_text())['/**']['ros__parameters']
    assert demo['action_period_sec'] == DEMO_ACTION_PERIOD_SEC
    assert demo['checkpoint_path'] == BUILTIN_DEMO
    assert builtin_demo_checkpoint() == DEMO_CHECKPOINT
    record = json.loads((DEMO_CHECKPOINT / TRAINING_FILE).read_text())
    digest = hashlib.sha256((DEMO_CHECKPOINT / 'model.safetensors').read_bytes()).hexdigest()
    assert record['weights_sha256'] == digest, 'the shipped weights are not the ones training.json describes'


def test_setup_installs_every_file_of_the_demo_checkpoint():
    """pip and colcon install package data only where setup.py names it."""
    patterns = re.findall(r"'(demo_checkpoint/[^']+)'", (ROOT / 'setup.py').read_text())
    installed = {path for pattern in patterns for path in (ROOT / 'vla_policy_node').glob(pattern) if path.is_file()}
    files = {path for path in DEMO_CHECKPOINT.rglob('*') if path.is_file()}
    assert (DEMO_CHECKPOINT / 'model.safetensors') in files and files == installed


@pytest.fixture(scope='module')
def demo_bag(tmp_path_factory):
    return write_sample_bag(tmp_path_factory.mktemp('demo_bag') / 'bag', DEMO_BAG_SPEC)


@pytest.fixture(scope='module')
def random_checkpoint(tmp_path_factory):
    return write_tiny_default(tmp_path_factory.mktemp('random') / 'tiny_pi0', 'pi0')


def _replay_error(bag, checkpoint, output, params=DEMO_PARAMS, **overrides):
    """The demo's parameters as shipped (stamp_mode zero) unless ``overrides`` say otherwise."""
    result = replay(bag, params, output, checkpoint=str(checkpoint), seed=0, overrides=overrides)
    return {name: e['rmse'] for name, e in result.summary['command_error'].items()}, result.summary


@pytest.fixture(scope='module')
def random_error(demo_bag, random_checkpoint, tmp_path_factory):
    return _replay_error(demo_bag, random_checkpoint, tmp_path_factory.mktemp('random_replay'))[0]


def test_trained_default_follows_the_recorded_command(demo_bag, random_error, tmp_path):
    trained, summary = _replay_error(demo_bag, BUILTIN_DEMO, tmp_path / 'trained')
    print('\nper-joint RMSE [rad], trained vs random:',
          {name: (round(trained[name], 4), round(random_error[name], 4)) for name in trained})
    for name, value in trained.items():
        assert value <= RATIO_BOUND * random_error[name], (name, value, random_error[name])
    # The prefix cache is used with the trained weights too (5 Hz cameras, 10 Hz ticks, the hold window).
    assert summary['cache']['hits'] >= summary['published'] // 3


def test_the_shipped_config_replays_the_demo_bag_as_well_as_observation_stamps(demo_bag, tmp_path):
    """config/vla_policy.yaml as shipped (stamp_mode zero) against the same with stamp_mode observation: every
    chunk counts from its observation in both, so the per-joint error is within 1.15x (issue 24; it was 3.3x
    when zero timed chunks from the tick). The clock choice is in the summary."""
    shipped, summary = _replay_error(demo_bag, BUILTIN_DEMO, tmp_path / 'shipped', params=SHIPPED_PARAMS)
    observation, _ = _replay_error(demo_bag, BUILTIN_DEMO, tmp_path / 'observation', params=SHIPPED_PARAMS,
                                   stamp_mode='observation')
    print('\nper-joint RMSE [rad], shipped (zero) vs observation:',
          {name: (round(shipped[name], 4), round(observation[name], 4)) for name in shipped})
    for name, value in shipped.items():
        assert value <= 1.15 * observation[name], (name, value, observation[name])
    assert summary['camera_clock']['used'] == 'header' and 'use_sim_time' in summary['camera_clock']['reason']
    # 5 Hz cameras at 10 Hz ticks: in the hold window (frozen scene and arm) every other tick repeats the
    # executing chunk's observation; those publish nothing and are no fault.
    assert summary['skipped'].get('repeated_observation', 0) >= 3 and summary['safety']['holds'] == {}


def test_the_cameras_matter():
    """Same joint state and instruction, frames from another moment: the trained chunk changes a lot."""
    runtime = PolicyRuntime.from_pretrained(DEMO_CHECKPOINT, device='cpu')
    spec = DEMO_BAG_SPEC
    state = joint_state_at(spec, 3.0)[0]
    chunks = []
    for t in (3.0, 0.4, 4.6):
        images = {name: render_frame(spec, i, t) for i, name in enumerate(spec.cameras)}
        chunks.append(runtime.infer(Observation(images, state, spec.instruction), seed=0).actions)
    assert np.abs(chunks[1] - chunks[0]).max() > 0.1 and np.abs(chunks[2] - chunks[0]).max() > 0.1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_training_reproduces_the_shipped_weights(demo_bag, tmp_path):
    """The shipped command again: bit for bit on the torch build and CPU kind it was made with; elsewhere its
    replay error within RETRAIN_RMSE_BOUND of the shipped one's, per joint."""
    record = json.loads((DEMO_CHECKPOINT / TRAINING_FILE).read_text())
    started = time.monotonic()
    result = train(tmp_path / 'retrained', seed=record['seed'], steps=record['steps'], progress=False)
    print(f'\ntraining: {time.monotonic() - started:.1f} s wall ({result.seconds:.1f} s in the loop), '
          f'final loss {result.final_loss:.4f} (shipped: {record["final_loss"]:.4f})')
    identical = result.weights_sha256 == record['weights_sha256']
    print(f'bit for bit: {identical} (torch {torch.__version__}, shipped with torch {record["torch"]})')
    if identical:
        return
    # Another torch build or CPU kind (kernels differ in the last bits): the behaviour must be the same.
    shipped, _ = _replay_error(demo_bag, DEMO_CHECKPOINT, tmp_path / 'shipped')
    retrained, _ = _replay_error(demo_bag, tmp_path / 'retrained', tmp_path / 'again')
    for name in shipped:
        assert abs(retrained[name] - shipped[name]) <= RETRAIN_RMSE_BOUND, (name, retrained[name], shipped[name])
