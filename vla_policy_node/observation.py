"""The observation contract: what one control tick feeds the policy, and why a tick is skipped.

    topic messages --InputBuffer.put--> latest per input --assemble--> Observation --runtime.infer-->

Two owners, one rule each:
- ``InputBuffer`` (here) owns timing and topics: an input missing, stale,
  from the future, cameras skewed, joint names that do not map; which clock
  the camera and joint-state stamps are in, and their jumps (``stamp_clock.py``).
- ``observation_checks.py`` owns content: frame geometry and encoding, a finite
  state of the right size, a non-empty instruction within its length; every
  backend runs it (the runtime before its cache lookup). It raises
  ``ObservationError`` carrying the ``SkipReason``; the tick turns either into
  a ``SkipTick`` naming the topic through ``InputLayout.topic_of``.

No rclpy: messages are duck-typed, so rclpy messages and rosbags messages
both work, and the node and the offline replay share every check.
"""
from __future__ import annotations

import collections
import enum
import threading
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .images import same_frame
from .stamp_clock import CONFIRM_SEC, ClockEvent, StampClock

NS_PER_SEC = 1_000_000_000
# camera_clock / joint_state_clock: which clock a camera frame's (a joint state's) time is read in (see
# clock_choice).
CAMERA_CLOCKS = ('auto', 'header', 'receive')
# A frame may arrive this much before its own stamp and its camera still count as on the node's clock
# (clocks synchronised over a network are this close).
CLOCK_SLACK_SEC = 0.005
# The StampClock of the joint states is reported under this name (cameras: their camera name).
JOINT_STATES = 'joint_states'
# Clock events waiting for the next tick to report them (a buffer that ticks never read stays bounded).
MAX_PENDING_EVENTS = 100
# Instructions are free text from a topic; beyond this bound no parameter can admit them.
MAX_INSTRUCTION_CHARS = 2000


class TextEnum(str, enum.Enum):
    """An enum whose members print as their value (a log word, a diagnostics key suffix), on Python 3.10+."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


class SkipReason(TextEnum):
    """Why a tick published no policy trajectory; the value is the diagnostics counter suffix."""

    WAITING_FOR_CLOCK = 'waiting_for_clock'
    CAMERA_MISSING = 'camera_missing'
    CAMERA_STALE = 'camera_stale'
    CAMERA_FUTURE = 'camera_future'
    # The camera's stamps moved against their receive times (stamp_clock.py) and the move has not held yet:
    # its frames are not timed from the estimate the move made stale.
    CAMERA_CLOCK_JUMP = 'camera_clock_jump'
    CAMERA_SKEW = 'camera_skew'
    BAD_IMAGE = 'bad_image'
    JOINT_STATE_MISSING = 'joint_state_missing'
    JOINT_STATE_STALE = 'joint_state_stale'
    JOINT_STATE_FUTURE = 'joint_state_future'
    JOINT_STATE_CLOCK_JUMP = 'joint_state_clock_jump'
    JOINT_STATE_MALFORMED = 'joint_state_malformed'
    JOINT_STATE_MISSING_JOINTS = 'joint_state_missing_joints'
    JOINT_STATE_NONFINITE = 'joint_state_nonfinite'
    INSTRUCTION_MISSING = 'instruction_missing'
    INSTRUCTION_EMPTY = 'instruction_empty'
    INSTRUCTION_TOO_LONG = 'instruction_too_long'
    BAD_INPUT = 'bad_input'
    INVALID_ACTIONS = 'invalid_actions'
    CHUNK_ELAPSED = 'chunk_elapsed'
    # The observation of the chunk being executed again (same frames, joints, instruction, settings): the
    # chunk goes on; nothing new is published. No fault.
    REPEATED_OBSERVATION = 'repeated_observation'
    # The remote backend (vla_policy_node/remote): one reason per kind of fault, never a trajectory.
    REMOTE_TIMEOUT = 'remote_timeout'               # no reply within remote_timeout_sec
    REMOTE_UNREACHABLE = 'remote_unreachable'       # connection refused / not connected (reconnecting)
    REMOTE_DISCONNECTED = 'remote_disconnected'     # the connection dropped mid-request
    REMOTE_ERROR = 'remote_error'                   # the server answered with an error frame (or is busy)
    REMOTE_AUTH = 'remote_auth'                     # the server refused the API key (HTTP 401/403)
    REMOTE_BAD_REPLY = 'remote_bad_reply'           # undecodable, oversized, wrong shape/dtype, non-finite
    INTERNAL_ERROR = 'internal_error'

    @property
    def fault(self) -> bool:
        """Something is wrong (on_fault applies, /diagnostics warns). Waiting for the first /clock and a
        repeated observation are not faults."""
        return self not in (SkipReason.WAITING_FOR_CLOCK, SkipReason.REPEATED_OBSERVATION)


class SkipTick(Exception):
    """A control tick that must not produce a trajectory: the reason, the topic at fault (if one), what is wrong."""

    def __init__(self, reason: SkipReason, message: str, topic: str = '') -> None:
        super().__init__(message)
        self.reason = SkipReason(reason)
        self.topic = topic

    def describe(self) -> str:
        """'[reason] on topic: what is wrong', for log lines."""
        where = f' on {self.topic}' if self.topic else ''
        return f'[{self.reason}]{where}: {self}'


class ObservationError(ValueError):
    """An observation the runtime refuses; ``field`` names the input ('images.<camera>', 'state', ...)."""

    def __init__(self, field_name: str, message: str, reason: SkipReason = SkipReason.BAD_INPUT) -> None:
        super().__init__(f'{field_name}: {message}')
        self.field = field_name
        self.reason = SkipReason(reason)


@dataclass
class Observation:
    """One control tick's inputs.

    images: camera name -> a camera message (sensor_msgs/Image or CompressedImage,
      rclpy or rosbags), a RawImage / CompressedFrame, an RGB uint8 array
      [H, W, 3], or None for a camera that is absent (masked). Cameras the model
      knows but the dict lacks are masked too.
    state: the robot state vector [state_dim], unnormalised (joint positions ...).
    instruction: the task text.
    """

    images: Mapping[str, Any]
    state: np.ndarray
    instruction: Optional[str] = None


# ---- which topic feeds which input ---------------------------------------------------------------

class InputKind(enum.Enum):
    CAMERA = 'camera'
    JOINT_STATE = 'joint_state'
    INSTRUCTION = 'instruction'
    ENABLE = 'enable'             # the operator's deadman (std_msgs/Bool)
    ESTOP = 'estop'               # the operator's e-stop (std_msgs/Bool, true latches)


@dataclass(frozen=True)
class InputTopic:
    """One subscribed topic and the observation field it fills."""

    topic: str
    kind: InputKind
    camera: str = ''              # camera name, for CAMERA inputs
    compressed: bool = False      # sensor_msgs/CompressedImage instead of Image

    @property
    def field(self) -> str:
        """The Observation field this topic fills, as ObservationError names it (operator inputs: their kind)."""
        if self.kind is InputKind.CAMERA:
            return f'images.{self.camera}'
        return 'state' if self.kind is InputKind.JOINT_STATE else self.kind.value

    @property
    def msg_type(self) -> str:
        if self.kind is InputKind.CAMERA:
            return 'sensor_msgs/msg/CompressedImage' if self.compressed else 'sensor_msgs/msg/Image'
        return {InputKind.JOINT_STATE: 'sensor_msgs/msg/JointState', InputKind.INSTRUCTION: 'std_msgs/msg/String'
                }.get(self.kind, 'std_msgs/msg/Bool')


@dataclass(frozen=True)
class InputLayout:
    """Every input topic, fixed at configure: cameras in camera order, joint states, instruction."""

    cameras: Tuple[InputTopic, ...]
    joint_states: InputTopic
    instruction: InputTopic
    state_joint_names: Tuple[str, ...]
    operator: Tuple[InputTopic, ...] = ()      # enable and e-stop, read by the safety supervisor

    @property
    def inputs(self) -> Tuple[InputTopic, ...]:
        return self.cameras + (self.joint_states, self.instruction) + self.operator

    @property
    def camera_names(self) -> Tuple[str, ...]:
        return tuple(camera.camera for camera in self.cameras)

    def by_topic(self) -> Dict[str, InputTopic]:
        return {entry.topic: entry for entry in self.inputs}

    def topic_of(self, field_name: str) -> str:
        """The topic behind an observation field ('' for fields no topic fills, such as noise)."""
        return next((entry.topic for entry in self.inputs if entry.field == field_name), '')


@dataclass(frozen=True)
class TimingLimits:
    """The live timing checks an observation must pass; from parameters."""

    max_image_age_sec: float = 0.5
    max_camera_skew_sec: float = 0.1
    max_joint_state_age_sec: float = 0.5
    default_instruction: str = ''     # used until an instruction arrives
    camera_clock: str = 'auto'        # CAMERA_CLOCKS: the clock camera frames are timed in
    joint_state_clock: str = 'auto'   # CAMERA_CLOCKS: the clock joint states are timed in
    sim_time: bool = False            # use_sim_time: the node's clock is /clock (a replay: bag time)


# ---- the latest message per input ------------------------------------------------------------------

@dataclass
class _Stamped:
    value: Any
    stamp_ns: int      # header stamp, or receive time when the header is unset
    receive_ns: int
    header_ns: int = 0     # header stamp as sent (0: unset)
    # Its input's StampClock when it arrived: the floor (the delay the node knows) and the departure from it
    # when this message belongs to a move of the stamps that has not held yet (0: settled).
    floor_ns: Optional[int] = None
    departure_ns: int = 0

    def time_ns(self, clock: 'CameraClock') -> int:
        """Its time in the node's clock: the header stamp (clock header), or its receive time less what it was
        late beyond the input's floor (clock receive): header stamp + floor, never after the receive time. A
        message without a header stamp: its receive time."""
        if clock.name == 'header' or not self.header_ns or self.floor_ns is None:
            return self.stamp_ns
        return min(self.receive_ns, self.header_ns + self.floor_ns)


def header_stamp_ns(msg: object) -> int:
    """header.stamp in ns (0 when the message has no header or an unset stamp)."""
    stamp = getattr(getattr(msg, 'header', None), 'stamp', None)
    if stamp is None:
        return 0
    return int(stamp.sec) * NS_PER_SEC + int(getattr(stamp, 'nanosec', 0))


@dataclass(frozen=True)
class OperatorInputs:
    """The latest deadman and e-stop inputs: value and age in seconds since received (None: never received)."""

    enable: Optional[bool] = None
    enable_age_sec: float = float('inf')
    estop: Optional[bool] = None


@dataclass(frozen=True)
class Measured:
    """Where the arm is now: positions of the commanded joints, or why that is unknown (``waiting``: no joint
    state has arrived yet, as at start-up, which is no fault of the arm)."""

    positions: Optional[np.ndarray]
    problem: str = ''
    waiting: bool = False


@dataclass(frozen=True)
class CameraClock:
    """The clock an observation's frames (or its joint state) were timed in ('header' or 'receive') and why
    (diagnostics, replay summary)."""

    name: str
    reason: str


@dataclass
class AssembledObservation:
    observation: Observation
    stamp_ns: int                       # the newest camera frame's time, in the node's clock: when the scene was seen
    camera_ages_sec: Dict[str, float] = field(default_factory=dict)
    clock: CameraClock = CameraClock('header', '')
    joint_clock: CameraClock = CameraClock('header', '')      # the joint state's clock and why
    # Per camera (layout order): the frame's own stamp (header, else receive time), which identifies it.
    frame_stamps: Tuple[int, ...] = ()

    @property
    def current_positions(self) -> np.ndarray:
        """Joint positions at the tick (the state vector, in state_joint_names order)."""
        return self.observation.state

    def repeats(self, other: 'AssembledObservation', state_tolerance: float) -> bool:
        """The same observation as ``other``: every camera's same frame (its stamp and its pixels), the joint
        state within ``state_tolerance`` per joint, the same instruction."""
        if self.frame_stamps != other.frame_stamps or self.observation.instruction != other.observation.instruction:
            return False
        state, before = np.asarray(self.observation.state), np.asarray(other.observation.state)
        if state.shape != before.shape or not np.all(np.abs(state - before) <= state_tolerance):
            return False
        images, old = self.observation.images, other.observation.images
        return images.keys() == old.keys() and all(same_frame(images[name], old[name]) for name in images)


def clock_choice(parameter: str, limits: TimingLimits, max_age_sec: float, floors: Mapping[str, Optional[int]],
                 what: str) -> CameraClock:
    """The ``parameter`` (camera_clock, joint_state_clock) as set, or auto's choice from the floor of each input's
    delays (receive - header stamp, ns; None: no header stamp), keyed by topic: header when the stamps are on
    the node's clock (use_sim_time: both on /clock; else none arrives more than CLOCK_SLACK_SEC before its
    stamp and the floor is within half of ``max_age_sec``), else receive.

    Half: a clock that drifts behind the node's, slowly, is taken for the node's until its floor passes the
    bound; with the whole age limit as the bound its frames, which wait for a tick on top of the floor, would
    look stale before that (blind for as long as the drift takes to cover the difference)."""
    setting = getattr(limits, parameter)
    age_parameter = 'max_image_age_sec' if parameter == 'camera_clock' else 'max_joint_state_age_sec'
    if setting != 'auto':
        return CameraClock(setting, f'{parameter} {setting}')
    if limits.sim_time:
        return CameraClock('header', f'auto: use_sim_time, the {what}\' stamps and the node both on /clock')
    for topic, delay in floors.items():
        if delay is None:
            return CameraClock('receive', f'auto: the {what} on {topic} carry no header stamp')
        if delay < -CLOCK_SLACK_SEC * NS_PER_SEC:
            return CameraClock('receive', f'auto: {what} on {topic} arrive {-delay / NS_PER_SEC:.3f} s before their '
                                          'stamp: stamped in another clock')
        if delay > max_age_sec / 2 * NS_PER_SEC:
            return CameraClock('receive', f'auto: {what} on {topic} arrive {delay / NS_PER_SEC:.3f} s after their '
                                          f'stamp at the soonest (over half of {age_parameter}): stamped in another '
                                          'clock')
    return CameraClock('header', f'auto: the {what}\' stamps are on the node\'s clock (they arrive after their '
                                 f'stamp, within half of {age_parameter})')


def camera_clock_choice(limits: TimingLimits, floors: Mapping[str, Optional[int]]) -> CameraClock:
    """The cameras' clock (camera_clock), from each camera's floor keyed by topic."""
    return clock_choice('camera_clock', limits, limits.max_image_age_sec, floors, 'frames')


def joint_state_clock_choice(limits: TimingLimits, floor: Optional[int], topic: str) -> CameraClock:
    """The joint states' clock (joint_state_clock): the same rule as the cameras', on their own floor."""
    return clock_choice('joint_state_clock', limits, limits.max_joint_state_age_sec, {topic: floor}, 'joint states')


class InputBuffer:
    """Latest message per input, written by subscription callbacks (or the replay), read at each tick."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cameras: Dict[str, _Stamped] = {}
        self._joint_state: Optional[_Stamped] = None
        self._instruction: Optional[_Stamped] = None
        self._operator: Dict[InputKind, _Stamped] = {}
        # Per timed input (camera name, JOINT_STATES): its stamps against the receive times (stamp_clock.py).
        self._clocks: Dict[str, StampClock] = {}
        self._events: Deque[ClockEvent] = collections.deque(maxlen=MAX_PENDING_EVENTS)
        self._clock = CameraClock('header', '')        # the latest tick's choice (camera_ages)
        # After ROS time jumped back (drop_timed): messages stamped this far ahead of their receipt are of the old
        # timeline, still in flight; per timed input, until its first message of the new one.
        self._old_timeline_ahead_ns = 0
        self._new_timeline: set = set()

    # ---- writer (callbacks): store only; every check waits for the tick ----------------------------
    def put(self, entry: InputTopic, msg: Any, receive_ns: int) -> None:
        """Store ``msg`` received on ``entry.topic`` at ``receive_ns``."""
        if entry.kind in (InputKind.INSTRUCTION, InputKind.ENABLE, InputKind.ESTOP):
            stamped = _Stamped(msg.data, receive_ns, receive_ns)
        else:
            header = header_stamp_ns(msg)
            stamped = _Stamped(msg, header or receive_ns, receive_ns, header)
        with self._lock:
            if entry.kind is InputKind.CAMERA:
                timed = self._timed(entry.camera, entry.topic, stamped)
                if timed is not None:
                    self._cameras[entry.camera] = timed
            elif entry.kind is InputKind.JOINT_STATE:
                self._joint_state = self._timed(JOINT_STATES, entry.topic, stamped) or self._joint_state
            elif entry.kind is InputKind.INSTRUCTION:
                self._instruction = stamped
            else:
                self._operator[entry.kind] = stamped

    def _timed(self, name: str, topic: str, stamped: _Stamped) -> Optional[_Stamped]:
        """(Under the lock.) The message through its input's StampClock: its floor and departure noted; None for
        a message of the timeline ROS time jumped back from."""
        if self._old_timeline_ahead_ns and name not in self._new_timeline and stamped.header_ns:
            if stamped.header_ns - stamped.receive_ns > self._old_timeline_ahead_ns:
                return None
            self._new_timeline.add(name)
        if stamped.header_ns:
            clock = self._clocks.setdefault(name, StampClock())
            event = clock.observe(stamped.header_ns, stamped.receive_ns, name, topic)
            if event is not None:
                self._events.append(event)
            stamped.floor_ns, stamped.departure_ns = clock.floor, clock.departure_ns
        return stamped

    def take_clock_events(self) -> List[ClockEvent]:
        """The clock jumps and outliers seen since the last call (the tick reports and counts them)."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events

    def clear(self) -> None:
        """Forget the observation inputs; operator inputs stay (an e-stop must not be forgotten)."""
        with self._lock:
            self._cameras.clear()
            self._clocks.clear()
            self._joint_state = None
            self._instruction = None
            self._old_timeline_ahead_ns = 0

    # ---- reader (tick) ------------------------------------------------------------------------------
    def drop_timed(self, back_sec: float = 0.0) -> None:
        """Forget the camera frames and the joint state (stamped in a timeline the clock left: it jumped
        back by ``back_sec``) and their clock estimates; the instruction and the operator's enable / e-stop stay
        (an e-stop must not be forgotten). Messages of the old timeline still in flight (an executor that
        takes the jump before the frames queued ahead of it) are dropped as they come: per input, those stamped
        more than half the jump ahead of their receipt, until its first message of the new timeline."""
        with self._lock:
            self._cameras.clear()
            self._clocks.clear()
            self._joint_state = None
            self._old_timeline_ahead_ns = int(back_sec * NS_PER_SEC / 2)
            self._new_timeline = set()

    def instruction(self) -> Optional[str]:
        """The latest instruction received, if any (diagnostics; a tick checks it in ``assemble``)."""
        with self._lock:
            return None if self._instruction is None else str(self._instruction.value)

    def camera_ages(self, now_ns: int) -> Dict[str, float]:
        """Per camera: the age of its newest frame, timed in the clock the latest tick chose."""
        with self._lock:
            return {name: (now_ns - entry.time_ns(self._clock)) / NS_PER_SEC for name, entry in self._cameras.items()}

    def operator_inputs(self, now_ns: int) -> OperatorInputs:
        with self._lock:
            enable, estop = self._operator.get(InputKind.ENABLE), self._operator.get(InputKind.ESTOP)
        return OperatorInputs(enable=None if enable is None else bool(enable.value),
                              enable_age_sec=float('inf') if enable is None else
                              (now_ns - enable.receive_ns) / NS_PER_SEC,
                              estop=None if estop is None else bool(estop.value))

    def measured(self, joint_names: Sequence[str], topic: str, limits: TimingLimits, now_ns: int,
                 max_age_sec: Optional[float] = None) -> Measured:
        """Positions of ``joint_names`` from the newest joint state, if timely (within ``max_age_sec``, default
        max_joint_state_age_sec, either way, in the joint states' clock), complete and finite."""
        with self._lock:
            entry = self._joint_state
        if entry is None:
            return Measured(None, f'no joint state received on {topic} yet', waiting=True)
        try:
            _joint_state_time(entry, joint_state_clock_choice(limits, entry.floor_ns, topic), topic, now_ns,
                              limits.max_joint_state_age_sec if max_age_sec is None else max_age_sec)
            positions = joint_positions(entry.value, joint_names, topic)
        except SkipTick as skip:
            return Measured(None, str(skip))
        if not np.all(np.isfinite(positions)):
            return Measured(None, f'the joint state on {topic} has non-finite positions')
        return Measured(positions)

    def assemble(self, layout: InputLayout, limits: TimingLimits, now_ns: int) -> AssembledObservation:
        """The observation for a tick at ``now_ns``, or SkipTick. Checks cameras, then joints, then instruction."""
        with self._lock:
            cameras = dict(self._cameras)
            joint_state = self._joint_state
            instruction = self._instruction
        for entry in layout.cameras:
            if entry.camera not in cameras:
                raise SkipTick(SkipReason.CAMERA_MISSING, f'no image received yet on {entry.topic}', entry.topic)
        clock = camera_clock_choice(limits, {entry.topic: cameras[entry.camera].floor_ns for entry in layout.cameras})
        self._clock = clock
        images, ages, stamps = _check_cameras(layout, limits, cameras, clock, now_ns)
        joint_clock = joint_state_clock_choice(limits, joint_state.floor_ns if joint_state is not None else None,
                                               layout.joint_states.topic)
        state = _check_joint_state(layout, limits, joint_state, joint_clock, now_ns)
        text = _check_instruction(layout, limits, instruction)
        return AssembledObservation(Observation(images=images, state=state, instruction=text),
                                    stamp_ns=max(stamps), camera_ages_sec=ages, clock=clock, joint_clock=joint_clock,
                                    frame_stamps=tuple(cameras[entry.camera].stamp_ns for entry in layout.cameras))


def _moved(what: str, topic: str, stamped: _Stamped) -> str:
    """Why a message of an unsettled input is refused (stamp_clock.py)."""
    departure = -stamped.departure_ns / NS_PER_SEC
    side = 'ahead of' if departure > 0 else 'behind'
    return (f'{what} on {topic} is stamped {abs(departure):.3f} s {side} the clock its earlier stamps kept (a clock '
            f'jump, a glitched stamp or a delivery stall): refused until the new offset holds for {CONFIRM_SEC:g} s '
            'or the stamps come back')


def _check_cameras(layout: InputLayout, limits: TimingLimits, cameras: Mapping[str, _Stamped], clock: CameraClock,
                   now_ns: int) -> Tuple[Dict[str, Any], Dict[str, float], List[int]]:
    images: Dict[str, Any] = {}
    ages: Dict[str, float] = {}
    stamps: List[int] = []
    for entry in layout.cameras:
        topic = entry.topic
        stamped = cameras[entry.camera]
        frame_ns = stamped.time_ns(clock)
        age = (now_ns - frame_ns) / NS_PER_SEC
        ages[entry.camera] = age
        if abs(age) > limits.max_image_age_sec and stamped.departure_ns:
            raise SkipTick(SkipReason.CAMERA_CLOCK_JUMP, _moved('the image', topic, stamped), topic)
        if age > limits.max_image_age_sec:
            raise SkipTick(SkipReason.CAMERA_STALE, f'image on {topic} is {age:.3f} s old '
                           f'(max_image_age_sec {limits.max_image_age_sec})', topic)
        if age < -limits.max_image_age_sec:
            raise SkipTick(SkipReason.CAMERA_FUTURE, f'image on {topic} is stamped {-age:.3f} s in the future '
                           '(clock mismatch between the camera and this node?)', topic)
        images[entry.camera] = stamped.value
        stamps.append(frame_ns)
    skew = (max(stamps) - min(stamps)) / NS_PER_SEC
    if skew > limits.max_camera_skew_sec:
        raise SkipTick(SkipReason.CAMERA_SKEW, f'camera stamps differ by {skew:.3f} s '
                       f'(max_camera_skew_sec {limits.max_camera_skew_sec})')
    return images, ages, stamps


def _joint_state_time(stamped: _Stamped, clock: CameraClock, topic: str, now_ns: int, max_age_sec: float) -> int:
    """The joint state's time in ``clock`` (joint_state_clock's choice), or SkipTick when it is older than
    ``max_age_sec``, as far in the future, or unsettled beyond either."""
    time_ns = stamped.time_ns(clock)
    age = (now_ns - time_ns) / NS_PER_SEC
    if abs(age) > max_age_sec and stamped.departure_ns:
        raise SkipTick(SkipReason.JOINT_STATE_CLOCK_JUMP, _moved('the joint state', topic, stamped), topic)
    if age > max_age_sec:
        raise SkipTick(SkipReason.JOINT_STATE_STALE, f'joint state on {topic} is {age:.3f} s old '
                       f'(max_joint_state_age_sec {max_age_sec})', topic)
    if age < -max_age_sec:
        raise SkipTick(SkipReason.JOINT_STATE_FUTURE, f'joint state on {topic} is stamped {-age:.3f} s in the '
                       'future (clock mismatch between its publisher and this node?)', topic)
    return time_ns


def _check_joint_state(layout: InputLayout, limits: TimingLimits, stamped: Optional[_Stamped], clock: CameraClock,
                       now_ns: int) -> np.ndarray:
    topic = layout.joint_states.topic
    if stamped is None:
        raise SkipTick(SkipReason.JOINT_STATE_MISSING, f'no joint state received yet on {topic}', topic)
    _joint_state_time(stamped, clock, topic, now_ns, limits.max_joint_state_age_sec)
    return joint_positions(stamped.value, layout.state_joint_names, topic)


def _check_instruction(layout: InputLayout, limits: TimingLimits, stamped: Optional[_Stamped]) -> str:
    """The received instruction, else the default; its content is the runtime's to check."""
    if stamped is not None:
        return str(stamped.value)
    if not limits.default_instruction.strip():
        topic = layout.instruction.topic
        raise SkipTick(SkipReason.INSTRUCTION_MISSING, f'no instruction on {topic} and the instruction '
                       'parameter is empty', topic)
    return limits.default_instruction


def joint_positions(msg: object, names: Sequence[str], topic: str) -> np.ndarray:
    """sensor_msgs/JointState -> positions in ``names`` order (values unchecked), or SkipTick."""
    msg_names = list(getattr(msg, 'name', []))
    positions = np.asarray(getattr(msg, 'position', []), dtype=np.float64)
    if positions.ndim != 1 or len(msg_names) != positions.shape[0]:
        raise SkipTick(SkipReason.JOINT_STATE_MALFORMED, f'joint state on {topic} has {len(msg_names)} names but '
                       f'{positions.size} positions', topic)
    index = {name: i for i, name in enumerate(msg_names)}
    missing = [name for name in names if name not in index]
    if missing:
        unknown = [name for name in msg_names if name not in names]
        detail = f'; it has unknown joint(s) {unknown[:6]}' if unknown else ''
        raise SkipTick(SkipReason.JOINT_STATE_MISSING_JOINTS,
                       f'joint state on {topic} lacks joint(s) {missing}{detail}', topic)
    return positions[[index[name] for name in names]]
