"""Generate small, deterministic sample bags for tests and demos (no ROS needed).

The bag mimics a multi-camera manipulation recording:

* ``/cameras/<name>/image_raw`` (sensor_msgs/msg/Image, rgb8) per raw camera, or
  ``/cameras/<name>/image_raw/compressed`` (sensor_msgs/msg/CompressedImage, JPEG)
  per compressed camera, at ``camera_rate_hz``;
* ``/instruction`` (std_msgs/msg/String) at the start and at the midpoint;
* ``/joint_states`` (sensor_msgs/msg/JointState) at ``joint_rate_hz``;
* ``/joint_command`` (sensor_msgs/msg/JointState): the commanded positions,
  i.e. the same trajectory 0.1 s ahead, at ``joint_rate_hz``.

Between ``hold_start_sec`` and ``hold_end_sec`` the scene (and robot) is frozen,
so every camera frame in that window is byte-identical; that is what an
exact-match prefix cache should hit on. After it the scene clock resumes
smoothly (its rate ramps from 0 to 1 over ``resume_sec``), as an arm resuming
from rest accelerates instead of jumping to full speed.

The frames carry the motion: each camera's square circles with the scene
clock, and a white marker shows two of the arm's joints (camera k: joints 2k
and 2k + 1, as x and y), so a policy trained on the bag (train_demo.py) can
read where the arm is and where the motion goes from its cameras. Nothing in
the frames or the joints tells when a hold ends: that part of the recorded
command no policy can predict.
"""
from __future__ import annotations

import argparse
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image as PilImage

from vla_policy_node.bags.bag_io import BagWriter, PathLike, get_kilted_typestore

# A recording in the root namespace: the names the node's relative defaults resolve to there.
INSTRUCTION_TOPIC = '/instruction'
JOINT_STATE_TOPIC = '/joint_states'
COMMAND_TOPIC = '/joint_command'

IMAGE_TYPE = 'sensor_msgs/msg/Image'
COMPRESSED_IMAGE_TYPE = 'sensor_msgs/msg/CompressedImage'
STRING_TYPE = 'std_msgs/msg/String'
JOINT_STATE_TYPE = 'sensor_msgs/msg/JointState'

# image_transport's format string for a JPEG made from an rgb8 image.
JPEG_FORMAT = 'rgb8; jpeg compressed bgr8'
JPEG_QUALITY = 90
# Extra bytes at the end of each row on one camera, so decoders that ignore
# ``step`` produce visibly wrong pictures. Non-zero so the mistake is obvious.
ROW_PADDING_BYTES = 4
PADDING_BYTE_VALUE = 0xA5
# The command stream leads the measured joints by this much (a tracking lag).
COMMAND_LEAD_SEC = 0.1

NS_PER_SEC = 1_000_000_000


@dataclass
class SampleBagSpec:
    """What ``write_sample_bag`` produces; same spec -> byte-identical messages."""

    cameras: Tuple[str, ...] = ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')
    # These publish sensor_msgs/CompressedImage (jpeg) on '<topic>/compressed'
    # instead of a raw Image; they must also appear in ``cameras``.
    compressed_cameras: Tuple[str, ...] = ()
    width: int = 64
    height: int = 48
    duration_sec: float = 4.0
    # Below a typical 10 Hz control rate, so consecutive control ticks see
    # identical frames.
    camera_rate_hz: float = 5.0
    joint_rate_hz: float = 50.0
    joint_names: Tuple[str, ...] = (
        'joint_1', 'joint_2', 'joint_3', 'joint_4', 'joint_5', 'joint_6')
    instruction: str = 'pick up the red block'
    # In [hold_start_sec, hold_end_sec) the scene is static: frames are
    # byte-identical to the first frame of the window. Set end <= start for none.
    hold_start_sec: float = 1.0
    hold_end_sec: float = 2.0
    # After the hold the scene clock's rate ramps linearly from 0 to 1 over this long (0: resumes at full speed).
    resume_sec: float = 1.5
    start_time_ns: int = 1_700_000_000 * NS_PER_SEC
    seed: int = 0
    storage: str = 'sqlite3'

    def validate(self) -> None:
        """Raise ValueError for a spec that cannot produce a sensible bag."""
        if not self.cameras:
            raise ValueError('at least one camera is required')
        unknown = [name for name in self.compressed_cameras if name not in self.cameras]
        if unknown:
            raise ValueError(
                f'compressed cameras {unknown} are not in cameras {list(self.cameras)}')
        if self.width < 4 or self.height < 4:
            raise ValueError('width and height must be at least 4 pixels')
        if self.duration_sec <= 0 or self.camera_rate_hz <= 0 or self.joint_rate_hz <= 0:
            raise ValueError('duration and rates must be positive')
        if not self.joint_names:
            raise ValueError('at least one joint name is required')
        if self.resume_sec < 0:
            raise ValueError('resume_sec must be >= 0')


def camera_topic(name: str) -> str:
    """Raw image topic of a camera."""
    return f'/cameras/{name}/image_raw'


def compressed_camera_topic(name: str) -> str:
    """Compressed image topic of a camera (image_transport naming)."""
    return f'{camera_topic(name)}/compressed'


def camera_topics(spec: SampleBagSpec) -> Dict[str, Tuple[str, str]]:
    """Map camera name -> (topic, msgtype) as written for ``spec``."""
    topics = {}
    for name in spec.cameras:
        if name in spec.compressed_cameras:
            topics[name] = (compressed_camera_topic(name), COMPRESSED_IMAGE_TYPE)
        else:
            topics[name] = (camera_topic(name), IMAGE_TYPE)
    return topics


def padded_camera(spec: SampleBagSpec) -> Optional[str]:
    """The raw camera whose rows carry padding (the last raw one), or None."""
    raw_cameras = [name for name in spec.cameras if name not in spec.compressed_cameras]
    return raw_cameras[-1] if raw_cameras else None


def sample_times_ns(spec: SampleBagSpec, rate_hz: float) -> List[int]:
    """Bag timestamps of a stream at ``rate_hz``: k / rate for k / rate < duration."""
    count = max(1, int(math.ceil(spec.duration_sec * rate_hz - 1e-9)))
    return [spec.start_time_ns + int(round(k * NS_PER_SEC / rate_hz)) for k in range(count)]


def instruction_times_ns(spec: SampleBagSpec) -> List[int]:
    """The instruction is sent at the start and repeated at the midpoint."""
    midpoint = spec.start_time_ns + int(round(spec.duration_sec * NS_PER_SEC / 2))
    return [spec.start_time_ns, midpoint]


def expected_counts(spec: SampleBagSpec) -> Dict[str, int]:
    """Number of messages per topic that ``write_sample_bag`` writes for ``spec``."""
    counts = {topic: len(sample_times_ns(spec, spec.camera_rate_hz))
              for topic, _ in camera_topics(spec).values()}
    counts[INSTRUCTION_TOPIC] = len(instruction_times_ns(spec))
    joint_count = len(sample_times_ns(spec, spec.joint_rate_hz))
    counts[JOINT_STATE_TOPIC] = joint_count
    counts[COMMAND_TOPIC] = joint_count
    return counts


def in_hold_window(spec: SampleBagSpec, t_sec: float) -> bool:
    """Whether bag-relative time ``t_sec`` falls in the static-scene window."""
    return spec.hold_start_sec <= t_sec < spec.hold_end_sec


def scene_time(spec: SampleBagSpec, t_sec: float) -> float:
    """Time as seen by the scene: it stops during the hold window, then resumes, its rate ramping from 0
    to 1 over ``resume_sec``.

    Freezing the scene clock (instead of special-casing frames) keeps pictures
    and joints consistent and makes hold-window frames identical by construction.
    """
    return _scene_clock(spec, t_sec)[0]


def _scene_clock(spec: SampleBagSpec, t_sec: float) -> Tuple[float, float]:
    """(scene time, its rate d scene / dt) at bag-relative ``t_sec``."""
    hold = max(0.0, spec.hold_end_sec - spec.hold_start_sec)
    if hold == 0.0 or t_sec < spec.hold_start_sec:
        return t_sec, 1.0
    if t_sec < spec.hold_end_sec:
        return spec.hold_start_sec, 0.0
    resumed, ramp = t_sec - spec.hold_end_sec, spec.resume_sec
    if resumed < ramp:
        return spec.hold_start_sec + resumed * resumed / (2.0 * ramp), resumed / ramp
    return spec.hold_start_sec + resumed - ramp / 2.0, 1.0


# --- pictures -----------------------------------------------------------------

def _camera_style(spec: SampleBagSpec, camera_index: int) -> Tuple[np.ndarray, np.ndarray, float]:
    """Deterministic per-camera (background tint, square colour, motion phase)."""
    rng = np.random.default_rng([spec.seed, camera_index])
    tint = rng.integers(0, 96, size=3, dtype=np.int64)
    colour = rng.integers(128, 256, size=3, dtype=np.int64)
    phase = float(rng.uniform(0.0, 2.0 * math.pi))
    return tint, colour, phase


def render_frame(spec: SampleBagSpec, camera_index: int, t_sec: float) -> np.ndarray:
    """The (height, width, 3) uint8 RGB picture camera ``camera_index`` sees at ``t_sec``.

    A tinted gradient background with a coloured square that circles at a
    camera-specific phase, and a white marker at two of the arm's joints (camera
    k: joints 2k, 2k + 1 as x, y, each scaled by its amplitude to the frame);
    ``t_sec`` is bag-relative and passes through the hold.
    """
    s = scene_time(spec, t_sec)
    tint, colour, phase = _camera_style(spec, camera_index)
    h, w = spec.height, spec.width
    ys, xs = np.mgrid[0:h, 0:w]
    frame = np.empty((h, w, 3), dtype=np.int64)
    frame[..., 0] = tint[0] + (xs * 96) // w
    frame[..., 1] = tint[1] + (ys * 96) // h
    frame[..., 2] = tint[2] + ((xs + ys) * 48) // (w + h)

    side = max(2, min(w, h) // 4)
    angle = 2.0 * math.pi * 0.25 * s + phase
    cx = int(round((w - side) / 2 * (1.0 + 0.8 * math.cos(angle))))
    cy = int(round((h - side) / 2 * (1.0 + 0.8 * math.sin(angle))))
    frame[cy:cy + side, cx:cx + side] = colour

    amplitude, _, _ = _joint_motion(spec)
    positions = joint_state_at(spec, t_sec)[0] / amplitude                    # each in [-1, 1]
    n = len(positions)
    mark = max(2, min(w, h) // 8)
    x = positions[(2 * camera_index) % n]
    y = positions[(2 * camera_index + 1) % n]
    mx = int(round((w - mark) / 2 * (1.0 + 0.9 * x)))
    my = int(round((h - mark) / 2 * (1.0 + 0.9 * y)))
    frame[my:my + mark, mx:mx + mark] = 255
    return np.clip(frame, 0, 255).astype(np.uint8)


def _padded_rows(frame: np.ndarray, padding: int) -> Tuple[np.ndarray, int]:
    """Row-major bytes with ``padding`` filler bytes after each row, and the step."""
    h, w, c = frame.shape
    step = w * c + padding
    rows = np.full((h, step), PADDING_BYTE_VALUE, dtype=np.uint8)
    rows[:, :w * c] = frame.reshape(h, w * c)
    return rows, step


def _jpeg_bytes(frame: np.ndarray) -> np.ndarray:
    buffer = io.BytesIO()
    # Fixed quality and no optimisation pass keeps the output deterministic.
    PilImage.fromarray(frame, mode='RGB').save(buffer, format='JPEG', quality=JPEG_QUALITY)
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8)


# --- messages -----------------------------------------------------------------

def _header(t_ns: int, frame_id: str):
    types = get_kilted_typestore().types
    stamp = types['builtin_interfaces/msg/Time'](
        sec=t_ns // NS_PER_SEC, nanosec=t_ns % NS_PER_SEC)
    return types['std_msgs/msg/Header'](stamp=stamp, frame_id=frame_id)


def _image_msg(spec: SampleBagSpec, name: str, frame: np.ndarray, t_ns: int):
    padding = ROW_PADDING_BYTES if name == padded_camera(spec) else 0
    rows, step = _padded_rows(frame, padding)
    image_type = get_kilted_typestore().types[IMAGE_TYPE]
    return image_type(
        header=_header(t_ns, name), height=spec.height, width=spec.width,
        encoding='rgb8', is_bigendian=0, step=step, data=rows.reshape(-1))


def _compressed_msg(name: str, frame: np.ndarray, t_ns: int):
    compressed_type = get_kilted_typestore().types[COMPRESSED_IMAGE_TYPE]
    return compressed_type(header=_header(t_ns, name), format=JPEG_FORMAT, data=_jpeg_bytes(frame))


def _joint_motion(spec: SampleBagSpec) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-joint sinusoid (amplitude rad, frequency Hz, phase rad), from the seed."""
    rng = np.random.default_rng([spec.seed, 1_000])
    n = len(spec.joint_names)
    amplitude = rng.uniform(0.2, 0.6, size=n)
    frequency = rng.uniform(0.2, 0.5, size=n)
    phase = rng.uniform(0.0, 2.0 * math.pi, size=n)
    return amplitude, frequency, phase


def joint_state_at(spec: SampleBagSpec, t_sec: float) -> Tuple[np.ndarray, np.ndarray]:
    """(positions, velocities) of the robot at bag-relative ``t_sec``.

    Velocities are the analytic derivative: zero while the scene is held, ramping up as it resumes.
    """
    amplitude, frequency, phase = _joint_motion(spec)
    omega = 2.0 * math.pi * frequency
    s, rate = _scene_clock(spec, t_sec)
    positions = amplitude * np.sin(omega * s + phase)
    velocities = amplitude * omega * np.cos(omega * s + phase) * rate
    return positions.astype(np.float64), velocities.astype(np.float64)


def _joint_msg(spec: SampleBagSpec, t_ns: int, lead_sec: float):
    t_sec = (t_ns - spec.start_time_ns) / NS_PER_SEC
    positions, velocities = joint_state_at(spec, t_sec + lead_sec)
    joint_state_type = get_kilted_typestore().types[JOINT_STATE_TYPE]
    return joint_state_type(
        header=_header(t_ns, ''), name=list(spec.joint_names), position=positions,
        velocity=velocities, effort=np.zeros(0, dtype=np.float64))


def _string_msg(text: str):
    return get_kilted_typestore().types[STRING_TYPE](data=text)


def _camera_messages(spec: SampleBagSpec) -> List[Tuple[int, str, object]]:
    messages = []
    for index, (name, (topic, msgtype)) in enumerate(camera_topics(spec).items()):
        for t_ns in sample_times_ns(spec, spec.camera_rate_hz):
            frame = render_frame(spec, index, (t_ns - spec.start_time_ns) / NS_PER_SEC)
            if msgtype == COMPRESSED_IMAGE_TYPE:
                messages.append((t_ns, topic, _compressed_msg(name, frame, t_ns)))
            else:
                messages.append((t_ns, topic, _image_msg(spec, name, frame, t_ns)))
    return messages


def _all_messages(spec: SampleBagSpec) -> List[Tuple[int, str, object]]:
    """Every (timestamp_ns, topic, msg) of the bag, in write order."""
    messages = [(t, INSTRUCTION_TOPIC, _string_msg(spec.instruction))
                for t in instruction_times_ns(spec)]
    messages += _camera_messages(spec)
    for t_ns in sample_times_ns(spec, spec.joint_rate_hz):
        messages.append((t_ns, JOINT_STATE_TOPIC, _joint_msg(spec, t_ns, 0.0)))
        messages.append((t_ns, COMMAND_TOPIC, _joint_msg(spec, t_ns, COMMAND_LEAD_SEC)))
    # Stable sort by time: ties keep the order above (instruction, cameras, joints),
    # so a replay delivers the instruction before the first frames.
    messages.sort(key=lambda item: item[0])
    return messages


def topic_types(spec: SampleBagSpec) -> Dict[str, str]:
    """Map topic -> msgtype of everything ``write_sample_bag`` writes."""
    types = {INSTRUCTION_TOPIC: STRING_TYPE}
    types.update({topic: msgtype for topic, msgtype in camera_topics(spec).values()})
    types[JOINT_STATE_TOPIC] = JOINT_STATE_TYPE
    types[COMMAND_TOPIC] = JOINT_STATE_TYPE
    return types


def write_sample_bag(path: PathLike, spec: SampleBagSpec = SampleBagSpec()) -> Path:
    """Write the sample bag described by ``spec`` to the new folder ``path``."""
    spec.validate()
    path = Path(path)
    with BagWriter(path, storage=spec.storage) as bag:
        for topic, msgtype in topic_types(spec).items():
            bag.add_topic(topic, msgtype)
        for t_ns, topic, msg in _all_messages(spec):
            bag.write(topic, t_ns, msg)
    return path


# --- CLI ----------------------------------------------------------------------

def _split_names(text: str) -> Tuple[str, ...]:
    return tuple(name.strip() for name in text.split(',') if name.strip())


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    defaults = SampleBagSpec()
    parser = argparse.ArgumentParser(
        prog='vla_policy_make_bag',
        description='Write a deterministic sample rosbag2 bag (cameras, instruction, joints).')
    parser.add_argument('out', help='output bag folder (must not exist)')
    parser.add_argument('--storage', choices=('sqlite3', 'mcap'), default=defaults.storage,
                        help='rosbag2 storage (default %(default)s)')
    parser.add_argument('--duration', type=float, default=defaults.duration_sec,
                        help='seconds of data (default %(default)s)')
    parser.add_argument('--cameras', type=_split_names, default=defaults.cameras,
                        help=f'comma-separated camera names (default {",".join(defaults.cameras)})')
    parser.add_argument('--compressed', type=_split_names, default=(),
                        help='comma-separated cameras to publish as JPEG CompressedImage')
    parser.add_argument('--width', type=int, default=defaults.width, help='frame width in pixels (default %(default)s)')
    parser.add_argument('--height', type=int, default=defaults.height,
                        help='frame height in pixels (default %(default)s)')
    parser.add_argument('--seed', type=int, default=defaults.seed,
                        help='colours and motion (default %(default)s: the demo bag\'s seed, the one builtin:demo '
                             'learned)')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Console entry point ``vla_policy_make_bag``."""
    args = _parse_args(argv)
    spec = SampleBagSpec(
        cameras=args.cameras, compressed_cameras=args.compressed, width=args.width,
        height=args.height, duration_sec=args.duration, seed=args.seed, storage=args.storage)
    try:
        path = write_sample_bag(args.out, spec)
    except (ValueError, RuntimeError) as err:
        print(f'vla_policy_make_bag: error: {err}', file=sys.stderr)
        return 2
    counts = expected_counts(spec)
    print(f'wrote {path} ({spec.storage}, {spec.duration_sec:g} s, '
          f'{spec.width}x{spec.height}, hold {spec.hold_start_sec:g}-{spec.hold_end_sec:g} s)')
    for topic, msgtype in topic_types(spec).items():
        print(f'  {topic:<48} {msgtype:<32} {counts[topic]:>5} msgs')
    return 0


if __name__ == '__main__':
    sys.exit(main())
