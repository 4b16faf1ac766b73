"""Tick-level rules shared by the node and the replay: settings checks, clock, statistics under threads."""
import threading

import numpy as np
import pytest

from runtime_fixtures import tiny_checkpoints  # noqa: F401
from vla_policy_node.observation import InputBuffer, SkipTick
from vla_policy_node.runtime import Observation, PolicyRuntime
from vla_policy_node.settings import SettingsError, camera_layout, resolve_values, tick_settings
from vla_policy_node.tick import TickEngine, TickOutcome, TickStats, check_settings_against_model

JOINTS = [f'joint_{i}' for i in range(1, 7)]


@pytest.fixture(scope='module')
def runtime(tiny_checkpoints):  # noqa: F811
    return PolicyRuntime.from_pretrained(tiny_checkpoints['pi0'], device='cpu', dtype='float32')


def _settings(runtime, **overrides):
    values = resolve_values(dict({'joint_names': JOINTS}, **overrides))
    cameras = camera_layout(values, runtime.config.camera_names)
    return tick_settings(values, {name: topic for name, (topic, _) in cameras.items()})


@pytest.mark.parametrize('overrides, message', [
    (dict(joint_lower_limits=[1.0] * 6, joint_upper_limits=[-1.0] * 6), 'must not exceed'),
    (dict(joint_lower_limits=[0.0] * 5), 'has 5 values for 6 joints'),
    (dict(joint_names=['a', 'a', 'b', 'c', 'd', 'e']), 'joint_names has duplicates'),
    (dict(joint_names=JOINTS[:5]), 'joint_names has 5 joints'),
    (dict(state_joint_names=JOINTS[:1] * 6), 'state_joint_names has duplicates'),
    (dict(execute_steps=11), 'exceeds the chunk size 10'),
])
def test_settings_the_model_cannot_use_are_refused_at_start_up(runtime, overrides, message):
    # Node configure and the replay both call this before the first tick.
    with pytest.raises(ValueError, match=message):
        check_settings_against_model(_settings(runtime, **overrides), runtime.config)


def test_duplicate_camera_names_are_refused():
    with pytest.raises(SettingsError, match='camera_names has duplicates'):
        camera_layout(resolve_values({'camera_names': ['a', 'a']}), ['a'])


def test_no_tick_before_the_first_clock(runtime):
    engine = TickEngine(runtime)
    outcome = engine.run(InputBuffer(), _settings(runtime), now_ns=0)
    assert outcome.skip is not None and outcome.skip.reason == 'waiting_for_clock'
    assert outcome.plan is None and engine.stats.skipped == {'waiting_for_clock': 1}


def test_use_cache_false_stores_nothing_and_does_not_change_the_default(runtime):
    frames = {name: np.full((8, 8, 3), 100, dtype=np.uint8) for name in runtime.config.camera_names}
    observation = Observation(frames, np.zeros(6), 'pick up the cube')
    before = runtime.cache.stats()
    chunk = runtime.infer(observation, seed=0, use_cache=False)
    assert not chunk.cache_hit and chunk.key is None
    assert runtime.cache.stats() == before and runtime.cache_enabled


def test_snapshots_stay_consistent_while_ticks_record_new_reasons():
    stats = TickStats()
    stop = threading.Event()
    errors = []

    def record():
        i = 0
        while not stop.is_set():
            stats.record(TickOutcome(now_ns=i, skip=SkipTick(f'reason_{i % 500}', 'x')))
            i += 1

    def read():
        try:
            for _ in range(300):
                snap = stats.snapshot()
                assert snap.skipped_total == sum(count for _, count in snap.skipped.items())
        except Exception as exc:  # "dictionary changed size during iteration" would land here
            errors.append(exc)

    writer = threading.Thread(target=record)
    writer.start()
    read()
    stop.set()
    writer.join()
    assert errors == []
