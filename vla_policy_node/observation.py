"""Observation assembly: the latest message per input, checked, turned into an Observation.

Shared by the live node and the offline replay (no rclpy: messages are
duck-typed, so rclpy messages and rosbags messages both work). Callbacks only
store; every check happens at the control tick, where a failure becomes a
``SkipTick`` naming the reason, the topic and the fault.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .images import Frame, ImageDecodeError, check_frame, frame_from_msg
from .runtime import Observation

NS_PER_SEC = 1_000_000_000


class SkipTick(Exception):
    """A control tick that must not produce a trajectory.

    ``reason`` is a short stable identifier (a diagnostics counter key);
    ``topic`` the input at fault, if one is; the message says what is wrong.
    """

    def __init__(self, reason: str, message: str, topic: str = '') -> None:
        super().__init__(message)
        self.reason = reason
        self.topic = topic


@dataclass(frozen=True)
class AssemblySettings:
    """The checks an observation must pass; from ROS parameters."""

    camera_names: Tuple[str, ...]
    camera_topics: Tuple[str, ...]
    state_joint_names: Tuple[str, ...]
    joint_states_topic: str
    instruction_topic: str
    default_instruction: str = ''
    max_image_age_sec: float = 0.5
    max_camera_skew_sec: float = 0.1
    max_joint_state_age_sec: float = 0.5
    max_instruction_length: int = 500


@dataclass
class _Stamped:
    value: object
    stamp_ns: int      # header stamp, or receive time when the header is unset
    receive_ns: int


def header_stamp_ns(msg: object) -> int:
    """header.stamp in ns (0 when the message has no header or an unset stamp)."""
    stamp = getattr(getattr(msg, 'header', None), 'stamp', None)
    if stamp is None:
        return 0
    return int(stamp.sec) * NS_PER_SEC + int(getattr(stamp, 'nanosec', 0))


@dataclass
class AssembledObservation:
    observation: Observation
    stamp_ns: int                       # the newest camera stamp: when the scene was seen
    camera_ages_sec: Dict[str, float] = field(default_factory=dict)

    @property
    def current_positions(self) -> np.ndarray:
        """Joint positions at the tick (the state vector, in state_joint_names order)."""
        return self.observation.state


class InputBuffer:
    """Latest message per input, written by subscription callbacks, read at each tick."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cameras: Dict[str, _Stamped] = {}
        self._camera_faults: Dict[str, str] = {}
        self._joint_state: Optional[_Stamped] = None
        self._instruction: Optional[_Stamped] = None

    # ---- writers (callbacks) --------------------------------------------------------
    def put_camera(self, name: str, msg: object, receive_ns: int) -> None:
        try:
            frame: Optional[Frame] = frame_from_msg(msg)
            check_frame(frame)  # cheap (no decoding): a malformed frame is reported as bad_image on its topic
            fault = ''
        except ImageDecodeError as exc:
            frame, fault = None, str(exc)
        stamp = header_stamp_ns(msg) or receive_ns
        with self._lock:
            self._cameras[name] = _Stamped(frame, stamp, receive_ns)
            self._camera_faults[name] = fault

    def put_joint_state(self, msg: object, receive_ns: int) -> None:
        with self._lock:
            self._joint_state = _Stamped(msg, header_stamp_ns(msg) or receive_ns, receive_ns)

    def put_instruction(self, text: str, receive_ns: int) -> None:
        with self._lock:
            self._instruction = _Stamped(text, receive_ns, receive_ns)

    def clear(self) -> None:
        with self._lock:
            self._cameras.clear()
            self._camera_faults.clear()
            self._joint_state = None
            self._instruction = None

    # ---- reader (tick) ------------------------------------------------------------------
    def camera_ages(self, now_ns: int) -> Dict[str, float]:
        with self._lock:
            return {name: (now_ns - entry.stamp_ns) / NS_PER_SEC for name, entry in self._cameras.items()}

    def assemble(self, settings: AssemblySettings, now_ns: int) -> AssembledObservation:
        """The observation for a tick at ``now_ns``, or SkipTick."""
        with self._lock:
            cameras = dict(self._cameras)
            faults = dict(self._camera_faults)
            joint_state = self._joint_state
            instruction = self._instruction
        images, ages, stamps = self._check_cameras(settings, cameras, faults, now_ns)
        state = self._check_joint_state(settings, joint_state, now_ns)
        text = self._check_instruction(settings, instruction)
        return AssembledObservation(Observation(images=images, state=state, instruction=text),
                                    stamp_ns=max(stamps), camera_ages_sec=ages)

    @staticmethod
    def _check_cameras(settings: AssemblySettings, cameras: Mapping[str, _Stamped], faults: Mapping[str, str],
                       now_ns: int) -> Tuple[Dict[str, Frame], Dict[str, float], List[int]]:
        images: Dict[str, Frame] = {}
        ages: Dict[str, float] = {}
        stamps: List[int] = []
        for name, topic in zip(settings.camera_names, settings.camera_topics):
            entry = cameras.get(name)
            if entry is None:
                raise SkipTick('camera_missing', f'no image received yet on {topic}', topic)
            if faults.get(name):
                raise SkipTick('bad_image', f'bad image on {topic}: {faults[name]}', topic)
            age = (now_ns - entry.stamp_ns) / NS_PER_SEC
            ages[name] = age
            if age > settings.max_image_age_sec:
                raise SkipTick('camera_stale', f'image on {topic} is {age:.3f} s old '
                               f'(max_image_age_sec {settings.max_image_age_sec})', topic)
            if age < -settings.max_image_age_sec:
                raise SkipTick('camera_future', f'image on {topic} is stamped {-age:.3f} s in the future '
                               '(clock mismatch between the camera and this node?)', topic)
            images[name] = entry.value  # type: ignore[assignment]
            stamps.append(entry.stamp_ns)
        skew = (max(stamps) - min(stamps)) / NS_PER_SEC
        if skew > settings.max_camera_skew_sec:
            raise SkipTick('camera_skew', f'camera stamps differ by {skew:.3f} s '
                           f'(max_camera_skew_sec {settings.max_camera_skew_sec})')
        return images, ages, stamps

    @staticmethod
    def _check_joint_state(settings: AssemblySettings, entry: Optional[_Stamped], now_ns: int) -> np.ndarray:
        topic = settings.joint_states_topic
        if entry is None:
            raise SkipTick('joint_state_missing', f'no joint state received yet on {topic}', topic)
        age = (now_ns - entry.stamp_ns) / NS_PER_SEC
        if age > settings.max_joint_state_age_sec:
            raise SkipTick('joint_state_stale', f'joint state on {topic} is {age:.3f} s old '
                           f'(max_joint_state_age_sec {settings.max_joint_state_age_sec})', topic)
        return joint_positions(entry.value, settings.state_joint_names, topic)

    @staticmethod
    def _check_instruction(settings: AssemblySettings, entry: Optional[_Stamped]) -> str:
        topic = settings.instruction_topic
        if entry is None:
            if not settings.default_instruction.strip():
                raise SkipTick('instruction_missing', f'no instruction on {topic} and the instruction '
                               'parameter is empty', topic)
            return settings.default_instruction
        text = str(entry.value)
        if not text.strip():
            raise SkipTick('instruction_empty', f'empty instruction received on {topic}', topic)
        if len(text) > settings.max_instruction_length:
            raise SkipTick('instruction_too_long', f'instruction on {topic} has {len(text)} characters '
                           f'(max_instruction_length {settings.max_instruction_length})', topic)
        return text


def joint_positions(msg: object, names: Sequence[str], topic: str) -> np.ndarray:
    """sensor_msgs/JointState -> positions in ``names`` order, or SkipTick."""
    msg_names = list(getattr(msg, 'name', []))
    positions = np.asarray(getattr(msg, 'position', []), dtype=np.float64)
    if len(msg_names) != positions.shape[0]:
        raise SkipTick('joint_state_malformed', f'joint state on {topic} has {len(msg_names)} names but '
                       f'{positions.shape[0]} positions', topic)
    index = {name: i for i, name in enumerate(msg_names)}
    missing = [name for name in names if name not in index]
    if missing:
        unknown = [name for name in msg_names if name not in names]
        detail = f'; it has unknown joint(s) {unknown[:6]}' if unknown else ''
        raise SkipTick('joint_state_missing_joints', f'joint state on {topic} lacks joint(s) {missing}{detail}',
                       topic)
    values = positions[[index[name] for name in names]]
    bad = [name for name, value in zip(names, values) if not math.isfinite(value)]
    if bad:
        raise SkipTick('joint_state_nonfinite', f'joint state on {topic} has non-finite position(s) for {bad}',
                       topic)
    return values
