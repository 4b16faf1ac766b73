"""ROS time jumping back (use_sim_time: a bag played again or looped, a simulator reset) as a callback."""
from __future__ import annotations

from typing import Callable

from rclpy.clock import JumpHandle, JumpThreshold
from rclpy.duration import Duration
from rclpy.node import Node

# A smaller step back is clock jitter between two sources, not a new timeline.
MIN_BACKWARD_SEC = 0.1


def watch_backward_jumps(node: Node, on_jump: Callable[[float], None]) -> JumpHandle:
    """``on_jump(seconds_back)`` after the node's clock jumped back; keep the handle (Humble .. Kilted API).

    rclpy calls it on the thread that set the time (the /clock subscription), before the next timer.
    """
    threshold = JumpThreshold(min_forward=None, min_backward=Duration(nanoseconds=-int(MIN_BACKWARD_SEC * 1e9)),
                              on_clock_change=False)
    return node.get_clock().create_jump_callback(
        threshold, post_callback=lambda jump: on_jump(-jump.delta.nanoseconds / 1e9))
