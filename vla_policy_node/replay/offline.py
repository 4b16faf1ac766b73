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

import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from ..observation import InputBuffer, InputKind, SkipTick, joint_positions
from ..outputs import split
from ..params import load_params_file, resolve_values, validate
from ..safety import PlanKind, Review
from ..settings import Configured, configure
from ..tick import TickEngine, TickOutcome
from ..bags.bag_io import BagError, BagWriter, bag_topics, read_messages, require_topics, storage_of
from ..bags.bag_time import DEFAULT_COMMAND_TOPIC, Due, on_bag_time, replayed_topics
from .report import ReplayResult, TickRecord, write_report
from .rosbags_msgs import output_message

NS_PER_SEC = 1_000_000_000


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
            record.fault = outcome.skip.describe()
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
                              command_spans=spans, outputs=self.outputs)
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
