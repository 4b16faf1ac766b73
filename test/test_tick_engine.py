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


# ---- time origin and repeated observations -----------------------------------------------------------------
PERIOD = NS // 10


def _buffer_at(settings, frame_ns, positions=(0.0,) * 6, data=bytes(range(192))):
    """Frames stamped (and received) at ``frame_ns``, a joint state and the instruction received then too."""
    buf = InputBuffer()
    for entry in settings.layout.cameras:
        buf.put(entry, _image(header=_header(frame_ns), data=data), frame_ns)
    buf.put(settings.layout.joint_states, SimpleNamespace(header=_header(frame_ns), name=JOINTS,
                                                          position=list(positions)), frame_ns)
    buf.put(settings.layout.instruction, SimpleNamespace(data='pick it up'), frame_ns)
    return buf


def _due_ns(plan, publish_ns):
    return (plan.stamp_ns or publish_ns) + np.round(plan.times_sec * NS).astype(np.int64)


@pytest.mark.parametrize('latency_ns', [0, 120_000_000])
def test_both_stamp_modes_time_every_action_from_the_observation(runtime, latency_ns):
    """A frame 150 ms old at the tick: action i is due at the frame's stamp + (i + 1) * period in both modes;
    zero leaves out the actions due by publication, observation stamps every one at the frame."""
    frame_ns, tick_ns = NOW - 150_000_000, NOW
    plans = {}
    for mode in ('zero', 'observation'):
        settings = _settings(runtime, stamp_mode=mode)
        engine = TickEngine(runtime)
        engine.activate(frame_ns)
        outcome = engine.run(_buffer_at(settings, frame_ns), settings, tick_ns, clock=lambda: tick_ns + latency_ns)
        assert outcome.origin_ns == frame_ns and outcome.assembled.clock.name == 'header'
        plans[mode] = (outcome.publish, _due_ns(outcome.publish, tick_ns + latency_ns))
    elapsed = (150_000_000 + latency_ns) // PERIOD
    zero, zero_due = plans['zero']
    stamped, stamped_due = plans['observation']
    assert zero.stamp_ns == 0 and zero.first_action == elapsed
    assert stamped.stamp_ns == frame_ns and stamped.first_action == 0
    expected = frame_ns + (np.arange(stamped.positions.shape[0]) + 1) * PERIOD
    np.testing.assert_array_equal(stamped_due, expected)
    np.testing.assert_array_equal(zero_due, expected[elapsed:])
    np.testing.assert_allclose(zero.positions, stamped.positions[elapsed:])
    assert zero_due[0] > tick_ns + latency_ns >= expected[elapsed - 1]


@pytest.mark.parametrize('overrides', [dict(seed=0), dict(seed=-1), dict(seed=0, chunking='rtc'),
                                       dict(seed=-1, chunking='rtc')],
                         ids=['independent-seed', 'independent-fresh', 'rtc-seed', 'rtc-fresh'])
def test_a_repeated_observation_keeps_the_executing_chunk_without_a_fault(runtime, overrides):
    """The same frames, joints and instruction again (5 Hz cameras, 10 Hz ticks, or a camera that stopped):
    no new chunk, no re-timing, no hold (on_fault hold, and longer than fault_hold_after_sec); the chunk goes
    on. A joint that moved, a new frame, another seed: a new chunk."""
    settings = _settings(runtime, max_image_age_sec=5.0, max_joint_state_age_sec=5.0, fault_hold_after_sec=0.3,
                         **overrides)
    engine = TickEngine(runtime)
    engine.activate(NOW)
    buf = _buffer_at(settings, NOW)
    first = engine.run(buf, settings, NOW + PERIOD)
    assert first.publish is not None
    executing = engine.handover.executing
    horizon = executing.end
    for k in range(2, horizon):                  # until its last action falls due
        outcome = engine.run(buf, settings, NOW + k * PERIOD)
        assert outcome.skip is not None and outcome.skip.reason is SkipReason.REPEATED_OBSERVATION
        assert not outcome.skip.reason.fault and outcome.publish is None and outcome.chunk is None
        assert outcome.review.kind is None
    assert engine.handover.executing is executing and engine.supervisor.label == 'active'
    assert engine.stats.skipped == {'repeated_observation': horizon - 2} and engine.stats.chunks == 1
    assert engine.stats.last_skip is None and engine.stats.snapshot().faults_total == 0
    # Each of these is new information: a chunk goes out.
    moved = _buffer_at(settings, NOW, positions=(0.01,) + (0.0,) * 5)
    for changed_buf, changed_settings in ((moved, settings), (buf, _settings(
            runtime, max_image_age_sec=5.0, max_joint_state_age_sec=5.0, fault_hold_after_sec=0.3,
            **dict(overrides, seed=5)))):
        engine = TickEngine(runtime)
        engine.activate(NOW)
        assert engine.run(buf, settings, NOW + PERIOD).publish is not None
        outcome = engine.run(changed_buf, changed_settings, NOW + 2 * PERIOD)
        assert outcome.skip is None and outcome.publish is not None and outcome.origin_ns == NOW
    newer = _buffer_at(settings, NOW + 2 * PERIOD)
    assert engine.run(newer, settings, NOW + 3 * PERIOD).publish is not None


class CountingBackend:
    """The runtime, counting its inferences."""

    def __init__(self, runtime):
        self.runtime, self.calls = runtime, 0

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def infer(self, *args, **kwargs):
        self.calls += 1
        return self.runtime.infer(*args, **kwargs)


def test_a_repeated_observation_after_the_chunk_ran_out_is_refused_before_inference(runtime):
    settings = _settings(runtime, max_image_age_sec=5.0, max_joint_state_age_sec=5.0, stamp_mode='observation')
    backend = CountingBackend(runtime)
    engine = TickEngine(backend)
    engine.activate(NOW)
    buf = _buffer_at(settings, NOW)
    assert engine.run(buf, settings, NOW + PERIOD).publish is not None and backend.calls == 1
    end = engine.handover.executing.end
    # Its last action is due at NOW + end * PERIOD: from then on nothing executes, and a chunk of the same frames
    # would be all due too: chunk_elapsed (a fault: the arm stands), decided without computing it.
    for k in range(3):
        outcome = engine.run(buf, settings, NOW + (end + k) * PERIOD)
        assert outcome.skip is not None and outcome.skip.reason is SkipReason.CHUNK_ELAPSED and outcome.chunk is None
        assert 'not computed' in str(outcome.skip)
    assert backend.calls == 1 and engine.stats.chunks == 1


@pytest.mark.parametrize('age_periods, computed', [(4, True), (5, False), (9, False)])
def test_an_observation_as_old_as_the_published_chunk_is_not_computed(runtime, age_periods, computed):
    """execute_steps 5: a frame 4 periods old still leaves its last action ahead (published); 5 or more: every
    published action is due before inference could even start."""
    settings = _settings(runtime, max_image_age_sec=5.0, max_joint_state_age_sec=5.0, execute_steps=5)
    backend = CountingBackend(runtime)
    engine = TickEngine(backend)
    engine.activate(NOW)
    outcome = engine.run(_buffer_at(settings, NOW), settings, NOW + age_periods * PERIOD)
    assert backend.calls == int(computed)
    if computed:
        assert outcome.publish is not None and outcome.publish.first_action == 4
    else:
        assert outcome.skip.reason is SkipReason.CHUNK_ELAPSED and outcome.chunk is None


def test_diagnostics_show_the_camera_clock_and_a_repeated_observation_is_no_warning(runtime):
    pytest.importorskip('diagnostic_msgs')
    from diagnostic_msgs.msg import DiagnosticStatus
    from vla_policy_node.ros.diagnostics import PolicyReport, diagnostics_msg
    settings = _settings(runtime, max_image_age_sec=5.0, max_joint_state_age_sec=5.0)
    engine = TickEngine(runtime)
    engine.activate(NOW)
    buf = InputBuffer()
    for entry in settings.layout.cameras:          # a camera machine whose clock is 30 s ahead of the node's
        buf.put(entry, _image(header=_header(NOW + 30 * NS)), NOW)
    buf.put(settings.layout.joint_states, SimpleNamespace(header=_header(NOW), name=JOINTS, position=[0.0] * 6), NOW)
    buf.put(settings.layout.instruction, SimpleNamespace(data='pick it up'), NOW)
    assert engine.run(buf, settings, NOW + PERIOD).publish is not None
    assert engine.run(buf, settings, NOW + 2 * PERIOD).skip.reason is SkipReason.REPEATED_OBSERVATION
    snapshot = engine.stats.snapshot()
    report = PolicyReport(name='policy', lifecycle='active', configure_error='', new_skips=snapshot.faults_total,
                          stats=snapshot)
    status = diagnostics_msg(NOW, report).status[0]
    values = {pair.key: pair.value for pair in status.values}
    assert values['camera_clock'] == 'receive' and settings.layout.cameras[0].topic in values['camera_clock_reason']
    assert values['skipped_repeated_observation'] == '1' and 'last_skip' not in values
    assert status.level == DiagnosticStatus.OK


def test_a_camera_clock_jump_is_logged_once_per_direction_and_counted_on_diagnostics(runtime):
    """The first camera's stamps 5 s ahead for good, then back: each jump is one log line (throttled, but there
    and back both said), counted per camera on /diagnostics."""
    pytest.importorskip('diagnostic_msgs')
    from vla_policy_node.ros.diagnostics import PolicyReport, diagnostics_msg
    from vla_policy_node.tick import ThrottledReporter
    settings = _settings(runtime, max_image_age_sec=1.0)
    engine, reporter, buf = TickEngine(runtime), ThrottledReporter(), InputBuffer()
    engine.activate(NOW)
    lines = []
    for k in range(60):                               # 20 Hz frames for 3 s, the jump at 1 s, back at 2 s
        t = NOW + k * NS // 20
        offset = 5 * NS if 20 <= k < 40 else 0
        for entry in settings.layout.cameras:
            buf.put(entry, _image(header=_header(t + (offset if entry is settings.layout.cameras[0] else 0))), t)
        buf.put(settings.layout.joint_states, SimpleNamespace(header=_header(t), name=JOINTS, position=[0.0] * 6), t)
        buf.put(settings.layout.instruction, SimpleNamespace(data='pick it up'), t)
        if k % 2:
            lines += [line for line in engine.run(buf, settings, t).warnings(reporter) if 'jumped' in line]
    camera = settings.layout.cameras[0]
    assert len(lines) == 2 and 'ahead of' in lines[0] and 'behind' in lines[1] and camera.topic in lines[0], lines
    snapshot = engine.stats.snapshot()
    report = PolicyReport(name='policy', lifecycle='active', configure_error='', new_skips=0, stats=snapshot)
    values = {pair.key: pair.value for pair in diagnostics_msg(NOW, report).status[0].values}
    assert values['clock_jumps'] == '2' and values[f'clock_jumps_{camera.camera}'] == '2', values
    assert values['joint_state_clock'] == 'header' and values['clock_outliers'] == '0'
