"""InputBuffer: timing and topic checks, with plain-Python message stand-ins (no ROS).

Content checks (frames, finite state, instruction text) are observation_checks.py's, which every
backend runs: test_runtime.py and test_tick_engine.py cover them through the runtime.
"""
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from vla_policy_node.observation import (InputBuffer, InputKind, InputLayout, InputTopic, SkipReason, SkipTick,
                                         TimingLimits)

NS = 1_000_000_000
NOW = 1000 * NS
CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb')
TOPICS = tuple(f'/cameras/{c}/image_raw' for c in CAMERAS)
JOINTS = ('j1', 'j2', 'j3')
LAYOUT = InputLayout(cameras=tuple(InputTopic(t, InputKind.CAMERA, camera=c) for c, t in zip(CAMERAS, TOPICS)),
                     joint_states=InputTopic('/joint_states', InputKind.JOINT_STATE),
                     instruction=InputTopic('/instruction', InputKind.INSTRUCTION), state_joint_names=JOINTS)
LIMITS = TimingLimits(max_image_age_sec=0.5, max_camera_skew_sec=0.1, max_joint_state_age_sec=0.5,
                      default_instruction='')
CAMERA = dict(zip(CAMERAS, LAYOUT.cameras))


def header(ns):
    return SimpleNamespace(stamp=SimpleNamespace(sec=ns // NS, nanosec=ns % NS), frame_id='')


def image(ns=NOW, height=4, width=6, **fields):
    msg = SimpleNamespace(header=header(ns), height=height, width=width, encoding='rgb8', step=width * 3,
                          is_bigendian=0, data=bytes(range(height * width * 3)))
    for key, value in fields.items():
        setattr(msg, key, value)
    return msg


def joints(ns=NOW, names=JOINTS, positions=(0.1, 0.2, 0.3)):
    return SimpleNamespace(header=header(ns), name=list(names), position=list(positions))


def text(value):
    return SimpleNamespace(data=value)


def buffer(cameras=True, joint_state=True, instruction='pick it up'):
    buf = InputBuffer()
    if cameras:
        for name in CAMERAS:
            buf.put(CAMERA[name], image(), NOW)
    if joint_state:
        buf.put(LAYOUT.joint_states, joints(), NOW)
    if instruction is not None:
        buf.put(LAYOUT.instruction, text(instruction), NOW)
    return buf


def skip_of(buf, limits=LIMITS, now=NOW):
    with pytest.raises(SkipTick) as info:
        buf.assemble(LAYOUT, limits, now)
    return info.value


def assemble(buf, limits=LIMITS, now=NOW):
    return buf.assemble(LAYOUT, limits, now)


def test_happy_path():
    buf = InputBuffer()
    buf.put(CAMERA[CAMERAS[0]], image(NOW - 50_000_000), NOW)
    buf.put(CAMERA[CAMERAS[1]], image(NOW - 20_000_000), NOW)
    buf.put(LAYOUT.joint_states, joints(names=('j3', 'extra', 'j1', 'j2'), positions=(3.0, 9.0, 1.0, 2.0)), NOW)
    buf.put(LAYOUT.instruction, text('pick it up'), NOW)
    assembled = assemble(buf)
    # State follows state_joint_names, whatever the message order; extra joints are ignored.
    np.testing.assert_array_equal(assembled.observation.state, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(assembled.current_positions, [1.0, 2.0, 3.0])
    assert assembled.observation.instruction == 'pick it up'
    assert assembled.stamp_ns == NOW - 20_000_000           # the newest camera stamp
    assert set(assembled.observation.images) == set(CAMERAS)
    # Messages are stored as received: decoding and frame checks wait for the runtime (on a miss).
    assert all(isinstance(f, SimpleNamespace) for f in assembled.observation.images.values())
    assert assembled.camera_ages_sec == pytest.approx({CAMERAS[0]: 0.05, CAMERAS[1]: 0.02})


def test_default_instruction_is_used_when_none_received():
    limits = replace(LIMITS, default_instruction='the default')
    assert assemble(buffer(instruction=None), limits).observation.instruction == 'the default'
    # A received one wins, even an empty one (the runtime then refuses it as instruction_empty).
    assert assemble(buffer(instruction='received'), limits).observation.instruction == 'received'
    assert assemble(buffer(instruction=''), limits).observation.instruction == ''


def test_layout_maps_fields_and_topics():
    assert LAYOUT.topic_of('images.left_wrist_0_rgb') == TOPICS[1]
    assert LAYOUT.topic_of('state') == '/joint_states' and LAYOUT.topic_of('instruction') == '/instruction'
    assert LAYOUT.topic_of('noise') == ''
    assert set(LAYOUT.by_topic()) == set(TOPICS) | {'/joint_states', '/instruction'}
    assert LAYOUT.by_topic()['/joint_states'].msg_type == 'sensor_msgs/msg/JointState'


def test_unset_header_stamp_falls_back_to_receive_time():
    buf = buffer()
    buf.put(CAMERA[CAMERAS[0]], image(0), NOW - 10_000_000)
    assert assemble(buf).stamp_ns == NOW
    assert buf.camera_ages(NOW)[CAMERAS[0]] == pytest.approx(0.01)


def test_camera_missing():
    buf = buffer()
    buf2 = InputBuffer()
    buf2.put(CAMERA[CAMERAS[0]], image(), NOW)
    buf2.put(LAYOUT.joint_states, joints(), NOW)
    skip = skip_of(buf2)
    assert (skip.reason, skip.topic) == ('camera_missing', TOPICS[1])
    assert TOPICS[1] in str(skip)
    buf.clear()
    assert skip_of(buf).reason == 'camera_missing'


def test_camera_stale():
    buf = buffer()
    buf.put(CAMERA[CAMERAS[1]], image(NOW - 600_000_000), NOW)
    skip = skip_of(buf)
    assert (skip.reason, skip.topic) == ('camera_stale', TOPICS[1]) and TOPICS[1] in str(skip)


@pytest.mark.parametrize('limits', [replace(LIMITS, camera_clock='header'), replace(LIMITS, sim_time=True)],
                         ids=['header', 'auto under use_sim_time'])
def test_camera_future(limits):
    buf = buffer()
    buf.put(CAMERA[CAMERAS[0]], image(NOW + 2 * NS), NOW)
    skip = skip_of(buf, limits)
    assert (skip.reason, skip.topic) == ('camera_future', TOPICS[0]) and TOPICS[0] in str(skip)


def test_auto_times_a_camera_on_another_clock_by_receive_time():
    """A frame stamped 2 s after it arrived is on another clock: auto says so and times frames by arrival."""
    buf = buffer()
    buf.put(CAMERA[CAMERAS[0]], image(NOW + 2 * NS), NOW)
    assembled = assemble(buf)
    assert assembled.clock.name == 'receive' and TOPICS[0] in assembled.clock.reason
    assert assembled.stamp_ns == NOW and assembled.camera_ages_sec[CAMERAS[0]] == 0.0
    # The same frames on the node's clock (all arrive after their stamps): header.
    assert assemble(buffer()).clock.name == 'header' and 'node' in assemble(buffer()).clock.reason


def test_receive_clock_takes_off_the_delay_beyond_the_cameras_smallest():
    """Camera stamps 100 s behind the node: a frame's time is its arrival less what it was late beyond the
    fastest recent frame of its camera; the age and staleness checks run in that time."""
    limits = replace(LIMITS, camera_clock='receive')
    buf = buffer(cameras=False)
    offset = 100 * NS
    for name in CAMERAS:                      # the fastest frames: 20 ms after their (shifted) stamps
        buf.put(CAMERA[name], image(NOW - offset - 20_000_000), NOW)
    buf.put(CAMERA[CAMERAS[0]], image(NOW - offset - 50_000_000), NOW)     # this one arrived 30 ms late
    assembled = assemble(buf, limits)
    assert assembled.clock.name == 'receive' and assembled.clock.reason == 'camera_clock receive'
    assert assembled.camera_ages_sec[CAMERAS[0]] == pytest.approx(0.03)
    assert assembled.camera_ages_sec[CAMERAS[1]] == pytest.approx(0.0)
    assert assembled.stamp_ns == NOW
    assert skip_of(buf, limits, NOW + 600_000_000).reason == 'camera_stale'
    # camera_clock header would call every frame 100 s old.
    assert skip_of(buf, replace(LIMITS, camera_clock='header')).reason == 'camera_stale'


def test_an_observation_repeats_with_the_same_frames_joints_and_instruction():
    first = assemble(buffer())
    assert first.repeats(first, 0.0)
    again = buffer()
    again.put(LAYOUT.joint_states, joints(positions=(0.1, 0.2, 0.3 + 5e-4)), NOW)
    assert assemble(again).repeats(first, 1e-3) and not assemble(again).repeats(first, 1e-4)
    later = buffer()
    later.put(CAMERA[CAMERAS[1]], image(NOW + 1), NOW)       # the same pixels, a later frame: new
    assert not assemble(later).repeats(first, 1e-3)
    other = buffer()
    other.put(CAMERA[CAMERAS[1]], image(data=bytes(72)), NOW)     # the same stamp, other pixels: new
    assert not assemble(other).repeats(first, 1e-3)
    assert not assemble(buffer(instruction='put it down')).repeats(first, 1e-3)


def test_camera_skew():
    buf = buffer()
    buf.put(CAMERA[CAMERAS[0]], image(NOW - 300_000_000), NOW)
    assert skip_of(buf).reason == 'camera_skew'
    buf.put(CAMERA[CAMERAS[0]], image(NOW - 90_000_000), NOW)    # within the skew
    assemble(buf)


def test_joint_state_missing():
    skip = skip_of(buffer(joint_state=False))
    assert (skip.reason, skip.topic) == ('joint_state_missing', '/joint_states') and '/joint_states' in str(skip)


def test_joint_state_stale():
    buf = buffer()
    buf.put(LAYOUT.joint_states, joints(NOW - NS), NOW)
    assert skip_of(buf).reason == 'joint_state_stale'


@pytest.mark.parametrize('names, positions, reason', [
    (JOINTS, (0.1, 0.2), 'joint_state_malformed'),
    (('j1', 'j2'), (0.1, 0.2), 'joint_state_missing_joints'),
    (('x1', 'x2', 'x3'), (0.1, 0.2, 0.3), 'joint_state_missing_joints'),
])
def test_joint_state_faults(names, positions, reason):
    buf = buffer()
    buf.put(LAYOUT.joint_states, joints(names=names, positions=positions), NOW)
    skip = skip_of(buf)
    assert (skip.reason, skip.topic) == (reason, '/joint_states')
    assert '/joint_states' in str(skip)


def test_unknown_joints_are_named():
    buf = buffer()
    buf.put(LAYOUT.joint_states, joints(names=('x1', 'x2', 'x3')), NOW)
    assert 'x1' in str(skip_of(buf))


def test_instruction_missing():
    skip = skip_of(buffer(instruction=None))
    assert (skip.reason, skip.topic) == (SkipReason.INSTRUCTION_MISSING, '/instruction')
    skip = skip_of(buffer(instruction=None), replace(LIMITS, default_instruction='   '))
    assert skip.reason == 'instruction_missing'


def test_non_finite_positions_pass_through_to_the_runtime():
    # Mapping names is the buffer's job; judging values is the runtime's (one check, one place).
    buf = buffer()
    buf.put(LAYOUT.joint_states, joints(positions=(0.1, float('nan'), 0.3)), NOW)
    assert np.isnan(assemble(buf).observation.state[1])


def test_checks_run_in_order_cameras_then_joints_then_instruction():
    buf = InputBuffer()
    assert skip_of(buf).reason == 'camera_missing'
    for name in CAMERAS:
        buf.put(CAMERA[name], image(), NOW)
    assert skip_of(buf).reason == 'joint_state_missing'
    buf.put(LAYOUT.joint_states, joints(), NOW)
    assert skip_of(buf).reason == 'instruction_missing'
