"""The demo: the real node as its own process, a sample bag replayed into it live over DDS.

    python -m vla_policy_node.demo [--output artifacts/demo] [--rate 1.0] [--policy demo|pi0|pi05|smolvla|groot]
                                   [--remote]

1. writes the sample bag (3 cameras, instruction, joint states, command topic) and, for comparison,
   the tiny pi0 with RANDOM weights in the lerobot layout, if missing;
2. starts `vla_policy_node` with config/demo.yaml (the embedded default, builtin:demo: the same tiny
   pi0 trained on this bag by train_demo.py) under use_sim_time;
3. replays the bag with /clock, shows ticks, latency and cache hit rate from
   /diagnostics, and records the trajectories that arrive into a bag;
4. runs the offline evaluation on the same bag (plots, summary, output bag), for the trained default and
   the random weights, and prints each one's per-joint error against the recorded command (and the
   live run's).

The inputs (sample bag, random-weight checkpoints) are shared in ``--output``. What a run writes
(``node.log``, ``live_trajectories/``, ``report/``, ``report_observation/``, ``report_random/``,
``serve.log``) goes to its kind's own folder, so no run overwrites another's: ``--output`` itself for the
trained default, ``<output>/<policy>/`` for another policy, ``<output>/remote/`` or
``<output>/<policy>_remote/`` with --remote (``run_folder``).

The node runs the shipped parameters as shipped (config/demo.yaml sets the checkpoint, joints, rates and
seed, and stamp_mode stays zero): every chunk counts from its observation in both stamp modes, so the
offline evaluation once more with stamp_mode observation (printed beside it, ``report_observation/``) shows
the same error. The error is measured on the bag the policy was trained on.

``--policy pi0|pi05|smolvla|groot`` runs a tiny RANDOM-weight checkpoint of that family instead of the trained
default (the plumbing of that family, meaningless actions). With ``--remote`` the checkpoint is served by
``vla_policy_serve`` in its own process and the node and the offline evaluation both use ``backend: remote``
against it (same tick path, same results for a seed).
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
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO_PARAMS = ROOT / 'config' / 'demo.yaml'
SHIPPED_PARAMS = ROOT / 'config' / 'vla_policy.yaml'
TRAJECTORY_TYPE = 'trajectory_msgs/msg/JointTrajectory'
ACTIVE_TIMEOUT_SEC = 120.0
DEMO_CHECKPOINT = 'builtin:demo'
# (start ns: the trajectory's stamp, or when it arrived for a zero stamp; time_from_start [K] s; positions
# [K, J]; when it arrived, ns, optional) of one published chunk, in bag time.
Plan = Tuple
# The stamp mode the offline evaluation is run with once more, for comparison (chunks count from their
# observation in both modes, so both errors are alike).
COMPARED_STAMP_MODE = {'stamp_mode': 'observation'}


def _say(text: str) -> None:
    print(text, flush=True)


def prepare(output: Path, policy: str = 'demo') -> Dict[str, Path]:
    """The checkpoint the demo runs (``demo``: the trained default; else a tiny RANDOM-weight one of that
    family), the random-weight pi0 it is compared with, and the sample bag; made only when missing."""
    from .policy.builtin import checkpoint_folder
    from .policy.families import EMBEDDED_TYPE
    from .policy.tiny_default import write_tiny_default
    from .replay.make_bag import write_sample_bag
    from .train_demo import DEMO_BAG_SPEC

    # The comparison: the embedded default's own model with random weights.
    paths = {'random': output / f'tiny_{EMBEDDED_TYPE}_random', 'bag': output / 'sample_bag'}
    paths['checkpoint'] = checkpoint_folder(DEMO_CHECKPOINT) if policy == 'demo' else output / f'tiny_{policy}'
    for name, family, what in (('random', EMBEDDED_TYPE, 'for comparison'),
                               ('checkpoint', policy, 'the demo runs it')):
        if family == 'demo' or (paths[name] / 'model.safetensors').exists():
            continue
        shutil.rmtree(paths[name], ignore_errors=True)
        write_tiny_default(paths[name], family)
        _say(f'[demo] wrote the tiny {family} with RANDOM weights ({what}) to {paths[name]}')
    if not (paths['bag'] / 'metadata.yaml').exists():
        shutil.rmtree(paths['bag'], ignore_errors=True)
        write_sample_bag(paths['bag'], DEMO_BAG_SPEC)
        _say(f'[demo] wrote a {DEMO_BAG_SPEC.duration_sec:g} s sample bag to {paths["bag"]}')
    return paths


def command_error_of(plans: Sequence[Plan], bag: Path, joint_names: Sequence[str]) -> Optional[Dict[str, Any]]:
    """Per joint: RMSE/MAE of published chunks (from their start in bag time; points already due when one
    arrived, where that is known, left out) against the bag's recorded command, exactly as the offline report
    computes it (replay/report.py command_error)."""
    from .observation import joint_positions
    from .bags.bag_io import read_messages
    from .replay.make_bag import COMMAND_TOPIC
    from .replay.report import ReplayResult, TickRecord, command_error

    times, positions = [], []
    for message in read_messages(bag, [COMMAND_TOPIC]):
        times.append(message.timestamp_ns)
        positions.append(joint_positions(message.msg, joint_names, COMMAND_TOPIC))
    records = [TickRecord(time_ns=start, plan_start_ns=start, plan_times_sec=np.asarray(offsets, dtype=np.float64),
                          plan_positions=np.asarray(points, dtype=np.float64),
                          publish_ns=int(arrived[0]) if arrived else 0)
               for start, offsets, points, *arrived in plans]
    joints = len(joint_names)
    result = ReplayResult(output=bag, records=records, joint_names=list(joint_names),
                          recorded_times_ns=np.zeros(0, dtype=np.int64), recorded_positions=np.zeros((0, joints)),
                          command_times_ns=np.asarray(times, dtype=np.int64),
                          command_positions=np.asarray(positions, dtype=np.float64).reshape(-1, joints), summary={})
    return command_error(result)


def _ratio_title(a: str, b: str) -> str:
    """``trained offline`` / ``pi0 random offline`` -> ``trained/pi0 random``: the words both end with dropped."""
    a_words, b_words = a.split(), b.split()
    while len(a_words) > 1 and len(b_words) > 1 and a_words[-1] == b_words[-1]:
        a_words, b_words = a_words[:-1], b_words[:-1]
    return f"{' '.join(a_words)}/{' '.join(b_words)}"


def error_table(columns: Dict[str, Optional[Dict[str, Any]]], ratio: Optional[Tuple[str, ...]] = None,
                ratios: Sequence[Tuple[str, ...]] = ()) -> List[str]:
    """Lines of a per-joint RMSE table, one column per run (None: no figures); each of ``ratio`` and ``ratios``,
    (a, b) or (a, b, title), adds a column a / b. Each column as wide as its title."""
    pairs = ([ratio] if ratio else []) + list(ratios)
    names = next((list(e) for e in columns.values() if e), [])
    titles = list(columns) + [pair[2] if len(pair) > 2 else _ratio_title(*pair[:2]) for pair in pairs]
    widths = [max(len(title), 6) + 2 for title in titles]
    lines = [f"{'joint':<10}" + ''.join(f'{title:>{width}}' for title, width in zip(titles, widths))]
    for name in names + ['mean']:
        values: Dict[str, Optional[float]] = {}
        for title, errors in columns.items():
            values[title] = None if not errors else (
                float(np.mean([e['rmse'] for e in errors.values()])) if name == 'mean' else errors[name]['rmse'])
        cells = [None if value is None else f'{value:.4f}' for value in values.values()]
        for pair in pairs:
            a, b = values[pair[0]], values[pair[1]]
            cells.append(None if a is None or not b else f'{a / b:.1%}')
        lines.append(f'{name:<10}' + ''.join(f"{cell or '-':>{width}}" for cell, width in zip(cells, widths)))
    return lines


def node_command(checkpoint: Path, remote: Optional[Dict[str, object]] = None) -> List[str]:
    script = shutil.which('vla_policy_node')
    launcher = [script] if script else [sys.executable, '-m', 'vla_policy_node.ros.main']
    extra = [arg for name, value in (remote or {}).items() for arg in ('-p', f'{name}:={value}')]
    return launcher + ['--ros-args', '--params-file', str(DEMO_PARAMS), '-p', f'checkpoint_path:={checkpoint}',
                       '-p', 'use_sim_time:=true',
                       '-p', f'diagnostics_period_sec:={DIAGNOSTICS_PERIOD_SEC}'] + extra


# The node's figures come with its /diagnostics; this often, so the progress line's ticks are fresh.
DIAGNOSTICS_PERIOD_SEC = 0.25


def ms_text(value: Any) -> str:
    """A latency in ms with one decimal, or ``-`` while there is no figure (missing, empty, nan)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return '-'
    return f'{number:.1f} ms' if np.isfinite(number) else '-'


def _plural(count: int, word: str) -> str:
    return f'{count} {word}' + ('' if count == 1 else 's')


def progress_text(bag_time: float, bag_duration: float, diag: Dict[str, str], diag_age_sec: Optional[float],
                  received: int, holds: int = 0) -> str:
    """One progress line: the node's own counts (one /diagnostics message, so ticks and published agree) and,
    apart, the trajectories this monitor received live (``holds`` of them holds, which the node does not count
    as published chunks: the hold it sends once joint states arrive)."""
    if diag_age_sec is None:
        node = 'node: no /diagnostics yet'
    else:
        node = (f'node: ticks {diag.get("ticks", "-")}, published {diag.get("chunks_published", "-")}, '
                f'skipped {diag.get("ticks_skipped", "-")}, cache hit rate '
                f'{float(diag.get("cache_hit_rate", 0)):.0%}, latency p50 '
                f'{ms_text(diag.get("latency_total_p50_ms"))} ({diag_age_sec:.1f} s ago)')
    held = f' ({_plural(holds, "hold")})' if holds else ''
    return f'[demo] bag {bag_time:4.1f}/{bag_duration:.1f} s | {node} | received {received} trajectories{held}'


def start_server(checkpoint: Path, run: Path) -> Tuple[subprocess.Popen, Dict[str, object]]:
    """vla_policy_serve on a free loopback port (its log in the run's folder), and the node parameters that point
    at it."""
    import re

    log_path = run / 'serve.log'
    script = shutil.which('vla_policy_serve')
    command = ([script] if script else [sys.executable, '-m', 'vla_policy_node.remote.server'])
    with open(log_path, 'w') as log:
        process = subprocess.Popen(command + ['--checkpoint', str(checkpoint), '--port', '0'], stdout=log,
                                   stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + ACTIVE_TIMEOUT_SEC
    while time.monotonic() < deadline and process.poll() is None:
        found = re.findall(r'on ws://127\.0\.0\.1:(\d+) ', log_path.read_text(errors='replace'))
        if found:
            _say(f'[demo] vla_policy_serve is serving the checkpoint on ws://127.0.0.1:{found[-1]}/')
            return process, {'backend': 'remote', 'remote_url': f'ws://127.0.0.1:{found[-1]}/',
                             'remote_key_layout': 'cameras', 'remote_image_size': 0, 'remote_timeout_sec': 5.0}
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f'vla_policy_serve did not start; see {log_path}')


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
        self.diagnostics_at: Optional[float] = None      # time.monotonic() of the last /diagnostics
        self.trajectories = 0
        self.holds = 0
        self.plans: List[Plan] = []
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
        arrived_ns = self.node.get_clock().now().nanoseconds      # bag time (/clock): a zero stamp starts here
        with self._lock:
            self.trajectories += 1
            # A hold (one point, zero velocity) is the safety layer keeping the arm still, not a chunk.
            hold = len(msg.points) == 1 and not any(msg.points[0].velocities)
            self.holds += hold
            if not hold:
                self.plans.append((stamp_ns or arrived_ns,
                                   np.array([p.time_from_start.sec + p.time_from_start.nanosec / 1e9
                                             for p in msg.points]),
                                   np.array([list(p.positions) for p in msg.points]), arrived_ns))
            self.first_stamp_ns = self.first_stamp_ns or stamp_ns or arrived_ns
            self.last_stamp_ns = stamp_ns or arrived_ns
            self._received.append((arrived_ns or stamp_ns, serialize_message(msg)))

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name.endswith(': policy'):
                with self._lock:
                    self.diagnostics = {kv.key: kv.value for kv in status.values}
                    self.diagnostics['_message'] = status.message
                    self.diagnostics_at = time.monotonic()

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
            diag, at, received, holds = dict(self.diagnostics), self.diagnostics_at, self.trajectories, self.holds
        return progress_text(bag_time, bag_duration, diag, None if at is None else time.monotonic() - at, received,
                             holds)

    def close(self) -> None:
        from .bags.bag_io import BagWriter

        with BagWriter(self._bag_path, storage='sqlite3') as writer:
            writer.add_topic(self._topic, TRAJECTORY_TYPE)
            for time_ns, raw in self._received:
                writer.write(self._topic, time_ns, raw)
        self.node.destroy_node()


def run_live(paths: Dict[str, Path], run: Path, rate: float,
             remote: Optional[Dict[str, object]] = None) -> Dict[str, object]:
    import rclpy
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor

    from .bags.bag_io import bag_topics, read_messages
    from .replay.play import play
    from .params import DEFAULT_TRAJECTORY_TOPIC
    from .settings import absolute_topic

    live_bag = run / 'live_trajectories'
    shutil.rmtree(live_bag, ignore_errors=True)
    log_path = run / 'node.log'
    # Keep the demo's DDS traffic on this machine, and let camera frames through whatever their size
    # (Fast DDS's default UDP transport drops most large frames; docs/troubleshooting.md). Both before
    # rclpy reads the environment and before the node inherits it.
    os.environ.setdefault('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    os.environ.setdefault('FASTDDS_BUILTIN_TRANSPORTS', 'LARGE_DATA')
    command = node_command(paths['checkpoint'], remote)
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
                'plans': list(monitor.plans),
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
    from .policy.families import known_types

    parser.add_argument('--policy', default='demo', choices=('demo',) + known_types(),
                        help='demo: the trained default (builtin:demo); a policy type ('
                             f'{", ".join(known_types())}): a tiny RANDOM-weight checkpoint of that family')
    parser.add_argument('--remote', action='store_true',
                        help='serve the checkpoint with vla_policy_serve and run node and replay with backend remote')
    args = parser.parse_args(argv)
    output = args.output.resolve()
    output.mkdir(parents=True, exist_ok=True)
    paths = prepare(output, args.policy)
    run = run_folder(output, args.policy, args.remote)
    run.mkdir(parents=True, exist_ok=True)
    server, remote = start_server(paths['checkpoint'], run) if args.remote else (None, None)
    try:
        return _run(paths, run, args, remote)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)


def run_folder(output: Path, policy: str, remote: bool) -> Path:
    """Where one kind of run writes its node.log, live_trajectories/, report/, report_observation/, report_random/
    and serve.log:
    ``output`` for the trained default (the README's paths), ``output/<policy>``, ``output/remote`` or
    ``output/<policy>_remote`` for the others."""
    name = ('' if policy == 'demo' else policy) + ('_remote' if remote else '')
    return output / name.lstrip('_') if name else output


def summary_stamp_mode(params: Path) -> str:
    """The stamp_mode a params file runs with (the table's default where the file sets none)."""
    from .params import load_params_file, resolve_values
    return str(resolve_values(load_params_file(params))['stamp_mode'])


def closing_note(policy: str, checkpoint: Path) -> str:
    """The NOTE after the summary: what this run's checkpoint is, and how to run the default and a real policy."""
    shipped = os.path.relpath(SHIPPED_PARAMS)
    if policy == 'demo':
        head = ('NOTE: the embedded default (builtin:demo) is a tiny pi0 trained on this sample bag only: it follows '
                'the recorded motion and knows nothing else (a hold\'s end, which nothing in the inputs announces, '
                'it cannot predict).')
    else:
        head = (f'NOTE: this run used a tiny {policy} with RANDOM weights ({checkpoint}): it shows that family\'s '
                'plumbing (inputs, tick path, outputs, latency) only; its actions are meaningless. '
                'The trained default is `python -m vla_policy_node.demo` (builtin:demo, a tiny pi0 trained on '
                'this sample bag).')
    return (f'{head} The shipped parameters run the trained default as they are:\n'
            f'  vla_policy_node --ros-args --params-file {shipped}\n'
            f'To run a real policy, copy {shipped} to robot.yaml, set checkpoint_path (a lerobot pi0, pi0.5, '
            'SmolVLA or GR00T N1.7 pretrained_model folder), tokenizer_path, joint_names and the camera topics, '
            'then:\n'
            '  vla_policy_node --ros-args --params-file robot.yaml\n'
            '(docs/checkpoints.md; the console scripts are in .venv/bin: `. .venv/bin/activate`).')


def _run(paths: Dict[str, Path], run: Path, args: argparse.Namespace, remote: Optional[Dict[str, object]]) -> int:
    live = run_live(paths, run, args.rate, remote)
    diag = live['diagnostics']
    _say('[demo] offline evaluation of the same bag (same params, same tick path)')
    from .replay.offline import replay

    report, random_report, compared_report = run / 'report', run / 'report_random', run / 'report_observation'
    for folder in (report, random_report, compared_report):
        shutil.rmtree(folder, ignore_errors=True)
    result = replay(paths['bag'], DEMO_PARAMS, report, checkpoint=str(paths['checkpoint']), overrides=remote)
    compared = replay(paths['bag'], DEMO_PARAMS, compared_report, checkpoint=str(paths['checkpoint']),
                      overrides=dict(COMPARED_STAMP_MODE, **(remote or {})))
    random_result = replay(paths['bag'], DEMO_PARAMS, random_report, checkpoint=str(paths['random']))
    summary = result.summary
    live_error = command_error_of(live['plans'], paths['bag'], result.joint_names) if live['plans'] else None
    total = summary['latency_ms'].get('total', {})
    holds = int(live['holds'])
    _say('\n=== demo summary ===')
    if remote is not None:
        _say(f"backend: remote, against vla_policy_serve at {remote['remote_url']} (node and offline evaluation); "
             f"node's remote figures: latency p50 {ms_text(diag.get('remote_latency_p50_ms'))} / p95 "
             f"{ms_text(diag.get('remote_latency_p95_ms'))} (round trip), connected "
             f"{diag.get('remote_connected', '?')}, reconnects {diag.get('remote_reconnects', '?')}, "
             f"connect failures {diag.get('remote_connect_failures', '?')}; server log: {run / 'serve.log'}")
    chunks = _plural(live['trajectories'] - holds, 'chunk')
    why = ', the one the node sends once joint states arrive' if holds == 1 else ''
    _say(f"live over DDS: received {live['trajectories']} trajectories ({chunks} and {_plural(holds, 'hold')}{why}) "
         f"for "
         f"{diag.get('ticks', '?')} ticks, "
         f"cache hit rate {float(diag.get('cache_hit_rate', 0)):.0%}, latency p50 "
         f"{ms_text(diag.get('latency_total_p50_ms'))} / p95 {ms_text(diag.get('latency_total_p95_ms'))}, "
         f"skipped {diag.get('ticks_skipped', '?')}; trajectories start in bag time "
         f"{(live['first_stamp_ns'] or 0) / 1e9:.1f} .. {(live['last_stamp_ns'] or 0) / 1e9:.1f} s")
    _say(f"offline: {summary['ticks']} ticks, {summary['published']} trajectories, cache hits "
         f"{summary['cache']['hits']} / misses {summary['cache']['misses']}, latency p50 "
         f"{ms_text(total.get('p50'))}, p95 {ms_text(total.get('p95'))}")
    _say(f'live trajectories (rosbag2): {live["live_bag"]}')
    _say(f'node log: {live["log"]}')
    _say(f'report: {report}/ (summary.json, chunks.png, latency.png, handover.png, trajectories/)')
    _say(f'report of the random-weight pi0: {random_report}/')
    _say('\nper-joint RMSE against the recorded /joint_command [rad], on the bag the policy was trained on, seed '
         f"{summary['seed']}, stamp_mode {summary_stamp_mode(DEMO_PARAMS)} (shipped) unless named:")
    ran = 'trained' if args.policy == 'demo' else f'{args.policy} (random)'
    columns = {f'{ran} offline': summary['command_error'],
               'observation offline': compared.summary['command_error'],
               'pi0 random offline': random_result.summary['command_error'], f'{ran} live': live_error}
    # The shipped stamp mode against observation, and the live run against the offline one; a ratio of two random
    # models means nothing: only the trained default gets trained/random.
    ratios = [(f'{ran} offline', 'observation offline', 'zero/observation'),
              (f'{ran} live', f'{ran} offline', 'live/offline')]
    if args.policy == 'demo':
        ratios.insert(0, (f'{ran} offline', 'pi0 random offline', 'trained/random'))
    for line in error_table(columns, ratios=ratios):
        _say('  ' + line)
    _say('\n' + closing_note(args.policy, paths['checkpoint']))
    return 0 if live['trajectories'] else 1


if __name__ == '__main__':
    sys.exit(main())
