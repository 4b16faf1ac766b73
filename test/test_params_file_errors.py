"""A params file that is missing or does not parse, typed as a user types it: one line naming the file and
exit status 2 from the node and the live player (``--ros-args --params-file``), never rclpy's traceback
"Couldn't parse params file". (vla_policy_replay's ``--params``: test_replay_offline.py.)"""
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip('rclpy')

from vla_policy_node.params import (  # noqa: E402
    ParameterError, check_ros_args_params_files, ros_args_params_files)

BIN = Path(sys.executable).parent
NOT_YAML = '/**:\n  ros__parameters:\n    joint_names: [joint_1, joint_2\n'
# YAML, but rcl reads a value before ros__parameters as an error: only rcl refuses it.
RCL_REFUSES = '/**:\n  ros__parameters: 5\n'


def _run(script, arguments, cwd):
    env = dict(os.environ, ROS_DOMAIN_ID=str(random.randint(100, 200)), ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST')
    assert (BIN / script).exists(), f'{script} is not installed in {BIN}'
    return subprocess.run([str(BIN / script)] + arguments, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def _lines(text):
    return [line for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize('script, before', [('vla_policy_node', []), ('vla_policy_play', ['some_bag'])])
def test_missing_params_file_is_one_line_and_status_2(tmp_path, script, before):
    result = _run(script, before + ['--ros-args', '--params-file', 'robot.yaml'], tmp_path)
    assert result.returncode == 2, result.stderr
    assert _lines(result.stderr) == [f'{script}: error: params file robot.yaml does not exist'], result.stderr
    assert 'Traceback' not in result.stdout + result.stderr


def test_unparsable_params_file_names_the_file_and_line(tmp_path):
    (tmp_path / 'robot.yaml').write_text(NOT_YAML)
    result = _run('vla_policy_node', ['--ros-args', '--params-file', 'robot.yaml'], tmp_path)
    assert result.returncode == 2, result.stderr
    lines = _lines(result.stderr)
    assert len(lines) == 1 and lines[0].startswith(
        'vla_policy_node: error: params file robot.yaml is not valid YAML (line 4, column 1'), result.stderr


def test_what_only_rcl_refuses_is_reported_without_a_traceback(tmp_path):
    (tmp_path / 'robot.yaml').write_text(RCL_REFUSES)
    result = _run('vla_policy_node', ['--ros-args', '--params-file', 'robot.yaml'], tmp_path)
    assert result.returncode == 2, result.stderr
    assert 'Traceback' not in result.stderr
    ours = [line for line in _lines(result.stderr) if line.startswith('vla_policy_node: error: ')]
    assert len(ours) == 1 and 'robot.yaml' in ours[0] and 'ros__parameters' in ours[0], result.stderr


def test_params_files_are_read_from_the_ros_args_sections_only(tmp_path):
    argv = ['prog', '--params-file', 'not_ros.yaml', '--ros-args', '-p', 'a:=1', '--params-file', 'a.yaml', '--',
            '--params-file', 'app.yaml', '--ros-args', '--params-file', 'b.yaml']
    assert ros_args_params_files(argv) == ['a.yaml', 'b.yaml']
    good = tmp_path / 'good.yaml'
    good.write_text('/**:\n  ros__parameters:\n    control_rate_hz: 5.0\n')
    check_ros_args_params_files(['prog', '--ros-args', '--params-file', str(good)])
    with pytest.raises(ParameterError, match='is a folder, not a file'):
        check_ros_args_params_files(['prog', '--ros-args', '--params-file', str(tmp_path)])
