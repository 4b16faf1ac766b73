"""One control tick, the same for the live node and the offline replay.

    InputBuffer --assemble--> Observation --runtime.infer--> ActionChunk --build_plan--> TrajectoryPlan
                 hand-over: leftover + delay ---^        publication time ---^--> take-over figures

Anything wrong on the way becomes a SkipTick with a reason; nothing invalid
leaves this module. The caller (node or replay) owns the clock and the output;
it passes the clock so a chunk can be timed from its publication. Every chunk
counts from its observation (handover.py); a tick that only repeats the executing
chunk's observation is skipped as repeated_observation, no fault, and the chunk goes on;
one whose chunk would be all due before it could be published (the executing chunk ran out
on the same frames) is skipped as chunk_elapsed before inference, not after it.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Callable, Deque, Dict, List, Optional, Tuple

import numpy as np

from .observation import (AssembledObservation, CameraClock, InputBuffer, InputLayout, Measured, ObservationError,
                          SkipReason, SkipTick, TimingLimits)
from .images import DEFAULT_MAX_PIXELS
from .stamp_clock import ClockEvent
from .handover import ChunkHandover, Continuation, ExecutingChunk, HandoverMetrics, elapsed_actions
from .policy.rtc import RTCSettings
from .runtime import STAGES, ActionChunk, PolicyRuntime
from .safety import PlanKind, Review, SafetySettings, SafetySupervisor
from .trajectory import TrajectoryError, TrajectoryPlan, build_plan, published_range

LATENCY_WINDOW = 200
HANDOVER_FIGURES = ('jump_max', 'overlap_mean')


@dataclass(frozen=True)
class TickSettings:
    """What one tick needs from the parameters: the fixed input layout and the live values."""

    layout: InputLayout
    limits: TimingLimits
    joint_names: Tuple[str, ...]
    action_period_sec: float = 0.1
    execute_steps: int = 0              # 0: the whole chunk
    stamp_mode: str = 'zero'
    lower_limits: Tuple[float, ...] = ()
    upper_limits: Tuple[float, ...] = ()
    num_steps: int = 0                  # 0: the checkpoint's num_inference_steps
    seed: Optional[int] = None          # None: fresh noise every tick
    cache_enabled: bool = True
    max_instruction_length: int = 500
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    rtc: Optional[RTCSettings] = None   # chunking 'rtc': continue the executing chunk; None: independent
    delay_mode: str = 'measured'        # how d is estimated (handover.DelayEstimator)
    delay_window: int = 20
    delay_steps: int = 0
    safety: SafetySettings = SafetySettings()
    repeated_state_tolerance: float = 1e-3    # joints closer than this to the executing chunk's: a repeat

    @property
    def period_ns(self) -> int:
        return int(round(self.action_period_sec * 1e9))


@dataclass
class TickOutcome:
    now_ns: int
    plan: Optional[TrajectoryPlan] = None
    chunk: Optional[ActionChunk] = None
    skip: Optional[SkipTick] = None
    assembled: Optional[AssembledObservation] = None
    origin_ns: int = 0                         # the observation time the chunk's actions count from
    publish_ns: int = 0                        # when it was ready to publish
    delay: int = 0                             # the estimated inference delay d it was computed with
    elapsed: int = 0                           # actions of the chunk already due at publication
    handover: Optional[HandoverMetrics] = None
    review: Review = dataclasses.field(default_factory=Review)   # what the safety supervisor lets out
    # Input clock jumps and outliers seen since the previous tick (stamp_clock.py).
    clock_events: List[ClockEvent] = dataclasses.field(default_factory=list)

    @property
    def publish(self) -> Optional[TrajectoryPlan]:
        """What goes to the controller: the (shaped) policy plan, a hold, or nothing."""
        return self.review.plan

    def warnings(self, reporter: 'ThrottledReporter') -> List[str]:
        """The log lines of this tick, each throttled per kind and topic: the clock events, then the skip (a
        repeated observation is no fault: the executing chunk goes on, unlogged)."""
        lines = [event.describe() for event in self.clock_events       # per direction: there and back both said
                 if reporter.should_report(f'clock_{"jump" if event.jump else "outliers"}:{event.topic}:'
                                           f'{event.shift_ns > 0}')]
        skip = self.skip
        if skip is not None and skip.reason.fault and reporter.should_report(f'{skip.reason}:{skip.topic}'):
            lines.append(f'tick skipped {skip.describe()}')
        return lines


class TickStats:
    """Counters and latency windows for diagnostics and replay summaries (thread-safe)."""

    def __init__(self, window: int = LATENCY_WINDOW) -> None:
        self._lock = threading.Lock()
        self.ticks = 0
        self.chunks = 0
        self.published = 0                     # policy chunks sent to the controller
        self.holds_published = 0               # hold trajectories sent to the controller
        self.cache_hits = 0
        self.cache_misses = 0
        self.clipped = 0
        self.skipped: Dict[str, int] = collections.Counter()
        self._latency: Dict[str, Deque[float]] = {stage: collections.deque(maxlen=window)
                                                  for stage in STAGES + ('total',)}
        self._handover: Dict[str, Deque[float]] = {name: collections.deque(maxlen=window)
                                                   for name in HANDOVER_FIGURES}
        self.handovers = 0
        self.continued = 0                     # chunks steered by the previous one (rtc)
        self.delay = 0                         # the last estimated inference delay, in actions
        self.last_skip: Optional[SkipTick] = None  # the latest fault (SkipReason.fault)
        self.timings_clock = ''                # how the latest chunk's stage timings were measured
        self.camera_clock: Optional[CameraClock] = None       # the latest observation's clock and why
        self.camera_clocks: Dict[str, int] = collections.Counter()   # observations per clock
        self.joint_state_clock: Optional[CameraClock] = None
        # Per input (camera name, joint_states): stamp clock jumps, and messages set aside as outliers.
        self.clock_jumps: Dict[str, int] = collections.Counter()
        self.clock_outliers: Dict[str, int] = collections.Counter()

    def record(self, outcome: TickOutcome) -> None:
        with self._lock:
            self.ticks += 1
            if outcome.skip is not None:
                self.skipped[outcome.skip.reason.value] += 1
                if outcome.skip.reason.fault:
                    self.last_skip = outcome.skip
            if outcome.assembled is not None:
                self.camera_clock = outcome.assembled.clock
                self.camera_clocks[outcome.assembled.clock.name] += 1
                self.joint_state_clock = outcome.assembled.joint_clock
            for event in outcome.clock_events:
                if event.jump:
                    self.clock_jumps[event.input] += 1
                else:
                    self.clock_outliers[event.input] += event.messages
            chunk = outcome.chunk
            if chunk is not None:
                self.chunks += 1
                if chunk.cache_hit:
                    self.cache_hits += 1
                else:
                    self.cache_misses += 1
                for stage in STAGES:
                    self._latency[stage].append(chunk.timings_ms.get(stage, 0.0))
                self._latency['total'].append(chunk.total_ms)
                self.timings_clock = getattr(chunk, 'timings_clock', '')
                self.continued += int(chunk.continued)
                self.delay = outcome.delay
            if outcome.plan is not None and outcome.plan.clipped:
                self.clipped += 1
            if outcome.handover is not None:
                self.handovers += 1
                for name in HANDOVER_FIGURES:
                    value = getattr(outcome.handover, name)
                    if np.isfinite(value):
                        self._handover[name].append(value)

    def record_published(self, kind: PlanKind) -> None:
        """A trajectory went to the controller: a policy chunk, or a hold (counted apart)."""
        with self._lock:
            if kind is PlanKind.HOLD:
                self.holds_published += 1
            else:
                self.published += 1

    def latency_summary(self) -> Dict[str, Dict[str, float]]:
        """Per stage: p50, p95 and max in ms over the recent window."""
        with self._lock:
            return _percentiles(self._latency)

    def handover_summary(self) -> Dict[str, Dict[str, float]]:
        """Hand-over jump and overlap disagreement (joint units): p50, p95 and max over the recent window."""
        with self._lock:
            return _percentiles(self._handover)

    @property
    def skipped_total(self) -> int:
        with self._lock:
            return sum(self.skipped.values())

    def snapshot(self) -> 'TickStatsSnapshot':
        """A consistent copy for another thread (diagnostics) while ticks keep updating."""
        with self._lock:
            return TickStatsSnapshot(ticks=self.ticks, chunks=self.chunks, published=self.published,
                                     holds_published=self.holds_published,
                                     clipped=self.clipped, skipped=dict(self.skipped), last_skip=self.last_skip,
                                     latency=_percentiles(self._latency), handover=_percentiles(self._handover),
                                     continued=self.continued, delay=self.delay,
                                     timings_clock=self.timings_clock, camera_clock=self.camera_clock,
                                     joint_state_clock=self.joint_state_clock, clock_jumps=dict(self.clock_jumps),
                                     clock_outliers=dict(self.clock_outliers))


def _percentiles(windows: Dict[str, Deque[float]]) -> Dict[str, Dict[str, float]]:
    summary = {}
    for name, values in windows.items():
        if values:
            array = np.asarray(values)
            summary[name] = {'p50': float(np.percentile(array, 50)), 'p95': float(np.percentile(array, 95)),
                             'max': float(array.max())}
    return summary


@dataclass(frozen=True)
class TickStatsSnapshot:
    ticks: int
    chunks: int
    published: int
    holds_published: int
    clipped: int
    skipped: Dict[str, int]
    last_skip: Optional[SkipTick]
    latency: Dict[str, Dict[str, float]]
    handover: Dict[str, Dict[str, float]] = dataclasses.field(default_factory=dict)
    continued: int = 0
    delay: int = 0
    timings_clock: str = ''      # 'cuda_events' or 'host' (runtime.ActionChunk.timings_clock); '' before a chunk
    camera_clock: Optional[CameraClock] = None    # the latest observation's clock and why; None before one
    joint_state_clock: Optional[CameraClock] = None
    clock_jumps: Dict[str, int] = dataclasses.field(default_factory=dict)       # per input
    clock_outliers: Dict[str, int] = dataclasses.field(default_factory=dict)    # per input, messages

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    @property
    def faults_total(self) -> int:
        """Skipped ticks that were faults (not waiting for /clock, not a repeated observation)."""
        return sum(count for reason, count in self.skipped.items() if SkipReason(reason).fault)


class TickEngine:
    """Runs ticks against a runtime, keeps the chunk hand-over and the safety supervisor; owns no clock and
    publishes nothing.

    Every plan it lets out (``outcome.publish``) is taken to be handed to the controller (dry_run
    included, so a dry run reports what the robot would have done); the caller publishes it through
    ``supervisor.release``, which drops a policy plan that an e-stop overtook.
    """

    def __init__(self, runtime: PolicyRuntime, stats: Optional[TickStats] = None) -> None:
        self.runtime = runtime
        self.stats = stats or TickStats()
        self.handover = ChunkHandover()
        self.supervisor = SafetySupervisor()

    def activate(self, now_ns: int) -> Review:
        """Nothing of an earlier activation is executing; policy trajectories may flow (ramped in)."""
        self.handover.reset()
        return self.supervisor.activate(now_ns)

    def deactivate(self, buffer: InputBuffer, settings: TickSettings, now_ns: int) -> Review:
        """Hold the arm where it is measured (deactivate, shutdown)."""
        self.handover.reset()
        return self.supervisor.deactivate(settings.joint_names, self.measured(buffer, settings, now_ns),
                                          settings.safety)

    def clock_jumped(self, buffer: InputBuffer, settings: TickSettings, now_ns: int, back_sec: float) -> Review:
        """ROS time jumped back by ``back_sec``: hold where the arm was last measured, drop the frames and the
        joint state of the old timeline (stamped in the new one's future: camera_future, camera_skew) and the
        executing chunk; ticks go on as soon as new inputs arrive."""
        measured = buffer.measured(settings.joint_names, settings.layout.joint_states.topic, settings.limits, now_ns,
                                   max_age_sec=float('inf'))
        buffer.drop_timed(back_sec)
        self.handover.reset()
        return self.supervisor.clock_jumped(
            settings.joint_names, measured, settings.safety, now_ns,
            f'ROS time jumped back by {back_sec:.2f} s (a bag played again or looped, a simulator reset): inputs '
            'received before the jump are dropped')

    def supervise(self, buffer: InputBuffer, settings: TickSettings, now_ns: int) -> Review:
        """Operator inputs and the no-trajectory timeout between ticks (on an operator message, each period)."""
        review = self.supervisor.supervise(buffer.operator_inputs(now_ns), settings.joint_names,
                                           self.measured(buffer, settings, now_ns), settings.safety, now_ns)
        if review.kind is PlanKind.HOLD:
            self.handover.reset()
        return review

    @staticmethod
    def measured(buffer: InputBuffer, settings: TickSettings, now_ns: int) -> Measured:
        return buffer.measured(settings.joint_names, settings.layout.joint_states.topic, settings.limits, now_ns)

    def run(self, buffer: InputBuffer, settings: TickSettings, now_ns: int,
            clock: Optional[Callable[[], int]] = None) -> TickOutcome:
        """One tick at ``now_ns``; ``clock()`` gives the publication time after inference (default: now_ns)."""
        outcome = TickOutcome(now_ns=now_ns, clock_events=buffer.take_clock_events())
        try:
            if now_ns == 0:
                # use_sim_time before the first /clock: time is 0, no age or stamp means anything yet.
                raise SkipTick(SkipReason.WAITING_FOR_CLOCK, 'use_sim_time is set and no /clock has arrived')
            outcome.assembled = buffer.assemble(settings.layout, settings.limits, now_ns)
            outcome.origin_ns = outcome.assembled.stamp_ns       # both stamp modes: the observation's time
            if self.handover.repeated(outcome.assembled, settings, now_ns, settings.repeated_state_tolerance):
                raise SkipTick(SkipReason.REPEATED_OBSERVATION, 'the executing chunk\'s observation again (same '
                               'frames, joints, instruction and settings): that chunk goes on')
            self._refuse_elapsed(outcome, settings, now_ns)
            continuation = self._continuation(outcome, settings)
            outcome.chunk = self._infer(outcome.assembled, settings, continuation)
            outcome.publish_ns = clock() if clock is not None else now_ns
            outcome.plan = self._plan(outcome, settings)
        except SkipTick as skip:
            outcome.skip = skip
        self._review(outcome, buffer, settings)
        self.stats.record(outcome)
        return outcome

    def fail(self, buffer: InputBuffer, settings: TickSettings, now_ns: int, error: BaseException) -> TickOutcome:
        """A tick that raised: counted as internal_error and reviewed like any skipped tick (on_fault hold)."""
        outcome = TickOutcome(now_ns=now_ns, skip=SkipTick(SkipReason.INTERNAL_ERROR, repr(error)))
        self._review(outcome, buffer, settings)
        self.stats.record(outcome)
        return outcome

    def _review(self, outcome: TickOutcome, buffer: InputBuffer, settings: TickSettings) -> None:
        """The supervisor's say, then the hand-over: a shaped policy plan takes over (its figures measured on
        what will be executed); a hold, or a plan slowed down in time, leaves nothing to continue."""
        now_ns = outcome.now_ns
        outcome.review = review = self.supervisor.review(
            outcome.plan, outcome.skip.reason if outcome.skip is not None else None, settings.joint_names,
            buffer.operator_inputs(now_ns),
            self.measured(buffer, settings, now_ns), settings.safety, now_ns, outcome.publish_ns or now_ns)
        if review.kind is PlanKind.POLICY and not review.timing_changed:
            plan, elapsed = review.plan, outcome.elapsed
            executed = plan.positions[elapsed - plan.first_action:]         # what the controller will execute
            outcome.handover = self.handover.take_over(
                ExecutingChunk(outcome.origin_ns, settings.period_ns, elapsed, outcome.chunk.actions, executed,
                               outcome.assembled, settings), elapsed)
        elif review.kind is not None:
            self.handover.reset()

    def _refuse_elapsed(self, outcome: TickOutcome, settings: TickSettings, now_ns: int) -> None:
        """chunk_elapsed before inference: a chunk counts from its observation, so one whose published actions
        would all be due by now (an observation as old as the chunk is long: the executing chunk ran out and
        the frames repeat, or a camera slower than execute_steps) is decided here, not computed and then
        dropped. chunk_size bounds every chunk the backend returns, so no publishable chunk is refused."""
        horizon = getattr(self.runtime.config, 'chunk_size', None)
        if not horizon:
            return
        end = published_range(int(horizon), settings.execute_steps)
        if elapsed_actions(outcome.origin_ns, now_ns, settings.period_ns) >= end:
            age_ms = (now_ns - outcome.origin_ns) / 1e6
            raise SkipTick(SkipReason.CHUNK_ELAPSED, f'the observation is {age_ms:.0f} ms old at the tick: all {end} '
                           'published actions of its chunk would already be due (not computed)')

    def _continuation(self, outcome: TickOutcome, settings: TickSettings) -> Continuation:
        delay = self.handover.delays.estimate(settings.delay_mode, settings.delay_window, settings.delay_steps)
        if settings.rtc is not None and settings.rtc.mode == 'trained':
            # The checkpoint learned to continue at most this many; lerobot's rollout clamps too.
            delay = min(delay, self.runtime.config.rtc_training_max_delay)
        outcome.delay = delay
        if settings.rtc is None:
            return Continuation(None, delay)
        return self.handover.continuation(outcome.origin_ns, delay)

    def _infer(self, assembled: AssembledObservation, settings: TickSettings,
               continuation: Continuation) -> ActionChunk:
        try:
            return self.runtime.infer(assembled.observation, seed=settings.seed, num_steps=settings.num_steps,
                                      use_cache=settings.cache_enabled,
                                      max_instruction_length=settings.max_instruction_length,
                                      max_image_pixels=settings.max_image_pixels,
                                      prev_actions=continuation.leftover,
                                      inference_delay=continuation.delay, rtc=settings.rtc)
        except ObservationError as exc:
            raise SkipTick(exc.reason, str(exc), settings.layout.topic_of(exc.field)) from exc

    def _plan(self, outcome: TickOutcome, settings: TickSettings) -> TrajectoryPlan:
        """The chunk as a trajectory from its first action not yet due; either way action i is due at
        origin + (i + 1) * period, the origin the observation's time.

        stamp_mode zero: the actions due by publication are dropped and the rest timed from the publication
        (time_from_start (i + 1) * period - (publication - origin)).
        stamp_mode observation: every point, stamped at the observation; the controller drops the
        elapsed ones itself (so clocks must agree).
        """
        chunk, assembled = outcome.chunk, outcome.assembled
        outcome.elapsed = elapsed = elapsed_actions(outcome.origin_ns, outcome.publish_ns, settings.period_ns)
        end = published_range(chunk.actions.shape[0], settings.execute_steps)
        if elapsed >= end:
            late_ms = (outcome.publish_ns - outcome.origin_ns) / 1e6
            raise SkipTick(SkipReason.CHUNK_ELAPSED, f'published {late_ms:.0f} ms after the observation: all {end} '
                           'published actions were already due')
        observation_stamp = settings.stamp_mode == 'observation'
        first = 0 if observation_stamp else elapsed
        same_joints = settings.layout.state_joint_names == settings.joint_names
        try:
            plan = build_plan(chunk.actions, settings.joint_names, settings.action_period_sec,
                              settings.execute_steps, outcome.origin_ns if observation_stamp else 0,
                              settings.lower_limits, settings.upper_limits,
                              current=assembled.current_positions if same_joints else None, first=first,
                              elapsed_sec=0.0 if observation_stamp else (outcome.publish_ns - outcome.origin_ns) / 1e9)
        except TrajectoryError as exc:
            raise SkipTick(SkipReason.INVALID_ACTIONS, f'policy output not published: {exc}') from exc
        return plan


class ThrottledReporter:
    """At most one report per key per period (per-fault throttling; rclpy's throttle is per call site)."""

    def __init__(self, period_sec: float = 5.0) -> None:
        self.period_sec = period_sec
        self._last: Dict[str, float] = {}

    def should_report(self, key: str) -> bool:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.period_sec:
            return False
        self._last[key] = now
        return True
