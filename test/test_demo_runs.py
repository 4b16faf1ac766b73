"""The demo as a user runs it, twice into one --output: the default, then --remote. Each kind of run keeps
its own folder (neither overwrites the other's node log, live trajectories or reports), and a start-up
before the first frames and joint states logs no ERROR (minutes: marked slow)."""
import os
import random
import subprocess
import sys

import pytest

pytest.importorskip('rclpy')

RUN_FILES = ('node.log', 'live_trajectories', 'report/summary.json', 'report_random/summary.json')


def _demo(output, *extra):
    env = dict(os.environ, ROS_DOMAIN_ID=str(random.randint(100, 230)), ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST',
               PYTHONUNBUFFERED='1')
    done = subprocess.run([sys.executable, '-m', 'vla_policy_node.demo', '--output', str(output), *extra], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


def _errors(log):
    return [line for line in log.read_text(errors='replace').splitlines() if line.startswith('[ERROR]')]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_runs_keep_their_own_folders_and_start_without_errors(tmp_path):
    output = tmp_path / 'demo'
    printed = _demo(output)
    assert f'node log: {output / "node.log"}' in printed and f'report: {output / "report"}/' in printed
    for name in RUN_FILES:
        assert (output / name).exists(), name
    default_log = (output / 'node.log').read_bytes()
    default_report = (output / 'report' / 'summary.json').read_bytes()
    assert not _errors(output / 'node.log'), (output / 'node.log').read_text()

    printed = _demo(output, '--remote')
    remote = output / 'remote'
    assert f'node log: {remote / "node.log"}' in printed and f'report: {remote / "report"}/' in printed
    for name in RUN_FILES + ('serve.log',):
        assert (remote / name).exists(), name
    assert (output / 'node.log').read_bytes() == default_log          # the default's run is left as it was
    assert (output / 'report' / 'summary.json').read_bytes() == default_report
    assert not _errors(remote / 'node.log'), (remote / 'node.log').read_text()
