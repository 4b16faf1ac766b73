"""Chunk hand-over: the chunk being executed, what is left of it, and how late a new chunk arrives.

Times are ns on the node's clock. A chunk is computed for an observation at its
origin o, in both stamp modes: the time of its newest camera frame in the node's
clock (observation.py: the header stamp, or the receive time less the delay
beyond the camera's smallest, per camera_clock), as lerobot and openpi policies
learn chunks from the camera stamp of their observation. Its action i is due at
o + (i + 1) * p, p = action_period_sec: with stamp_mode observation trajectory
point i sits at time_from_start (i + 1) * p after the stamp o; with zero the
actions due by publication t are dropped and the rest sit at (i + 1) * p - (t - o).

A tick whose observation repeats the executing chunk's (the same frames, joints
within repeated_state_tolerance, instruction and settings: seed, chunking ...)
carries nothing new: the chunk goes on and the tick is skipped as
repeated_observation (no fault), whatever the chunking and the seed; a sample of
fresh noise for it would only swap one guess at the same scene for another.

    tick at o_N:   executing chunk C --align--> leftover = C's published actions not yet due
                   delay d = actions expected to elapse before the new chunk is out (estimated)
    publish at t:  elapsed e = actions of the new chunk already due at t (measured)
                   -> first published action; hand-over jump and overlap against C

lerobot measures the delay from wall-clock latency and (at 7427f318) keeps a
running maximum that one slow warm-up inference inflates for good; its PR 4223
measures it from the actions actually consumed instead. Here the delay is the
largest number of actions that elapsed during recent inferences (a window of
ticks, the first chunk after activation excluded), or a fixed number.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Deque, Optional

import numpy as np

from .observation import AssembledObservation

CHUNKING_MODES = ('independent', 'rtc')
DELAY_MODES = ('measured', 'fixed')
NS_PER_SEC = 1_000_000_000


@dataclass(frozen=True)
class ExecutingChunk:
    """A chunk handed to the controller: its origin and the actions [first, end) it published."""

    origin_ns: int
    period_ns: int
    first: int
    actions: np.ndarray               # [H, A] the whole chunk, robot units
    positions: np.ndarray             # [end - first, J] what the controller executes (after limits)
    observed: Optional[AssembledObservation] = None    # what it was computed from
    settings: Any = None              # the tick settings it was computed with (tick.TickSettings)

    @property
    def end(self) -> int:
        return self.first + self.positions.shape[0]

    def due_ns(self, index: np.ndarray) -> np.ndarray:
        return self.origin_ns + (np.asarray(index, dtype=np.int64) + 1) * self.period_ns

    def position_at(self, time_ns: np.ndarray) -> np.ndarray:
        """Where this trajectory commands the arm at ``time_ns`` [N] -> [N, J]: linear between points,
        the first point before it, the last point held after it (as a trajectory controller ends)."""
        due = self.due_ns(np.arange(self.first, self.end)).astype(np.float64)
        return np.stack([np.interp(np.asarray(time_ns, dtype=np.float64), due, self.positions[:, j])
                         for j in range(self.positions.shape[1])], axis=1)


@dataclass(frozen=True)
class Continuation:
    """What a new chunk continues: the leftover (robot units [T, A], or None) and the estimated delay d.

    In robot units, absolute: the runtime re-anchors it to the new observation (relative-action
    checkpoints) and normalises it."""

    leftover: Optional[np.ndarray]
    delay: int


@dataclass(frozen=True)
class HandoverMetrics:
    """At the moment a new trajectory takes over: how far it is from where the old one would be."""

    jump_max: float              # largest per-joint |new - old| at the new trajectory's first point
    overlap_mean: float          # mean |new - old| over the points both trajectories cover
    elapsed: int                 # actions of the new chunk already due when it was published


class DelayEstimator:
    """Inference delay d in actions: the most that elapsed during the last ``window`` inferences."""

    def __init__(self) -> None:
        self._elapsed: Deque[int] = collections.deque(maxlen=1000)
        self._skip_next = True

    def reset(self) -> None:
        """After (re)activation: the next inference may be a slow cold one; do not count it."""
        self._elapsed.clear()
        self._skip_next = True

    def record(self, elapsed: int) -> None:
        if self._skip_next:
            self._skip_next = False
            return
        self._elapsed.append(int(elapsed))

    def estimate(self, mode: str, window: int, fixed_steps: int) -> int:
        if mode == 'fixed':
            return int(fixed_steps)
        recent = list(self._elapsed)[-int(window):]
        return max(recent) if recent else 0


class ChunkHandover:
    """The chunk being executed and the delay estimate; one per node or replay, used by the tick only."""

    def __init__(self) -> None:
        self.executing: Optional[ExecutingChunk] = None
        self.delays = DelayEstimator()

    def reset(self) -> None:
        """Nothing is executing any more (activation, a hold): the next chunk starts afresh."""
        self.executing = None
        self.delays.reset()

    def continuation(self, origin_ns: int, delay: int) -> Continuation:
        """The executing chunk aligned to a new observation at ``origin_ns``: its published actions from
        the one due with the new chunk's action 0 onwards."""
        chunk = self.executing
        if chunk is None:
            return Continuation(None, delay)
        aligned = int(round((origin_ns - chunk.origin_ns) / chunk.period_ns))   # C's action at new action 0
        if not 0 <= aligned < chunk.end:
            return Continuation(None, delay)
        # Index 0 of the leftover must be due with the new action 0, so it starts at C's aligned action even
        # when that one had elapsed before C was published (the first d of the new chunk are past anyway).
        return Continuation(chunk.actions[aligned:chunk.end], delay)

    def repeated(self, observed: AssembledObservation, settings: Any, now_ns: int, state_tolerance: float) -> bool:
        """``observed`` is the executing chunk's observation again, with the same settings, and the chunk still
        has actions ahead at ``now_ns``: a new chunk would carry nothing new."""
        chunk = self.executing
        if chunk is None or chunk.observed is None or chunk.settings != settings:
            return False
        if chunk.due_ns(np.array([chunk.end - 1]))[0] <= now_ns:
            return False                   # it ran out: the arm stands at its last point
        return observed.repeats(chunk.observed, state_tolerance)

    def take_over(self, new: ExecutingChunk, elapsed: int) -> Optional[HandoverMetrics]:
        """``new`` replaces the executing chunk; returns the hand-over figures (None for the first chunk)."""
        old, self.executing = self.executing, new
        self.delays.record(elapsed)
        if old is None:
            return None
        due = new.due_ns(np.arange(new.first, new.end))
        difference = np.abs(new.positions - old.position_at(due))                   # [N, J]
        old_end = old.due_ns(np.array([old.end - 1]))[0]
        overlap = difference[due <= old_end]
        return HandoverMetrics(jump_max=float(difference[0].max()),
                               overlap_mean=float(overlap.mean()) if overlap.size else float('nan'),
                               elapsed=int(elapsed))


def elapsed_actions(origin_ns: int, publish_ns: int, period_ns: int) -> int:
    """Actions of a chunk (action i due at origin + (i+1) p) already due at ``publish_ns``."""
    return max(0, (publish_ns - origin_ns) // period_ns)
