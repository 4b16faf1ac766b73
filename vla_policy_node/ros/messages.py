"""Conversions to and from rclpy: plans -> JointTrajectory, stamps, input message classes and QoS."""
from __future__ import annotations

from builtin_interfaces.msg import Duration, Time
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Bool, String
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from ..observation import InputKind, InputTopic
from ..trajectory import TrajectoryPlan

NS_PER_SEC = 1_000_000_000
MESSAGE_CLASSES = {'sensor_msgs/msg/Image': Image, 'sensor_msgs/msg/CompressedImage': CompressedImage,
                   'sensor_msgs/msg/JointState': JointState, 'std_msgs/msg/String': String, 'std_msgs/msg/Bool': Bool}


def input_msg_class(entry: InputTopic) -> type:
    """The rclpy message class of an input topic."""
    return MESSAGE_CLASSES[entry.msg_type]


def input_qos(entry: InputTopic, instruction_durability: str) -> QoSProfile:
    """Sensor data (best effort) for cameras and joint states; the operator's enable and e-stop reliable (an
    e-stop must not be dropped); the instruction reliable, with the durability asked."""
    if entry.kind in (InputKind.ENABLE, InputKind.ESTOP):
        return QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    if entry.kind is not InputKind.INSTRUCTION:
        return qos_profile_sensor_data
    durability = (DurabilityPolicy.TRANSIENT_LOCAL if instruction_durability == 'transient_local'
                  else DurabilityPolicy.VOLATILE)
    return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=durability)


def time_msg(stamp_ns: int) -> Time:
    return Time(sec=int(stamp_ns // NS_PER_SEC), nanosec=int(stamp_ns % NS_PER_SEC))


def duration_msg(seconds: float) -> Duration:
    total_ns = int(round(seconds * NS_PER_SEC))
    return Duration(sec=total_ns // NS_PER_SEC, nanosec=total_ns % NS_PER_SEC)


def trajectory_msg(plan: TrajectoryPlan, frame_id: str = '') -> JointTrajectory:
    msg = JointTrajectory()
    msg.header.stamp = time_msg(plan.stamp_ns)
    msg.header.frame_id = frame_id
    msg.joint_names = list(plan.joint_names)
    msg.points = [JointTrajectoryPoint(positions=[float(v) for v in positions],
                                       velocities=[float(v) for v in velocities],
                                       time_from_start=duration_msg(float(t)))
                  for t, positions, velocities in zip(plan.times_sec, plan.positions, plan.velocities)]
    return msg
