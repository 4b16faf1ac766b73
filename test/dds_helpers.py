"""Helpers for the DDS integration tests: the node as a subprocess, and an in-process test rig.

* ``NodeProcess`` starts ``vla_policy_node`` (console script, or ``python -m``) with a params
  file written to a tmp folder, on an isolated domain, logging to a file.
* ``TestRig`` is an rclpy node in its own Context: it streams cameras / joint states /
  instruction (and optionally /clock), records trajectories and /diagnostics, and talks to
  the node's parameter and lifecycle services.
"""
from __future__ import annotations

import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np
import pytest
import yaml

import rclpy
from builtin_interfaces.msg import Time as TimeMsg
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState
from rcl_interfaces.srv import GetParameters, SetParameters
from rclpy.context import Context
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter, parameter_value_to_python
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from vla_policy_node.trajectory import check_controller_rules

REPO_ROOT = Path(__file__).resolve().parents[1]
NODE_NAME = 'vla_policy'
STATUS_NAME = f'/{NODE_NAME}: policy'        # the node's fully qualified name (root namespace)
NS = 1_000_000_000
JOINTS = ['joint_1', 'joint_2', 'joint_3', 'joint_4', 'joint_5', 'joint_6']
CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')
TRAJECTORY_TOPIC = '/joint_trajectory_controller/joint_trajectory'
JOINT_STATES_TOPIC = '/joint_states'
INSTRUCTION_TOPIC = '/instruction'
INSTRUCTION = 'pick up the red block'
FRAME_SHAPE = (48, 64)           # height, width of the frames the rig publishes

TRANSITIONS = {'configure': Transition.TRANSITION_CONFIGURE, 'cleanup': Transition.TRANSITION_CLEANUP,
               'activate': Transition.TRANSITION_ACTIVATE, 'deactivate': Transition.TRANSITION_DEACTIVATE}


def camera_topic(name: str) -> str:
    return f'/cameras/{name}/image_raw'


# ---- isolation ---------------------------------------------------------------------------------
def pick_domain_id(exclude: Optional[str] = None) -> int:
    """A random domain in 100..230, different from whatever the environment already holds (and ``exclude``)."""
    taken = {os.environ.get('ROS_DOMAIN_ID'), exclude}
    while True:
        domain = random.randint(100, 230)
        if str(domain) not in taken:
            return domain


def isolate(domain_id: int) -> None:
    """Export the domain (and localhost-only discovery) for this process and its children."""
    os.environ['ROS_DOMAIN_ID'] = str(domain_id)
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'


def ros_env(domain_id: int, log_dir: Path) -> Dict[str, str]:
    """Environment for a node subprocess: explicit domain (several test modules share os.environ)."""
    env = dict(os.environ)
    env['ROS_DOMAIN_ID'] = str(domain_id)
    env['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    env['PYTHONPATH'] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get('PYTHONPATH', '')] if p])
    env['PYTHONUNBUFFERED'] = '1'
    env['RCUTILS_LOGGING_BUFFERED_STREAM'] = '0'
    env['RCUTILS_COLORIZED_OUTPUT'] = '0'
    env['ROS_LOG_DIR'] = str(log_dir)
    # Small CI machines (2 cores here): torch's spinning OpenMP workers competing with the rig's
    # publisher threads make inference 20x slower; one intra-op thread keeps ticks at ~40 ms.
    env.setdefault('OMP_NUM_THREADS', '1')
    return env


# ---- params ------------------------------------------------------------------------------------
LOADED_MACHINE_AGE_SEC = 2.0
LOADED_MACHINE_SKEW_SEC = 1.0
LOADED_MACHINE_FAULT_HOLD_SEC = 3.0
# How long a test waits for what the node must do (a trajectory, a hold, a status): on a loaded 2-core machine
# the node's executor and the rig's can each stall for a second or more; a wait is a bound on a hang, not a
# figure (bench/ measures how fast).
LOADED_MACHINE_WAIT_SEC = 30.0


def base_params(checkpoint: Path, **overrides) -> Dict[str, object]:
    # The age, skew and no-trajectory limits are wider than the shipped ones (0.5 s, 0.5 s, 0.1 s, 1 s): on a
    # loaded 2-core machine the rig's streaming thread or the node's executor can stall for most of a second
    # (and deliver one camera's frames a few rounds behind the others'), and a test that is not about
    # staleness or skew must not see that stall as a camera fault and a hold. Tests about those faults set the
    # limits they exercise.
    params: Dict[str, object] = {
        'checkpoint_path': str(checkpoint), 'joint_names': list(JOINTS), 'instruction': INSTRUCTION,
        'control_rate_hz': 10.0, 'action_period_sec': 0.1, 'seed': 0, 'diagnostics_period_sec': 0.25,
        'max_image_age_sec': LOADED_MACHINE_AGE_SEC, 'max_joint_state_age_sec': LOADED_MACHINE_AGE_SEC,
        'max_camera_skew_sec': LOADED_MACHINE_SKEW_SEC,
        'fault_hold_after_sec': LOADED_MACHINE_FAULT_HOLD_SEC,
    }
    params.update(overrides)
    return params


def write_params(path: Path, params: Dict[str, object], node_name: str = NODE_NAME) -> Path:
    """A ROS 2 params file; ``/**`` so it applies whatever the namespace."""
    del node_name  # the wildcard covers it
    path.write_text(yaml.safe_dump({'/**': {'ros__parameters': params}}, default_flow_style=None))
    return path


def node_command() -> List[str]:
    """Prefer the installed console script; fall back to the module (package not installed)."""
    exe = shutil.which('vla_policy_node')
    return [exe] if exe else [sys.executable, '-m', 'vla_policy_node.ros.main']


# ---- the node subprocess -----------------------------------------------------------------------
class NodeProcess:
    """``vla_policy_node --ros-args --params-file FILE`` with stdout+stderr in ``log_path``."""

    def __init__(self, workdir: Path, params: Dict[str, object], domain_id: int,
                 extra_ros_args: Sequence[str] = ()) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.params_path = write_params(self.workdir / 'params.yaml', params)
        self.log_path = self.workdir / 'node.log'
        self.domain_id = domain_id
        self.command = node_command() + ['--ros-args', '--params-file', str(self.params_path),
                                         *extra_ros_args]
        self.proc: Optional[subprocess.Popen] = None
        self._log_file = None

    def start(self) -> 'NodeProcess':
        self._log_file = open(self.log_path, 'wb')
        self.proc = subprocess.Popen(self.command, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     env=ros_env(self.domain_id, self.workdir / 'ros_log'),
                                     cwd=str(self.workdir), start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors='replace')
        except FileNotFoundError:
            return ''

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]

    def wait_for_log(self, predicate: Callable[[str], bool], timeout: float = 3.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(predicate(line) for line in self.log_text().splitlines()):
                return True
            time.sleep(0.05)
        return False

    def wait_for_state(self, rig: 'TestRig', label: str, timeout: float = 60.0) -> None:
        """Poll ``/vla_policy/get_state`` until the lifecycle state is ``label``."""
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f'node exited with {self.proc.returncode}:\n{self.log_tail()}')
            state = rig.get_state(timeout=1.0)
            if state == label:
                return
            time.sleep(0.1)
        raise AssertionError(f'node state {state!r} after {timeout} s, expected {label!r}:\n{self.log_tail()}')

    def stop(self) -> None:
        """SIGINT, then SIGKILL; always closes the log."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def print_log(self, title: str = 'node log') -> None:
        """Printed in fixture teardown: pytest shows it only for failing tests."""
        print(f'----- {title} ({self.log_path}) -----\n{self.log_text()}')


# ---- JTC rules -----------------------------------------------------------------------------------
def duration_sec(duration) -> float:
    return duration.sec + duration.nanosec / NS


def stamp_ns(stamp) -> int:
    return int(stamp.sec) * NS + int(stamp.nanosec)


def times_of(msg: JointTrajectory) -> List[float]:
    return [duration_sec(p.time_from_start) for p in msg.points]


def positions_of(msg: JointTrajectory) -> np.ndarray:
    return np.array([list(p.positions) for p in msg.points], dtype=np.float64)


def check_jtc(msg: JointTrajectory, joint_names: Sequence[str] = JOINTS, points: Optional[int] = None,
              zero_stamp: Optional[bool] = None, now_ns: Optional[int] = None, late_sec: float = 0.0) -> None:
    """What joint_trajectory_controller's validate_trajectory_msg checks, plus header sanity.

    The controller's rules (ros2_controllers joint_trajectory_controller.cpp, validate_trajectory_msg):
    its own joints exactly (no partial goals by default: a joint it does not own rejects the message),
    time_from_start strictly increasing, one position/velocity per joint, zero final velocity, and a
    trajectory with a non-zero stamp that ends in the past (stamp + the last point's time_from_start
    before the controller's clock, ``now_ns`` when it arrived) is rejected. The node publishes a chunk only
    while an action of it is still ahead on its own clock (tick.py; test_handover.py checks it); what the
    message then takes to arrive, and how stale the node's clock is (under use_sim_time: the last /clock
    its executor took), is the machine's: ``late_sec`` allows for it.
    """
    assert list(msg.joint_names) == list(joint_names)
    check_controller_rules(list(msg.joint_names), times_of(msg), [list(p.positions) for p in msg.points],
                           [list(p.velocities) for p in msg.points])
    for point in msg.points:
        assert len(point.velocities) == len(joint_names), 'velocities must be filled (cubic interpolation)'
        assert len(point.accelerations) in (0, len(joint_names))
        assert len(point.effort) == 0, 'no effort command interface'
        assert 0 <= point.time_from_start.nanosec < NS
    assert list(msg.points[-1].velocities) == [0.0] * len(joint_names)
    if points is not None:
        assert len(msg.points) == points
    assert 0 <= msg.header.stamp.nanosec < NS
    if zero_stamp is True:
        assert stamp_ns(msg.header.stamp) == 0
    elif zero_stamp is False:
        assert stamp_ns(msg.header.stamp) > 0
    if now_ns is not None and stamp_ns(msg.header.stamp) != 0:
        end_ns = stamp_ns(msg.header.stamp) + int(round(duration_sec(msg.points[-1].time_from_start) * NS))
        assert end_ns >= now_ns - int(late_sec * NS), (
            f'the controller rejects a stamped trajectory that ends in the past: it ends at {end_ns} ns, '
            f'received at {now_ns} ns (allowing {late_sec} s of delivery)')


def check_chunk_timing(msg: JointTrajectory, execute_steps: int, dt: float) -> None:
    """stamp zero: the actions not yet due when the chunk was published, timed from publication.

    Points are dt apart; the first is due within (0, dt] (it is the first action not yet due); the
    ones that fell due during inference are not published. How many fell due depends on how long the
    tick took, which a loaded machine stretches: any count from none to all but one is correct.
    """
    check_jtc(msg, JOINTS, zero_stamp=True)
    times = times_of(msg)
    assert 1 <= len(times) <= execute_steps, times
    assert 0 < times[0] <= dt + 1e-9, times
    assert times == pytest.approx([times[0] + k * dt for k in range(len(times))], abs=1e-6)


# ---- frames ------------------------------------------------------------------------------------
def make_frame(seed: int, shape=FRAME_SHAPE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(*shape, 3), dtype=np.uint8)


def image_msg(frame: np.ndarray, stamp: TimeMsg, frame_id: str = '') -> Image:
    msg = Image()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.height, msg.width = int(frame.shape[0]), int(frame.shape[1])
    msg.encoding = 'rgb8'
    msg.is_bigendian = 0
    msg.step = int(frame.shape[1]) * 3
    msg.data = frame.tobytes()
    return msg


def time_msg(ns: int) -> TimeMsg:
    return TimeMsg(sec=int(ns // NS), nanosec=int(ns % NS))


# ---- the in-process rig ---------------------------------------------------------------------------
class TestRig:
    """Publishes the node's inputs, records its outputs, calls its services.

    Inputs are streamed by a background thread at ``stream_hz`` from mutable state:
    ``frames`` (camera -> RGB array), ``camera_overrides`` (camera -> fn(stamp) -> message to send
    instead), ``paused_cameras``, ``joint_names`` / ``joint_positions``, ``instruction``.
    """

    __test__ = False   # not a pytest class

    def __init__(self, domain_id: int, name: str = 'test_rig', node_name: str = NODE_NAME,
                 trajectory_topic: str = TRAJECTORY_TOPIC, cameras: Sequence[str] = CAMERAS,
                 stream_hz: float = 20.0) -> None:
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = Node(name, context=self.context)
        self.cameras = tuple(cameras)
        self.stream_period = 1.0 / stream_hz
        reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self._camera_pubs = {c: self.node.create_publisher(Image, camera_topic(c), reliable) for c in cameras}
        self._compressed_pubs: Dict[str, object] = {}
        self._joint_pub = self.node.create_publisher(JointState, JOINT_STATES_TOPIC, reliable)
        self._instruction_pub = self.node.create_publisher(
            String, INSTRUCTION_TOPIC, QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE))
        self._clock_pub = self.node.create_publisher(Clock, '/clock', reliable)
        self._enable_pub = self.node.create_publisher(Bool, '/enable', reliable)
        self._estop_pub = self.node.create_publisher(Bool, '/estop', reliable)
        self._reset_estop = self.node.create_client(Trigger, f'/{node_name}/reset_estop')
        self._lock = threading.Condition()
        self.trajectories: List[JointTrajectory] = []
        self.trajectory_times: List[float] = []
        self.trajectory_received_ns: List[int] = []      # the rig's clock (sim time while it drives /clock)
        self.extra: Dict[str, List[object]] = {}         # subscribe(): topic -> messages
        self.diagnostics: List[DiagnosticArray] = []
        self.node.create_subscription(JointTrajectory, trajectory_topic, self._on_trajectory,
                                      QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics, 50)
        self._get_state = self.node.create_client(GetState, f'/{node_name}/get_state')
        self._change_state = self.node.create_client(ChangeState, f'/{node_name}/change_state')
        self._set_params = self.node.create_client(SetParameters, f'/{node_name}/set_parameters')
        self._get_params = self.node.create_client(GetParameters, f'/{node_name}/get_parameters')
        self.executor = MultiThreadedExecutor(num_threads=3, context=self.context)
        self.executor.add_node(self.node)
        self._spin_thread = threading.Thread(target=self._spin, daemon=True)
        self._spin_thread.start()
        # streamed inputs
        self.reset_inputs()
        self._stream_thread: Optional[threading.Thread] = None
        self._stream_stop = threading.Event()
        self.published_stamps: List[int] = []
        # simulated clock
        self._clock_thread: Optional[threading.Thread] = None
        self._clock_stop = threading.Event()
        self._sim_start_ns: Optional[int] = None
        self._sim_wall0 = 0.0
        self.frozen_stamp_ns: Optional[int] = None   # stamp images with this (sim time before /clock)

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:   # context shut down during teardown
            pass

    # ---- inputs --------------------------------------------------------------------------------
    def reset_inputs(self) -> None:
        with self._lock:
            self.frames = {c: make_frame(i) for i, c in enumerate(self.cameras)}
            self.camera_overrides: Dict[str, Callable[[TimeMsg], object]] = {}
            self.paused_cameras: set = set()
            self.joint_names: List[str] = list(JOINTS)
            self.joint_positions: List[float] = [0.1, -0.2, 0.3, -0.1, 0.2, 0.0]
            self.instruction: Optional[str] = INSTRUCTION
            self.enable: Optional[bool] = None        # streamed on /enable when set (the deadman)

    def set_inputs(self, **fields) -> None:
        with self._lock:
            for key, value in fields.items():
                if not hasattr(self, key):
                    raise AttributeError(key)
                setattr(self, key, value)

    def now_ns(self) -> int:
        """The stamp for inputs: sim time when the rig drives /clock, else the rig's clock."""
        if self._sim_start_ns is not None:
            return self._sim_start_ns + int((time.monotonic() - self._sim_wall0) * NS)
        if self.frozen_stamp_ns is not None:
            return self.frozen_stamp_ns
        return self.node.get_clock().now().nanoseconds

    def sim_ns_at(self, monotonic: float) -> int:
        """The sim time the rig's /clock showed at ``monotonic`` (while the clock runs)."""
        assert self._sim_start_ns is not None, 'the rig is not driving /clock'
        return self._sim_start_ns + int((monotonic - self._sim_wall0) * NS)

    def publish_frame(self, camera: str, frame: np.ndarray, stamp: Optional[TimeMsg] = None) -> None:
        self._camera_pubs[camera].publish(image_msg(frame, stamp or time_msg(self.now_ns()), camera))

    def publish_raw(self, camera: str, **fields) -> Image:
        """An Image with arbitrary fields (defaults: a valid rgb8 frame stamped now)."""
        msg = image_msg(self.frames[camera], time_msg(self.now_ns()), camera)
        for key, value in fields.items():
            setattr(msg, key, value)
        self._camera_pubs[camera].publish(msg)
        return msg

    def publish_compressed(self, topic: str, data: bytes, fmt: str = 'jpeg',
                           stamp: Optional[TimeMsg] = None) -> None:
        if topic not in self._compressed_pubs:
            self._compressed_pubs[topic] = self.node.create_publisher(
                CompressedImage, topic, QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        msg = CompressedImage(format=fmt, data=bytes(data))
        msg.header.stamp = stamp or time_msg(self.now_ns())
        self._compressed_pubs[topic].publish(msg)

    def publish_joint_state(self, names: Sequence[str], positions: Sequence[float],
                            stamp: Optional[TimeMsg] = None) -> None:
        msg = JointState(name=list(names), position=[float(p) for p in positions])
        msg.header.stamp = stamp or time_msg(self.now_ns())
        self._joint_pub.publish(msg)

    def publish_instruction(self, text: str) -> None:
        self._instruction_pub.publish(String(data=text))

    def publish_once(self) -> None:
        with self._lock:
            frames = dict(self.frames)
            overrides = dict(self.camera_overrides)
            paused = set(self.paused_cameras)
            names, positions = list(self.joint_names), list(self.joint_positions)
            instruction, enable = self.instruction, self.enable
        now = self.now_ns()
        stamp = time_msg(now)
        for camera in self.cameras:
            if camera in paused:
                continue
            if camera in overrides:
                self._camera_pubs[camera].publish(overrides[camera](stamp))
            else:
                self.publish_frame(camera, frames[camera], stamp)
        self.published_stamps.append(now)
        self.publish_joint_state(names, positions, stamp)
        if instruction is not None:
            self.publish_instruction(instruction)
        if enable is not None:
            self._enable_pub.publish(Bool(data=enable))

    def publish_estop(self, value: bool) -> None:
        self._estop_pub.publish(Bool(data=value))

    def reset_estop(self, timeout: float = 5.0) -> Trigger.Response:
        response = self._call(self._reset_estop, Trigger.Request(), timeout)
        if response is None:
            raise AssertionError(f'reset_estop: no answer in {timeout} s')
        return response

    def start_streaming(self) -> None:
        if self._stream_thread is not None:
            return
        self._stream_stop.clear()

        def loop() -> None:
            while not self._stream_stop.is_set() and self.context.ok():
                try:
                    self.publish_once()
                except Exception:   # context shut down under us
                    return
                self._stream_stop.wait(self.stream_period)

        self._stream_thread = threading.Thread(target=loop, daemon=True)
        self._stream_thread.start()

    def stop_streaming(self) -> None:
        self._stream_stop.set()
        if self._stream_thread is not None:
            self._stream_thread.join(timeout=2)
        self._stream_thread = None

    # ---- /clock --------------------------------------------------------------------------------
    def start_clock(self, start_ns: int, period_sec: float = 0.01) -> None:
        """Publish /clock from ``start_ns``, advancing with wall time (10 ms per 10 ms)."""
        self._sim_start_ns, self._sim_wall0 = start_ns, time.monotonic()
        self._clock_stop.clear()

        def loop() -> None:
            while not self._clock_stop.is_set() and self.context.ok():
                msg = Clock()
                msg.clock = time_msg(self.now_ns())
                try:
                    self._clock_pub.publish(msg)
                except Exception:
                    return
                self._clock_stop.wait(period_sec)

        self._clock_thread = threading.Thread(target=loop, daemon=True)
        self._clock_thread.start()

    def stop_clock(self) -> None:
        self._clock_stop.set()
        if self._clock_thread is not None:
            self._clock_thread.join(timeout=2)
        self._clock_thread = None
        self._sim_start_ns = None

    # ---- outputs -------------------------------------------------------------------------------
    def _on_trajectory(self, msg: JointTrajectory) -> None:
        received_ns = self.now_ns()
        with self._lock:
            self.trajectories.append(msg)
            self.trajectory_times.append(time.monotonic())
            self.trajectory_received_ns.append(received_ns)
            self._lock.notify_all()

    def subscribe(self, topic: str, msg_type) -> None:
        """Record ``msg_type`` messages on another output topic into ``extra[topic]`` (reliable, like the node)."""
        self.extra.setdefault(topic, [])

        def record(msg) -> None:
            with self._lock:
                self.extra[topic].append(msg)
                self._lock.notify_all()

        self.node.create_subscription(msg_type, topic, record,
                                      QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))

    def extra_since(self, topic: str, since: int = 0) -> List[object]:
        with self._lock:
            return list(self.extra[topic][since:])

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        if not any(status.name == STATUS_NAME for status in msg.status):
            return
        with self._lock:
            self.diagnostics.append(msg)
            del self.diagnostics[:-200]
            self._lock.notify_all()

    def clear(self) -> None:
        with self._lock:
            self.trajectories.clear()
            self.trajectory_times.clear()
            self.trajectory_received_ns.clear()
            for messages in self.extra.values():
                messages.clear()
            self.diagnostics.clear()

    def trajectory_count(self) -> int:
        with self._lock:
            return len(self.trajectories)

    def wait_for_trajectories(self, count: int, timeout: float, since: int = 0) -> List[JointTrajectory]:
        """At least ``count`` trajectories received after index ``since``; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.trajectories) - since < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f'{len(self.trajectories) - since} trajectories in {timeout} s, '
                                         f'expected {count}; last diagnostics: {self.last_diagnostics()}')
                self._lock.wait(remaining)
            return list(self.trajectories[since:])

    def trajectories_since(self, since: int) -> List[JointTrajectory]:
        with self._lock:
            return list(self.trajectories[since:])

    def last_diagnostics(self) -> Optional[Dict[str, object]]:
        """{'level', 'message', 'name', **values} of the newest status from the node."""
        with self._lock:
            if not self.diagnostics:
                return None
            status = next(s for s in self.diagnostics[-1].status if s.name == STATUS_NAME)
        values = {kv.key: kv.value for kv in status.values}
        values.update(level=status.level, message=status.message, name=status.name)
        return values

    def wait_for_diagnostics(self, predicate: Callable[[Dict[str, object]], bool] = lambda d: True,
                             timeout: float = 10.0, fresh: bool = True) -> Dict[str, object]:
        """The first status (newer than now when ``fresh``) for which ``predicate`` holds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            start = len(self.diagnostics) if fresh else 0
            if fresh:
                self.diagnostics.clear()
                start = 0
        last = None
        while time.monotonic() < deadline:
            with self._lock:
                arrays = list(self.diagnostics[start:])
                start += len(arrays)
            for array in arrays:
                status = next(s for s in array.status if s.name == STATUS_NAME)
                values = {kv.key: kv.value for kv in status.values}
                values.update(level=status.level, message=status.message, name=status.name)
                last = values
                if predicate(values):
                    return values
            with self._lock:
                self._lock.wait(0.1)
        raise AssertionError(f'no matching diagnostics in {timeout} s; last: {last}')

    # ---- services ------------------------------------------------------------------------------
    def _call(self, client, request, timeout: float):
        if not client.wait_for_service(timeout_sec=timeout):
            return None
        future = client.call_async(request)
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout):
            client.remove_pending_request(future)
            return None
        return future.result()

    def get_state(self, timeout: float = 2.0) -> Optional[str]:
        response = self._call(self._get_state, GetState.Request(), timeout)
        return None if response is None else response.current_state.label

    def change_state(self, transition: str, timeout: float = 30.0) -> bool:
        request = ChangeState.Request()
        request.transition.id = TRANSITIONS[transition]
        response = self._call(self._change_state, request, timeout)
        if response is None:
            raise AssertionError(f'change_state {transition}: no answer in {timeout} s')
        return bool(response.success)

    def set_parameters(self, timeout: float = 5.0, **values):
        """One SetParameters call; returns the list of SetParametersResult (one per value)."""
        request = SetParameters.Request()
        request.parameters = [Parameter(name, value=value).to_parameter_msg() for name, value in values.items()]
        response = self._call(self._set_params, request, timeout)
        if response is None:
            raise AssertionError(f'set_parameters {values}: no answer in {timeout} s')
        return list(response.results)

    def get_parameters(self, names: Iterable[str], timeout: float = 5.0) -> Dict[str, object]:
        names = list(names)
        response = self._call(self._get_params, GetParameters.Request(names=names), timeout)
        if response is None:
            raise AssertionError(f'get_parameters {names}: no answer in {timeout} s')
        return {name: parameter_value_to_python(value) for name, value in zip(names, response.values)}

    # ---- teardown ------------------------------------------------------------------------------
    def close(self) -> None:
        self.stop_streaming()
        self.stop_clock()
        self.executor.shutdown(timeout_sec=2)
        self.node.destroy_node()
        self.context.try_shutdown()
        self._spin_thread.join(timeout=2)


def is_hold(msg: JointTrajectory) -> bool:
    """A hold trajectory: one point, zero velocity (the arm stays where it was measured)."""
    return len(msg.points) == 1 and not any(msg.points[0].velocities)


def wait_for_policy_trajectories(rig: TestRig, count: int, timeout: float, since: int = 0) -> List[JointTrajectory]:
    """``count`` chunks from the policy (more than one point), ignoring holds in between."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunks = [m for m in rig.trajectories_since(since) if not is_hold(m)]
        if len(chunks) >= count:
            return chunks[:count]
        time.sleep(0.05)
    raise AssertionError(f'fewer than {count} policy trajectories in {timeout} s')


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = LOADED_MACHINE_WAIT_SEC) -> None:
    """Poll ``predicate`` until it holds; AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f'not within {timeout} s: {what}')
        time.sleep(0.05)


def settled_count(rig: TestRig, quiet: float = 2.0, timeout: float = LOADED_MACHINE_WAIT_SEC) -> int:
    """The trajectory count once nothing has arrived for ``quiet`` seconds: what a node still had in flight (a
    loaded machine delivers the last ticks of a finished input late) is counted before, not after."""
    deadline = time.monotonic() + timeout
    count, since = rig.trajectory_count(), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() > deadline:
            raise AssertionError(f'trajectories kept arriving for {timeout} s')
        time.sleep(0.05)
        if rig.trajectory_count() != count:
            count, since = rig.trajectory_count(), time.monotonic()
    return count


def assert_no_new_trajectories(rig: TestRig, seconds: float, settle: float = 0.6) -> None:
    """After ``settle`` (one tick may be in flight), nothing arrives for ``seconds``."""
    time.sleep(settle)
    before = rig.trajectory_count()
    time.sleep(seconds)
    after = rig.trajectory_count()
    assert after == before, f'{after - before} trajectories arrived while none should'


def assert_no_policy_after_hold(rig: TestRig, since: int, seconds: float) -> None:
    """For ``seconds``, no policy trajectory follows the first hold received after index ``since``. One writer
    delivers in order, so whatever the node published before the hold arrived before it: nothing after the hold
    can be a tick that was already in flight, whatever the machine's load."""
    trajectories = rig.trajectories_since(since)
    first_hold = next((i for i, m in enumerate(trajectories) if is_hold(m)), None)
    assert first_hold is not None, 'no hold received'
    time.sleep(seconds)
    after = [m for m in rig.trajectories_since(since + first_hold + 1) if not is_hold(m)]
    assert after == [], f'{len(after)} policy trajectories after the hold: {after}'


def diag_int(values: Optional[Dict[str, object]], key: str) -> int:
    if not values or key not in values:
        return 0
    return int(values[key])


def finite(values: Iterable[float]) -> bool:
    return all(math.isfinite(v) for v in values)


# ---- camera clocks (test_camera_clock_dds.py, bench/bench_camera_clock.py) -----------------------------------
# A step case: the first camera's stamps moved by this much (ns), then back.
CLOCK_STEPS = {'1e6 s ahead': 10**6 * NS, '1e6 s behind': -(10**6) * NS, '5 s forward': 5 * NS, '5 s back': -5 * NS}


def shifted_frames(rig: TestRig, camera: str, offset: Callable[[int], int]) -> Callable[[TimeMsg], Image]:
    """A camera override: the frame the rig would send, its stamp moved by ``offset(stamp_ns)`` ns."""
    return lambda stamp: image_msg(rig.frames[camera], time_msg(stamp_ns(stamp) + offset(stamp_ns(stamp))), camera)


def glitched_once(rig: TestRig, camera: str, offset_ns: int) -> Callable[[TimeMsg], Image]:
    """A camera override: the next frame stamped ``offset_ns`` away, every later one as sent."""
    sent = []

    def frame(stamp: TimeMsg) -> Image:
        moved = 0 if sent else offset_ns
        sent.append(stamp_ns(stamp))
        return image_msg(rig.frames[camera], time_msg(stamp_ns(stamp) + moved), camera)
    return frame


def first_chunk_observed_since(rig: TestRig, start_ns: int, timeout: float, since: int = 0) -> float:
    """stamp_mode observation: the monotonic time at which the first policy chunk stamped at or after ``start_ns``
    (the rig's clock, the node's: computed from frames sent after it) arrived; AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with rig._lock:
            received = list(zip(rig.trajectories[since:], rig.trajectory_times[since:]))
        for msg, at in received:
            if not is_hold(msg) and stamp_ns(msg.header.stamp) >= start_ns:
                return at
        time.sleep(0.02)
    raise AssertionError(f'no policy chunk observed after {start_ns} ns within {timeout} s; last diagnostics: '
                         f'{rig.last_diagnostics()}')


def implausible_stamps(rig: TestRig, chunk_sec: float, allowance_sec: float = 2.5,
                       ahead_sec: float = 0.1) -> List[str]:
    """stamp_mode observation: every policy chunk must be stamped at an observation the node could have made:
    not after the rig received it, and not so long before that the whole chunk (``chunk_sec``) was due before
    it was published, give or take ``allowance_sec`` of delivery on a loaded machine (the rig's callbacks were
    seen 1.1 s late with the suite on two workers). The window stays under the 5 s clock step of the jump tests,
    so a frame timed from a stale estimate is still caught. Ahead of receipt, ``ahead_sec``: a camera clock that
    drifts ahead is header-timed until camera_clock auto's estimate calls it another clock, so its last frames
    before that are a few tens of ms ahead of their receipt; a stale estimate after a 5 s step is seconds ahead.
    Holds: stamp zero."""
    with rig._lock:
        received = list(zip(rig.trajectories, rig.trajectory_received_ns))
    found = []
    for msg, at in received:
        stamp = stamp_ns(msg.header.stamp)
        if is_hold(msg):
            if stamp != 0:
                found.append(f'a hold stamped {stamp}')
        elif not at - int((chunk_sec + allowance_sec) * NS) <= stamp <= at + int(ahead_sec * NS):
            found.append(f'a chunk stamped {(stamp - at) / NS:+.3f} s from its receipt')
    return found
