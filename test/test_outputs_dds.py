"""`outputs` over real DDS: an arm joint_trajectory_controller and a gripper forward_command_controller fed by
one node process; declared, described, dumped and loaded back like every parameter."""
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dds_helpers import (JOINTS, NodeProcess, TestRig, base_params, check_jtc, is_hold, isolate, pick_domain_id,
                         ros_env, wait_until, write_params)

DOMAIN_ID = pick_domain_id()
isolate(DOMAIN_ID)

rclpy = pytest.importorskip('rclpy')
pytestmark = pytest.mark.dds

from builtin_interfaces.msg import Duration  # noqa: E402
from rclpy.context import Context  # noqa: E402
from std_msgs.msg import Float64MultiArray  # noqa: E402
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint  # noqa: E402

from vla_policy_node.policy.tiny_default import write_tiny_default  # noqa: E402
from vla_policy_node.ros.node import VlaPolicyNode  # noqa: E402

BIN = Path(sys.executable).parent
ROS2 = BIN / 'ros2'
ARM, GRIPPER = JOINTS[:5], JOINTS[5:]
ARM_TOPIC, GRIPPER_TOPIC = '/arm_controller/joint_trajectory', '/gripper_controller/commands'
OUTPUTS = {'outputs': ['arm', 'gripper'], 'arm': {'joints': ARM},
           'gripper': {'joints': GRIPPER, 'type': 'float64_multi_array'}}


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    return write_tiny_default(tmp_path_factory.mktemp('ckpt') / 'tiny_pi0', 'pi0')


def test_jtc_validator_rejects_a_stamped_trajectory_that_ended():
    msg = JointTrajectory(joint_names=list(JOINTS))
    msg.header.stamp.sec = 100
    msg.points = [JointTrajectoryPoint(positions=[0.0] * 6, velocities=[0.0] * 6,
                                       time_from_start=Duration(sec=0, nanosec=500_000_000))]
    check_jtc(msg, JOINTS, now_ns=100_400_000_000)                    # ends at 100.5 s: still ahead
    with pytest.raises(AssertionError, match='ends in the past'):
        check_jtc(msg, JOINTS, now_ns=100_600_000_000)


@pytest.mark.timeout(60)
def test_output_parameters_are_declared_described_and_refused(checkpoint, tmp_path):
    context = Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    try:
        good = write_params(tmp_path / 'good.yaml', base_params(checkpoint, autostart=False, **OUTPUTS))
        node = VlaPolicyNode(context=context, cli_args=['--ros-args', '--params-file', str(good)])
        try:
            assert node.params.errors == []
            assert node.get_parameter('arm.joints').value == ARM
            assert node.get_parameter('gripper.type').value == 'float64_multi_array'
            assert node.get_parameter('arm.type').value == 'joint_trajectory'        # the default
            descriptor = node.describe_parameter('gripper.joints')
            assert descriptor.read_only and 'joints of joint_names' in descriptor.description
        finally:
            node.destroy_node()
        typo = dict(OUTPUTS, arm={'joint': ARM})
        bad = write_params(tmp_path / 'bad.yaml', base_params(checkpoint, autostart=False, **typo))
        node = VlaPolicyNode(context=context, cli_args=['--ros-args', '--params-file', str(bad)])
        try:
            errors = node.params.errors
            assert any("unknown parameter(s) ['arm.joint']" in error for error in errors), errors
            assert any('arm.joints is not set' in error for error in errors), errors
        finally:
            node.destroy_node()
    finally:
        context.try_shutdown()


@pytest.mark.timeout(150)
def test_arm_and_gripper_get_their_share_of_every_plan_and_every_hold(checkpoint, tmp_path):
    rig = TestRig(DOMAIN_ID, trajectory_topic=ARM_TOPIC)
    rig.subscribe(GRIPPER_TOPIC, Float64MultiArray)
    proc = NodeProcess(tmp_path, base_params(checkpoint, execute_steps=10, **OUTPUTS), DOMAIN_ID).start()
    try:
        rig.start_streaming()
        proc.wait_for_state(rig, 'active', timeout=60)
        rig.wait_for_trajectories(4, timeout=30)
        policy = [(m, t) for m, t in zip(rig.trajectories_since(0), rig.trajectory_received_ns) if not is_hold(m)]
        assert policy, 'no policy trajectory on the arm topic'
        for msg, received_ns in policy:
            check_jtc(msg, ARM, zero_stamp=True, now_ns=received_ns)       # the arm controller's own joints only
        gripper = rig.extra_since(GRIPPER_TOPIC)
        assert gripper and all(len(m.data) == 1 for m in gripper)

        # An e-stop holds every output at the measured position, in one supervisor decision.
        before = rig.trajectory_count()
        rig.publish_estop(True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(is_hold(m) for m in rig.trajectories_since(before)):
            time.sleep(0.05)
        holds = [m for m in rig.trajectories_since(before) if is_hold(m)]
        assert holds, 'the e-stop did not hold the arm'
        check_jtc(holds[0], ARM, points=1, zero_stamp=True)
        assert list(holds[0].points[0].positions) == pytest.approx(rig.joint_positions[:5])
        # The gripper's hold is the same release (delivered on its own topic, in its own time).
        wait_until(lambda: list(rig.extra_since(GRIPPER_TOPIC)[-1].data) == pytest.approx(rig.joint_positions[5:]),
                   'the gripper held at the measured position')
        rig.stop_streaming()
        # Every release publishes both outputs: as many gripper commands as arm trajectories, once all arrived.
        wait_until(lambda: len(rig.extra_since(GRIPPER_TOPIC)) == rig.trajectory_count(),
                   'one gripper command per arm trajectory')
        time.sleep(0.5)
        assert len(rig.extra_since(GRIPPER_TOPIC)) == rig.trajectory_count()
    finally:
        rig.stop_streaming()
        proc.stop()
        if proc.proc.returncode not in (0, None):
            proc.print_log()
        rig.close()


def _ros2_until(env, *args, attempts=6):
    """``ros2 ARGS --no-daemon --timeout 10`` until it succeeds (a few attempts), as test_user_journey does."""
    for _ in range(attempts):
        done = subprocess.run([str(ROS2), *args, '--no-daemon', '--timeout', '10'], env=env, capture_output=True,
                              text=True, timeout=60)
        if done.returncode == 0:
            return done
        time.sleep(1.0)
    raise AssertionError(f'ros2 {" ".join(args)}: {done.stdout}{done.stderr}')


@pytest.mark.timeout(240)
@pytest.mark.skipif(not ROS2.exists(), reason='ros2 CLI not installed in the venv (make setup: ../shared/ros-tools)')
def test_ros2_param_dump_of_outputs_loads_back(checkpoint, tmp_path):
    rig = TestRig(DOMAIN_ID, trajectory_topic=ARM_TOPIC)
    proc = NodeProcess(tmp_path / 'node', base_params(checkpoint, autostart=False, **OUTPUTS), DOMAIN_ID).start()
    env = ros_env(DOMAIN_ID, tmp_path / 'cli_log')
    try:
        proc.wait_for_state(rig, 'unconfigured', timeout=60)
        # Retried: under load one discovery round of the CLI may not find the node yet ("Node not found").
        described = _ros2_until(env, 'param', 'describe', '/vla_policy', 'gripper.type')
        assert 'float64_multi_array' in described.stdout and 'Read only: true' in described.stdout, described
        dumped = _ros2_until(env, 'param', 'dump', '/vla_policy')
        document = yaml.safe_load(dumped.stdout)
        section = document['/vla_policy']['ros__parameters']
        assert section['outputs'] == ['arm', 'gripper']
        assert section['arm']['joints'] == ARM and section['gripper']['type'] == 'float64_multi_array'
    finally:
        proc.stop()
        rig.close()
    # The dump, as a params file, gives the same parameters (and the replay reads it the same way).
    path = tmp_path / 'dump.yaml'
    path.write_text(dumped.stdout)
    context = Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    try:
        node = VlaPolicyNode(context=context, cli_args=['--ros-args', '--params-file', str(path)])
        try:
            assert node.params.errors == []
            assert node.get_parameter('gripper.joints').value == GRIPPER
            assert node.get_parameter('gripper.type').value == 'float64_multi_array'
        finally:
            node.destroy_node()
    finally:
        context.try_shutdown()
    from vla_policy_node.params import load_params_file, problems, resolve_values
    assert problems(resolve_values(load_params_file(path))) == []
