"""InputBuffer.assemble with plain-Python message stand-ins (no ROS)."""
from types import SimpleNamespace

import numpy as np
import pytest

from vla_policy_node.images import RawImage
from vla_policy_node.observation import AssemblySettings, InputBuffer, SkipTick

NS = 1_000_000_000
NOW = 1000 * NS
CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb')
TOPICS = tuple(f'/cameras/{c}/image_raw' for c in CAMERAS)
JOINTS = ('j1', 'j2', 'j3')
SETTINGS = AssemblySettings(camera_names=CAMERAS, camera_topics=TOPICS, state_joint_names=JOINTS,
                            joint_states_topic='/joint_states', instruction_topic='/instruction',
                            default_instruction='', max_image_age_sec=0.5, max_camera_skew_sec=0.1,
                            max_joint_state_age_sec=0.5, max_instruction_length=20)


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


def buffer(cameras=True, joint_state=True, instruction='pick it up'):
    buf = InputBuffer()
    if cameras:
        for name in CAMERAS:
            buf.put_camera(name, image(), NOW)
    if joint_state:
        buf.put_joint_state(joints(), NOW)
    if instruction is not None:
        buf.put_instruction(instruction, NOW)
    return buf


def skip_of(buf, settings=SETTINGS, now=NOW):
    with pytest.raises(SkipTick) as info:
        buf.assemble(settings, now)
    return info.value


def test_happy_path():
    buf = InputBuffer()
    buf.put_camera(CAMERAS[0], image(NOW - 50_000_000), NOW)
    buf.put_camera(CAMERAS[1], image(NOW - 20_000_000), NOW)
    buf.put_joint_state(joints(names=('j3', 'extra', 'j1', 'j2'), positions=(3.0, 9.0, 1.0, 2.0)), NOW)
    buf.put_instruction('pick it up', NOW)
    assembled = buf.assemble(SETTINGS, NOW)
    # State follows state_joint_names, whatever the message order; extra joints are ignored.
    np.testing.assert_array_equal(assembled.observation.state, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(assembled.current_positions, [1.0, 2.0, 3.0])
    assert assembled.observation.instruction == 'pick it up'
    assert assembled.stamp_ns == NOW - 20_000_000           # the newest camera stamp
    assert set(assembled.observation.images) == set(CAMERAS)
    assert all(isinstance(f, RawImage) for f in assembled.observation.images.values())
    assert assembled.camera_ages_sec == pytest.approx({CAMERAS[0]: 0.05, CAMERAS[1]: 0.02})


def test_default_instruction_is_used_when_none_received():
    settings = SettingsWith(default_instruction='the default')
    assert buffer(instruction=None).assemble(settings, NOW).observation.instruction == 'the default'
    # A received one wins.
    assert buffer(instruction='received').assemble(settings, NOW).observation.instruction == 'received'


def SettingsWith(**changes):
    values = dict(SETTINGS.__dict__)
    values.update(changes)
    return AssemblySettings(**values)


def test_unset_header_stamp_falls_back_to_receive_time():
    buf = buffer()
    buf.put_camera(CAMERAS[0], image(0), NOW - 10_000_000)
    assert buf.assemble(SETTINGS, NOW).stamp_ns == NOW
    assert buf.camera_ages(NOW)[CAMERAS[0]] == pytest.approx(0.01)


def test_camera_missing():
    buf = buffer()
    buf2 = InputBuffer()
    buf2.put_camera(CAMERAS[0], image(), NOW)
    buf2.put_joint_state(joints(), NOW)
    skip = skip_of(buf2)
    assert (skip.reason, skip.topic) == ('camera_missing', TOPICS[1])
    assert TOPICS[1] in str(skip)
    buf.clear()
    assert skip_of(buf).reason == 'camera_missing'


def test_camera_stale():
    buf = buffer()
    buf.put_camera(CAMERAS[1], image(NOW - 600_000_000), NOW)
    skip = skip_of(buf)
    assert (skip.reason, skip.topic) == ('camera_stale', TOPICS[1]) and TOPICS[1] in str(skip)


def test_camera_future():
    buf = buffer()
    buf.put_camera(CAMERAS[0], image(NOW + 2 * NS), NOW)
    skip = skip_of(buf)
    assert (skip.reason, skip.topic) == ('camera_future', TOPICS[0]) and TOPICS[0] in str(skip)


def test_camera_skew():
    buf = buffer()
    buf.put_camera(CAMERAS[0], image(NOW - 300_000_000), NOW)
    assert skip_of(buf).reason == 'camera_skew'
    buf.put_camera(CAMERAS[0], image(NOW - 90_000_000), NOW)    # within the skew
    buf.assemble(SETTINGS, NOW)


def test_bad_image():
    buf = buffer()
    buf.put_camera(CAMERAS[1], SimpleNamespace(header=header(NOW), height=4, width=6), NOW)   # no data/encoding
    skip = skip_of(buf)
    assert (skip.reason, skip.topic) == ('bad_image', TOPICS[1]) and TOPICS[1] in str(skip)
    # A good frame clears the fault.
    buf.put_camera(CAMERAS[1], image(), NOW)
    buf.assemble(SETTINGS, NOW)


def test_joint_state_missing():
    skip = skip_of(buffer(joint_state=False))
    assert (skip.reason, skip.topic) == ('joint_state_missing', '/joint_states') and '/joint_states' in str(skip)


def test_joint_state_stale():
    buf = buffer()
    buf.put_joint_state(joints(NOW - NS), NOW)
    assert skip_of(buf).reason == 'joint_state_stale'


@pytest.mark.parametrize('names, positions, reason', [
    (JOINTS, (0.1, 0.2), 'joint_state_malformed'),
    (('j1', 'j2'), (0.1, 0.2), 'joint_state_missing_joints'),
    (('x1', 'x2', 'x3'), (0.1, 0.2, 0.3), 'joint_state_missing_joints'),
    (JOINTS, (0.1, float('nan'), 0.3), 'joint_state_nonfinite'),
    (JOINTS, (0.1, float('inf'), 0.3), 'joint_state_nonfinite'),
])
def test_joint_state_faults(names, positions, reason):
    buf = buffer()
    buf.put_joint_state(joints(names=names, positions=positions), NOW)
    skip = skip_of(buf)
    assert (skip.reason, skip.topic) == (reason, '/joint_states')
    assert '/joint_states' in str(skip)


def test_unknown_joints_are_named():
    buf = buffer()
    buf.put_joint_state(joints(names=('x1', 'x2', 'x3')), NOW)
    assert 'x1' in str(skip_of(buf))


def test_instruction_missing():
    skip = skip_of(buffer(instruction=None))
    assert (skip.reason, skip.topic) == ('instruction_missing', '/instruction')
    skip = skip_of(buffer(instruction=None), SettingsWith(default_instruction='   '))
    assert skip.reason == 'instruction_missing'


@pytest.mark.parametrize('text', ['', '   ', '\n'])
def test_instruction_empty(text):
    # An explicit empty instruction is refused even when a default exists.
    skip = skip_of(buffer(instruction=text), SettingsWith(default_instruction='the default'))
    assert (skip.reason, skip.topic) == ('instruction_empty', '/instruction')


def test_instruction_too_long():
    skip = skip_of(buffer(instruction='x' * 21))
    assert (skip.reason, skip.topic) == ('instruction_too_long', '/instruction') and '/instruction' in str(skip)
    assert buffer(instruction='x' * 20).assemble(SETTINGS, NOW).observation.instruction == 'x' * 20


def test_checks_run_in_order_cameras_then_joints_then_instruction():
    buf = InputBuffer()
    assert skip_of(buf).reason == 'camera_missing'
    for name in CAMERAS:
        buf.put_camera(name, image(), NOW)
    assert skip_of(buf).reason == 'joint_state_missing'
    buf.put_joint_state(joints(), NOW)
    assert skip_of(buf).reason == 'instruction_missing'
