"""The safety supervisor: the last word on every trajectory, between the policy and the controller.

Shared by the node and the replay (no rclpy). Every tick's outcome passes ``review``;
operator inputs (deadman, e-stop) are also supervised as soon as they arrive and on
every control-timer period, so a stuck tick cannot keep the arm moving.

    state      how it is entered                                   how it is left
    ACTIVE     activation; a released hold; an e-stop reset        -
    HELD       a skipped tick (on_fault hold); no valid trajectory  by itself when a tick gives a valid
               for fault_hold_after_sec; a trajectory refused by    trajectory again (the deadman: when
               the limits (limit_mode hold); the deadman; ROS time  enable is back); deactivate: activate
               jumping back; deactivate
    ESTOP      e-stop input true                                   only reset_estop, with the input false

On entry into HELD or ESTOP one hold trajectory is published: the arm stays where it is
measured now (the latest joint state; one point, zero velocity). Without a fresh joint
state there is nothing to hold to: nothing is published, loudly, and the hold is sent
as soon as a joint state is back while still held.

Policy trajectories are shaped, in this order, before they go out:
  ramp-in     for ramp_in_sec after activation, an enable or a released hold, positions are
              blended from the measured position toward the policy's (the first point of the
              first trajectory is exactly the measured position);
  step limit  |p_i - p_(i-1)| <= max_position_step per joint, p_(-1) the measured position;
  velocity    |p_i - p_(i-1)| / (t_i - t_(i-1)) <= max_velocity per joint;
per limit_mode: clamp (move the point to the bound), stretch (steps clamped, slow segments
down in time instead of moving them) or hold (refuse the trajectory and hold).
"""
from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .observation import Measured, OperatorInputs, SkipReason, TextEnum
from .trajectory import TrajectoryPlan, finite_difference_velocities

NS_PER_SEC = 1_000_000_000
ON_FAULT_MODES = ('hold', 'continue')
LIMIT_MODES = ('clamp', 'stretch', 'hold')
# Floating-point slack when comparing a step with its bound (a clamped step sits exactly on it).
_LIMIT_TOLERANCE = 1e-9


class SupervisorState(TextEnum):
    ACTIVE = 'active'
    HELD = 'held'
    ESTOP = 'estop'


class HoldReason(TextEnum):
    """Why the arm is held; the value is the diagnostics counter suffix (holds_<reason>)."""

    INPUT_FAULT = 'input_fault'
    NO_TRAJECTORY = 'no_trajectory'
    LIMIT = 'limit'
    DEADMAN = 'deadman'
    INACTIVE = 'inactive'
    ESTOP = 'estop'
    CLOCK_JUMP = 'clock_jump'


class PlanKind(enum.Enum):
    POLICY = 'policy'
    HOLD = 'hold'


@dataclass(frozen=True)
class SafetySettings:
    """The live safety parameters (see params.py)."""

    on_fault: str = 'hold'
    fault_hold_after_sec: float = 1.0           # 0: off
    max_position_step: Tuple[float, ...] = ()   # per joint; empty: off
    max_velocity: Tuple[float, ...] = ()        # per joint; empty: off
    limit_mode: str = 'clamp'
    require_enable: bool = False
    enable_timeout_sec: float = 0.5
    ramp_in_sec: float = 0.0                    # 0: off
    hold_time_sec: float = 0.1                  # time_from_start of the hold point


@dataclass
class Review:
    """What to send to the controller after a tick or an operator event, and what happened on the way."""

    plan: Optional[TrajectoryPlan] = None
    kind: Optional[PlanKind] = None
    transitions: List[str] = field(default_factory=list)       # one log line per state change
    interventions: Dict[str, int] = field(default_factory=dict)   # '<kind>:<joint>' -> points changed
    timing_changed: bool = False                                # stretched: the chunk's timing no longer holds
    # A hold was due and nothing could be held to: said once per hold (the supervisor counts the rest);
    # ``waiting``: no joint state yet (start-up), a warning rather than an error.
    cannot_hold: str = ''
    cannot_hold_waiting: bool = False


# ---- limit math (pure) ----------------------------------------------------------------------------

def limit_increments(positions: np.ndarray, start: np.ndarray, bound: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Each point moved to within ``bound`` [N, J] of the (already limited) previous one, the first of ``start``.

    Returns the positions [N, J] and which entries moved [N, J]. Sequential, so every step of the
    result respects its bound.
    """
    limited = np.array(positions, dtype=np.float64, copy=True)
    moved = np.zeros(limited.shape, dtype=bool)
    previous = np.asarray(start, dtype=np.float64)
    for i in range(limited.shape[0]):
        step = limited[i] - previous
        clipped = np.clip(step, -bound[i], bound[i])
        moved[i] = np.abs(clipped - step) > _LIMIT_TOLERANCE
        limited[i] = previous + clipped
        previous = limited[i]
    return limited, moved


def step_bounds(times: np.ndarray, max_position_step: Sequence[float], max_velocity: Sequence[float],
                joints: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per point and joint: the largest step allowed by max_position_step, and by max_velocity over the segment."""
    count = times.shape[0]
    segments = np.diff(np.concatenate([[0.0], times]))                        # [N], the first from t = 0
    step = np.broadcast_to(np.asarray(max_position_step, dtype=np.float64) if len(max_position_step)
                           else np.full(joints, np.inf), (count, joints))
    velocity = (segments[:, None] * np.asarray(max_velocity, dtype=np.float64)[None, :] if len(max_velocity)
                else np.full((count, joints), np.inf))
    return step, velocity


def step_sizes(positions: np.ndarray, start: np.ndarray) -> np.ndarray:
    """|p_i - p_(i-1)| [N, J], p_(-1) = start."""
    return np.abs(np.diff(np.concatenate([np.asarray(start, dtype=np.float64)[None], positions]), axis=0))


def stretched_times(positions: np.ndarray, times: np.ndarray, start: np.ndarray,
                    max_velocity: Sequence[float]) -> np.ndarray:
    """Times [N] with every segment slowed down until each joint's speed is within max_velocity."""
    needed = (step_sizes(positions, start) / np.asarray(max_velocity, dtype=np.float64)[None, :]).max(axis=1)
    segments = np.diff(np.concatenate([[0.0], times]))
    return np.cumsum(np.maximum(segments, needed))


def ramp_fractions(due_ns: np.ndarray, origin_ns: int, ramp_in_sec: float) -> np.ndarray:
    """0 at the ramp's origin, 1 after ramp_in_sec, linear between: [N]."""
    return np.clip((due_ns - origin_ns) / (ramp_in_sec * NS_PER_SEC), 0.0, 1.0)


def hold_plan(joint_names: Sequence[str], positions: np.ndarray, hold_time_sec: float) -> TrajectoryPlan:
    """One point at the measured position with zero velocity: the controller stops the arm there."""
    return TrajectoryPlan(tuple(joint_names), np.array([hold_time_sec]), np.asarray(positions, dtype=np.float64)[None],
                          np.zeros((1, len(joint_names))), stamp_ns=0)


# ---- the supervisor ------------------------------------------------------------------------------

class SafetySupervisor:
    """State, hold decisions and trajectory shaping; thread-safe (ticks, operator callbacks, the timer)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.state = SupervisorState.ACTIVE
        self.reason: Optional[HoldReason] = None
        self._hold_pending = False             # a hold was due but there was nothing to hold to
        self._unheld_said = False              # ... and the review said so (once per hold)
        self.cannot_hold_count = 0     # holds that found nothing to hold to when they fell due
        self._last_valid_ns: Optional[int] = None   # the no-trajectory timeout runs from activate / the first plan
        self._ramp_pending = True
        self._ramp_origin_ns = 0
        self._ramp_anchor: Optional[np.ndarray] = None
        self.holds: Dict[str, int] = {}
        self.interventions: Dict[str, int] = {}
        self.dropped = 0                       # policy trajectories stopped at the last moment (e-stop raced a tick)

    @property
    def label(self) -> str:
        """'active', 'held: <reason>' or 'estop'."""
        with self._lock:
            if self.state is SupervisorState.HELD:
                return f'held: {self.reason}'
            return str(self.state)

    def counters(self) -> Tuple[str, Dict[str, int], Dict[str, int], int]:
        with self._lock:
            return self.label, dict(self.holds), dict(self.interventions), self.dropped

    def hold_waiting(self) -> Tuple[bool, int]:
        """(a hold is due and waits for a joint state to hold to, how many holds found none when due)."""
        with self._lock:
            return self._hold_pending, self.cannot_hold_count

    # ---- lifecycle ----------------------------------------------------------------------------------
    def activate(self, now_ns: int) -> Review:
        """Activation: policy trajectories may flow again, ramped in; an e-stop stays latched."""
        with self._lock:
            review = Review()
            if self.state is not SupervisorState.ESTOP:
                self._set(SupervisorState.ACTIVE, None, review, 'activated')
            # Under use_sim_time the clock reads 0 until the first /clock: the timeout starts there.
            self._last_valid_ns = now_ns or None
            self._ramp_pending = True
            return review

    def deactivate(self, joint_names: Sequence[str], measured: Measured, settings: SafetySettings) -> Review:
        """Deactivate or shutdown: hold the arm where it is (an e-stop stays latched)."""
        with self._lock:
            review = Review()
            if self.state is not SupervisorState.ESTOP:
                self._enter_hold(HoldReason.INACTIVE, joint_names, measured, settings, review, 'deactivated')
            return review

    # ---- operator inputs and the no-trajectory timeout --------------------------------------------------
    def supervise(self, operator: OperatorInputs, joint_names: Sequence[str], measured: Measured,
                  settings: SafetySettings, now_ns: int) -> Review:
        """E-stop, deadman and the no-trajectory timeout, at any moment (not only at ticks)."""
        with self._lock:
            review = Review()
            self._supervise(operator, joint_names, measured, settings, now_ns, review)
            return review

    def _supervise(self, operator: OperatorInputs, joint_names: Sequence[str], measured: Measured,
                   settings: SafetySettings, now_ns: int, review: Review) -> None:
        if self.state is SupervisorState.HELD and self.reason is HoldReason.INACTIVE:
            return
        if operator.estop:
            if self.state is not SupervisorState.ESTOP:
                self._enter_hold(HoldReason.ESTOP, joint_names, measured, settings, review, 'e-stop input is true')
            return
        if self.state is SupervisorState.ESTOP:
            self._retry_pending_hold(joint_names, measured, settings, review)
            return
        # A negative age is an enable "from the future": the clock jumped back (a looped bag, a simulator
        # reset). It proves nothing about the operator now, so it does not count as fresh.
        fresh = operator.enable is True and 0.0 <= operator.enable_age_sec <= settings.enable_timeout_sec
        if settings.require_enable and not fresh:
            why = ('no enable message yet' if operator.enable is None else
                   'enable is false' if not operator.enable else
                   f'the last enable is {operator.enable_age_sec:.2f} s old (enable_timeout_sec '
                   f'{settings.enable_timeout_sec})')
            self._enter_hold(HoldReason.DEADMAN, joint_names, measured, settings, review, why)
        elif self.state is SupervisorState.HELD and self.reason is HoldReason.DEADMAN:
            self._set(SupervisorState.ACTIVE, None, review,
                      'enable is back' if settings.require_enable else 'require_enable is off')
            self._ramp_pending = True
            self._last_valid_ns = now_ns
        if self._last_valid_ns is None and now_ns > 0:
            self._last_valid_ns = now_ns          # the first real time after activation
        if (self.state is SupervisorState.ACTIVE and settings.fault_hold_after_sec > 0
                and self._last_valid_ns is not None
                and now_ns - self._last_valid_ns > settings.fault_hold_after_sec * NS_PER_SEC):
            self._enter_hold(HoldReason.NO_TRAJECTORY, joint_names, measured, settings, review,
                             f'no valid trajectory for {(now_ns - self._last_valid_ns) / NS_PER_SEC:.2f} s '
                             f'(fault_hold_after_sec {settings.fault_hold_after_sec})')
        self._retry_pending_hold(joint_names, measured, settings, review)

    def clock_jumped(self, joint_names: Sequence[str], measured: Measured, settings: SafetySettings, now_ns: int,
                     why: str) -> Review:
        """ROS time jumped back (a bag played again, a simulator reset): what was executing belongs to the
        timeline the clock left, so hold (once) until a tick gives a valid trajectory in the new one."""
        with self._lock:
            review = Review()
            self._last_valid_ns = now_ns
            if self.state is SupervisorState.ESTOP or (self.state is SupervisorState.HELD
                                                       and self.reason is HoldReason.INACTIVE):
                return review
            self._enter_hold(HoldReason.CLOCK_JUMP, joint_names, measured, settings, review, why)
            return review

    def reset_estop(self, operator: OperatorInputs, now_ns: int) -> Tuple[bool, str]:
        """The operator's reset: allowed only while latched and with the e-stop input false."""
        with self._lock:
            if self.state is not SupervisorState.ESTOP:
                return False, f'no e-stop is latched (state: {self.label})'
            if operator.estop:
                return False, 'the e-stop input is still true: release it first'
            self._set(SupervisorState.ACTIVE, None, Review(), 'e-stop reset')
            self._ramp_pending = True
            self._last_valid_ns = now_ns
            return True, 'e-stop reset: policy trajectories resume (ramped in when ramp_in_sec > 0)'

    # ---- a tick's outcome -----------------------------------------------------------------------------
    def review(self, plan: Optional[TrajectoryPlan], skipped: Optional[SkipReason], joint_names: Sequence[str],
               operator: OperatorInputs, measured: Measured, settings: SafetySettings, now_ns: int,
               publish_ns: int) -> Review:
        """The tick produced ``plan`` (or was ``skipped`` for a reason): decide what the controller gets.

        Waiting for the first /clock is no fault: there is no time yet, and nothing was published. Nor is a
        repeated observation: the trajectory being executed goes on, valid.
        """
        with self._lock:
            review = Review()
            if skipped is SkipReason.WAITING_FOR_CLOCK:
                return review
            self._supervise(operator, joint_names, measured, settings, now_ns, review)
            if self.state is SupervisorState.ESTOP or (
                    self.state is SupervisorState.HELD and self.reason in (HoldReason.INACTIVE, HoldReason.DEADMAN)):
                return review
            if plan is None:
                if skipped is SkipReason.REPEATED_OBSERVATION and self.state is SupervisorState.ACTIVE:
                    self._last_valid_ns = now_ns     # the executing trajectory goes on: it is still valid
                    return review
                if skipped is not None and settings.on_fault == 'hold' and self.state is SupervisorState.ACTIVE:
                    self._enter_hold(HoldReason.INPUT_FAULT, joint_names, measured, settings, review,
                                     f'a tick was skipped [{skipped}] (on_fault hold)')
                return review
            self._last_valid_ns = now_ns
            if measured.positions is None:
                # A policy plan without a fresh joint state cannot be checked against where the arm is.
                if settings.max_position_step or settings.max_velocity or settings.ramp_in_sec > 0:
                    self._enter_hold(HoldReason.INPUT_FAULT, joint_names, measured, settings, review,
                                     f'cannot check the trajectory: {measured.problem}')
                    return review
            shaped = self._shape(plan, measured, settings, publish_ns, review)
            if shaped is None:
                self._enter_hold(HoldReason.LIMIT, joint_names, measured, settings, review,
                                 'trajectory beyond max_position_step / max_velocity (limit_mode hold)')
                return review
            if self.state is SupervisorState.HELD:
                self._set(SupervisorState.ACTIVE, None, review, 'inputs are good again')
            review.plan, review.kind = shaped, PlanKind.POLICY
            return review

    def release(self, review: Review, publish: Callable[[TrajectoryPlan], None]) -> bool:
        """Publish ``review.plan`` unless the state changed since (an e-stop racing a tick): under the lock."""
        with self._lock:
            if review.plan is None:
                return False
            if review.kind is PlanKind.POLICY and self.state is not SupervisorState.ACTIVE:
                self.dropped += 1
                return False
            publish(review.plan)
            return True

    # ---- internals -----------------------------------------------------------------------------------
    def _set(self, state: SupervisorState, reason: Optional[HoldReason], review: Review, why: str) -> None:
        before = self.label
        self.state, self.reason = state, reason
        if self.label != before:
            review.transitions.append(f'supervisor {before} -> {self.label}: {why}')

    def _enter_hold(self, reason: HoldReason, joint_names: Sequence[str], measured: Measured,
                    settings: SafetySettings, review: Review, why: str) -> None:
        state = SupervisorState.ESTOP if reason is HoldReason.ESTOP else SupervisorState.HELD
        if (self.state, self.reason) == (state, reason):
            return                                   # one hold per entry into the held state
        self._set(state, reason, review, why)
        self.holds[reason.value] = self.holds.get(reason.value, 0) + 1
        self._ramp_pending = True
        self._hold_pending, self._unheld_said = True, False
        self._retry_pending_hold(joint_names, measured, settings, review)

    def _retry_pending_hold(self, joint_names: Sequence[str], measured: Measured, settings: SafetySettings,
                            review: Review) -> None:
        if not self._hold_pending or not joint_names:
            return
        if measured.positions is None:
            # Once per hold, not per tick: an idle node (nothing publishing) would say it every tick.
            if not self._unheld_said:
                self._unheld_said = True
                self.cannot_hold_count += 1
                review.cannot_hold_waiting = measured.waiting
                review.cannot_hold = (f'cannot hold the arm ({self.label}): {measured.problem}; nothing is '
                                      'published' + ('; the hold follows the first joint state' if measured.waiting
                                                     else ' until the joint state is back'))
            return
        if self._unheld_said:
            review.transitions.append(f'supervisor {self.label}: the joint state arrived, the hold is published')
        self._hold_pending = self._unheld_said = False
        review.plan, review.kind = hold_plan(joint_names, measured.positions, settings.hold_time_sec), PlanKind.HOLD

    def _shape(self, plan: TrajectoryPlan, measured: Measured, settings: SafetySettings, publish_ns: int,
               review: Review) -> Optional[TrajectoryPlan]:
        """Ramp-in, then the step and velocity limits; None when limit_mode hold refuses the plan."""
        positions, times = plan.positions, plan.times_sec
        names = plan.joint_names
        start = measured.positions
        due_ns = (plan.stamp_ns or publish_ns) + np.round(times * NS_PER_SEC).astype(np.int64)
        if settings.ramp_in_sec > 0 and start is not None and (self._ramp_pending or self._ramp_anchor is not None):
            if self._ramp_pending:
                self._ramp_pending, self._ramp_origin_ns, self._ramp_anchor = False, int(due_ns[0]), start.copy()
            fraction = ramp_fractions(due_ns, self._ramp_origin_ns, settings.ramp_in_sec)[:, None]   # [N, 1]
            if np.all(fraction >= 1.0):
                self._ramp_anchor = None
            else:
                blended = self._ramp_anchor + fraction * (positions - self._ramp_anchor)
                self._count(review, 'ramp_in', names, np.abs(blended - positions) > _LIMIT_TOLERANCE)
                positions = blended
        else:
            self._ramp_pending = False
        if start is None or not (settings.max_position_step or settings.max_velocity):
            return _replace(plan, positions, times, start)
        step_bound, velocity_bound = step_bounds(times, settings.max_position_step, settings.max_velocity,
                                                 len(names))
        if settings.limit_mode == 'hold':
            steps = step_sizes(positions, start)
            over_step = steps > step_bound + _LIMIT_TOLERANCE
            over_velocity = steps > velocity_bound + _LIMIT_TOLERANCE
            if over_step.any() or over_velocity.any():
                self._count(review, 'step_refused', names, over_step)
                self._count(review, 'velocity_refused', names, over_velocity)
                return None
            return _replace(plan, positions, times, start)
        positions, moved = limit_increments(positions, start, step_bound)
        self._count(review, 'step_clamped', names, moved)
        if not settings.max_velocity:
            return _replace(plan, positions, times, start)
        if settings.limit_mode == 'clamp':
            positions, moved = limit_increments(positions, start, velocity_bound)
            self._count(review, 'velocity_clamped', names, moved)
            return _replace(plan, positions, times, start)
        too_fast = step_sizes(positions, start) > velocity_bound + _LIMIT_TOLERANCE   # [N, J]: who sets the pace
        if too_fast.any():
            self._count(review, 'velocity_stretched', names, too_fast)
            review.timing_changed = True
            times = stretched_times(positions, times, start, settings.max_velocity)
        return _replace(plan, positions, times, start)

    def _count(self, review: Review, kind: str, names: Sequence[str], changed: np.ndarray) -> None:
        """Points changed [N, J] per joint, under '<kind>:<joint>', in the review and the running totals."""
        for name, count in zip(names, np.asarray(changed).sum(axis=0)):
            if count:
                key = f'{kind}:{name}'
                review.interventions[key] = review.interventions.get(key, 0) + int(count)
                self.interventions[key] = self.interventions.get(key, 0) + int(count)


def _replace(plan: TrajectoryPlan, positions: np.ndarray, times: np.ndarray,
             start: Optional[np.ndarray]) -> TrajectoryPlan:
    if positions is plan.positions and times is plan.times_sec:
        return plan
    velocities = finite_difference_velocities(positions, times, start)
    return TrajectoryPlan(plan.joint_names, np.asarray(times, dtype=np.float64), positions, velocities,
                          plan.stamp_ns, plan.clipped, plan.first_action)
