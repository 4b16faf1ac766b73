"""Action chunk -> joint trajectory plan that a ros2_control JointTrajectoryController accepts.

Rules (joint_trajectory_controller's validate_trajectory_msg):
  - joint_names non-empty and unique; every point has one position (and velocity) per joint;
  - time_from_start strictly increasing: action i at (i + 1) * dt after the chunk's origin;
  - the last point's velocity is zero (Jazzy/Kilted reject anything else by default);
  - header.stamp zero means "start now"; a stamp in the past drops elapsed points.
A chunk published ``elapsed`` after its origin with stamp zero starts at its
first action not yet due, timed from the publication (handover.py).
Velocities are central finite differences over the point times (one-sided at
the start, from the current joint positions at t = 0 when known), so the
controller interpolates with cubics.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

STAMP_MODES = ('zero', 'observation')


class TrajectoryError(ValueError):
    """A plan that a controller would reject (or that should never reach one)."""


@dataclass(frozen=True)
class TrajectoryPlan:
    joint_names: Tuple[str, ...]
    times_sec: np.ndarray      # [N] strictly increasing, > 0
    positions: np.ndarray      # [N, J]
    velocities: np.ndarray     # [N, J], last row zero
    stamp_ns: int              # 0 = start now
    clipped: bool = False      # some action was outside the joint limits
    first_action: int = 0      # index in the chunk of the first point


def published_range(horizon: int, execute_steps: int) -> int:
    """One past the last action of a chunk that is published: execute_steps (0: the whole chunk)."""
    return horizon if execute_steps <= 0 else min(int(execute_steps), horizon)


def build_plan(actions: np.ndarray, joint_names: Sequence[str], dt: float, execute_steps: int, stamp_ns: int,
               lower: Optional[Sequence[float]] = None, upper: Optional[Sequence[float]] = None,
               current: Optional[np.ndarray] = None, first: int = 0, elapsed_sec: float = 0.0) -> TrajectoryPlan:
    """Actions [first, end) of a chunk [H, J] -> a plan, end = published_range(H, execute_steps); action i
    at (i + 1) * dt - elapsed_sec after the stamp; clipped to [lower, upper] when given."""
    actions = np.asarray(actions, dtype=np.float64)
    joints = len(joint_names)
    if actions.ndim != 2 or actions.shape[1] != joints:
        raise TrajectoryError(f'actions {list(actions.shape)} do not match {joints} joint names')
    if not (dt > 0 and math.isfinite(dt)):
        raise TrajectoryError(f'dt must be a positive number of seconds, got {dt}')
    end = published_range(actions.shape[0], execute_steps)
    times = (np.arange(first, end, dtype=np.float64) + 1.0) * dt - elapsed_sec
    if not times.size or times[0] <= 0:
        raise TrajectoryError(f'no action of [{first}, {end}) is still ahead after {elapsed_sec:.3f} s')
    positions = actions[first:end]
    if not np.all(np.isfinite(positions)):
        raise TrajectoryError('the policy produced non-finite actions')
    clipped = False
    if lower is not None and len(lower) or upper is not None and len(upper):
        low = np.asarray(lower if lower is not None and len(lower) else [-np.inf] * joints, dtype=np.float64)
        high = np.asarray(upper if upper is not None and len(upper) else [np.inf] * joints, dtype=np.float64)
        bounded = np.clip(positions, low, high)
        clipped = bool(np.any(bounded != positions))
        positions = bounded
    velocities = finite_difference_velocities(positions, times, current)
    return TrajectoryPlan(tuple(joint_names), times, positions, velocities, int(stamp_ns), clipped, int(first))


def finite_difference_velocities(positions: np.ndarray, times: np.ndarray,
                                 current: Optional[np.ndarray] = None) -> np.ndarray:
    """[N, J] positions at increasing ``times`` [N] (> 0) -> velocities; central differences, last row zero."""
    count = positions.shape[0]
    velocities = np.zeros_like(positions)
    if count < 2:
        return velocities
    times = np.asarray(times, dtype=np.float64)
    # Point 0 sits between the current position (t = 0) and point 1, when the current one is known.
    previous = np.asarray(current, dtype=np.float64) if current is not None else None
    if previous is not None and previous.shape == positions[0].shape:
        velocities[0] = (positions[1] - previous) / times[1]
    else:
        velocities[0] = (positions[1] - positions[0]) / (times[1] - times[0])
    velocities[1:-1] = (positions[2:] - positions[:-2]) / (times[2:] - times[:-2])[:, None]
    return velocities


def check_controller_rules(joint_names: Sequence[str], times_sec: Sequence[float], positions: Sequence[Sequence[float]],
                           velocities: Sequence[Sequence[float]]) -> None:
    """Raise TrajectoryError where joint_trajectory_controller would reject the trajectory."""
    if not joint_names:
        raise TrajectoryError('joint_names is empty')
    if len(set(joint_names)) != len(joint_names):
        raise TrajectoryError(f'joint_names has duplicates: {list(joint_names)}')
    if not len(times_sec):
        raise TrajectoryError('the trajectory has no points')
    previous = 0.0
    for i, (t, pos, vel) in enumerate(zip(times_sec, positions, velocities)):
        if not t > previous:
            raise TrajectoryError(f'time_from_start is not strictly increasing at point {i} ({t} after {previous})')
        previous = t
        if len(pos) != len(joint_names) or (len(vel) and len(vel) != len(joint_names)):
            raise TrajectoryError(f'point {i} has {len(pos)} positions / {len(vel)} velocities '
                                  f'for {len(joint_names)} joints')
        if not all(math.isfinite(v) for v in list(pos) + list(vel)):
            raise TrajectoryError(f'point {i} has a non-finite value')
    last_velocity = velocities[-1]
    if len(last_velocity) and any(v != 0.0 for v in last_velocity):
        raise TrajectoryError('the last point has a non-zero velocity')
