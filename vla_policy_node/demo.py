"""The demo: the real node as its own process, a sample bag replayed into it live over DDS.

    python -m vla_policy_node.demo [--output artifacts/demo] [--rate 1.0] [--policy pi0|pi05|smolvla]

1. writes the embedded default if missing: a tiny pi0 with RANDOM weights in
   the lerobot layout, and a sample bag (3 cameras, instruction, joint states,
   command topic);
2. starts `vla_policy_node` with config/demo.yaml under use_sim_time;
3. replays the bag with /clock, shows ticks, latency and cache hit rate from
   /diagnostics, and records the trajectories that arrive into a bag;
4. runs the offline evaluation on the same bag (plots, summary, output bag).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
DEMO_PARAMS = ROOT / 'config' / 'demo.yaml'
SHIPPED_PARAMS = ROOT / 'config' / 'vla_policy.yaml'
TRAJECTORY_TYPE = 'trajectory_msgs/msg/JointTrajectory'
ACTIVE_TIMEOUT_SEC = 120.0


def _say(text: str) -> None:
    print(text, flush=True)


def prepare(output: Path, policy: str = 'pi0') -> Dict[str, Path]:
    """The tiny checkpoint (of the ``policy`` family) and the sample bag, made only when missing."""
    from .policy.tiny_default import write_tiny_default
    from .replay.make_bag import SampleBagSpec, write_sample_bag

    paths = {'checkpoint': output / f'tiny_{policy}', 'bag': output / 'sample_bag'}
    if not (paths['checkpoint'] / 'model.safetensors').exists():
        shutil.rmtree(paths['checkpoint'], ignore_errors=True)
        write_tiny_default(paths['checkpoint'], policy)
        _say(f'[demo] wrote the tiny {policy} checkpoint (RANDOM weights) to {paths["checkpoint"]}')
    if not (paths['bag'] / 'metadata.yaml').exists():
        shutil.rmtree(paths['bag'], ignore_errors=True)
        write_sample_bag(paths['bag'], SampleBagSpec(duration_sec=6.0))
        _say(f'[demo] wrote a 6 s sample bag to {paths["bag"]}')
    return paths


def node_command(checkpoint: Path) -> List[str]:
    script = shutil.which('vla_policy_node')
    launcher = [script] if script else [sys.executable, '-m', 'vla_policy_node.ros.main']
    return launcher + ['--ros-args', '--params-file', str(DEMO_PARAMS), '-p', f'checkpoint_path:={checkpoint}',
                       '-p', 'use_sim_time:=true', '-p', 'stamp_mode:=observation']


class Monitor:
    """Watches the node over DDS: lifecycle state, /diagnostics, trajectories (recorded to a bag)."""

    def __init__(self, context, trajectory_topic: str, bag_path: Path) -> None:
        from rclpy.node import Node
        from rclpy.parameter import Parameter
        from diagnostic_msgs.msg import DiagnosticArray
        from trajectory_msgs.msg import JointTrajectory

        self.node = Node('vla_policy_demo_monitor', context=context,
                         parameter_overrides=[Parameter('use_sim_time', value=True)])
        self.diagnostics: Dict[str, str] = {}
        self.trajectories = 0
        self.holds = 0
        self.first_stamp_ns: Optional[int] = None
        self.last_stamp_ns: Optional[int] = None
        self._lock = threading.Lock()
        # Written at close, from the main thread: rosbags' sqlite3 writer is bound to its thread.
        self._received: List[tuple] = []
        self._bag_path = bag_path
        self._topic = trajectory_topic
        self.node.create_subscription(JointTrajectory, trajectory_topic, self._on_trajectory, 10)
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics, 10)

    def _on_trajectory(self, msg) -> None:
        from rclpy.serialization import serialize_message

        stamp_ns = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        with self._lock:
            self.trajectories += 1
            # A hold (one point, zero velocity) is the safety layer keeping the arm still, not a chunk.
            self.holds += len(msg.points) == 1 and not any(msg.points[0].velocities)
            self.first_stamp_ns = self.first_stamp_ns or stamp_ns
            self.last_stamp_ns = stamp_ns
            self._received.append((self.node.get_clock().now().nanoseconds or stamp_ns, serialize_message(msg)))

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name.endswith(': policy'):
                with self._lock:
                    self.diagnostics = {kv.key: kv.value for kv in status.values}
                    self.diagnostics['_message'] = status.message

    def lifecycle_state(self, timeout: float = 2.0) -> str:
        from lifecycle_msgs.srv import GetState
        import rclpy

        client = self.node.create_client(GetState, '/vla_policy/get_state')
        try:
            if not client.wait_for_service(timeout_sec=timeout):
                return 'unreachable'
            future = client.call_async(GetState.Request())
            deadline = time.monotonic() + timeout
            while not future.done() and time.monotonic() < deadline and rclpy.ok(context=self.node.context):
                time.sleep(0.02)
            return future.result().current_state.label if future.done() else 'unreachable'
        finally:
            self.node.destroy_client(client)

    def progress_line(self, bag_time: float, bag_duration: float) -> str:
        with self._lock:
            diag = dict(self.diagnostics)
            received = self.trajectories
        return (f'[demo] bag {bag_time:4.1f}/{bag_duration:.1f} s | ticks {diag.get("ticks", "-")} | '
                f'trajectories {received} | cache hit rate {float(diag.get("cache_hit_rate", 0)):.0%} | '
                f'latency p50 {diag.get("latency_total_p50_ms", "-")} ms | skipped {diag.get("ticks_skipped", "-")}')

    def close(self) -> None:
        from .replay.bag_io import BagWriter

        with BagWriter(self._bag_path, storage='sqlite3') as writer:
            writer.add_topic(self._topic, TRAJECTORY_TYPE)
            for time_ns, raw in self._received:
                writer.write(self._topic, time_ns, raw)
        self.node.destroy_node()


def run_live(paths: Dict[str, Path], output: Path, rate: float) -> Dict[str, object]:
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor

    from .replay.bag_io import bag_topics, read_messages
    from .replay.play import play
    from .params import DEFAULT_TRAJECTORY_TOPIC
    from .settings import absolute_topic

    live_bag = output / 'live_trajectories'
    shutil.rmtree(live_bag, ignore_errors=True)
    log_path = output / 'node.log'
    # Keep the demo's DDS traffic on this machine, and let camera frames through whatever their size
    # (Fast DDS's default UDP transport drops most large frames; README "Troubleshooting"). Both before
    # rclpy reads the environment and before the node inherits it.
    os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    os.environ.setdefault('FASTDDS_BUILTIN_TRANSPORTS', 'LARGE_DATA')
    command = node_command(paths['checkpoint'])
    _say('[demo] starting the node: ' + ' '.join(command))
    with open(log_path, 'w') as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    context = Context()
    rclpy.init(context=context)
    executor = SingleThreadedExecutor(context=context)
    monitor = Monitor(context, absolute_topic(DEFAULT_TRAJECTORY_TOPIC), live_bag)
    executor.add_node(monitor.node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        deadline = time.monotonic() + ACTIVE_TIMEOUT_SEC
        state = 'unreachable'
        while time.monotonic() < deadline and process.poll() is None:
            state = monitor.lifecycle_state()
            if state == 'active':
                break
            time.sleep(0.5)
        if state != 'active':
            raise RuntimeError(f'the node did not become active (state {state}); see {log_path}')
        _say('[demo] node is active; replaying the bag live with /clock')
        times = [m.timestamp_ns for m in read_messages(paths['bag'], topics=list(bag_topics(paths['bag'])))]
        start_ns, duration = times[0], (times[-1] - times[0]) / 1e9
        last_print = [0.0]

        def on_progress(_count: int, bag_time_ns: int) -> None:
            if time.monotonic() - last_print[0] >= 1.0:
                last_print[0] = time.monotonic()
                _say(monitor.progress_line((bag_time_ns - start_ns) / 1e9, duration))

        published = play(paths['bag'], rate=rate, context=context, on_progress=on_progress,
                         wait_for_subscribers=5.0)
        time.sleep(1.5)  # the last chunks and one more /diagnostics
        _say(monitor.progress_line(duration, duration))
        return {'published': published, 'trajectories': monitor.trajectories, 'holds': monitor.holds,
                'diagnostics': monitor.diagnostics,
                'first_stamp_ns': monitor.first_stamp_ns, 'last_stamp_ns': monitor.last_stamp_ns,
                'live_bag': live_bag, 'log': log_path}
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        executor.shutdown()
        monitor.close()
        rclpy.try_shutdown(context=context)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--output', type=Path, default=ROOT / 'artifacts' / 'demo')
    parser.add_argument('--rate', type=float, default=1.0, help='bag replay speed factor')
    parser.add_argument('--policy', default='pi0', choices=('pi0', 'pi05', 'smolvla'),
                        help='the tiny random-weight policy family to run (default pi0)')
    args = parser.parse_args(argv)
    output = args.output.resolve()
    output.mkdir(parents=True, exist_ok=True)
    paths = prepare(output, args.policy)
    live = run_live(paths, output, args.rate)
    diag = live['diagnostics']
    _say('[demo] offline evaluation of the same bag (same params, same tick path)')
    from .replay.offline import replay

    report = output / 'report'
    shutil.rmtree(report, ignore_errors=True)
    result = replay(paths['bag'], DEMO_PARAMS, report, checkpoint=str(paths['checkpoint']))
    summary = result.summary
    total = summary['latency_ms'].get('total', {})
    _say('\n=== demo summary ===')
    _say(f"live over DDS: {live['trajectories'] - live['holds']} chunks and {live['holds']} holds received for "
         f"{diag.get('ticks', '?')} ticks, "
         f"cache hit rate {float(diag.get('cache_hit_rate', 0)):.0%}, latency p50 "
         f"{diag.get('latency_total_p50_ms', '?')} ms / p95 {diag.get('latency_total_p95_ms', '?')} ms, "
         f"skipped {diag.get('ticks_skipped', '?')}; stamps in bag time "
         f"{(live['first_stamp_ns'] or 0) / 1e9:.1f} .. {(live['last_stamp_ns'] or 0) / 1e9:.1f} s")
    _say(f"offline: {summary['ticks']} ticks, {summary['published']} trajectories, cache hits "
         f"{summary['cache']['hits']} / misses {summary['cache']['misses']}, latency p50 "
         f"{total.get('p50', float('nan')):.1f} ms, p95 {total.get('p95', float('nan')):.1f} ms")
    _say(f'live trajectories (rosbag2): {live["live_bag"]}')
    _say(f'node log: {live["log"]}')
    _say(f'report: {report}/summary.json, {report}/chunks.png, {report}/latency.png, {report}/handover.png, '
         f'{report}/trajectories/')
    shipped = os.path.relpath(SHIPPED_PARAMS)
    _say('\nNOTE: the policy has RANDOM weights (the embedded tiny default): the trajectories exercise the '
         f'whole pipeline but mean nothing. The shipped parameters run the same default as they are:\n'
         f'  vla_policy_node --ros-args --params-file {shipped}\n'
         f'To run a real policy, copy {shipped} to robot.yaml, set checkpoint_path (a lerobot pi0/pi0.5 '
         'pretrained_model folder), tokenizer_path, joint_names and the camera topics, then:\n'
         '  vla_policy_node --ros-args --params-file robot.yaml\n'
         '(README: "Getting a real checkpoint"; the console scripts are in .venv/bin: `. .venv/bin/activate`).')
    return 0 if live['trajectories'] else 1


if __name__ == '__main__':
    sys.exit(main())
