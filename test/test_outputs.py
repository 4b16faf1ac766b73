"""Several controllers from one action vector (`outputs`): the table's checks, the split, the replay's bag."""
import json

import numpy as np
import pytest

from vla_policy_node.outputs import Output, due_index, split
from vla_policy_node.params import ParameterError, load_params_file, problems, resolve_values
from vla_policy_node.policy.tiny_default import write_tiny_default
from vla_policy_node.bags.bag_io import read_messages
from vla_policy_node.replay.make_bag import SampleBagSpec, write_sample_bag
from vla_policy_node.replay.offline import replay
from vla_policy_node.trajectory import TrajectoryPlan, check_controller_rules

JOINTS = [f'joint_{i}' for i in range(1, 7)]
ARM, GRIPPER = JOINTS[:5], JOINTS[5:]
NS = 1_000_000_000
UR_GRIPPER = {'outputs': ['arm', 'gripper'], 'arm': {'joints': ARM},
              'gripper': {'joints': GRIPPER, 'type': 'float64_multi_array'}}


def _values(**extra):
    return resolve_values(dict({'joint_names': JOINTS}, **extra))


def _plan(stamp_ns=0):
    times = np.array([0.1, 0.2, 0.3])
    positions = np.arange(18, dtype=np.float64).reshape(3, 6)
    velocities = np.ones((3, 6))
    velocities[-1] = 0.0
    return TrajectoryPlan(tuple(JOINTS), times, positions, velocities, stamp_ns)


def test_outputs_partition_joint_names():
    assert problems(_values(outputs=['arm', 'gripper'], **{'arm.joints': ARM, 'gripper.joints': GRIPPER})) == []
    found = problems(_values(outputs=['arm', 'gripper'], **{'arm.joints': ARM[:4], 'gripper.joints': GRIPPER}))
    assert found and "joints ['joint_5'] of joint_names are in no output" in found[0]
    found = problems(_values(outputs=['arm', 'gripper'], **{'arm.joints': JOINTS, 'gripper.joints': GRIPPER}))
    assert "'joint_6' is in both arm.joints and gripper.joints" in found[0]
    found = problems(_values(outputs=['arm'], **{'arm.joints': JOINTS + ['elbow']}))
    assert "arm.joints names 'elbow', which is not in joint_names" in found[0]
    assert 'arm.joints is not set' in problems(_values(outputs=['arm']))[0]
    assert 'must be one of' in problems(_values(outputs=['arm'], **{'arm.joints': JOINTS, 'arm.type': 'x'}))[0]
    assert 'is not a usable name' in problems(_values(outputs=['my-arm']))[0]
    assert 'already a parameter name' in problems(_values(outputs=['seed']))[0]
    same = {'arm.joints': ARM, 'gripper.joints': GRIPPER, 'gripper.topic': 'arm_controller/joint_trajectory'}
    assert 'share the topic' in problems(_values(outputs=['arm', 'gripper'], **same))[0]
    with pytest.raises(ParameterError, match=r"unknown parameter\(s\) \['arm.joint'\]"):
        _values(outputs=['arm'], **{'arm.joint': JOINTS})


def test_nested_params_file_reads_as_rcl_does(tmp_path):
    path = tmp_path / 'p.yaml'
    path.write_text(json.dumps({'/**': {'ros__parameters': dict(UR_GRIPPER, joint_names=JOINTS)}}))
    raw = load_params_file(path)
    assert raw['arm.joints'] == ARM and raw['gripper.type'] == 'float64_multi_array'
    assert problems(resolve_values(raw)) == []


def test_split_is_one_plan_per_joint_partition():
    outputs = (Output('arm', '/arm', 'joint_trajectory', tuple(ARM), tuple(range(5))),
               Output('gripper', '/g', 'float64_multi_array', tuple(GRIPPER), (5,)))
    plan = _plan()
    (arm, arm_plan), (gripper, value) = split(plan, outputs, publish_ns=5 * NS)
    assert arm_plan.joint_names == tuple(ARM)
    np.testing.assert_array_equal(arm_plan.positions, plan.positions[:, :5])
    np.testing.assert_array_equal(arm_plan.velocities, plan.velocities[:, :5])
    assert list(arm_plan.times_sec) == list(plan.times_sec) and arm_plan.stamp_ns == 0
    np.testing.assert_array_equal(value, plan.positions[0, 5:])        # stamp zero: the first point is due next
    # Stamped at an observation 0.15 s before publication: points 0 has fallen due, point 1 is next.
    stamped = _plan(stamp_ns=5 * NS - int(0.15 * NS))
    assert due_index(stamped, 5 * NS) == 1
    np.testing.assert_array_equal(split(stamped, outputs, 5 * NS)[1][1], stamped.positions[1, 5:])


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    return write_tiny_default(tmp_path_factory.mktemp('ckpt') / 'tiny_pi0', 'pi0')


def test_replay_writes_one_topic_per_output_from_the_same_plans(checkpoint, tmp_path):
    bag = write_sample_bag(tmp_path / 'bag', SampleBagSpec(duration_sec=3.0))
    params = dict(UR_GRIPPER, joint_names=JOINTS, instruction='pick up the red block', max_camera_skew_sec=0.25,
                  execute_steps=10)
    path = tmp_path / 'params.yaml'
    path.write_text(json.dumps({'/**': {'ros__parameters': params}}))
    result = replay(bag, path, tmp_path / 'out', checkpoint=str(checkpoint), seed=1)
    summary = result.summary
    arm = [(m.timestamp_ns, m.msg) for m in read_messages(tmp_path / 'out' / 'trajectories',
                                                          ['/arm_controller/joint_trajectory'])]
    gripper = [(m.timestamp_ns, m.msg) for m in read_messages(tmp_path / 'out' / 'trajectories',
                                                              ['/gripper_controller/commands'])]
    assert summary['published'] > 0
    assert len(arm) == len(gripper) == summary['published'] + summary['holds_published']
    for (t_arm, msg), (t_gripper, command) in zip(arm, gripper):
        assert t_arm == t_gripper                                        # the same publication
        assert list(msg.joint_names) == ARM
        check_controller_rules(list(msg.joint_names), [p.time_from_start.sec + p.time_from_start.nanosec / NS
                                                       for p in msg.points],
                               [list(p.positions) for p in msg.points], [list(p.velocities) for p in msg.points])
        assert len(command.data) == 1 and np.isfinite(command.data[0])
    # The arm's share of each published policy plan is what the replay recorded for those joints.
    plans = [r for r in result.records if r.plan_positions is not None]
    arm_policy = [msg for _, msg in arm if len(msg.points) > 1]
    assert len(plans) == len(arm_policy)
    for record, msg in zip(plans, arm_policy):
        np.testing.assert_allclose([list(p.positions) for p in msg.points], record.plan_positions[:, :5])


def test_no_outputs_is_one_trajectory_of_every_joint(checkpoint, tmp_path):
    bag = write_sample_bag(tmp_path / 'bag', SampleBagSpec(duration_sec=1.5))
    path = tmp_path / 'params.yaml'
    path.write_text(json.dumps({'/**': {'ros__parameters': {'joint_names': JOINTS, 'instruction': 'go',
                                                            'max_camera_skew_sec': 0.25}}}))
    replay(bag, path, tmp_path / 'out', checkpoint=str(checkpoint), seed=1)
    messages = list(read_messages(tmp_path / 'out' / 'trajectories', None))
    assert {m.topic for m in messages} == {'/joint_trajectory_controller/joint_trajectory'}
    assert all(list(m.msg.joint_names) == JOINTS for m in messages)


def test_gripper_relay_says_what_it_needs_without_control_msgs():
    import subprocess
    import sys
    from vla_policy_node.ros.gripper_relay import gripper_command_action, should_send
    assert should_send(0.04, None, 0.001, busy=False)
    assert not should_send(0.0405, 0.04, 0.001, busy=True)           # same target: the goal runs on
    assert should_send(0.02, 0.04, 0.001, busy=True)                 # a new target preempts
    if gripper_command_action() is not None:
        pytest.skip('control_msgs is installed (apt ROS): the relay runs')
    done = subprocess.run([sys.executable, '-m', 'vla_policy_node.ros.gripper_relay'], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and 'ros-$ROS_DISTRO-control-msgs' in done.stderr, done
