"""Tick-level rules shared by the node and the replay: settings checks, clock, statistics under threads."""
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from runtime_fixtures import tiny_checkpoints  # noqa: F401
from vla_policy_node.observation import InputBuffer, Observation, SkipReason, SkipTick
from vla_policy_node.params import resolve_values
from vla_policy_node.runtime import PolicyRuntime
from vla_policy_node.settings import input_layout, tick_settings
from vla_policy_node.tick import TickEngine, TickOutcome, TickStats

JOINTS = [f'joint_{i}' for i in range(1, 7)]
NS = 1_000_000_000
NOW = 100 * NS
REASONS = list(SkipReason)


@pytest.fixture(scope='module')
def runtime(tiny_checkpoints):  # noqa: F811
    return PolicyRuntime.from_pretrained(tiny_checkpoints['pi0'], device='cpu', dtype='float32')


def _settings(runtime, **overrides):
    values = resolve_values(dict({'joint_names': JOINTS, 'seed': 0}, **overrides))
    return tick_settings(values, input_layout(values, runtime.config))


def _header(ns):
    return SimpleNamespace(stamp=SimpleNamespace(sec=ns // NS, nanosec=ns % NS))


def _image(**fields):
    msg = SimpleNamespace(header=_header(NOW), height=8, width=8, encoding='rgb8', step=24, is_bigendian=0,
                          data=bytes(range(192)))
    for key, value in fields.items():
        setattr(msg, key, value)
    return msg


def _filled_buffer(settings, camera_msg=None, positions=(0.0,) * 6, instruction='pick it up'):
    buf = InputBuffer()
    for entry in settings.layout.cameras:
        buf.put(entry, camera_msg if camera_msg is not None and entry is settings.layout.cameras[0] else _image(),
                NOW)
    buf.put(settings.layout.joint_states, SimpleNamespace(header=_header(NOW), name=JOINTS,
                                                          position=list(positions)), NOW)
    buf.put(settings.layout.instruction, SimpleNamespace(data=instruction), NOW)
    return buf


@pytest.mark.parametrize('inputs, reason, topic', [
    (dict(camera_msg=_image(step=20)), SkipReason.BAD_IMAGE, '/cameras/base_0_rgb/image_raw'),
    (dict(camera_msg=_image(encoding='yuv422')), SkipReason.BAD_IMAGE, '/cameras/base_0_rgb/image_raw'),
    (dict(camera_msg=SimpleNamespace(header=_header(NOW), height=4, width=6)), SkipReason.BAD_IMAGE,
     '/cameras/base_0_rgb/image_raw'),
    (dict(positions=(0.0, float('nan'), 0, 0, 0, 0)), SkipReason.JOINT_STATE_NONFINITE, '/joint_states'),
    (dict(instruction='  '), SkipReason.INSTRUCTION_EMPTY, '/instruction'),
    (dict(instruction='x' * 21), SkipReason.INSTRUCTION_TOO_LONG, '/instruction'),
])
def test_content_the_runtime_refuses_is_a_skip_naming_reason_and_topic(runtime, inputs, reason, topic):
    settings = _settings(runtime, max_instruction_length=20)
    engine = TickEngine(runtime)
    outcome = engine.run(_filled_buffer(settings, **inputs), settings, NOW)
    assert outcome.plan is None and outcome.skip is not None
    assert (outcome.skip.reason, outcome.skip.topic) == (reason, topic)
    assert engine.stats.skipped == {reason.value: 1}
    # The same buffer with good content publishes.
    good = engine.run(_filled_buffer(settings, instruction='x' * 20), settings, NOW)
    assert good.skip is None and good.plan is not None


def test_no_tick_before_the_first_clock(runtime):
    engine = TickEngine(runtime)
    outcome = engine.run(InputBuffer(), _settings(runtime), now_ns=0)
    assert outcome.skip is not None and outcome.skip.reason == 'waiting_for_clock'
    assert outcome.plan is None and engine.stats.skipped == {'waiting_for_clock': 1}


def test_use_cache_false_stores_nothing_and_does_not_change_the_default(runtime):
    frames = {name: np.full((8, 8, 3), 100, dtype=np.uint8) for name in runtime.config.camera_names}
    observation = Observation(frames, np.zeros(6), "pick up the cube")
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
            stats.record(TickOutcome(now_ns=i, skip=SkipTick(REASONS[i % len(REASONS)], 'x')))
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
