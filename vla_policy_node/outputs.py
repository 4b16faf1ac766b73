"""Several controllers from one action vector: the plan the supervisor let out, split per output (no rclpy).

A real ros2_control set-up splits the joints of one policy between controllers (a UR arm's
joint_trajectory_controller and a gripper's forward_command_controller; two arms and two
grippers of an ALOHA). A joint_trajectory_controller refuses a message naming a joint it does
not own, so each output gets its own message with only its joints:

    review.plan (every joint; the supervisor's one decision) --split--> one command per output

Everything upstream stays per joint and joint-wide (one plan, one hold decision, the limits per
joint), so the outputs of a tick always come from the same plan and a hold holds all of them.

Output types:
  joint_trajectory      trajectory_msgs/JointTrajectory: the plan's points for the output's
                        joints (same stamp, same times, same velocities).
  float64_multi_array   std_msgs/Float64MultiArray: one position per joint, the plan's first
                        point not yet due at publication (stamp zero: its first point, the action
                        due next; a hold: the measured position). A forward_command_controller
                        has no notion of time, so it gets the next target at every tick and
                        follows at the control rate.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .trajectory import TrajectoryPlan

OUTPUT_TYPES = ('joint_trajectory', 'float64_multi_array')
MESSAGE_TYPES = {'joint_trajectory': 'trajectory_msgs/msg/JointTrajectory',
                 'float64_multi_array': 'std_msgs/msg/Float64MultiArray'}
NS_PER_SEC = 1_000_000_000
# A name that can be a ROS parameter name token (rcl's rule: letters, digits, underscores; no leading digit).
_NAME = re.compile(r'^[A-Za-z][A-Za-z0-9_]*$')


@dataclass(frozen=True)
class Output:
    """One controller's share of the action vector."""

    name: str                      # '' for the single output of every joint (no `outputs` parameter)
    topic: str                     # resolved
    kind: str                      # one of OUTPUT_TYPES
    joints: Tuple[str, ...]
    columns: Tuple[int, ...]       # the joints' indices in joint_names

    @property
    def msg_type(self) -> str:
        return MESSAGE_TYPES[self.kind]


Command = Union[TrajectoryPlan, np.ndarray]


def output_name_problem(name: Any, reserved: Mapping[str, Any]) -> Optional[str]:
    """Why ``name`` cannot name an output (its sub-parameters are ``<name>.joints`` ...), or None."""
    if not isinstance(name, str) or not _NAME.match(name):
        return (f'outputs entry {name!r} is not a usable name: letters, digits and underscores, starting with a '
                'letter (it prefixes the parameters <name>.joints, <name>.type, <name>.topic)')
    if name in reserved or name == 'qos_overrides':
        return f'outputs entry {name!r} is already a parameter name; pick another'
    return None


def build_outputs(values: Mapping[str, Any], resolve, topic_of) -> Tuple[Output, ...]:
    """The outputs ``values`` describe (already validated); without ``outputs``, the one trajectory of today.

    ``resolve`` gives a topic's name on the wire; ``topic_of(values, name)`` an output's topic before that.
    """
    joints = list(values['joint_names'])
    names = values.get('outputs') or []
    if not names:
        return (Output('', resolve(values['trajectory_topic']), 'joint_trajectory', tuple(joints),
                       tuple(range(len(joints)))),)
    return tuple(Output(name, resolve(topic_of(values, name)), values[f'{name}.type'],
                        tuple(values[f'{name}.joints']),
                        tuple(joints.index(joint) for joint in values[f'{name}.joints']))
                 for name in names)


def due_index(plan: TrajectoryPlan, publish_ns: int) -> int:
    """The first point not yet due when the plan is published (the last one if all are)."""
    due_ns = (plan.stamp_ns or publish_ns) + np.round(np.asarray(plan.times_sec) * NS_PER_SEC).astype(np.int64)
    ahead = np.nonzero(due_ns >= publish_ns)[0]
    return int(ahead[0]) if ahead.size else len(due_ns) - 1


def split(plan: TrajectoryPlan, outputs: Sequence[Output], publish_ns: int) -> List[Tuple[Output, Command]]:
    """One command per output from the one plan: a sub-trajectory, or the positions due now."""
    commands: List[Tuple[Output, Command]] = []
    for output in outputs:
        columns = list(output.columns)
        if output.kind == 'float64_multi_array':
            commands.append((output, np.asarray(plan.positions[due_index(plan, publish_ns), columns],
                                                dtype=np.float64)))
        elif columns == list(range(len(plan.joint_names))):
            commands.append((output, plan))
        else:
            commands.append((output, TrajectoryPlan(output.joints, plan.times_sec, plan.positions[:, columns],
                                                    plan.velocities[:, columns], plan.stamp_ns, plan.clipped,
                                                    plan.first_action)))
    return commands
