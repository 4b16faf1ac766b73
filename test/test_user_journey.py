"""What a robot user types, end to end: colcon build, ros2 launch, ros2 param/lifecycle/topic, Ctrl-C.

Needs colcon and the ROS 2 command-line tools in the venv (`make setup` installs them from
../shared/ros-tools when that folder exists): skips without them. Every ros2 command runs with
--no-daemon (a daemon would outlive the test) on a random domain. Step timings are printed (-s),
never asserted.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dds_helpers import pick_domain_id

from vla_policy_node.params import PARAMETERS, ROS_PARAMETERS, TINY_JOINT_NAMES

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NODE = '/vla_policy'
TRAJECTORY = ('/joint_trajectory_controller/joint_trajectory', 'trajectory_msgs/msg/JointTrajectory')

pytestmark = [
    pytest.mark.dds,
    pytest.mark.skipif(not (BIN / 'colcon').exists() or not (BIN / 'ros2').exists(),
                       reason='colcon / ros2 CLI not installed in the venv (make setup installs them from '
                              '../shared/ros-tools when it exists)'),
]


def sourced_env(install: Path, domain: int, log_dir: Path) -> dict:
    """os.environ after `source install/setup.bash`, isolated on ``domain``."""
    base = dict(os.environ, PATH=f'{BIN}{os.pathsep}{os.environ["PATH"]}')
    out = subprocess.run(['bash', '-c', f'source {install}/setup.bash && env -0'], env=base,
                         capture_output=True, check=True).stdout
    env = dict(item.split('=', 1) for item in out.decode().split('\0') if '=' in item)
    env.update(ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', ROS_LOG_DIR=str(log_dir),
               PYTHONUNBUFFERED='1', RCUTILS_COLORIZED_OUTPUT='0', OMP_NUM_THREADS='1')
    return env


class Steps:
    """Runs commands without a shell and times each one."""

    def __init__(self, env: dict, cwd: Path) -> None:
        self.env, self.cwd, self.times = env, cwd, []

    # Bounds on a hang, sized for a loaded 2-core machine (a ros2 CLI command alone takes seconds there).
    def run(self, *cmd: str, timeout: float = 120, check: bool = True, env: dict = None, stderr: bool = False) -> str:
        start = time.monotonic()
        result = subprocess.run(cmd, env=env or self.env, cwd=self.cwd, capture_output=True, text=True,
                                timeout=timeout)
        self.times.append((' '.join(cmd[:4]), time.monotonic() - start))
        if check:
            assert result.returncode == 0, f'{cmd} -> {result.returncode}\n{result.stdout}\n{result.stderr}'
        return result.stdout + (result.stderr if stderr else '')

    def until(self, predicate, *cmd: str, timeout: float = 120, env: dict = None) -> str:
        deadline, out = time.monotonic() + timeout, ''
        while time.monotonic() < deadline:
            out = self.run(*cmd, check=False, env=env)
            if predicate(out):
                return out
            time.sleep(0.2)
        raise AssertionError(f'{cmd}: no match in {timeout} s; last output:\n{out}')

    def until_active(self, node: str, env: dict = None) -> None:
        # `ros2 lifecycle` has no --timeout: under load one --spin-time may not discover the node.
        self.until(lambda out: out.startswith('active'), 'ros2', 'lifecycle', 'get', node, '--no-daemon',
                   '--spin-time', '1', env=env)

    def report(self, total_since: float) -> None:
        print('\n'.join(f'{seconds:6.1f} s  {what}' for what, seconds in self.times))
        print(f'{time.monotonic() - total_since:6.1f} s  total')


def start(cmd, env: dict, cwd: Path, log: Path) -> subprocess.Popen:
    # A process of its own (the signal goes to it alone), with SIGINT at its default even when pytest runs
    # as a background job of a non-interactive shell (which starts children with SIGINT ignored).
    with open(log, 'wb') as out:
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def stop(proc: subprocess.Popen, timeout: float = 20) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


@pytest.mark.timeout(900)
def test_build_launch_inspect_and_stop(tmp_path):
    t0 = time.monotonic()
    ws = tmp_path / 'ws'
    (ws / 'src').mkdir(parents=True)
    (ws / 'src' / 'vla_policy_node').symlink_to(REPO)
    with_venv = dict(os.environ, PATH=f'{BIN}{os.pathsep}{os.environ["PATH"]}')
    subprocess.run([str(BIN / 'colcon'), 'build', '--packages-select', 'vla_policy_node'], cwd=ws, check=True,
                   capture_output=True, timeout=600, env=with_venv)
    install = ws / 'install'
    env = sourced_env(install, pick_domain_id(), tmp_path / 'ros_log')
    other = dict(env, ROS_DOMAIN_ID=str(pick_domain_id(exclude=env['ROS_DOMAIN_ID'])))
    steps = Steps(env, tmp_path)
    steps.times.append(('colcon build + source', time.monotonic() - t0))
    assert steps.run('ros2', 'pkg', 'prefix', 'vla_policy_node').strip() == str(install / 'vla_policy_node')
    steps.run('vla_policy_make_bag', '--duration', '30', str(tmp_path / 'bag'))

    # The command of README.md and docs/install.md as written, from the shipped parameters (the embedded
    # checkpoint), here in a namespace:
    # every default topic follows it and /diagnostics names the node in full.
    readme = start(['vla_policy_node', '--ros-args', '--params-file', str(REPO / 'config' / 'vla_policy.yaml'),
                    '-r', '__ns:=/arm'], other, tmp_path, tmp_path / 'readme_node.log')
    try:
        steps.until_active('/arm/vla_policy', env=other)
        expected = {'/arm/cameras/base_0_rgb/image_raw', '/arm/instruction', '/arm/joint_states', '/arm/enable',
                    '/arm/estop', '/arm/joint_trajectory_controller/joint_trajectory'}
        # Retried: discovery of every endpoint can take longer than one --spin-time.
        steps.until(lambda out: expected <= set(out.split()), 'ros2', 'topic', 'list', '--no-daemon',
                    '--spin-time', '2', env=other, timeout=30)
        status = steps.run('ros2', 'topic', 'echo', '--once', '--no-daemon', '--timeout', '30', '/diagnostics',
                           'diagnostic_msgs/msg/DiagnosticArray', '--field', 'status', env=other)
        assert "name='/arm/vla_policy: policy'" in status, status
    finally:
        assert stop(readme) == 0, (tmp_path / 'readme_node.log').read_text()[-3000:]

    launch = start(['ros2', 'launch', 'vla_policy_node', 'vla_policy.launch.py',
                    f'params_file:={REPO / "config" / "demo.yaml"}', 'use_sim_time:=true'],
                   env, tmp_path, tmp_path / 'launch.log')
    player = None
    try:
        begin = time.monotonic()
        steps.until_active(NODE)
        steps.times.append(('launch -> active', time.monotonic() - begin))

        dump = steps.run('ros2', 'param', 'dump', NODE, '--no-daemon', '--timeout', '30')
        params = yaml.safe_load(dump)[NODE]['ros__parameters']
        assert set(params) == {spec.name for spec in PARAMETERS} | set(ROS_PARAMETERS)   # every one, none blank
        assert params['joint_names'] == list(TINY_JOINT_NAMES)
        assert params['camera_names'] == [] and params['use_sim_time'] is True
        (tmp_path / 'dump.yaml').write_text(dump)
        # The dump loads back: the same node (a dump names it) on another domain, then the same dump from it.
        copy = start(['vla_policy_node', '--ros-args', '--params-file', str(tmp_path / 'dump.yaml')], other, tmp_path,
                     tmp_path / 'copy_node.log')
        try:
            steps.until_active(NODE, env=other)
            redump = steps.run('ros2', 'param', 'dump', NODE, '--no-daemon', '--timeout', '30', env=other)
            assert yaml.safe_load(redump) == yaml.safe_load(dump)
        finally:
            assert stop(copy) == 0

        assert 'successful' in steps.run('ros2', 'param', 'set', NODE, 'control_rate_hz', '5.0',
                                         '--no-daemon', '--timeout', '30')
        assert '5.0' in steps.run('ros2', 'param', 'get', NODE, 'control_rate_hz', '--no-daemon', '--timeout', '30')
        refused = steps.run('ros2', 'param', 'set', NODE, 'camera_names', "['a']", '--no-daemon', '--timeout', '30',
                            check=False, stderr=True)
        assert 'read-only' in refused, refused
        for transition in ('deactivate', 'activate'):
            # Retried: a --spin-time that did not discover the node prints "Node not found" and sends nothing.
            steps.until(lambda out: 'Transitioning successful' in out,
                        'ros2', 'lifecycle', 'set', NODE, transition, '--no-daemon', '--spin-time', '1')

        player = start(['vla_policy_play', str(tmp_path / 'bag'), '--wait-for-subscribers', '10'], env, tmp_path,
                       tmp_path / 'player.log')
        # The type on the command line: without it echo must discover the publisher within its short
        # --no-daemon spin ("Could not determine the type for the passed topic").
        echoed = steps.run('ros2', 'topic', 'echo', '--once', '--no-daemon', '--timeout', '30', *TRAJECTORY,
                           '--field', 'joint_names')
        assert 'joint_1' in echoed
    finally:
        if player is not None:
            stop(player)
        begin = time.monotonic()
        rc = stop(launch)
        steps.times.append(('Ctrl-C -> launch exit', time.monotonic() - begin))
        text = (tmp_path / 'launch.log').read_text(errors='replace')
        steps.report(t0)
    assert rc == 0, text[-3000:]
    assert 'process has finished cleanly' in text, text[-3000:]
    for noise in ('Traceback', 'RCLError', 'process has died', 'KeyboardInterrupt'):
        assert noise not in text, text[-3000:]
