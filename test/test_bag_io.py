"""Tests for the rosbags helpers and the sample-bag generator (no ROS needed)."""
import io
from collections import Counter, defaultdict

import numpy as np
import pytest
from PIL import Image as PilImage

from vla_policy_node.bags import bag_io
from vla_policy_node.bags.bag_io import (
    BagError, BagWriter, bag_topics, read_messages, require_topics, storage_of)
from vla_policy_node.replay.make_bag import (
    COMMAND_TOPIC, INSTRUCTION_TOPIC, JOINT_STATE_TOPIC, JPEG_FORMAT, ROW_PADDING_BYTES,
    SampleBagSpec, camera_topic, compressed_camera_topic, expected_counts, main,
    padded_camera, render_frame, write_sample_bag)

CAMERAS = SampleBagSpec().cameras


def decode_rgb8(msg):
    """Step-aware rgb8 decode (the point of the padded camera)."""
    rows = np.frombuffer(bytes(msg.data), dtype=np.uint8).reshape(msg.height, msg.step)
    return rows[:, :msg.width * 3].reshape(msg.height, msg.width, 3)


def messages_by_topic(path):
    grouped = defaultdict(list)
    for message in read_messages(path):
        grouped[message.topic].append(message)
    return grouped


@pytest.fixture(scope='module', params=['sqlite3', 'mcap'])
def sample_bag(request, tmp_path_factory):
    spec = SampleBagSpec(storage=request.param, compressed_cameras=('left_wrist_0_rgb',))
    path = write_sample_bag(tmp_path_factory.mktemp(request.param) / 'bag', spec)
    return path, spec


def test_topics_types_and_storage(sample_bag):
    path, spec = sample_bag
    assert storage_of(path) == spec.storage
    assert bag_topics(path) == {
        INSTRUCTION_TOPIC: 'std_msgs/msg/String',
        camera_topic('base_0_rgb'): 'sensor_msgs/msg/Image',
        compressed_camera_topic('left_wrist_0_rgb'): 'sensor_msgs/msg/CompressedImage',
        camera_topic('right_wrist_0_rgb'): 'sensor_msgs/msg/Image',
        JOINT_STATE_TOPIC: 'sensor_msgs/msg/JointState',
        COMMAND_TOPIC: 'sensor_msgs/msg/JointState',
    }


def test_counts_and_time_order(sample_bag):
    path, spec = sample_bag
    messages = list(read_messages(path))
    counts = Counter(message.topic for message in messages)
    assert counts == expected_counts(spec)
    per_camera = spec.duration_sec * spec.camera_rate_hz
    for topic in (camera_topic('base_0_rgb'), compressed_camera_topic('left_wrist_0_rgb')):
        assert abs(counts[topic] - per_camera) <= 1
    assert abs(counts[JOINT_STATE_TOPIC] - spec.duration_sec * spec.joint_rate_hz) <= 1
    assert counts[INSTRUCTION_TOPIC] == 2
    stamps = [message.timestamp_ns for message in messages]
    assert stamps == sorted(stamps)
    assert stamps[0] == spec.start_time_ns
    assert stamps[-1] < spec.start_time_ns + spec.duration_sec * 1e9


def test_message_contents(sample_bag):
    path, spec = sample_bag
    grouped = messages_by_topic(path)
    instructions = grouped[INSTRUCTION_TOPIC]
    assert [m.msg.data for m in instructions] == [spec.instruction] * 2
    midpoint = spec.start_time_ns + int(spec.duration_sec * 1e9 / 2)
    assert [m.timestamp_ns for m in instructions] == [spec.start_time_ns, midpoint]

    image = grouped[camera_topic('base_0_rgb')][3]
    stamp = image.msg.header.stamp
    assert stamp.sec * 10**9 + stamp.nanosec == image.timestamp_ns
    assert image.msg.header.frame_id == 'base_0_rgb'
    assert image.msg.encoding == 'rgb8'
    t_sec = (image.timestamp_ns - spec.start_time_ns) / 1e9
    np.testing.assert_array_equal(decode_rgb8(image.msg), render_frame(spec, 0, t_sec))

    joints = grouped[JOINT_STATE_TOPIC][0].msg
    assert list(joints.name) == list(spec.joint_names)
    assert len(joints.position) == len(joints.velocity) == len(spec.joint_names)
    command = grouped[COMMAND_TOPIC][0].msg
    assert not np.allclose(command.position, joints.position)  # leads the measured state


def test_compressed_camera_is_jpeg_of_same_picture(sample_bag):
    path, spec = sample_bag
    message = messages_by_topic(path)[compressed_camera_topic('left_wrist_0_rgb')][2]
    assert message.msg.format == JPEG_FORMAT
    decoded = np.asarray(PilImage.open(io.BytesIO(bytes(message.msg.data))).convert('RGB'))
    t_sec = (message.timestamp_ns - spec.start_time_ns) / 1e9
    expected = render_frame(spec, 1, t_sec)
    assert decoded.shape == expected.shape
    # JPEG is lossy: compare on average.
    assert np.abs(decoded.astype(int) - expected.astype(int)).mean() < 8


def test_padded_step_on_one_camera(sample_bag):
    path, spec = sample_bag
    grouped = messages_by_topic(path)
    padded = padded_camera(spec)
    assert padded == 'right_wrist_0_rgb'
    padded_msg = grouped[camera_topic(padded)][0].msg
    assert padded_msg.step == spec.width * 3 + ROW_PADDING_BYTES
    assert len(padded_msg.data) == padded_msg.step * spec.height
    np.testing.assert_array_equal(decode_rgb8(padded_msg), render_frame(spec, 2, 0.0))
    assert grouped[camera_topic('base_0_rgb')][0].msg.step == spec.width * 3


def test_frames_move_and_differ_per_camera(sample_bag):
    path, spec = sample_bag
    frames = [m.msg.data.tobytes() for m in messages_by_topic(path)[camera_topic('base_0_rgb')]]
    assert frames[0] != frames[1]
    assert render_frame(spec, 0, 0.0).tobytes() != render_frame(spec, 2, 0.0).tobytes()


def test_hold_window_frames_are_identical(sample_bag):
    path, spec = sample_bag
    for topic in (camera_topic('base_0_rgb'), compressed_camera_topic('left_wrist_0_rgb')):
        held = [m.msg.data.tobytes() for m in messages_by_topic(path)[topic]
                if spec.hold_start_sec <= (m.timestamp_ns - spec.start_time_ns) / 1e9
                < spec.hold_end_sec]
        assert len(held) >= 4
        assert len(set(held)) == 1
    joints = [m.msg for m in messages_by_topic(path)[JOINT_STATE_TOPIC]
              if spec.hold_start_sec + 0.1 <= (m.timestamp_ns - spec.start_time_ns) / 1e9
              < spec.hold_end_sec]
    assert all(np.array_equal(j.position, joints[0].position) for j in joints)
    assert all(not np.any(j.velocity) for j in joints)


def test_same_spec_gives_identical_bytes(tmp_path):
    spec = SampleBagSpec(duration_sec=1.0, storage='mcap', compressed_cameras=('base_0_rgb',))
    first = write_sample_bag(tmp_path / 'a', spec)
    second = write_sample_bag(tmp_path / 'b', spec)
    raw_a = [(m.topic, m.timestamp_ns, m.raw) for m in read_messages(first)]
    raw_b = [(m.topic, m.timestamp_ns, m.raw) for m in read_messages(second)]
    assert raw_a == raw_b
    other_seed = write_sample_bag(tmp_path / 'c', SampleBagSpec(
        duration_sec=1.0, storage='mcap', compressed_cameras=('base_0_rgb',), seed=1))
    assert [m.raw for m in read_messages(other_seed)] != [raw for _, _, raw in raw_a]


def test_require_topics_errors(sample_bag, tmp_path):
    path, _ = sample_bag
    available = require_topics(path, {JOINT_STATE_TOPIC: 'sensor_msgs/msg/JointState',
                                      INSTRUCTION_TOPIC: None})
    assert JOINT_STATE_TOPIC in available
    with pytest.raises(BagError, match='topic /nope is not in the bag; it has: ') as info:
        require_topics(path, {'/nope': None})
    assert '/joint_states (sensor_msgs/msg/JointState)' in str(info.value)
    with pytest.raises(BagError, match='has type sensor_msgs/msg/JointState'):
        require_topics(path, {JOINT_STATE_TOPIC: 'sensor_msgs/msg/Image'})
    missing = tmp_path / 'missing_bag'
    with pytest.raises(BagError, match='no rosbag2 bag at .*expected a folder with metadata.yaml'):
        require_topics(missing, {'/x': None})
    with pytest.raises(BagError, match='no rosbag2 bag at'):
        read_messages(missing)
    with pytest.raises(BagError, match='not in the bag'):
        read_messages(path, topics=['/nope'])


def test_bag_writer_refuses_existing_path_and_unknown_type(tmp_path):
    existing = tmp_path / 'exists'
    existing.mkdir()
    with pytest.raises(BagError, match='already exists'):
        BagWriter(existing)
    with BagWriter(tmp_path / 'new', storage='mcap') as bag:
        with pytest.raises(BagError, match='unknown message type'):
            bag.add_topic('/x', 'nope_msgs/msg/Nothing')
        bag.add_topic('/x', 'std_msgs/msg/String')
        string_type = bag_io.TYPESTORE.types['std_msgs/msg/String']
        bag.write('/x', 5, string_type(data='hello'))
    written = [(m.timestamp_ns, m.msg.data) for m in read_messages(tmp_path / 'new')]
    assert written == [(5, 'hello')]
    with pytest.raises(BagError, match='unknown storage'):
        BagWriter(tmp_path / 'other', storage='rosbag1')


def test_cli_writes_bag(tmp_path, capsys):
    out = tmp_path / 'cli_bag'
    assert main([str(out), '--storage', 'mcap', '--duration', '1', '--cameras', 'a,b',
                 '--compressed', 'b', '--width', '32', '--height', '24']) == 0
    printed = capsys.readouterr().out
    assert 'wrote' in printed and compressed_camera_topic('b') in printed
    assert storage_of(out) == 'mcap'
    topics = bag_topics(out)
    assert topics[camera_topic('a')] == 'sensor_msgs/msg/Image'
    assert topics[compressed_camera_topic('b')] == 'sensor_msgs/msg/CompressedImage'
    image = next(read_messages(out, topics=[camera_topic('a')])).msg
    assert (image.width, image.height) == (32, 24)
    # A second run must not clobber the existing bag.
    assert main([str(out)]) == 2
