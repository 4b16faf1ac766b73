"""The safety supervisor without ROS: limit math by hand, holds, e-stop, deadman, ramp-in."""
import numpy as np
import pytest

from vla_policy_node.observation import Measured, OperatorInputs, SkipReason
from vla_policy_node.safety import (HoldReason, PlanKind, SafetySettings, SafetySupervisor, SupervisorState,
                                    limit_increments, ramp_fractions, step_bounds, stretched_times)
from vla_policy_node.trajectory import build_plan, check_controller_rules

NS = 1_000_000_000
JOINTS = ('a', 'b')
HERE = Measured(np.array([0.0, 1.0]))
NOBODY = OperatorInputs()


# ---- limit math, by hand ------------------------------------------------------------------------
def test_steps_are_clamped_one_after_the_other_from_the_measured_position():
    positions = np.array([[0.5, 1.0], [0.6, 0.2], [0.6, 0.2]])
    limited, moved = limit_increments(positions, np.array([0.0, 1.0]), np.full((3, 2), 0.3))
    # a: 0 -> 0.3 (clamped) -> 0.6 (0.3 step, exact) -> 0.6; b: 1.0 -> 1.0 -> 0.7 (clamped) -> 0.4 (clamped)
    np.testing.assert_allclose(limited, [[0.3, 1.0], [0.6, 0.7], [0.6, 0.4]])
    assert moved.tolist() == [[True, False], [False, True], [False, True]]


def test_velocity_bounds_follow_the_segment_durations():
    times = np.array([0.05, 0.15, 0.35])          # first segment from t = 0
    step, velocity = step_bounds(times, (0.2, 0.4), (1.0, 2.0), 2)
    np.testing.assert_allclose(step, [[0.2, 0.4]] * 3)
    np.testing.assert_allclose(velocity, [[0.05, 0.1], [0.1, 0.2], [0.2, 0.4]])
    unlimited = step_bounds(times, (), (), 2)
    assert np.isinf(unlimited[0]).all() and np.isinf(unlimited[1]).all()


def test_stretch_slows_only_the_segments_that_are_too_fast():
    positions = np.array([[0.1, 1.0], [0.5, 1.0], [0.6, 1.05]])
    times = np.array([0.1, 0.2, 0.3])
    # a moves 0.1, 0.4, 0.1 at <= 1 rad/s: segment 2 needs 0.4 s instead of 0.1; b never sets the pace.
    np.testing.assert_allclose(stretched_times(positions, times, np.array([0.0, 1.0]), (1.0, 1.0)),
                               [0.1, 0.5, 0.6])


def test_ramp_fractions():
    due = np.array([0, 250, 500, 1000, 2000]) * 1_000_000
    np.testing.assert_allclose(ramp_fractions(due, 0, 1.0), [0.0, 0.25, 0.5, 1.0, 1.0])


# ---- the supervisor ------------------------------------------------------------------------------
def plan(positions, dt=0.1, stamp_ns=0):
    return build_plan(np.asarray(positions, dtype=np.float64), JOINTS, dt, 0, stamp_ns)


def review(supervisor, settings, now_ns, policy=None, skipped=None, measured=HERE, operator=NOBODY):
    return supervisor.review(policy, skipped, JOINTS, operator, measured, settings, now_ns, now_ns)


def assert_hold_at(result, positions):
    assert result.kind is PlanKind.HOLD
    hold = result.plan
    check_controller_rules(hold.joint_names, hold.times_sec, hold.positions, hold.velocities)
    assert hold.positions.tolist() == [list(positions)] and not hold.velocities.any() and hold.stamp_ns == 0


def test_a_skipped_tick_holds_once_and_good_inputs_release():
    supervisor, settings = SafetySupervisor(), SafetySettings()
    supervisor.activate(0)
    first = review(supervisor, settings, NS, skipped=SkipReason.CAMERA_STALE)
    assert_hold_at(first, [0.0, 1.0])
    assert supervisor.label == 'held: input_fault' and first.transitions
    again = review(supervisor, settings, 2 * NS, skipped=SkipReason.CAMERA_STALE)
    assert again.plan is None and not again.transitions            # once per entry
    back = review(supervisor, settings, 3 * NS, policy=plan([[0.0, 1.0], [0.1, 1.0]]))
    assert back.kind is PlanKind.POLICY and supervisor.state is SupervisorState.ACTIVE
    assert supervisor.holds == {'input_fault': 1}


def test_on_fault_continue_publishes_nothing_until_the_no_trajectory_timeout():
    supervisor, settings = SafetySupervisor(), SafetySettings(on_fault='continue', fault_hold_after_sec=1.0)
    supervisor.activate(1)
    assert review(supervisor, settings, NS // 2, skipped=SkipReason.CAMERA_STALE).plan is None
    late = review(supervisor, settings, NS + 2, skipped=SkipReason.CAMERA_STALE)
    assert_hold_at(late, [0.0, 1.0])
    assert supervisor.reason is HoldReason.NO_TRAJECTORY


def test_under_sim_time_the_no_trajectory_timeout_starts_at_the_first_clock():
    supervisor, settings = SafetySupervisor(), SafetySettings(on_fault='continue', fault_hold_after_sec=1.0)
    supervisor.activate(0)                                   # activated before any /clock: time reads 0
    first_clock = 1_700_000_000 * NS
    assert review(supervisor, settings, first_clock, skipped=SkipReason.CAMERA_MISSING).plan is None
    assert supervisor.state is SupervisorState.ACTIVE
    assert review(supervisor, settings, first_clock + NS + 1, skipped=SkipReason.CAMERA_MISSING).kind \
        is PlanKind.HOLD


def test_waiting_for_the_first_clock_is_no_fault():
    supervisor = SafetySupervisor()
    assert review(supervisor, SafetySettings(), 0, skipped=SkipReason.WAITING_FOR_CLOCK).plan is None
    assert supervisor.state is SupervisorState.ACTIVE


def test_nothing_to_hold_to_is_said_and_the_hold_follows_when_the_joint_state_is_back():
    supervisor, settings = SafetySupervisor(), SafetySettings()
    supervisor.activate(0)
    blind = review(supervisor, settings, NS, skipped=SkipReason.JOINT_STATE_STALE, measured=Measured(None, 'stale'))
    assert blind.plan is None and 'cannot hold the arm' in blind.cannot_hold and 'stale' in blind.cannot_hold
    later = supervisor.supervise(NOBODY, JOINTS, HERE, settings, 2 * NS)
    assert_hold_at(later, [0.0, 1.0])


def test_nothing_to_hold_to_is_said_once_per_hold_and_counted():
    # An idle node (nothing publishing): every tick and every timer check finds no joint state.
    supervisor, settings = SafetySupervisor(), SafetySettings()
    supervisor.activate(0)
    never = Measured(None, 'no joint state received on /joint_states yet', waiting=True)
    first = review(supervisor, settings, NS, skipped=SkipReason.CAMERA_MISSING, measured=never)
    assert first.cannot_hold and first.cannot_hold_waiting          # start-up: a warning, not an error
    for i in range(2, 60):
        again = review(supervisor, settings, i * NS, skipped=SkipReason.CAMERA_MISSING, measured=never)
        assert not again.cannot_hold and again.plan is None
        assert not supervisor.supervise(NOBODY, JOINTS, never, settings, i * NS).cannot_hold
    assert supervisor.hold_waiting() == (True, 1)
    arrived = supervisor.supervise(NOBODY, JOINTS, HERE, settings, 60 * NS)
    assert_hold_at(arrived, [0.0, 1.0])
    assert any('the joint state arrived' in line for line in arrived.transitions)
    assert supervisor.hold_waiting() == (False, 1)
    # Back to good inputs, then a joint state that goes stale: a new hold, said again, now as an error.
    review(supervisor, settings, 61 * NS, policy=plan([[0.0, 1.0], [0.1, 1.1]]))
    assert supervisor.state is SupervisorState.ACTIVE
    stale = Measured(None, 'the joint state on /joint_states is 2.000 s old')
    lost = review(supervisor, settings, 62 * NS, skipped=SkipReason.JOINT_STATE_STALE, measured=stale)
    assert lost.cannot_hold and not lost.cannot_hold_waiting and 'until the joint state is back' in lost.cannot_hold
    assert not review(supervisor, settings, 63 * NS, skipped=SkipReason.JOINT_STATE_STALE, measured=stale).cannot_hold
    assert supervisor.hold_waiting() == (True, 2)


def test_estop_latches_survives_good_inputs_and_resets_only_when_released():
    supervisor, settings = SafetySupervisor(), SafetySettings()
    supervisor.activate(0)
    latched = supervisor.supervise(OperatorInputs(estop=True), JOINTS, HERE, settings, NS)
    assert_hold_at(latched, [0.0, 1.0])
    assert supervisor.state is SupervisorState.ESTOP
    released_input = OperatorInputs(estop=False)
    good = review(supervisor, settings, 2 * NS, policy=plan([[0.0, 1.0], [0.1, 1.0]]), operator=released_input)
    assert good.plan is None and supervisor.state is SupervisorState.ESTOP
    assert supervisor.reset_estop(OperatorInputs(estop=True), 3 * NS)[0] is False
    ok, message = supervisor.reset_estop(released_input, 3 * NS)
    assert ok and supervisor.state is SupervisorState.ACTIVE, message
    assert supervisor.reset_estop(released_input, 4 * NS)[0] is False          # nothing latched any more


def test_a_policy_plan_that_an_estop_overtook_is_not_released():
    supervisor, settings = SafetySupervisor(), SafetySettings()
    supervisor.activate(0)
    ready = review(supervisor, settings, NS, policy=plan([[0.0, 1.0], [0.1, 1.0]]))
    supervisor.supervise(OperatorInputs(estop=True), JOINTS, HERE, settings, NS + 1)
    sent = []
    assert not supervisor.release(ready, sent.append) and sent == [] and supervisor.dropped == 1


def test_deadman_holds_without_fresh_true_enables_and_releases_with_them():
    supervisor, settings = SafetySupervisor(), SafetySettings(require_enable=True, enable_timeout_sec=0.5)
    supervisor.activate(0)
    enabled = OperatorInputs(enable=True, enable_age_sec=0.1)
    assert review(supervisor, settings, NS, policy=plan([[0.0, 1.0]]), operator=enabled).kind is PlanKind.POLICY
    for operator in (OperatorInputs(enable=True, enable_age_sec=0.6), OperatorInputs(enable=False, enable_age_sec=0.0),
                     OperatorInputs()):
        supervisor.supervise(enabled, JOINTS, HERE, settings, NS)       # back to active
        held = review(supervisor, settings, NS, policy=plan([[0.0, 1.0]]), operator=operator)
        assert_hold_at(held, [0.0, 1.0])
        assert supervisor.reason is HoldReason.DEADMAN
    assert review(supervisor, settings, NS, policy=plan([[0.0, 1.0]]), operator=enabled).kind is PlanKind.POLICY


def test_an_enable_from_the_future_after_the_clock_jumped_back_does_not_count():
    supervisor, settings = SafetySupervisor(), SafetySettings(require_enable=True, enable_timeout_sec=0.5)
    supervisor.activate(NS)
    held = supervisor.supervise(OperatorInputs(enable=True, enable_age_sec=-52.0), JOINTS, HERE, settings, 50 * NS)
    assert_hold_at(held, [0.0, 1.0])
    assert supervisor.reason is HoldReason.DEADMAN


def test_deactivate_holds_and_activation_releases():
    supervisor, settings = SafetySupervisor(), SafetySettings()
    held = supervisor.deactivate(JOINTS, HERE, settings)
    assert_hold_at(held, [0.0, 1.0])
    assert review(supervisor, settings, NS, policy=plan([[0.0, 1.0]])).plan is None
    supervisor.activate(2 * NS)
    assert review(supervisor, settings, 2 * NS, policy=plan([[0.0, 1.0]])).kind is PlanKind.POLICY


@pytest.mark.parametrize('mode', ['clamp', 'stretch', 'hold'])
def test_a_point_past_max_position_step(mode):
    supervisor = SafetySupervisor()
    settings = SafetySettings(max_position_step=(0.2, 0.2), limit_mode=mode)
    result = review(supervisor, settings, NS, policy=plan([[0.5, 1.0], [0.6, 1.0]]))
    if mode == 'hold':
        assert_hold_at(result, [0.0, 1.0])
        assert supervisor.reason is HoldReason.LIMIT and supervisor.interventions == {'step_refused:a': 1}
        return
    shaped = result.plan
    np.testing.assert_allclose(shaped.positions, [[0.2, 1.0], [0.4, 1.0]])
    check_controller_rules(shaped.joint_names, shaped.times_sec, shaped.positions, shaped.velocities)
    assert result.interventions == {'step_clamped:a': 2}


def test_velocity_clamp_and_stretch():
    positions = [[0.05, 1.0], [0.45, 1.0], [0.5, 1.0]]
    clamp = review(SafetySupervisor(), SafetySettings(max_velocity=(1.0, 1.0)), NS, policy=plan(positions))
    np.testing.assert_allclose(clamp.plan.positions[:, 0], [0.05, 0.15, 0.25])        # 0.1 per 0.1 s
    np.testing.assert_allclose(clamp.plan.times_sec, [0.1, 0.2, 0.3])
    stretch = review(SafetySupervisor(), SafetySettings(max_velocity=(1.0, 1.0), limit_mode='stretch'), NS,
                     policy=plan(positions))
    np.testing.assert_allclose(stretch.plan.positions[:, 0], [0.05, 0.45, 0.5])       # the path is kept
    np.testing.assert_allclose(stretch.plan.times_sec, [0.1, 0.5, 0.6])              # the 0.4 step takes 0.4 s
    assert stretch.timing_changed and stretch.interventions == {'velocity_stretched:a': 1}
    velocities = np.abs(np.diff(np.concatenate([[0.0], stretch.plan.positions[:, 0]])) /
                        np.diff(np.concatenate([[0.0], stretch.plan.times_sec])))
    assert velocities.max() <= 1.0 + 1e-9


def test_ramp_in_starts_exactly_at_the_measured_position_and_ends_at_the_policy():
    supervisor = SafetySupervisor()
    settings = SafetySettings(ramp_in_sec=0.5)
    supervisor.activate(0)
    target = np.tile([0.8, 0.2], (10, 1))
    first = review(supervisor, settings, NS, policy=plan(target)).plan
    np.testing.assert_array_equal(first.positions[0], HERE.positions)
    # Point k is k * 0.1 s after the ramp's origin: 0, 20, 40 ... 100% of the way.
    np.testing.assert_allclose(first.positions[:6, 0], [0.0, 0.16, 0.32, 0.48, 0.64, 0.8])
    np.testing.assert_allclose(first.positions[5:], target[5:])
    # A later trajectory, 0.3 s on (its first point 0.3 s after the origin), continues the same ramp.
    later = review(supervisor, settings, NS + 300_000_000, policy=plan(target)).plan
    np.testing.assert_allclose(later.positions[:3, 0], [0.48, 0.64, 0.8])
    assert review(supervisor, settings, 2 * NS, policy=plan(target)).plan.positions.tolist() == target.tolist()


def test_a_clock_jump_holds_once_and_a_valid_plan_releases_it():
    supervisor, settings = SafetySupervisor(), SafetySettings()
    supervisor.activate(5 * NS)
    review = supervisor.clock_jumped(JOINTS, HERE, settings, 2 * NS, 'ROS time jumped back')
    assert review.kind is PlanKind.HOLD and supervisor.label == 'held: clock_jump'
    np.testing.assert_array_equal(review.plan.positions, [HERE.positions])
    # The ticks that follow (no new frames yet) hold no more; the first valid plan releases it.
    skipped = supervisor.review(None, SkipReason.CAMERA_MISSING, JOINTS, NOBODY, HERE, settings, 2 * NS, 2 * NS)
    assert skipped.plan is None and supervisor.holds == {'clock_jump': 1}
    released = supervisor.review(plan([[0.1, 1.0], [0.2, 1.0]]), None, JOINTS, NOBODY, HERE, settings, 3 * NS, 3 * NS)
    assert released.kind is PlanKind.POLICY and supervisor.state is SupervisorState.ACTIVE


def test_a_clock_jump_leaves_an_estop_latched():
    supervisor, settings = SafetySupervisor(), SafetySettings()
    supervisor.activate(5 * NS)
    supervisor.supervise(OperatorInputs(estop=True), JOINTS, HERE, settings, 5 * NS)
    assert supervisor.clock_jumped(JOINTS, HERE, settings, 2 * NS, 'back').plan is None
    assert supervisor.state is SupervisorState.ESTOP and HoldReason.CLOCK_JUMP.value not in supervisor.holds
