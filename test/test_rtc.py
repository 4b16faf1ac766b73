"""Real-time chunking in the model and the runtime: weights, guidance, trained clamping, cache behaviour."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from runtime_fixtures import make_observation, tiny_checkpoint, tiny_checkpoints  # noqa: F401
from vla_policy_node.policy.families import family_class
from vla_policy_node.policy.rtc import RTCSettings, guidance_weight, prefix_weights, prepare_guide, stack_guides
from vla_policy_node.policy.tiny_default import random_model
from vla_policy_node.runtime import PolicyRuntime


# ---- lerobot's formulas, values worked out by hand (policies/rtc/modeling_rtc.py at 7427f318) ----------------
@pytest.mark.parametrize('schedule, expected', [
    ('zeros', [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    ('ones', [1] * 10 + [0] * 4),
    ('linear', [1, 1, 1, .875, .75, .625, .5, .375, .25, .125, 0, 0, 0, 0]),
    # exp: r * expm1(r) / (e - 1) on the linear ramp r
    ('exp', [1, 1, 1] + [r * math.expm1(r) / (math.e - 1) for r in (.875, .75, .625, .5, .375, .25, .125)]
     + [0, 0, 0, 0]),
])
def test_prefix_weights_match_lerobot_for_delay_3_horizon_10_chunk_14(schedule, expected):
    np.testing.assert_allclose(prefix_weights(3, 10, 14, schedule).numpy(), expected, atol=1e-6)


@pytest.mark.parametrize('start, end, total, expected', [
    (0, 4, 6, [.8, .6, .4, .2, 0, 0]),            # no delay: the ramp starts below 1
    (5, 3, 6, [1, 1, 1, 0, 0, 0]),                # delay beyond the horizon is capped at it
    (2, 9, 6, [1, 1, .8, .6, .4, .2]),            # a horizon beyond the chunk: the ramp is cut at the end
    (0, 0, 3, [0, 0, 0]),
])
def test_linear_weights_edge_cases(start, end, total, expected):
    np.testing.assert_allclose(prefix_weights(start, end, total, 'linear').numpy(), expected, atol=1e-6)


def test_guidance_weight_over_ten_steps():
    # min(beta, (t^2 + (1-t)^2) / (t (1-t))) at t = 1.0, 0.9, ..., 0.1 with beta 10.
    expected = [10, 9.1111, 4.25, 2.7619, 2.1667, 2.0, 2.1667, 2.7619, 4.25, 9.1111]
    got = [guidance_weight(1.0 - k / 10, 10.0) for k in range(10)]
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert guidance_weight(0.0, 10.0) == 0.0 and guidance_weight(0.5, 1.5) == 1.5


def test_settings_refuse_what_lerobot_refuses():
    for bad in (dict(mode='soft'), dict(schedule='cosine'), dict(max_guidance_weight=0.0),
                dict(execution_horizon=0)):
        with pytest.raises(ValueError):
            RTCSettings(**bad)


# ---- the denoise loop ------------------------------------------------------------------------------
def inputs_for(model, seed=0):
    """A prefix context, a normalised state and noise for ``model`` from a fixed seed."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    height, width = config.image_resolution
    images = torch.rand(1, len(config.camera_names), 3, height, width, generator=generator) * 2 - 1
    masks = torch.ones(1, len(config.camera_names), dtype=torch.bool)
    tokens = torch.randint(4, config.vocab_size, (1, config.tokenizer_max_length), generator=generator)
    context = model.fill_prefix(images, masks, tokens, torch.ones_like(tokens, dtype=torch.bool))
    state = torch.randn(1, config.max_state_dim, generator=generator)
    noise = torch.randn(1, config.chunk_size, config.max_action_dim, generator=generator)
    return context, state, noise


@pytest.fixture(scope='module', params=['pi0', 'pi05'])
def model_and_context(request):
    model = random_model(family_class(request.param).tiny_config(), seed=3)
    return (model,) + inputs_for(model)


def test_no_previous_chunk_is_exactly_the_plain_path(model_and_context):
    model, context, state, noise = model_and_context
    plain = model.denoise(context, state, noise, 5)
    assert torch.equal(model.denoise(context, state, noise, 5, rtc=RTCSettings()), plain)
    empty = torch.zeros(0, 6)
    assert torch.equal(model.denoise(context, state, noise, 5, prev_chunk_left_over=empty, rtc=RTCSettings()), plain)
    # A leftover without rtc settings is ignored too (chunking independent).
    assert torch.equal(model.denoise(context, state, noise, 5, prev_chunk_left_over=torch.ones(4, 6)), plain)


def test_one_guided_step_matches_the_hand_computed_update(model_and_context):
    model, context, state, noise = model_and_context
    horizon, width = noise.shape[1], noise.shape[2]
    leftover = torch.linspace(-1, 1, 7 * 6).reshape(7, 6)
    rtc = RTCSettings(schedule='linear', max_guidance_weight=4.0, execution_horizon=5)
    # One Euler step: t = 1, dt = -1, so x = noise - v and the plain step gives v = noise - x.
    velocity = noise - model.denoise(context, state, noise, 1)
    target = torch.zeros(1, horizon, width)
    target[0, :7, :6] = leftover
    weights = prefix_weights(2, 5, horizon, 'linear')[None, :, None]
    guided_velocity = velocity - 4.0 * (target - (noise - 1.0 * velocity)) * weights   # g(1) = beta
    expected = noise - guided_velocity
    got = model.denoise(context, state, noise, 1, prev_chunk_left_over=leftover, inference_delay=2, rtc=rtc)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    # Past the execution horizon the weights are 0: those actions are the plain ones.
    plain = model.denoise(context, state, noise, 1)
    assert torch.equal(got[:, 5:], plain[:, 5:])


def test_guided_chunks_continue_the_leftover_over_many_steps(model_and_context):
    model, context, state, noise = model_and_context
    other_noise = torch.randn(noise.shape, generator=torch.Generator().manual_seed(9))
    previous = model.denoise(context, state, other_noise, 10)[0, 2:, :6]     # what is left of another chunk
    plain = model.denoise(context, state, noise, 10)[0, :, :6]
    guided = model.denoise(context, state, noise, 10, prev_chunk_left_over=previous, inference_delay=2,
                           rtc=RTCSettings(execution_horizon=6))[0, :, :6]
    plain_gap = (plain[:2] - previous[:2]).abs().mean()
    guided_gap = (guided[:2] - previous[:2]).abs().mean()
    assert guided_gap < 0.1 * plain_gap, (guided_gap, plain_gap)


def trained_model(policy_type):
    config = dataclasses.replace(family_class(policy_type).tiny_config(), rtc_training_max_delay=4)
    return random_model(config, seed=3)


@pytest.mark.parametrize('policy_type', ['pi0', 'pi05'])
def test_trained_mode_clamps_the_delay_and_conditions_per_token(policy_type):
    model = trained_model(policy_type)
    context, state, noise = inputs_for(model)
    leftover = torch.linspace(-0.5, 0.5, 8 * 6).reshape(8, 6)
    rtc = RTCSettings(mode='trained')
    out = model.denoise(context, state, noise, 10, prev_chunk_left_over=leftover, inference_delay=3, rtc=rtc)
    # The first d actions are the leftover exactly (padded action dims clamped to 0, as lerobot does).
    assert torch.equal(out[0, :3, :6], leftover[:3])
    assert torch.equal(out[0, :3, 6:], torch.zeros(3, 26))
    # The rest is sampled with those tokens seen as clean (time 0): neither plain sampling nor clamping alone.
    plain = model.denoise(context, state, noise, 10)
    assert not torch.allclose(out[0, 3:], plain[0, 3:])
    with pytest.raises(ValueError, match='exceeds the checkpoint rtc_training_max_delay 4'):
        model.denoise(context, state, noise, 10, prev_chunk_left_over=leftover, inference_delay=5, rtc=rtc)


@pytest.mark.parametrize('policy_type', ['pi0', 'pi05'])
def test_trained_mode_time_condition_is_per_token(policy_type):
    """Clean prefix tokens are embedded at t = 0, the others at the step's time."""
    model = trained_model(policy_type)
    _, _, noise = inputs_for(model)
    terms = model._time_terms(2)
    clean = torch.zeros(1, noise.shape[1], dtype=torch.bool)
    clean[0, :3] = True
    shared, cond_shared = model._embed_suffix(noise, terms, 0)
    mixed, cond_mixed = model._embed_suffix(noise, terms, 0, clean)
    if policy_type == 'pi0':
        assert torch.equal(mixed[:, 3:], shared[:, 3:])
        assert not torch.allclose(mixed[:, :3], shared[:, :3])
        assert cond_shared is None and cond_mixed is None
    else:
        width = model.config.expert.width
        assert torch.equal(mixed, shared)                        # the time acts through the norms only
        assert cond_shared.shape == (1, width) and cond_mixed.shape == (1, noise.shape[1], width)
        torch.testing.assert_close(cond_mixed[:, 3:], cond_shared[:, None].expand(-1, noise.shape[1] - 3, -1))
        torch.testing.assert_close(cond_mixed[:, :3], terms[-1].expand(1, 3, -1))
        assert not torch.allclose(cond_mixed[:, :3], cond_shared[:, None].expand(-1, 3, -1))


def test_trained_mode_needs_a_trained_checkpoint(model_and_context):
    model, context, state, noise = model_and_context
    with pytest.raises(ValueError, match='rtc_training_max_delay > 0'):
        model.denoise(context, state, noise, 2, prev_chunk_left_over=torch.zeros(4, 6), inference_delay=1,
                      rtc=RTCSettings(mode='trained'))


# ---- runtime: robot units, cache ------------------------------------------------------------------
def test_hit_equals_miss_with_rtc_and_the_prefix_stays_untouched(runtime):
    obs = make_observation()
    rtc = RTCSettings(execution_horizon=6)
    leftover = np.linspace(-1, 1, 8 * 6).reshape(8, 6)
    miss = runtime.infer(obs, seed=1, prev_actions=leftover, inference_delay=2, rtc=rtc)
    entry = runtime.cache.get(miss.key)
    stored = entry['kv'].clone()
    hit = runtime.infer(obs, seed=1, prev_actions=leftover, inference_delay=2, rtc=rtc)
    assert not miss.cache_hit and hit.cache_hit and miss.continued and hit.continued
    assert np.array_equal(hit.actions, miss.actions)
    assert torch.equal(runtime.cache.get(miss.key)['kv'], stored)
    plain = runtime.infer(obs, seed=1)
    assert plain.cache_hit and not plain.continued and not np.array_equal(plain.actions, miss.actions)


def test_robot_unit_leftover_is_normalised_with_the_action_statistics(runtime):
    obs = make_observation()
    rtc = RTCSettings(execution_horizon=6)
    robot = np.linspace(-0.3, 0.3, 8 * 6).reshape(8, 6)
    normalised = runtime.action_normalizer.normalize(robot)
    a = runtime.infer(obs, seed=1, prev_actions=robot, inference_delay=1, rtc=rtc)
    b = runtime.infer(obs, seed=1, prev_chunk_left_over=normalised, inference_delay=1, rtc=rtc)
    np.testing.assert_allclose(a.actions, b.actions, atol=1e-6)
    assert np.allclose(runtime.action_normalizer.unnormalize(a.normalized), a.actions, atol=1e-5)


@pytest.mark.parametrize('kwargs, field', [
    (dict(prev_actions=np.zeros((4, 5))), 'prev_actions'),
    (dict(prev_actions=np.full((4, 6), np.nan)), 'prev_actions'),
    (dict(prev_chunk_left_over=np.zeros((4, 33))), 'prev_chunk_left_over'),
    (dict(prev_actions=np.zeros((4, 6)), prev_chunk_left_over=np.zeros((4, 6))), 'prev_actions'),
    (dict(prev_actions=np.zeros((4, 6)), inference_delay=-1), 'inference_delay'),
    (dict(prev_actions=np.zeros((4, 6)), inference_delay=1, rtc=RTCSettings(mode='trained')), 'rtc'),
])
def test_bad_leftovers_are_refused_before_the_cache(runtime, kwargs, field):
    from vla_policy_node.observation import ObservationError
    kwargs.setdefault('rtc', RTCSettings())
    before = runtime.cache.stats()
    with pytest.raises(ObservationError) as info:
        runtime.infer(make_observation(), seed=0, **kwargs)
    assert info.value.field == field
    assert runtime.cache.stats() == before


@pytest.fixture
def runtime(tiny_checkpoint):  # noqa: F811
    return PolicyRuntime.from_pretrained(tiny_checkpoint, device='cpu', dtype='float32')


def test_guides_of_several_robots_stack_row_by_row_or_not_at_all():
    """stack_guides (a batch of robots, runtime/batch.py): each row keeps its own guide; guides that differ in
    structure or plain values, or hold a tensor that is not one row, do not stack (the robots then run alone)."""
    noise = torch.zeros(1, 6, 4)
    first = prepare_guide(torch.ones(3, 2), noise, 4, 1, None, RTCSettings(), 0)
    second = prepare_guide(-torch.ones(5, 2), noise, 4, 2, 4, RTCSettings(schedule='exp'), 0)
    both = stack_guides([first, second])
    assert torch.equal(both.target, torch.cat([first.target, second.target])) and both.clamp is None
    pairs = zip(both.scales + both.pulls, first.scales + first.pulls, second.scales + second.pulls)
    assert all(torch.equal(stacked, torch.cat([a, b])) for stacked, a, b in pairs)
    trained = prepare_guide(torch.ones(3, 2), noise, 4, 1, None, RTCSettings(mode='trained'), 3)
    assert stack_guides([first, trained]) is None and stack_guides([first, None]) is None
    assert stack_guides([prepare_guide(torch.ones(3, 2), noise, 3, 1, None, RTCSettings(), 0), first]) is None

    @dataclasses.dataclass
    class Schedule:
        target: torch.Tensor
        per_step: torch.Tensor          # [steps]: not a row of the batch
        label: str

    one = Schedule(torch.zeros(1, 6, 4), torch.ones(4), 'a')
    assert stack_guides([one, one]) is None
    rows = Schedule(torch.zeros(1, 6, 4), torch.ones(1, 4), 'a')
    assert stack_guides([rows, dataclasses.replace(rows, label='b')]) is None
    assert stack_guides([rows, rows]).per_step.shape == (2, 4)
