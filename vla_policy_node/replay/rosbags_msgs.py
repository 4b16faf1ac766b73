"""TrajectoryPlan -> rosbags JointTrajectory (the replay's twin of ros/messages.py, without rclpy)."""
from __future__ import annotations

import numpy as np

from ..trajectory import TrajectoryPlan
from ..bags.bag_io import get_kilted_typestore

NS_PER_SEC = 1_000_000_000


def _split_ns(total_ns: int) -> dict:
    return {'sec': total_ns // NS_PER_SEC, 'nanosec': total_ns % NS_PER_SEC}


def joint_trajectory(plan: TrajectoryPlan):
    types = get_kilted_typestore().types
    header = types['std_msgs/msg/Header'](stamp=types['builtin_interfaces/msg/Time'](**_split_ns(plan.stamp_ns)),
                                          frame_id='')
    point_type = types['trajectory_msgs/msg/JointTrajectoryPoint']
    duration_type = types['builtin_interfaces/msg/Duration']
    empty = np.zeros(0, dtype=np.float64)
    points = [point_type(positions=np.ascontiguousarray(positions, dtype=np.float64),
                         velocities=np.ascontiguousarray(velocities, dtype=np.float64),
                         accelerations=empty, effort=empty,
                         time_from_start=duration_type(**_split_ns(int(round(float(t) * NS_PER_SEC)))))
              for t, positions, velocities in zip(plan.times_sec, plan.positions, plan.velocities)]
    trajectory_type = types['trajectory_msgs/msg/JointTrajectory']
    return trajectory_type(header=header, joint_names=list(plan.joint_names), points=points)


def float64_multi_array(values) -> object:
    """std_msgs/Float64MultiArray with an empty layout (what a forward_command_controller reads)."""
    types = get_kilted_typestore().types
    layout = types['std_msgs/msg/MultiArrayLayout'](dim=[], data_offset=0)
    return types['std_msgs/msg/Float64MultiArray'](layout=layout, data=np.ascontiguousarray(values, dtype=np.float64))


def output_message(output, command):
    """The message of one output's command (outputs.split): a JointTrajectory or a Float64MultiArray."""
    return joint_trajectory(command) if output.kind == 'joint_trajectory' else float64_multi_array(command)
