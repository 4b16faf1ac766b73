"""build_plan / finite_difference_velocities / check_controller_rules (no ROS)."""
import math

import numpy as np
import pytest

from vla_policy_node.trajectory import (TrajectoryError, build_plan, check_controller_rules,
                                        finite_difference_velocities)

JOINTS = ('a', 'b', 'c')


def ramp(steps=5, joints=3):
    return np.arange(steps * joints, dtype=np.float64).reshape(steps, joints) * 0.1


def test_times_are_i_plus_one_dt_and_strictly_increasing():
    plan = build_plan(ramp(), JOINTS, 0.05, 0, 0)
    assert plan.times_sec == pytest.approx([0.05 * (i + 1) for i in range(5)])
    assert np.all(np.diff(plan.times_sec) > 0) and plan.times_sec[0] > 0
    assert plan.joint_names == JOINTS and plan.stamp_ns == 0 and not plan.clipped
    check_controller_rules(plan.joint_names, plan.times_sec, plan.positions, plan.velocities)


def test_last_velocity_is_zero_and_velocities_are_central_differences():
    rng = np.random.default_rng(0)
    positions = rng.normal(size=(6, 3))
    dt = 0.1
    times = (np.arange(6) + 1.0) * dt
    velocities = finite_difference_velocities(positions, times)
    assert np.all(velocities[-1] == 0.0)
    np.testing.assert_allclose(velocities[1:-1], (positions[2:] - positions[:-2]) / (2 * dt))
    np.testing.assert_allclose(velocities[0], (positions[1] - positions[0]) / dt)   # one-sided without current
    current = rng.normal(size=3)
    with_current = finite_difference_velocities(positions, times, current)
    np.testing.assert_allclose(with_current[0], (positions[1] - current) / (2 * dt))
    # A current position of the wrong shape is ignored, not broadcast.
    np.testing.assert_allclose(finite_difference_velocities(positions, times, np.zeros(2))[0], velocities[0])


def test_single_point_has_zero_velocity():
    plan = build_plan(ramp(1), JOINTS, 0.1, 0, 0)
    assert plan.velocities.shape == (1, 3) and np.all(plan.velocities == 0)


def test_execute_steps_zero_means_all_and_n_takes_the_first_n():
    actions = ramp(10)
    assert len(build_plan(actions, JOINTS, 0.1, 0, 0).times_sec) == 10
    plan = build_plan(actions, JOINTS, 0.1, 4, 123)
    assert len(plan.times_sec) == 4 and plan.stamp_ns == 123
    np.testing.assert_array_equal(plan.positions, actions[:4])
    assert np.all(plan.velocities[-1] == 0)
    assert len(build_plan(actions, JOINTS, 0.1, 99, 0).times_sec) == 10   # capped at the chunk


def test_clipping_to_limits_sets_clipped():
    actions = np.array([[-5.0, 0.0, 5.0], [0.0, 0.0, 0.0]])
    plan = build_plan(actions, JOINTS, 0.1, 0, 0, lower=[-1.0, -1.0, -1.0], upper=[1.0, 1.0, 1.0])
    assert plan.clipped
    np.testing.assert_array_equal(plan.positions[0], [-1.0, 0.0, 1.0])
    inside = build_plan(actions * 0.1, JOINTS, 0.1, 0, 0, lower=[-1.0] * 3, upper=[1.0] * 3)
    assert not inside.clipped
    one_sided = build_plan(actions, JOINTS, 0.1, 0, 0, upper=[1.0, 1.0, 1.0])
    assert one_sided.clipped and one_sided.positions[0, 0] == -5.0 and one_sided.positions[0, 2] == 1.0


@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
def test_non_finite_actions_are_refused(bad):
    actions = ramp()
    actions[2, 1] = bad
    with pytest.raises(TrajectoryError, match='non-finite'):
        build_plan(actions, JOINTS, 0.1, 0, 0)
    # ... unless they are beyond the executed steps.
    assert len(build_plan(actions, JOINTS, 0.1, 2, 0).times_sec) == 2


@pytest.mark.parametrize('actions, dt', [(np.zeros((5, 2)), 0.1), (np.zeros(5), 0.1), (np.zeros((5, 3)), 0.0),
                                         (np.zeros((5, 3)), -0.1), (np.zeros((5, 3)), math.nan)])
def test_shape_and_dt_errors(actions, dt):
    with pytest.raises(TrajectoryError):
        build_plan(actions, JOINTS, dt, 0, 0)


GOOD = dict(joint_names=['a', 'b'], times_sec=[0.1, 0.2], positions=[[0, 0], [1, 1]], velocities=[[1, 1], [0, 0]])


def test_check_controller_rules_accepts_a_good_trajectory():
    check_controller_rules(**GOOD)
    check_controller_rules(**dict(GOOD, velocities=[[], []]))   # positions only is allowed


@pytest.mark.parametrize('change, message', [
    (dict(joint_names=[]), 'empty'),
    (dict(joint_names=['a', 'a']), 'duplicates'),
    (dict(times_sec=[], positions=[], velocities=[]), 'no points'),
    (dict(times_sec=[0.2, 0.2]), 'strictly increasing'),
    (dict(times_sec=[0.2, 0.1]), 'strictly increasing'),
    (dict(times_sec=[0.0, 0.1]), 'strictly increasing'),
    (dict(positions=[[0, 0], [1]]), 'positions'),
    (dict(velocities=[[1, 1, 1], [0, 0]]), 'velocities'),
    (dict(positions=[[0, math.nan], [1, 1]]), 'non-finite'),
    (dict(velocities=[[math.inf, 1], [0, 0]]), 'non-finite'),
    (dict(velocities=[[1, 1], [0, 0.5]]), 'non-zero velocity'),
])
def test_check_controller_rules_catches_each_violation(change, message):
    with pytest.raises(TrajectoryError, match=message):
        check_controller_rules(**dict(GOOD, **change))
