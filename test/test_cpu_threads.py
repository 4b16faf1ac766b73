"""cpu_threads: 0 is auto (room for the executor, the tick thread and the other processes), -1 torch's default."""
import os

import pytest

from dds_helpers import NodeProcess, base_params, isolate, pick_domain_id

from vla_policy_node.params import problems, resolve_values
from vla_policy_node.policy.tiny_default import write_tiny_default
from vla_policy_node.settings import cpu_threads, usable_cpus

DOMAIN_ID = pick_domain_id()
isolate(DOMAIN_ID)


@pytest.mark.parametrize('cpus, threads', [(1, 1), (2, 1), (3, 1), (4, 2), (8, 4), (16, 8), (64, 32)])
def test_auto_leaves_room(cpus, threads):
    assert cpu_threads(0, cpus) == threads


def test_explicit_and_torch_default():
    assert cpu_threads(3, 2) == 3
    assert cpu_threads(-1, 2) == 0                      # torch keeps its own default
    assert problems(resolve_values({'joint_names': ['a'], 'cpu_threads': -1})) == []
    assert 'cpu_threads must be in [-1, 256]' in problems(resolve_values({'joint_names': ['a'], 'cpu_threads': -2}))[0]


@pytest.mark.dds
@pytest.mark.timeout(90)
def test_the_node_says_how_many_threads_auto_gave(tmp_path):
    pytest.importorskip('rclpy')
    checkpoint = write_tiny_default(tmp_path / 'tiny', 'pi0')
    proc = NodeProcess(tmp_path / 'node', base_params(checkpoint), DOMAIN_ID).start()
    try:
        expected = f'torch CPU threads: {cpu_threads(0)} (cpu_threads 0, {usable_cpus()} usable CPUs)'
        assert proc.wait_for_log(lambda line: expected in line, timeout=60), proc.log_tail()
    finally:
        proc.stop()
    assert usable_cpus() <= (os.cpu_count() or 1)
