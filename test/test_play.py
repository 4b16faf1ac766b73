"""Live replay tests: play() publishes bag messages and /clock over DDS."""
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

# Isolate these DDS tests from other test runs and machines; must happen before
# rclpy creates any participant.
os.environ['ROS_DOMAIN_ID'] = str(random.randint(100, 200))
os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')

import numpy as np  # noqa: E402
import pytest  # noqa: E402

rclpy = pytest.importorskip('rclpy')

from rclpy.context import Context  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from vla_policy_node.bags.bag_io import BagError  # noqa: E402
from vla_policy_node.replay.make_bag import (  # noqa: E402
    INSTRUCTION_TOPIC, SampleBagSpec, camera_topic, expected_counts, render_frame,
    write_sample_bag)
from vla_policy_node.replay.play import message_class, play  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEC = SampleBagSpec(duration_sec=1.0, cameras=('base_0_rgb', 'right_wrist_0_rgb'))
NS = 10**9


@pytest.fixture
def context():
    ctx = Context()
    rclpy.init(context=ctx)
    yield ctx
    ctx.try_shutdown()


@pytest.fixture(scope='module')
def short_bag(tmp_path_factory):
    return write_sample_bag(tmp_path_factory.mktemp('play') / 'bag', SPEC)


class Recorder:
    """Subscriber node that keeps everything it receives, with bag-time checks."""

    def __init__(self, context, topics):
        self.node = Node('replay_recorder', context=context)
        self.received = {topic: [] for topic in topics}
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        for topic, msg_type in topics.items():
            self.node.create_subscription(
                msg_type, topic, lambda msg, topic=topic: self.received[topic].append(msg), qos)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)

    def spin_while(self, busy, linger_sec=0.5, timeout_sec=30.0):
        """Spin until ``busy()`` turns False, then a little longer for the tail."""
        deadline = time.monotonic() + timeout_sec
        while busy() and time.monotonic() < deadline:
            self.executor.spin_once(timeout_sec=0.05)
        linger_end = time.monotonic() + linger_sec
        while time.monotonic() < linger_end:
            self.executor.spin_once(timeout_sec=0.05)

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()


def decode_rgb8(msg):
    rows = np.frombuffer(msg.data, dtype=np.uint8).reshape(msg.height, msg.step)
    return rows[:, :msg.width * 3].reshape(msg.height, msg.width, 3)


def stamp_ns(stamp):
    return stamp.sec * NS + stamp.nanosec


def check_images(images, camera_index):
    assert len(images) == expected_counts(SPEC)[camera_topic(SPEC.cameras[camera_index])]
    for msg in images:
        t_sec = (stamp_ns(msg.header.stamp) - SPEC.start_time_ns) / 1e9
        np.testing.assert_array_equal(decode_rgb8(msg), render_frame(SPEC, camera_index, t_sec))


def check_clock(clocks):
    values = [stamp_ns(msg.clock) for msg in clocks]
    assert len(values) >= 10  # per message plus ~100 Hz in between
    assert values == sorted(values)
    # The clock shows a stamp once its messages are out: it starts just short of the first one.
    assert SPEC.start_time_ns - 1 <= values[0]
    assert values[-1] < SPEC.start_time_ns + SPEC.duration_sec * NS


@pytest.mark.timeout(60)
def test_play_in_thread_publishes_images_and_clock(context, short_bag):
    topics = {camera_topic(name): Image for name in SPEC.cameras}
    topics['/clock'] = Clock
    recorder = Recorder(context, topics)
    progress = []
    result = {}

    def run():
        started = time.monotonic()
        result['count'] = play(
            short_bag, rate=2.0, topics=[camera_topic(name) for name in SPEC.cameras],
            context=context, node_name='player_under_test', wait_for_subscribers=10.0,
            on_progress=lambda count, t_ns: progress.append((count, t_ns)))
        result['elapsed'] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        recorder.spin_while(thread.is_alive)
        thread.join(timeout=5.0)
    finally:
        recorder.close()

    expected = sum(expected_counts(SPEC)[camera_topic(name)] for name in SPEC.cameras)
    assert result['count'] == expected
    assert [count for count, _ in progress] == list(range(1, expected + 1))
    for index, name in enumerate(SPEC.cameras):
        check_images(recorder.received[camera_topic(name)], index)
    check_clock(recorder.received['/clock'])
    # Last frame is 0.8 s into the bag: ~0.4 s at rate 2 (plus discovery wait).
    assert result['elapsed'] >= 0.35


@pytest.mark.timeout(60)
def test_cli_subprocess_replays_with_ros_args(context, short_bag):
    image_topic = camera_topic('base_0_rgb')
    recorder = Recorder(context, {image_topic: Image, INSTRUCTION_TOPIC: String, '/clock': Clock})
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get('PYTHONPATH')]))
    command = [
        sys.executable, '-m', 'vla_policy_node.replay.play', str(short_bag),
        '--rate', '2.0', '--topics', f'{image_topic},{INSTRUCTION_TOPIC}',
        '--wait-for-subscribers', '15', '--ros-args', '-r', '__node:=cli_player_under_test']
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        recorder.spin_while(lambda: process.poll() is None, timeout_sec=40.0)
        stdout, stderr = process.communicate(timeout=10.0)
    finally:
        if process.poll() is None:
            process.kill()
        recorder.close()

    assert process.returncode == 0, stderr
    counts = expected_counts(SPEC)
    assert f'published {counts[image_topic] + counts[INSTRUCTION_TOPIC]} messages' in stdout
    check_images(recorder.received[image_topic], 0)
    assert [msg.data for msg in recorder.received[INSTRUCTION_TOPIC]] == [SPEC.instruction] * 2
    check_clock(recorder.received['/clock'])


@pytest.mark.timeout(90)
def test_cli_waits_for_a_late_subscriber_by_default(context, short_bag):
    # A node started just before the player subscribes only once configured: the player must not
    # publish the bag's t=0 instruction to nobody.
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get('PYTHONPATH')]))
    command = [sys.executable, '-m', 'vla_policy_node.replay.play', str(short_bag), '--topics', INSTRUCTION_TOPIC,
               '--ros-args', '-r', '__node:=late_player_under_test']
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3.0)                        # the player is up and waiting; then the subscriber appears
        assert process.poll() is None, 'the player did not wait for a subscriber'
        recorder = Recorder(context, {INSTRUCTION_TOPIC: String})
        try:
            recorder.spin_while(lambda: process.poll() is None, timeout_sec=40.0)
        finally:
            recorder.close()
        stdout, stderr = process.communicate(timeout=10.0)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert 'waiting up to 10 s for a subscriber' in stderr and 'subscribed: playing' in stderr, stderr
    assert [msg.data for msg in recorder.received[INSTRUCTION_TOPIC]] == [SPEC.instruction] * 2


def test_cli_reports_missing_topic(short_bag, capsys):
    from vla_policy_node.replay.play import main
    assert main([str(short_bag), '--topics', '/nope']) == 2
    assert 'topic /nope is not in the bag' in capsys.readouterr().err


def test_play_rejects_bad_input(short_bag, tmp_path):
    with pytest.raises(BagError, match='not in the bag'):
        play(short_bag, topics=['/nope'])
    with pytest.raises(BagError, match='no rosbag2 bag at'):
        play(tmp_path / 'missing')
    with pytest.raises(ValueError, match='rate must be positive'):
        play(short_bag, rate=0.0)


def test_message_class_import():
    assert message_class('sensor_msgs/msg/Image') is Image
    with pytest.raises(BagError, match='unknown message type nope_msgs/msg/Nothing'):
        message_class('nope_msgs/msg/Nothing')
    with pytest.raises(BagError, match='unknown message type'):
        message_class('not-a-type')
