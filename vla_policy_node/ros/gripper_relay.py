"""Drive a control_msgs GripperCommand action gripper from a float64_multi_array output.

    vla_policy_gripper_relay --ros-args -p command_topic:=gripper_controller/commands \
        -p action:=/gripper_action_controller/gripper_cmd -p max_effort:=20.0

ros2_controllers' gripper_action_controller (and parallel_gripper_action_controller, Robotiq and
Franka hand drivers) take control_msgs/action/GripperCommand goals, not a topic. The node's
``<name>.type: float64_multi_array`` output publishes one position per tick; this relay sends
it as a goal when it moved by more than ``deadband`` (or the previous goal finished), so a goal
is not preempted at every tick for the same target. A hold of the node is a position like any
other: the relay sends it on.

control_msgs is not on PyPI: it comes with an apt ROS (``ros-$ROS_DISTRO-control-msgs``). Without
it the relay says so and exits with status 2; nothing else in the package needs it.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Optional, Sequence

NOT_AVAILABLE = ('vla_policy_gripper_relay needs control_msgs (control_msgs/action/GripperCommand), which is '
                 'not on PyPI: install it with ROS, e.g. `sudo apt install ros-$ROS_DISTRO-control-msgs`, and '
                 'source /opt/ros/$ROS_DISTRO/setup.bash')


def gripper_command_action() -> Optional[Any]:
    """control_msgs.action.GripperCommand when installed (an apt ROS), else None."""
    try:
        return importlib.import_module('control_msgs.action').GripperCommand
    except ImportError:
        return None


def should_send(target: float, last_sent: Optional[float], deadband: float, busy: bool) -> bool:
    """A new goal only for a target that moved beyond the deadband, or once the previous goal is done."""
    return last_sent is None or abs(target - last_sent) > deadband or (not busy and target != last_sent)


def main(argv: Optional[Sequence[str]] = None) -> int:
    action_type = gripper_command_action()
    if action_type is None:
        print(NOT_AVAILABLE, file=sys.stderr)
        return 2
    import rclpy
    from rclpy.action import ActionClient
    from rclpy.node import Node
    from std_msgs.msg import Float64MultiArray

    from .startup import init_rclpy

    status = init_rclpy('vla_policy_gripper_relay', argv if argv is not None else sys.argv)
    if status is not None:
        return status
    node = Node('vla_policy_gripper_relay')
    topic = node.declare_parameter('command_topic', 'gripper_controller/commands').value
    action = node.declare_parameter('action', 'gripper_action_controller/gripper_cmd').value
    max_effort = float(node.declare_parameter('max_effort', 0.0).value)
    deadband = float(node.declare_parameter('deadband', 0.001).value)
    client = ActionClient(node, action_type, action)
    state = {'last': None, 'busy': False}

    def done(future) -> None:
        state['busy'] = False

    def on_command(msg: Float64MultiArray) -> None:
        if len(msg.data) != 1:
            node.get_logger().error(f'{topic}: expected one position, got {len(msg.data)}', throttle_duration_sec=5)
            return
        target = float(msg.data[0])
        if not client.server_is_ready() or not should_send(target, state['last'], deadband, state['busy']):
            return
        goal = action_type.Goal()
        goal.command.position, goal.command.max_effort = target, max_effort
        state['last'], state['busy'] = target, True
        client.send_goal_async(goal).add_done_callback(
            lambda sent: sent.result().get_result_async().add_done_callback(done) if sent.result().accepted
            else done(None))

    node.create_subscription(Float64MultiArray, topic, on_command, 10)
    node.get_logger().info(f'relaying {node.resolve_topic_name(topic)} to the GripperCommand action {action}')
    try:
        rclpy.spin(node)
    except KeyboardInterrupt:
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
