"""docs/install.md's robot install on a PEP 668 system Python (Ubuntu 24.04 / Debian 12), run for real.

Against this machine's system ``python3`` where it is externally managed: a bare pip install is
refused; a venv with ``--system-site-packages`` still sees the system's (apt's) packages; the page's
pip line installs there; the package's checkpoint doctor runs from it (the package on PYTHONPATH, as
a colcon install puts it). Skips, naming the reason, where there is no such Python. Needs the
registry (or the local wheel cache) for torch and the pip line: a minute or two on 2 cores.
"""
import os
import subprocess
from pathlib import Path

import pytest

from vla_policy_node.policy.tiny_default import write_tiny_default

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path('/usr/bin/python3')
PAGE_PIP_LINE = ['safetensors', 'sentencepiece', 'tokenizers', 'xxhash', 'rosbags']
# What rosdep installs from apt on a robot (package.xml exec_depends); here only what the system lacks.
APT_ON_A_ROBOT = ['numpy', 'pyyaml', 'pillow', 'matplotlib', 'tqdm']


def _system_marker():
    if not SYSTEM_PYTHON.exists():
        return None
    stdlib = subprocess.run([str(SYSTEM_PYTHON), '-c', 'import sysconfig; print(sysconfig.get_path("stdlib"))'],
                            capture_output=True, text=True, timeout=30).stdout.strip()
    marker = Path(stdlib) / 'EXTERNALLY-MANAGED'
    return marker if marker.exists() else None


def _run(command, **kwargs):
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)


@pytest.mark.timeout(900)
@pytest.mark.skipif(_system_marker() is None,
                    reason=f'no externally managed (PEP 668) system Python at {SYSTEM_PYTHON}')
def test_venv_with_system_site_packages_on_a_pep668_python(tmp_path):
    if _run([SYSTEM_PYTHON, '-c', 'import venv, ensurepip'], timeout=30).returncode:
        pytest.skip(f'{SYSTEM_PYTHON} has no venv/ensurepip (apt install python3-venv)')
    env = {k: v for k, v in os.environ.items() if k not in ('VIRTUAL_ENV', 'PYTHONPATH', 'PYTHONHOME')}
    # The failure the page explains.
    refused = _run([SYSTEM_PYTHON, '-m', 'pip', 'install', '--dry-run', 'xxhash'], env=env, timeout=120)
    if 'No module named pip' not in refused.stderr:
        assert refused.returncode != 0 and 'externally-managed-environment' in refused.stderr, refused

    venv = tmp_path / 'venv'
    made = _run([SYSTEM_PYTHON, '-m', 'venv', '--system-site-packages', venv], env=env, timeout=300)
    assert made.returncode == 0, made.stderr
    python = venv / 'bin' / 'python'
    # The system's site packages (where apt puts rclpy and python3-*) stay visible inside the venv.
    system_sites = _run([SYSTEM_PYTHON, '-c', 'import site; print("\\n".join(site.getsitepackages()))'],
                        env=env, timeout=30).stdout.split()
    inside = _run([python, '-c', 'import sys; print("\\n".join(sys.path))'], env=env, timeout=30).stdout.split()
    assert set(system_sites) & set(inside), (system_sites, inside)

    # The page's torch step (the CPU build from the wheel cache here) and its pip line, in the venv.
    torch_spec = os.environ.get('VENV_TEST_TORCH_SPEC', f'torch=={_torch_version()}').split()
    for packages in (torch_spec, PAGE_PIP_LINE + APT_ON_A_ROBOT):
        done = _run([python, '-m', 'pip', 'install', '-q', *packages], env=env, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    checkpoint = write_tiny_default(tmp_path / 'tiny', 'pi0')
    doctor = _run([python, '-m', 'vla_policy_node.doctor', checkpoint], env=dict(env, PYTHONPATH=str(ROOT)),
                  timeout=300)
    assert doctor.returncode == 0 and 'the node would load this checkpoint' in doctor.stdout, \
        doctor.stdout[-2000:] + doctor.stderr[-2000:]
    assert str(venv) in _run([python, '-c', 'import torch; print(torch.__file__)'], env=env, timeout=120).stdout


def test_the_install_page_shows_the_pip_line_this_test_installs():
    # websockets (backend remote, vla_policy_serve) follows the tested packages on the page's line.
    line = [line for line in (ROOT / 'docs' / 'install.md').read_text().splitlines()
            if line.startswith('pip install safetensors')]
    assert len(line) == 1 and line[0].startswith('pip install ' + ' '.join(PAGE_PIP_LINE) + ' '), line


def _torch_version():
    import torch
    return torch.__version__.split('+')[0]
