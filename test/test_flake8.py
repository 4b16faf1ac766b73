"""Lint: ament_flake8 on a ROS machine, plain flake8 elsewhere (same setup.cfg rules)."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.flake8
@pytest.mark.linter
def test_flake8():
    pytest.importorskip('flake8', reason='flake8 is not installed (pip install -e .[test])')
    result = subprocess.run([sys.executable, '-m', 'flake8', 'vla_policy_node', 'test', 'bench', 'launch',
                             'setup.py'], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, 'flake8 found problems:\n' + result.stdout + result.stderr
