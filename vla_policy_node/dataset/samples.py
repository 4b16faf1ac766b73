"""A bag -> one dataset sample per control tick, assembled exactly as the node's tick assembles its observation.

    bag messages --on_bag_time--> InputBuffer.put ... Due(t) --assemble (timing, topics)--> content checks
        --> Sample(images, state, task, action)  or  Gap(reason, topic, what)

Every rule is the node's own, from the same code: the input layout and topics (settings.input_layout from the
params), the InputBuffer with its age, skew and joint-name rules (observation.py), the frame, state and
instruction checks (observation_checks.py, in the runtime's order), the decoding (images.py through
remote/frames.rgb_frame, grey frames as RGB as the runtime expands them), the tick grid (bags/bag_time.py,
shared with vla_policy_replay). A tick the node would skip is a ``Gap`` with the node's skip reason, never a
sample.

The action is the command recorded at the tick: the newest message on the command topic received at or before
the tick (a message stamped at the tick counts: it is the command of that instant, although the observation at
that tick has not seen it yet):
- sensor_msgs/JointState: its positions in ``joint_names`` order;
- trajectory_msgs/JointTrajectory: the point due at the tick, i.e. the first point whose due time (header
  stamp, or the receive time for a zero stamp as joint_trajectory_controller reads it, plus time_from_start)
  is at or after the tick: the set point the controller is moving to then; once every point is due, the last
  one (the controller holds it).
No command yet, or one that lacks a joint, is a gap too (``ActionProblem``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..observation import (NS_PER_SEC, MAX_INSTRUCTION_CHARS, InputBuffer, InputLayout, ObservationError,
                           SkipReason, SkipTick, TextEnum, TimingLimits, header_stamp_ns, joint_positions)
from ..remote.frames import rgb_frame
from ..bags.bag_io import BagMessage, read_messages
from ..bags.bag_time import Due, on_bag_time
from ..observation_checks import camera_slots, checked_instruction, checked_state
from . import DatasetError

JOINT_STATE_TYPE = 'sensor_msgs/msg/JointState'
JOINT_TRAJECTORY_TYPE = 'trajectory_msgs/msg/JointTrajectory'
COMMAND_TYPES = (JOINT_STATE_TYPE, JOINT_TRAJECTORY_TYPE)
# joint_positions' reasons for a message that does not name every joint (the rest: malformed).
_MISSING_JOINTS = (SkipReason.JOINT_STATE_MISSING_JOINTS,)


class ActionProblem(TextEnum):
    """Why a tick has no action (beside the node's own SkipReason values); the value counts the gap."""

    ACTION_MISSING = 'action_missing'                  # no command received yet on the command topic
    ACTION_MISSING_JOINTS = 'action_missing_joints'    # the command lacks a joint of joint_names
    ACTION_MALFORMED = 'action_malformed'              # names and positions disagree, a point without positions
    ACTION_NONFINITE = 'action_nonfinite'


@dataclass(frozen=True)
class TickInputs:
    """What one tick's sample is made of: the parameters' layout and limits, and the checkpoint's state size."""

    layout: InputLayout
    limits: TimingLimits
    joint_names: Tuple[str, ...]
    state_dim: int
    max_instruction_length: int
    max_image_pixels: int


@dataclass
class Sample:
    """One tick the node would run: its observation as the policy gets it, and the recorded command."""

    time_ns: int
    images: Dict[str, np.ndarray]        # camera -> RGB uint8 [H, W, 3] as decoded by the node
    camera_ages_sec: Tuple[float, ...]   # per camera (layout order): tick time - the frame's stamp
    state: np.ndarray                    # float64 [state_dim], state_joint_names order
    task: str                            # the instruction in force
    action: Optional[np.ndarray] = None  # float64 [len(joint_names)]


@dataclass(frozen=True)
class Gap:
    """A tick the node would skip (or one without an action): why, on which topic, what was wrong."""

    time_ns: int
    reason: str
    message: str
    topic: str = ''


class CommandTrack:
    """The newest recorded command, read as the action at a tick (see the module docstring)."""

    def __init__(self, topic: str, msgtype: str, joint_names: Sequence[str]) -> None:
        if msgtype not in COMMAND_TYPES:
            raise DatasetError(f'the action topic {topic} has type {msgtype}; it must be one of {list(COMMAND_TYPES)}')
        self.topic = topic
        self.msgtype = msgtype
        self.joint_names = tuple(joint_names)
        self._latest: Any = None
        self._receive_ns = 0

    @property
    def taken(self) -> str:
        """What the action is, in words (info.json names it)."""
        if self.msgtype == JOINT_STATE_TYPE:
            return (f'{self.topic} ({self.msgtype}): position in joint_names order of the newest message received '
                    'at or before the tick')
        return (f'{self.topic} ({self.msgtype}): the point due at the tick (the first one due at or after it, '
                'the last once all are due) of the newest trajectory received at or before it, in joint_names order')

    def put(self, msg: Any, receive_ns: int) -> None:
        self._latest, self._receive_ns = msg, receive_ns

    def at(self, time_ns: int) -> Union[np.ndarray, Gap]:
        if self._latest is None:
            return Gap(time_ns, ActionProblem.ACTION_MISSING.value, f'no command received yet on {self.topic}',
                       self.topic)
        try:
            positions = (self._joint_state() if self.msgtype == JOINT_STATE_TYPE else self._trajectory_point(time_ns))
        except SkipTick as skip:
            reason = (ActionProblem.ACTION_MISSING_JOINTS if skip.reason in _MISSING_JOINTS
                      else ActionProblem.ACTION_MALFORMED)
            return Gap(time_ns, reason.value, str(skip), self.topic)
        if not np.all(np.isfinite(positions)):
            return Gap(time_ns, ActionProblem.ACTION_NONFINITE.value, f'the command on {self.topic} has non-finite '
                       'positions', self.topic)
        return positions

    def _joint_state(self) -> np.ndarray:
        return joint_positions(self._latest, self.joint_names, self.topic)

    def _trajectory_point(self, time_ns: int) -> np.ndarray:
        msg = self._latest
        names = list(getattr(msg, 'joint_names', []))
        points = list(getattr(msg, 'points', []))
        missing = [name for name in self.joint_names if name not in names]
        if missing:
            raise SkipTick(SkipReason.JOINT_STATE_MISSING_JOINTS, f'trajectory on {self.topic} lacks joint(s) '
                           f'{missing}', self.topic)
        if not points:
            raise SkipTick(SkipReason.JOINT_STATE_MALFORMED, f'trajectory on {self.topic} has no points', self.topic)
        start = header_stamp_ns(msg) or self._receive_ns
        due = [start + int(p.time_from_start.sec) * NS_PER_SEC + int(p.time_from_start.nanosec) for p in points]
        chosen = next((i for i, when in enumerate(due) if when >= time_ns), len(points) - 1)
        positions = np.asarray(points[chosen].positions, dtype=np.float64)
        if positions.shape != (len(names),):
            raise SkipTick(SkipReason.JOINT_STATE_MALFORMED, f'trajectory on {self.topic}: point {chosen} has '
                           f'{positions.size} positions for {len(names)} joint names', self.topic)
        index = {name: i for i, name in enumerate(names)}
        return positions[[index[name] for name in self.joint_names]]


def observe(buffer: InputBuffer, inputs: TickInputs, now_ns: int) -> Union[Sample, Gap]:
    """The tick's observation as the node's tick builds it (InputBuffer timing checks, then the runtime's content
    checks, frames decoded as the runtime decodes them), or the Gap with the node's skip reason."""
    try:
        assembled = buffer.assemble(inputs.layout, inputs.limits, now_ns)
    except SkipTick as skip:
        return Gap(now_ns, skip.reason.value, str(skip), skip.topic)
    observation = assembled.observation
    try:
        # In the runtime's order: every frame checked without decoding, the state, the instruction, then decoding.
        slots = camera_slots(observation.images, inputs.layout.camera_names, inputs.max_image_pixels)
        state = checked_state(observation.state, inputs.state_dim)
        task = checked_instruction(observation.instruction, min(inputs.max_instruction_length, MAX_INSTRUCTION_CHARS))
        images = {name: np.ascontiguousarray(rgb_frame(name, frame, inputs.max_image_pixels)) for name, frame in slots}
    except ObservationError as exc:
        return Gap(now_ns, exc.reason.value, str(exc), inputs.layout.topic_of(exc.field))
    ages = tuple(float(assembled.camera_ages_sec[name]) for name in inputs.layout.camera_names)
    return Sample(now_ns, images, ages, state, task)


def bag_ticks(bag: Path, topics: Iterable[str], inputs: TickInputs, command: CommandTrack, period_ns: int,
              progress: Optional[Any] = None) -> Iterator[Union[Sample, Gap]]:
    """Every control tick over ``bag`` in time order, as a Sample (with its action) or a Gap.

    ``topics``: what the bag is read for (bags/bag_time.replayed_topics: they set the tick grid). ``progress``
    (a tqdm bar) advances per message. A message that cannot be read raises DatasetError naming its topic and
    bag time.
    """
    buffer = InputBuffer()
    entries = inputs.layout.by_topic()
    pending: List[Union[Sample, Gap]] = []        # ticks whose command instant has not been passed yet
    for item in on_bag_time(_checked_messages(bag, topics, progress), period_ns):
        if isinstance(item, Due):
            pending.append(observe(buffer, inputs, item.time_ns))
            continue
        # Every message up to a tick's time has been delivered: its command is known.
        while pending and pending[0].time_ns < item.timestamp_ns:
            yield _with_action(pending.pop(0), command)
        msg = _message(bag, item)
        entry = entries.get(item.topic)
        if entry is not None:
            buffer.put(entry, msg, item.timestamp_ns)
        if item.topic == command.topic:
            command.put(msg, item.timestamp_ns)
    for tick in pending:
        yield _with_action(tick, command)


def _with_action(tick: Union[Sample, Gap], command: CommandTrack) -> Union[Sample, Gap]:
    if isinstance(tick, Gap):
        return tick
    action = command.at(tick.time_ns)
    if isinstance(action, Gap):
        return action
    tick.action = action
    return tick


def bag_time_text(time_ns: int) -> str:
    """'bag time 1700000001.200000000 s' (rosbag2 receive time, as ros2 bag info shows it)."""
    return f'bag time {time_ns // NS_PER_SEC}.{time_ns % NS_PER_SEC:09d} s'


def _message(bag: Path, message: BagMessage) -> Any:
    try:
        return message.msg
    except Exception as err:  # a truncated or foreign CDR payload: rosbags raises several kinds
        raise DatasetError(f'{bag}: the message on {message.topic} at {bag_time_text(message.timestamp_ns)} '
                           f'cannot be read ({type(err).__name__}: {err}); the bag is damaged there') from err


def _checked_messages(bag: Path, topics: Iterable[str], progress: Optional[Any]) -> Iterator[BagMessage]:
    """The bag's messages; a storage error mid-bag (a truncated file) names the last message read."""
    last: Optional[BagMessage] = None
    iterator = read_messages(bag, sorted(topics))
    while True:
        try:
            message = next(iterator)
        except StopIteration:
            return
        except Exception as err:
            where = (f'after the message on {last.topic} at {bag_time_text(last.timestamp_ns)}' if last is not None
                     else 'before its first message')
            raise DatasetError(f'{bag}: reading stopped {where} ({type(err).__name__}: {err}); the bag is '
                               'truncated or damaged') from err
        if progress is not None:
            progress.update(1)
        last = message
        yield message
