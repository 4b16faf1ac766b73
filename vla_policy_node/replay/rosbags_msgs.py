"""TrajectoryPlan -> rosbags JointTrajectory (the replay's twin of ros/messages.py, without rclpy)."""
from __future__ import annotations

import numpy as np

from ..trajectory import TrajectoryPlan
from .bag_io import get_kilted_typestore

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
    points = [point_type(positions=np.asarray(positions, dtype=np.float64),
                         velocities=np.asarray(velocities, dtype=np.float64), accelerations=empty, effort=empty,
                         time_from_start=duration_type(**_split_ns(int(round(float(t) * NS_PER_SEC)))))
              for t, positions, velocities in zip(plan.times_sec, plan.positions, plan.velocities)]
    trajectory_type = types['trajectory_msgs/msg/JointTrajectory']
    return trajectory_type(header=header, joint_names=list(plan.joint_names), points=points)
