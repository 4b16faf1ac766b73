"""Offline evaluation: a rosbag2 through the node's own tick path, on bag time.

    vla_policy_replay BAG --params config/demo.yaml [--checkpoint DIR] --output OUT [--seed N]
    vla_policy_replay --dataset DIR [--episodes 3,4] --params ... --output OUT    (replay/dataset_replay.py)

Messages are fed to the same InputBuffer the node's callbacks fill; control
ticks run at ``control_rate_hz`` on bag time through the same TickEngine
(assembly checks, runtime, trajectory building). Outputs in OUT/:
  trajectories/   rosbag2 with what went to the controllers, one topic per output (`outputs`; without it,
                  the JointTrajectory topic), stamped in bag time
  summary.json    ticks, skips by reason, cache figures, latency p50/p95/max,
                  per-joint error against a recorded command topic when present
  chunks.png      predicted chunks over recorded joint positions, per joint
  latency.png     latency per tick, cache hits and misses marked
  handover.png    consecutive trajectories overlaid at each hand-over, and the jump of each
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ..observation import InputBuffer, InputKind, SkipTick, joint_positions
from ..outputs import split
from ..params import ParameterError, load_params_file, resolve_values, validate
from ..policy.checkpoint import CheckpointError
from ..policy.config_fields import ConfigError
from ..policy.tokenizer import TokenizerError
from ..safety import PlanKind, Review
from ..settings import Configured, configure
from ..tick import TickEngine, TickOutcome
from .bag_io import BagError, BagWriter, bag_topics, read_messages, require_topics, storage_of
from .bag_time import Due, on_bag_time, replayed_topics
from .report import ReplayResult, TickRecord, write_report
from .rosbags_msgs import output_message

NS_PER_SEC = 1_000_000_000
DEFAULT_COMMAND_TOPIC = '/joint_command'


class ReplayError(RuntimeError):
    """A replay that cannot run; the message says what to fix."""


def _recorded_positions(msg: Any, names: Sequence[str], topic: str) -> np.ndarray:
    """A recorded joint state in ``names`` order, NaN where it cannot be mapped (for plots and errors only)."""
    try:
        return joint_positions(msg, names, topic)
    except SkipTick:
        return np.full(len(names), np.nan)


class OfflineReplay:
    """Walks a bag in time order and runs the node's ticks on bag time."""

    def __init__(self, configured: Configured, values: Mapping[str, Any], latency_ms: float = 0.0) -> None:
        self.runtime = configured.runtime
        self.layout = configured.layout
        self.settings = configured.settings
        self.outputs = configured.outputs
        self.values = dict(values)
        # configure resolved the layout's topics in the root namespace: the absolute names a bag records.
        self.inputs = self.layout.by_topic()
        self.period_ns = int(round(NS_PER_SEC / float(self.values['control_rate_hz'])))
        self.buffer = InputBuffer()
        self.engine = TickEngine(self.runtime)
        # Simulated time from an observation to the publication of its chunk, so a bag gives the same
        # trajectories every run (the measured compute time is recorded beside it, not used).
        self.latency_ns = int(round(latency_ms * 1e6))

    def required_topics(self) -> Dict[str, Optional[str]]:
        """Cameras and joint states must be in the bag; the instruction may come from the parameter."""
        return {entry.topic: entry.msg_type for entry in self.layout.cameras + (self.layout.joint_states,)}

    def _tick(self, time_ns: int, writer: BagWriter) -> TickRecord:
        # The replay ticks on the timer grid: a slow simulated tick does not delay the next one.
        outcome: TickOutcome = self.engine.run(self.buffer, self.settings, time_ns,
                                               clock=lambda: time_ns + self.latency_ns)
        record = TickRecord(time_ns=time_ns, supervisor=self.engine.supervisor.label,
                            publish_ns=outcome.publish_ns or time_ns)
        self._publish(outcome.review, outcome.publish_ns or time_ns, writer, record)
        if outcome.skip is not None:
            record.skipped = outcome.skip.reason.value
            return record
        record.cache_hit = outcome.chunk.cache_hit
        record.timings_ms = dict(outcome.chunk.timings_ms)
        record.continued = outcome.chunk.continued
        record.handover = outcome.handover
        plan = outcome.publish if outcome.review.kind is PlanKind.POLICY else None
        if plan is not None:
            record.plan_start_ns = plan.stamp_ns or outcome.publish_ns
            record.plan_times_sec = plan.times_sec
            record.plan_positions = plan.positions
        return record

    def _publish(self, review: Review, time_ns: int, writer: BagWriter, record: Optional[TickRecord] = None) -> None:
        """What the supervisor lets out goes into the output bag at its publication time, as the node sends it:
        one message per output, all from the one plan."""
        if review.kind is PlanKind.HOLD and record is not None:
            record.hold = True
        if review.plan is None or self.values['dry_run']:
            return

        def write(plan) -> None:
            for output, command in split(plan, self.outputs, time_ns):
                writer.write(output.topic, time_ns, output_message(output, command))

        if self.engine.supervisor.release(review, write):
            self.engine.stats.record_published(review.kind)

    def run(self, bag: Path, output: Path, command_topic: Optional[str] = None,
            progress: bool = True) -> ReplayResult:
        topics = require_topics(bag, self.required_topics())
        names = self.settings.joint_names
        state_topic = self.layout.joint_states.topic
        if command_topic and command_topic not in topics:
            raise BagError(f'command topic {command_topic} is not in the bag')
        wanted = replayed_topics(self.layout, topics, command_topic)
        output.mkdir(parents=True, exist_ok=True)
        records: List[TickRecord] = []
        recorded_t, recorded_p, command_t, command_p = [], [], [], []
        messages = read_messages(bag, sorted(wanted))
        with BagWriter(output / 'trajectories', storage=storage_of(bag)) as writer:
            for entry in self.outputs:
                writer.add_topic(entry.topic, entry.msg_type)
            active = False
            for message in on_bag_time(_progress(messages, progress, bag), self.period_ns):
                if isinstance(message, Due):       # ticks see the inputs received before them, as on the robot
                    records.append(self._tick(message.time_ns, writer))
                    continue
                if not active:
                    self.engine.activate(message.timestamp_ns)       # as the node activates before its ticks
                    active = True
                msg = message.msg
                entry = self.inputs.get(message.topic)
                if entry is not None:
                    self.buffer.put(entry, msg, message.timestamp_ns)
                    if entry.kind in (InputKind.ENABLE, InputKind.ESTOP):    # an e-stop holds now, as on the robot
                        self._publish(self.engine.supervise(self.buffer, self.settings, message.timestamp_ns),
                                      message.timestamp_ns, writer)
                if message.topic == state_topic:
                    recorded_t.append(message.timestamp_ns)
                    recorded_p.append(_recorded_positions(msg, names, state_topic))
                elif message.topic == command_topic:
                    command_t.append(message.timestamp_ns)
                    command_p.append(_recorded_positions(msg, names, command_topic))
        return self.report(output, records, (recorded_t, recorded_p), (command_t, command_p), bag, command_topic)

    def report(self, output: Path, records: List[TickRecord], recorded: tuple, command: tuple, source: Path,
               command_topic: Optional[str], spans: Optional[List[tuple]] = None,
               described: Optional[Mapping[str, Any]] = None) -> ReplayResult:
        """The ticks' result and its report (summary.json, plots) in ``output``; ``recorded`` and ``command``:
        (times ns, positions in joint_names order), ``spans``: the stretches the command covers."""
        names = self.settings.joint_names
        result = ReplayResult(output=output, records=records, joint_names=names,
                              recorded_times_ns=np.asarray(recorded[0], dtype=np.int64),
                              recorded_positions=np.asarray(recorded[1]).reshape(-1, len(names)),
                              command_times_ns=np.asarray(command[0], dtype=np.int64),
                              command_positions=np.asarray(command[1]).reshape(-1, len(names)), summary={},
                              command_spans=spans)
        result.summary = write_report(result, self.engine.stats, self.runtime, bag=source, values=self.values,
                                      command_topic=command_topic, latency_ms=self.latency_ns / 1e6,
                                      supervisor=self.engine.supervisor, source=described)
        return result


def _progress(messages, enabled: bool, bag: Path):
    if not enabled:
        return messages
    from tqdm import tqdm
    return tqdm(messages, desc=f'replaying {Path(bag).name}', unit='msg', file=sys.stderr)


def replay_values(params: Optional[Path], checkpoint: Optional[str], seed: Optional[int],
                  overrides: Optional[Mapping[str, Any]], latency_ms: float) -> Dict[str, Any]:
    """The parameter values a replay runs with: the params file, the overrides, --checkpoint and --seed,
    validated; the seed 0 unless one is given (a replay is deterministic by default); on bag time
    (use_sim_time)."""
    raw = load_params_file(params) if params else {}
    raw.update(overrides or {})
    if checkpoint:
        raw['checkpoint_path'] = checkpoint
    if seed is not None:
        raw['seed'] = seed
    values = resolve_values(raw)
    validate(values)  # before the seed default below, so a bad seed is named as given
    if values['seed'] < 0:
        values['seed'] = 0
    values['use_sim_time'] = True       # the replay's clock is bag time, the /clock a live replay publishes
    if not (latency_ms >= 0 and np.isfinite(latency_ms)):
        raise ReplayError(f'--latency-ms must be a finite number >= 0, got {latency_ms}')
    return values


def replay(bag: Path, params: Optional[Path], output: Path, checkpoint: Optional[str] = None,
           seed: Optional[int] = None, command_topic: Optional[str] = DEFAULT_COMMAND_TOPIC,
           progress: bool = False, overrides: Optional[Mapping[str, Any]] = None,
           latency_ms: float = 0.0) -> ReplayResult:
    """Library entry point (the CLI and tests call this)."""
    if not (Path(bag) / 'metadata.yaml').exists():
        raise BagError(f'no rosbag2 bag at {bag} (expected a folder with metadata.yaml)')
    values = replay_values(params, checkpoint, seed, overrides, latency_ms)
    topics = bag_topics(bag)
    configured = configure(values)  # the node's configure path: same checks, same order, same warm-up
    command = command_topic if command_topic and command_topic in topics else None
    return OfflineReplay(configured, values, latency_ms).run(Path(bag), Path(output), command_topic=command,
                                                             progress=progress)


# The replay of LeRobotDataset episodes (--dataset) builds on OfflineReplay, so the command reaches it by name,
# as backends.py names its loaders: no import circle between the two modules.
DATASET_REPLAY = 'vla_policy_node.replay.dataset_replay'


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog='vla_policy_replay', description=__doc__.split('\n\n')[0])
    parser.add_argument('bag', type=Path, nargs='?', help='rosbag2 folder (sqlite3 or mcap)')
    parser.add_argument('--dataset', type=Path,
                        help='instead of a bag: a LeRobotDataset folder (vla_policy_bag_to_lerobot), its episodes '
                             'replayed through the same ticks (frames from the videos, action as the command)')
    parser.add_argument('--episodes', help="with --dataset: the episodes, e.g. '3,4' or '0-9' (default all)")
    parser.add_argument('--params', type=Path, help="the node's params YAML (same file as for the robot)")
    parser.add_argument('--checkpoint', help='overrides checkpoint_path from the params file')
    parser.add_argument('--output', type=Path, required=True, help='folder for the report (created)')
    parser.add_argument('--seed', type=int, help='noise seed (default: params seed, else 0)')
    parser.add_argument('--command-topic', default=DEFAULT_COMMAND_TOPIC,
                        help='recorded command topic (sensor_msgs/JointState) to compare against, if in the bag')
    parser.add_argument('--latency-ms', type=float, default=0.0,
                        help='simulated time from an observation to the publication of its chunk (deterministic; '
                             'default 0): actions that fall due meanwhile are dropped and drive the RTC delay')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')
    args = parser.parse_args(argv)
    if (args.bag is None) == (args.dataset is None):
        parser.error('give a bag or --dataset DIR (one of them)')
    if args.episodes and args.dataset is None:
        parser.error('--episodes selects episodes of --dataset')
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)
    try:
        if args.dataset is not None:
            source = importlib.import_module(DATASET_REPLAY)
            result = source.replay_dataset(args.dataset, source.parse_episodes(args.episodes), args.params,
                                           args.output, checkpoint=args.checkpoint, seed=args.seed,
                                           progress=not args.no_progress, latency_ms=args.latency_ms)
        else:
            result = replay(args.bag, args.params, args.output, checkpoint=args.checkpoint, seed=args.seed,
                            command_topic=args.command_topic, progress=not args.no_progress,
                            latency_ms=args.latency_ms)
    except (BagError, ReplayError, ParameterError, CheckpointError, ConfigError, TokenizerError) as exc:
        print(f'vla_policy_replay: error: {exc}', file=sys.stderr)
        return 2
    summary = result.summary
    entry = summary['cache']['entry_bytes']
    print(f"ticks {summary['ticks']}, published {summary['published']}, skipped {summary['skipped_total']} "
          f"{summary['skipped']}, cache hits {summary['cache']['hits']} / misses {summary['cache']['misses']}"
          + (f" (one entry {entry} bytes)" if entry is not None else ''))
    errors = summary.get('command_error')
    if errors:
        print(f"RMSE against {summary['command_topic']}: "
              + ', '.join(f"{joint} {figures['rmse']:.4f}" for joint, figures in errors.items()))
    total = summary['latency_ms'].get('total')
    if total:
        print(f"latency p50 {total['p50']:.1f} ms, p95 {total['p95']:.1f} ms, max {total['max']:.1f} ms")
    print(f'report in {result.output}: summary.json, chunks.png, latency.png, handover.png, trajectories/')
    return 0


if __name__ == '__main__':
    sys.exit(main())
