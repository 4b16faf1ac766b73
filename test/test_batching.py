"""Batching several robots' chunks in one server: each robot's chunk is its own ``infer``'s, for every family.

runtime/batch.py against PolicyRuntime.infer (fp32 on the CPU): prefixes of different lengths (prompt buckets),
misses and hits, step counts, seeds, guided and trained RTC leftovers, robots sending identical frames, bad
requests that fail alone; remote/batching.py's queue (batches close when full or when the window ends, the
bound refuses as busy); and vla_policy_serve's answers over real WebSockets, each connection its own.
"""
import numpy as np
import pytest

from vla_policy_node.observation import Observation, ObservationError
from vla_policy_node.policy.families import family_class, known_types
from vla_policy_node.policy.rtc import RTCSettings
from vla_policy_node.policy.tiny_default import write_random_checkpoint
from vla_policy_node.runtime import PolicyRuntime
from vla_policy_node.runtime.batch import infer_batch

TOLERANCE = 1e-5        # fp32: a batched matrix product sums in another order than a single one


@pytest.fixture(scope='module', params=known_types())
def checkpoint(request, tmp_path_factory):
    """A tiny checkpoint of each registered family, trained for RTC where the family keeps that field."""
    config = family_class(request.param).tiny_config(rtc_training_max_delay=3)
    return write_random_checkpoint(tmp_path_factory.mktemp(request.param) / 'ckpt', config)


def load(checkpoint):
    runtime = PolicyRuntime.from_pretrained(checkpoint, device='cpu', dtype='float32')
    # Buckets every 4 tokens: prompts of different lengths give prefixes of different lengths.
    return PolicyRuntime.from_pretrained(checkpoint, device='cpu', dtype='float32',
                                         prompt_buckets=range(4, runtime.config.tokenizer_max_length, 4))


def frames(cameras, seed):
    rng = np.random.default_rng(seed)
    return {name: rng.integers(0, 256, size=(24, 40, 3), dtype=np.uint8) for name in cameras}


def observation(cfg, seed, prompt):
    state = np.random.default_rng(100 + seed).normal(0, 0.3, cfg.state_dim)
    return Observation(images=frames(cfg.camera_names, seed), state=state, instruction=prompt)


def leftover(cfg, seed, length):
    return np.random.default_rng(200 + seed).normal(0, 0.1, (length, cfg.action_dim))


def fleet(cfg):
    """Robots as a fleet sends them: prompts of several lengths, two step counts, guided RTC with leftovers of
    different lengths, delays and schedules, trained RTC where the checkpoint has it, and a robot whose frames,
    prompt and state equal another's (only its seed and leftover differ)."""
    guided = RTCSettings()
    items = [
        (observation(cfg, 0, 'pick'), dict(seed=1)),
        (observation(cfg, 1, 'pick up the red cube and place it in the box'), dict(seed=2)),
        (observation(cfg, 2, 'go'), dict(seed=3, num_steps=3)),
        (observation(cfg, 3, 'stack the blocks'), dict(seed=4, num_steps=3)),
        (observation(cfg, 4, 'stack the blocks'), dict(seed=5, prev_actions=leftover(cfg, 4, 4), inference_delay=1,
                                                       rtc=guided)),
        (observation(cfg, 5, 'open the drawer'), dict(seed=6, prev_actions=leftover(cfg, 5, 7), inference_delay=2,
                                                      rtc=RTCSettings(schedule='exp', execution_horizon=5))),
        # robot 6 sends exactly robot 0's observation
        (observation(cfg, 0, 'pick'), dict(seed=7, prev_actions=leftover(cfg, 6, 5), inference_delay=1, rtc=guided)),
    ]
    if cfg.rtc_training_max_delay > 0:
        trained = RTCSettings(mode='trained')
        items += [(observation(cfg, 7, 'pick'), dict(seed=8, prev_actions=leftover(cfg, 7, 6), inference_delay=1,
                                                     rtc=trained)),
                  (observation(cfg, 8, 'push it'), dict(seed=9, prev_actions=leftover(cfg, 8, 6), inference_delay=3,
                                                        rtc=trained))]
    return items


def test_a_batch_gives_every_robot_its_own_chunk_for_every_family(checkpoint):
    batched, alone = load(checkpoint), load(checkpoint)
    items = fleet(batched.config)
    lengths = {len(batched._prepare(obs).tokens) for obs, _ in items}
    assert len(lengths) > 1, 'the fleet must batch prefixes of different lengths'
    expected = [alone.infer(obs, **options) for obs, options in items]
    for round_ in ('misses', 'hits'):
        chunks = infer_batch(batched, items)
        for robot, (chunk, own) in enumerate(zip(chunks, expected)):
            assert not isinstance(chunk, Exception), (robot, chunk)
            assert chunk.cache_hit == (round_ == 'hits'), (round_, robot)
            np.testing.assert_allclose(chunk.actions, own.actions, rtol=0, atol=TOLERANCE, err_msg=f'robot {robot}')
            assert chunk.num_steps == own.num_steps and chunk.continued == own.continued
    # Robot 6 sent robot 0's observation: one prefix, yet its own noise and leftover, so its own actions.
    assert chunks[6].key == chunks[0].key
    assert np.abs(chunks[6].actions - chunks[0].actions).max() > 100 * TOLERANCE


def test_a_batch_of_one_is_infer_bit_for_bit(checkpoint):
    batched, alone = load(checkpoint), load(checkpoint)
    for obs, options in fleet(batched.config)[3:6]:
        for _ in range(2):                          # a miss, then a hit
            (chunk,) = infer_batch(batched, [(obs, options)])
            own = alone.infer(obs, **options)
            assert np.array_equal(chunk.actions, own.actions) and chunk.cache_hit == own.cache_hit


def test_a_bad_request_fails_alone_with_its_own_error(checkpoint):
    batched, alone = load(checkpoint), load(checkpoint)
    cfg = batched.config
    good = fleet(cfg)[:3]
    nan_state = observation(cfg, 9, 'pick')
    nan_state.state[0] = np.nan
    corrupt = observation(cfg, 10, 'pick')
    corrupt.images[cfg.camera_names[0]] = b'\xff\xd8 not a jpeg'
    items = [good[0], (nan_state, dict(seed=1)), good[1], (corrupt, dict(seed=1)), good[2],
             (good[0][0], dict(seed=1, num_steps=-1))]
    chunks = infer_batch(batched, items)
    for index in (1, 3, 5):
        assert isinstance(chunks[index], ObservationError), (index, chunks[index])
        with pytest.raises(ObservationError) as alone_error:
            alone.infer(items[index][0], **items[index][1])
        assert chunks[index].reason == alone_error.value.reason
    for index, (obs, options) in zip((0, 2, 4), good):
        np.testing.assert_allclose(chunks[index].actions, alone.infer(obs, **options).actions, rtol=0,
                                   atol=TOLERANCE)
