"""One control tick, the same for the live node and the offline replay.

    InputBuffer --assemble--> Observation --runtime.infer--> ActionChunk --build_plan--> TrajectoryPlan

Anything wrong on the way becomes a SkipTick with a reason; nothing invalid
leaves this module. The caller (node or replay) owns the clock and the output.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Deque, Dict, Optional, Tuple

import numpy as np

from .observation import (AssembledObservation, InputBuffer, InputLayout, ObservationError, SkipReason, SkipTick,
                          TimingLimits)
from .runtime import STAGES, ActionChunk, PolicyRuntime
from .trajectory import TrajectoryError, TrajectoryPlan, build_plan

LATENCY_WINDOW = 200


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
    num_steps: int = 10
    seed: Optional[int] = None          # None: fresh noise every tick
    cache_enabled: bool = True
    max_instruction_length: int = 500


@dataclass
class TickOutcome:
    now_ns: int
    plan: Optional[TrajectoryPlan] = None
    chunk: Optional[ActionChunk] = None
    skip: Optional[SkipTick] = None
    assembled: Optional[AssembledObservation] = None


class TickStats:
    """Counters and latency windows for diagnostics and replay summaries (thread-safe)."""

    def __init__(self, window: int = LATENCY_WINDOW) -> None:
        self._lock = threading.Lock()
        self.ticks = 0
        self.chunks = 0
        self.published = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.clipped = 0
        self.skipped: Dict[str, int] = collections.Counter()
        self._latency: Dict[str, Deque[float]] = {stage: collections.deque(maxlen=window)
                                                  for stage in STAGES + ('total',)}
        self.last_skip: Optional[SkipTick] = None

    def record(self, outcome: TickOutcome) -> None:
        with self._lock:
            self.ticks += 1
            if outcome.skip is not None:
                self.skipped[outcome.skip.reason.value] += 1
                self.last_skip = outcome.skip
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
            if outcome.plan is not None and outcome.plan.clipped:
                self.clipped += 1

    def record_published(self) -> None:
        with self._lock:
            self.published += 1

    def latency_summary(self) -> Dict[str, Dict[str, float]]:
        """Per stage: p50, p95 and max in ms over the recent window."""
        with self._lock:
            return self.latency_summary_unlocked()

    @property
    def skipped_total(self) -> int:
        with self._lock:
            return sum(self.skipped.values())

    def snapshot(self) -> 'TickStatsSnapshot':
        """A consistent copy for another thread (diagnostics) while ticks keep updating."""
        with self._lock:
            return TickStatsSnapshot(ticks=self.ticks, chunks=self.chunks, published=self.published,
                                     clipped=self.clipped, skipped=dict(self.skipped), last_skip=self.last_skip,
                                     latency=self.latency_summary_unlocked())

    def latency_summary_unlocked(self) -> Dict[str, Dict[str, float]]:
        summary = {}
        for stage, values in self._latency.items():
            if values:
                array = np.asarray(values)
                summary[stage] = {'p50': float(np.percentile(array, 50)), 'p95': float(np.percentile(array, 95)),
                                  'max': float(array.max())}
        return summary


@dataclass(frozen=True)
class TickStatsSnapshot:
    ticks: int
    chunks: int
    published: int
    clipped: int
    skipped: Dict[str, int]
    last_skip: Optional[SkipTick]
    latency: Dict[str, Dict[str, float]]

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


class TickEngine:
    """Runs ticks against a runtime; owns no clock and publishes nothing."""

    def __init__(self, runtime: PolicyRuntime, stats: Optional[TickStats] = None) -> None:
        self.runtime = runtime
        self.stats = stats or TickStats()

    def run(self, buffer: InputBuffer, settings: TickSettings, now_ns: int) -> TickOutcome:
        outcome = TickOutcome(now_ns=now_ns)
        try:
            if now_ns == 0:
                # use_sim_time before the first /clock: time is 0, no age or stamp means anything yet.
                raise SkipTick(SkipReason.WAITING_FOR_CLOCK, 'use_sim_time is set and no /clock has arrived')
            outcome.assembled = buffer.assemble(settings.layout, settings.limits, now_ns)
            outcome.chunk = self._infer(outcome.assembled, settings)
            outcome.plan = self._plan(outcome.chunk, outcome.assembled, settings)
        except SkipTick as skip:
            outcome.skip = skip
        self.stats.record(outcome)
        return outcome

    def _infer(self, assembled: AssembledObservation, settings: TickSettings) -> ActionChunk:
        try:
            return self.runtime.infer(assembled.observation, seed=settings.seed, num_steps=settings.num_steps,
                                      use_cache=settings.cache_enabled,
                                      max_instruction_length=settings.max_instruction_length)
        except ObservationError as exc:
            raise SkipTick(exc.reason, str(exc), settings.layout.topic_of(exc.field)) from exc

    @staticmethod
    def _plan(chunk: ActionChunk, assembled: AssembledObservation, settings: TickSettings) -> TrajectoryPlan:
        stamp_ns = assembled.stamp_ns if settings.stamp_mode == 'observation' else 0
        same_joints = settings.layout.state_joint_names == settings.joint_names
        try:
            return build_plan(chunk.actions, settings.joint_names, settings.action_period_sec,
                              settings.execute_steps, stamp_ns, settings.lower_limits, settings.upper_limits,
                              current=assembled.current_positions if same_joints else None)
        except TrajectoryError as exc:
            raise SkipTick(SkipReason.INVALID_ACTIONS, f'policy output not published: {exc}') from exc


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
