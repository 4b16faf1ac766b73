"""Chunk hand-over in the shared tick: alignment, elapsed actions, delay estimate, take-over figures."""
from types import SimpleNamespace

import numpy as np
import torch
import pytest

from runtime_fixtures import tiny_checkpoints  # noqa: F401
from vla_policy_node.handover import ChunkHandover, DelayEstimator, ExecutingChunk, elapsed_actions
from vla_policy_node.observation import InputBuffer, SkipReason
from vla_policy_node.params import resolve_values
from vla_policy_node.runtime import PolicyRuntime
from vla_policy_node.settings import input_layout, tick_settings
from vla_policy_node.tick import TickEngine

NS = 1_000_000_000
MS = 1_000_000
JOINTS = [f'joint_{i}' for i in range(1, 7)]


def chunk(origin_ns, period_ns, first=0, horizon=10, joints=2, offset=0.0):
    actions = np.arange(horizon, dtype=np.float64)[:, None].repeat(joints, 1) + offset
    return ExecutingChunk(origin_ns, period_ns, first, actions, actions[first:])


# ---- alignment ----------------------------------------------------------------------------------
@pytest.mark.parametrize('period_ms, ticks_later, first, leftover_from', [
    (100, 1, 0, 1),        # 10 Hz ticks, 10 Hz actions: one action executed per tick
    (100, 3, 0, 3),
    (20, 5, 0, 5),         # 50 Hz actions, a 10 Hz tick is 5 actions later
    (100, 1, 2, 1),        # the old chunk was published late (first 2 elapsed): alignment is by time
    (50, 0, 0, 0),         # the same observation again (a cache hit, observation stamps)
])
def test_the_leftover_starts_at_the_old_action_due_with_the_new_action_0(period_ms, ticks_later, first,
                                                                         leftover_from):
    handover = ChunkHandover()
    period = period_ms * MS
    handover.take_over(chunk(10 * NS, period, first), elapsed=first)
    new_origin = 10 * NS + ticks_later * 100 * MS if period_ms != 20 else 10 * NS + ticks_later * period
    continuation = handover.continuation(new_origin, delay=2)
    np.testing.assert_array_equal(continuation.leftover[:, 0], np.arange(leftover_from, 10))
    assert continuation.delay == 2


def test_off_grid_origins_round_to_the_nearest_action_and_exhausted_chunks_leave_nothing():
    handover = ChunkHandover()
    handover.take_over(chunk(NS, 100 * MS), elapsed=0)
    assert handover.continuation(NS + 140 * MS, 0).leftover[0, 0] == 1
    assert handover.continuation(NS + 160 * MS, 0).leftover[0, 0] == 2
    assert handover.continuation(NS + 10 * 100 * MS, 0).leftover is None      # everything executed
    assert handover.continuation(NS - 200 * MS, 0).leftover is None           # a new origin before the old one
    handover.reset()
    assert handover.continuation(NS, 0).leftover is None and handover.executing is None


@pytest.mark.parametrize('latency_ms, period_ms, elapsed', [(0, 100, 0), (99, 100, 0), (100, 100, 1),
                                                            (250, 100, 2), (45, 20, 2), (30, 50, 0)])
def test_elapsed_actions(latency_ms, period_ms, elapsed):
    assert elapsed_actions(5 * NS, 5 * NS + latency_ms * MS, period_ms * MS) == elapsed


def test_delay_estimate_is_the_windowed_maximum_without_the_cold_first_inference():
    estimator = DelayEstimator()
    estimator.record(9)                       # the first inference after activation: not counted
    assert estimator.estimate('measured', 3, 0) == 0
    for elapsed in (1, 2, 1, 1, 1):
        estimator.record(elapsed)
    assert estimator.estimate('measured', 3, 0) == 1          # the 2 has left the window of 3
    assert estimator.estimate('measured', 10, 0) == 2
    assert estimator.estimate('fixed', 3, 4) == 4
    estimator.reset()
    estimator.record(7)
    assert estimator.estimate('measured', 3, 0) == 0


def test_take_over_figures():
    handover = ChunkHandover()
    period = 100 * MS
    assert handover.take_over(chunk(NS, period, horizon=5), elapsed=0) is None     # nothing to hand over from
    # The new chunk is one action later (its action 0 is the old action 1) and 0.5 higher everywhere.
    newer = chunk(NS + period, period, horizon=5, offset=1.0 + 0.5)
    figures = handover.take_over(newer, elapsed=0)
    assert figures.jump_max == pytest.approx(0.5)
    # Overlap: old points due at 2..5 periods, new due at 2..6; after the old end the old one holds 4.0.
    assert figures.overlap_mean == pytest.approx(0.5)
    assert handover.executing is newer


# ---- the tick: publication timing per stamp mode ---------------------------------------------------------
@pytest.fixture(scope='module')
def runtime(tiny_checkpoints):  # noqa: F811
    return PolicyRuntime.from_pretrained(tiny_checkpoints['pi0'], device='cpu', dtype='float32')


def settings_for(runtime, **overrides):
    values = resolve_values(dict({'joint_names': JOINTS, 'seed': 0, 'max_image_age_sec': 5.0,
                                  'max_joint_state_age_sec': 5.0}, **overrides))
    return tick_settings(values, input_layout(values, runtime.config))


def filled_buffer(settings, stamp_ns):
    header = SimpleNamespace(stamp=SimpleNamespace(sec=stamp_ns // NS, nanosec=stamp_ns % NS))
    buf = InputBuffer()
    for index, entry in enumerate(settings.layout.cameras):
        buf.put(entry, SimpleNamespace(header=header, height=8, width=8, encoding='rgb8', step=24, is_bigendian=0,
                                       data=bytes((index * 7 + i) % 256 for i in range(192))), stamp_ns)
    buf.put(settings.layout.joint_states, SimpleNamespace(header=header, name=JOINTS, position=[0.0] * 6), stamp_ns)
    buf.put(settings.layout.instruction, SimpleNamespace(data='pick it up'), stamp_ns)
    return buf


@pytest.mark.parametrize('rate_hz, period_sec, latency_ms, first', [
    (10.0, 0.1, 30, 0), (10.0, 0.1, 250, 2), (10.0, 0.05, 120, 2), (5.0, 0.02, 95, 4)])
def test_stamp_zero_publishes_from_the_first_action_not_yet_due(runtime, rate_hz, period_sec, latency_ms, first):
    settings = settings_for(runtime, action_period_sec=period_sec, control_rate_hz=rate_hz)
    now = 100 * NS
    outcome = TickEngine(runtime).run(filled_buffer(settings, now), settings, now,
                                      clock=lambda: now + latency_ms * MS)
    plan = outcome.plan
    assert plan.stamp_ns == 0 and plan.first_action == first
    np.testing.assert_allclose(plan.times_sec, (np.arange(first, 10) + 1) * period_sec - latency_ms / 1000)
    np.testing.assert_array_equal(plan.positions, outcome.chunk.actions[first:])
    assert 0 < plan.times_sec[0] <= period_sec


def test_stamp_observation_publishes_every_point_at_the_camera_stamp(runtime):
    settings = settings_for(runtime, stamp_mode='observation')
    now, camera = 100 * NS, 100 * NS - 40 * MS
    outcome = TickEngine(runtime).run(filled_buffer(settings, camera), settings, now,
                                      clock=lambda: now + 200 * MS)
    plan = outcome.plan
    assert plan.stamp_ns == camera and plan.first_action == 0 and len(plan.times_sec) == 10
    np.testing.assert_allclose(plan.times_sec, (np.arange(10) + 1) * 0.1)
    assert outcome.origin_ns == camera


def test_a_chunk_entirely_due_before_publication_is_skipped(runtime):
    settings = settings_for(runtime, execute_steps=3)
    now = 100 * NS
    engine = TickEngine(runtime)
    outcome = engine.run(filled_buffer(settings, now), settings, now, clock=lambda: now + 300 * MS)
    assert outcome.plan is None and outcome.skip.reason is SkipReason.CHUNK_ELAPSED
    assert engine.stats.skipped == {'chunk_elapsed': 1}


def test_rtc_ticks_continue_the_executing_chunk_with_the_measured_delay(runtime):
    """Consecutive ticks with 150 ms latency at 10 Hz: the delay becomes 1, chunks continue each other and the
    hand-over jump is far below independent sampling's."""
    jumps = {}
    for chunking in ('independent', 'rtc'):
        settings = settings_for(runtime, chunking=chunking, seed=-1)
        engine = TickEngine(runtime)
        torch.manual_seed(0)
        outcomes = []
        for k in range(6):
            now = 100 * NS + k * 100 * MS
            outcomes.append(engine.run(filled_buffer(settings, now), settings, now, clock=lambda: now + 150 * MS))
        assert all(o.plan is not None and o.plan.first_action == 1 for o in outcomes)
        assert [o.delay for o in outcomes] == [0, 0, 1, 1, 1, 1]   # the cold first inference is not counted
        assert [o.chunk.continued for o in outcomes] == [False] + [chunking == 'rtc'] * 5
        jumps[chunking] = np.median([o.handover.jump_max for o in outcomes[1:]])
    assert jumps['rtc'] < 0.2 * jumps['independent'], jumps
