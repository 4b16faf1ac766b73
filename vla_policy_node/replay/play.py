"""Pure-Python ``ros2 bag play --clock`` for machines without rosbag2.

Reads a rosbag2 bag (sqlite3 or mcap) with rosbags and publishes each
message's raw CDR bytes at the recorded pace (divided by ``rate``). With
``clock`` on it also publishes rosgraph_msgs/Clock from the bag timestamps,
before each message and at ~100 Hz in between, so nodes with use_sim_time
see bag time and their timers keep firing.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import rclpy
from rclpy.context import Context
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.utilities import remove_ros_args

from vla_policy_node.ros.startup import init_rclpy
from vla_policy_node.bags.bag_io import BagError, BagMessage, PathLike, bag_topics, read_messages

CLOCK_TOPIC = '/clock'
# Between messages, /clock is refreshed this often so sim-time timers advance.
CLOCK_PERIOD_SEC = 0.01
# Extra wait after the first subscriber shows up, so the rest of that node's
# subscriptions (discovered a few ms apart) are matched too.
DISCOVERY_SETTLE_SEC = 0.3
# How long to wait at the end for reliable subscribers to acknowledge.
ACK_TIMEOUT_SEC = 1.0
# The command line waits this long (by default) for a subscriber before the first message: a node
# started just before subscribes only once it is configured (model loaded, warmed up), and a bag's
# t=0 instruction, published once, would otherwise go to nobody.
DEFAULT_WAIT_FOR_SUBSCRIBERS_SEC = 10.0

ProgressCallback = Callable[[int, int], None]


def message_class(msgtype: str) -> type:
    """Import the rclpy message class for a type string like 'sensor_msgs/msg/Image'."""
    parts = msgtype.split('/')
    if len(parts) != 3:
        raise BagError(f'unknown message type {msgtype} (expected package/msg/Name)')
    package, kind, name = parts
    try:
        module = importlib.import_module(f'{package}.{kind}')
        return getattr(module, name)
    except (ImportError, AttributeError) as err:
        raise BagError(
            f'unknown message type {msgtype}: cannot import {package}.{kind}.{name} '
            '(is the message package installed and sourced?)') from err


def replay_qos() -> QoSProfile:
    """Reliable, keep-last 10: a reliable publisher also matches best-effort subscribers."""
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE)


def _select_topics(bag_path: PathLike, topics: Optional[Iterable[str]],
                   clock: bool) -> Dict[str, str]:
    """Map topic -> msgtype of what to replay; unknown requested topics raise BagError."""
    available = bag_topics(bag_path)
    if topics is None:
        selected = dict(available)
    else:
        selected = {}
        for topic in topics:
            if topic not in available:
                listing = ', '.join(f'{t} ({m})' for t, m in sorted(available.items()))
                raise BagError(f'topic {topic} is not in the bag; it has: {listing}')
            selected[topic] = available[topic]
    if clock:
        # Our own /clock stream replaces a recorded one; two sources would fight.
        selected.pop(CLOCK_TOPIC, None)
    return selected


class _Player:
    """Publishers plus the pacing state for one ``play`` call."""

    def __init__(self, node: Node, topic_types: Dict[str, str], rate: float,
                 clock: bool, clock_topic: str, stop_event: Optional[threading.Event]) -> None:
        self.node = node
        self.rate = rate
        self.stop_event = stop_event
        self.publishers = {
            topic: node.create_publisher(message_class(msgtype), topic, replay_qos())
            for topic, msgtype in topic_types.items()
        }
        self.clock_publisher = None
        if clock:
            clock_type = message_class('rosgraph_msgs/msg/Clock')
            self.clock_publisher = node.create_publisher(clock_type, clock_topic, replay_qos())
        self.last_clock_ns: Optional[int] = None

    def should_stop(self) -> bool:
        stopped = self.stop_event is not None and self.stop_event.is_set()
        return stopped or not self.node.context.ok()

    # --- discovery --------------------------------------------------------------

    def subscriber_counts(self) -> List[int]:
        return [pub.get_subscription_count() for pub in self.publishers.values()]

    def wait_for_subscribers(self, timeout_sec: float) -> bool:
        """Wait (bounded) until some replayed topic has a subscriber; True if one did.

        Waiting for *any* topic rather than a specific one works whether the
        consumer listens to cameras only or to everything.
        """
        if timeout_sec <= 0 or not self.publishers:
            return False
        deadline = time.monotonic() + timeout_sec
        while not self.should_stop() and time.monotonic() < deadline:
            if any(self.subscriber_counts()):
                self._settle(deadline + DISCOVERY_SETTLE_SEC)
                return True
            time.sleep(0.02)
        return False

    def _settle(self, deadline: float) -> None:
        """Wait until subscriber counts stop changing for a short while."""
        counts = self.subscriber_counts()
        stable_since = time.monotonic()
        while time.monotonic() < deadline and not self.should_stop():
            time.sleep(0.02)
            now_counts = self.subscriber_counts()
            if now_counts != counts:
                counts, stable_since = now_counts, time.monotonic()
            elif time.monotonic() - stable_since >= DISCOVERY_SETTLE_SEC:
                return

    # --- clock ------------------------------------------------------------------

    def publish_clock(self, bag_time_ns: int) -> None:
        """Publish /clock, never going backwards within one pass."""
        if self.clock_publisher is None:
            return
        if self.last_clock_ns is not None and bag_time_ns <= self.last_clock_ns:
            return
        msg = self.clock_publisher.msg_type()
        msg.clock.sec, msg.clock.nanosec = divmod(int(bag_time_ns), 1_000_000_000)
        self.clock_publisher.publish(msg)
        self.last_clock_ns = bag_time_ns

    def wait_until(self, wall_target: float, wall_start: float, bag_start_ns: int,
                   next_bag_ns: int) -> None:
        """Sleep until ``wall_target``, publishing interpolated bag time meanwhile."""
        while not self.should_stop():
            remaining = wall_target - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(remaining, CLOCK_PERIOD_SEC))
            elapsed_ns = int((time.monotonic() - wall_start) * self.rate * 1e9)
            # Clamp just short of the next message's stamp: see publish_message.
            self.publish_clock(min(bag_start_ns + elapsed_ns, next_bag_ns - 1))

    # --- playback ---------------------------------------------------------------

    def play_once(self, bag_path: PathLike, on_progress: Optional[ProgressCallback],
                  published_before: int) -> int:
        """Replay the bag once; returns messages published in this pass."""
        self.last_clock_ns = None  # a loop restarts bag time, like ros2 bag play --loop
        published = 0
        wall_start = 0.0
        bag_start_ns: Optional[int] = None
        for message in read_messages(bag_path, topics=list(self.publishers)):
            if self.should_stop():
                break
            if bag_start_ns is None:
                bag_start_ns, wall_start = message.timestamp_ns, time.monotonic()
            wall_target = wall_start + (message.timestamp_ns - bag_start_ns) / 1e9 / self.rate
            self.wait_until(wall_target, wall_start, bag_start_ns, message.timestamp_ns)
            if self.should_stop():
                break
            self.publish_message(message)
            published += 1
            last_ns = message.timestamp_ns
            if on_progress is not None:
                on_progress(published_before + published, message.timestamp_ns)
        if published and not self.should_stop():
            self.publish_clock(last_ns)          # the last stamp, now that its messages are out
        return published

    def publish_message(self, message: BagMessage) -> None:
        # /clock shows t only once every message stamped t is out (the next wait moves it on): a node ticking
        # at t then sees all three camera frames of t, not one new and two old (a false camera_skew).
        self.publish_clock(message.timestamp_ns - 1)
        self.publishers[message.topic].publish(message.raw)

    def wait_for_acks(self) -> None:
        """Give reliable subscribers a moment to receive the tail before teardown."""
        timeout = Duration(seconds=ACK_TIMEOUT_SEC)
        for publisher in list(self.publishers.values()) + [self.clock_publisher]:
            if publisher is not None:
                publisher.wait_for_all_acked(timeout)


def play(bag_path: PathLike, rate: float = 1.0, topics: Optional[Iterable[str]] = None,
         clock: bool = True, clock_topic: str = CLOCK_TOPIC, loop: bool = False,
         context: Optional[Context] = None, node_name: str = 'vla_policy_play',
         on_progress: Optional[ProgressCallback] = None, wait_for_subscribers: float = 0.0,
         stop_event: Optional[threading.Event] = None) -> int:
    """Replay ``bag_path`` live; returns the number of messages published.

    ``context`` must be initialised (rclpy.init(context=...)); with None, the
    global context is used, and initialised/shut down here if it is not yet.
    ``loop`` repeats until ``stop_event`` is set or the context shuts down.
    ``on_progress(total_published, bag_time_ns)`` is called after each message.
    """
    if rate <= 0:
        raise ValueError(f'rate must be positive, got {rate}')
    topic_types = _select_topics(bag_path, topics, clock)
    owns_context = context is None and not rclpy.ok()
    if owns_context:
        rclpy.init()
    try:
        node = Node(node_name, context=context)
        try:
            return _run_player(node, bag_path, topic_types, rate, clock, clock_topic, loop,
                               on_progress, wait_for_subscribers, stop_event)
        finally:
            node.destroy_node()
    finally:
        if owns_context:
            rclpy.try_shutdown()


def _run_player(node: Node, bag_path: PathLike, topic_types: Dict[str, str], rate: float,
                clock: bool, clock_topic: str, loop: bool,
                on_progress: Optional[ProgressCallback], wait_for_subscribers: float,
                stop_event: Optional[threading.Event]) -> int:
    player = _Player(node, topic_types, rate, clock, clock_topic, stop_event)
    if wait_for_subscribers > 0:
        logger = node.get_logger()
        logger.info(f'waiting up to {wait_for_subscribers:g} s for a subscriber of the bag\'s topics '
                    '(--wait-for-subscribers 0 starts at once)')
        if player.wait_for_subscribers(wait_for_subscribers):
            unheard = [topic for topic, count in zip(player.publishers, player.subscriber_counts()) if not count]
            logger.info('subscribed: playing' + (f' (no subscriber on {", ".join(unheard)})' if unheard else ''))
        else:
            logger.warning(f'no subscriber after {wait_for_subscribers:g} s; playing anyway (is the node running, '
                           'configured, on this ROS_DOMAIN_ID?)')
    total = 0
    while True:
        published = player.play_once(bag_path, on_progress, total)
        total += published
        # An empty selection would otherwise spin forever under --loop.
        if not loop or published == 0 or player.should_stop():
            break
    if player.node.context.ok():
        player.wait_for_acks()
    return total


def _split_topics(text: str) -> List[str]:
    return [topic.strip() for topic in text.split(',') if topic.strip()]


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog='vla_policy_play',
        description='Replay a rosbag2 bag live (pure-Python "ros2 bag play --clock").')
    parser.add_argument('bag', help='rosbag2 bag folder (sqlite3 or mcap)')
    parser.add_argument('--rate', type=float, default=1.0, help='playback speed factor')
    parser.add_argument('--topics', type=_split_topics, default=None,
                        help='comma-separated topics to replay (default: all)')
    parser.add_argument('--no-clock', action='store_true', help='do not publish /clock')
    parser.add_argument('--clock-topic', default=CLOCK_TOPIC, help='where /clock goes (default %(default)s)')
    parser.add_argument('--loop', action='store_true', help='replay until interrupted')
    parser.add_argument('--wait-for-subscribers', type=float, default=DEFAULT_WAIT_FOR_SUBSCRIBERS_SEC, metavar='S',
                        help='wait up to S seconds for a subscriber before the first message (default '
                             f'{DEFAULT_WAIT_FOR_SUBSCRIBERS_SEC:g}; 0: start at once)')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point ``vla_policy_play`` (accepts ``--ros-args ...``).

    ``argv`` excludes the program name, as for argparse; None means sys.argv[1:].
    """
    full_argv = ['vla_policy_play'] + list(sys.argv[1:] if argv is None else argv)
    context = Context()
    status = init_rclpy('vla_policy_play', full_argv, context=context)     # before remove_ros_args, which
    if status is not None:                                                  # parses the params files too
        return status
    try:
        args = _parse_args(remove_ros_args(full_argv)[1:])
        count = play(args.bag, rate=args.rate, topics=args.topics, clock=not args.no_clock,
                     clock_topic=args.clock_topic, loop=args.loop, context=context,
                     wait_for_subscribers=args.wait_for_subscribers)
        print(f'published {count} messages from {args.bag}')
        return 0
    except BagError as err:
        print(f'vla_policy_play: error: {err}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        context.try_shutdown()


if __name__ == '__main__':
    sys.exit(main())
