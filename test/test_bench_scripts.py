"""Every script in bench/ runs: its smoke run (--quick; gpu_checks.py: --device cpu --dry-run) exits 0 and
prints its table.

Nothing here looks at a figure (timing never goes into tests); a benchmark that crashes half way through
(a renamed argument, a moved module) fails here instead of on a user's first try. A script that needs what
this machine may lack (lerobot) exits 2 with ``skipped: needs X``; that is accepted for
those scripts only, for that reason only.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / 'bench'

# script -> (arguments of its smoke run, a line of its table that must be printed)
QUICK_RUNS = {
    'bench_runtime.py': (['--quick'], r'miss / hit = [\d.]+x'),
    'bench_rtc.py': (['--quick'], r'\| 150 ms \| rtc \| \d+ \|.*\n(.*\n)*\| tiny \(\d+ layers\) \| [\d.]+ ms \|'),
    'bench_cpu_threads.py': (['--quick'], r'\| 0 \(auto\) \| \d+ \| [\d.]+ \|'),
    'bench_remote.py': (['--quick'], r'remote, raw frames +[\d.]+ /'),
    'bench_fleet.py': (['--quick'], r'N = 8: throughput \(saturated\) batching / serial = [\d.]+x(.*\n)+'
                                    r'N = 8: hit rate affinity [\d.]+'),
    'bench_camera_clock.py': (['--quick'], r'\| 1e6 s ahead \| back \| (?:[\d.]+|> [\d.]+) \|'),
    'bf16_accuracy.py': (['--quick'], r'ours / before = [\d.]+x max'),
    'flops.py': (['--quick'], r'\| tiny \| pi0 \| \d+ \| \d+ \| [\d.]+ \| [\d.]+ \|'),
    # the whole script through the strict CUDA-capture stand-in, so the device script cannot rot (~1 min alone)
    'gpu_checks.py': (['--device', 'cpu', '--dry-run', '--output', 'gpu_checks.json'], r'all checks passed'),
    'compare_lerobot_dataset.py': (['--quick'], r'meta/stats.json vs lerobot'),
    'compare_lerobot_smolvla.py': (['--quick'], r'lerobot vs ours'),
    'compare_lerobot_groot.py': (['--quick'], r'lerobot vs ours, fp32 cases: actions within'),
    'compare_lerobot_bf16.py': (['--quick'], r'ours / lerobot: [\d.]+x max'),
    'quant_speed.py': (['--quick'], r'int8_weights +miss +[\d.]+ ms \([\d.]+x\), hit'),
    'quant_accuracy.py': (['--quick'], r'int8_weights \(fp32\) +[\d.]+ / [\d.]+'),
}
# The only scripts allowed to skip, and what they may say they need.
MAY_SKIP = {
    'bench_camera_clock.py': 'rclpy',
    'compare_lerobot_dataset.py': 'lerobot',
    'compare_lerobot_smolvla.py': 'lerobot',
    'compare_lerobot_groot.py': 'lerobot',
    'compare_lerobot_bf16.py': 'lerobot',
}
# Tens of seconds each on a shared 2-core machine (several processes, a replay of a bag, deep models).
SLOW = {'bench_rtc.py', 'bench_cpu_threads.py', 'bench_remote.py', 'bench_fleet.py', 'quant_accuracy.py',
        'gpu_checks.py', 'bench_camera_clock.py'}


def _scripts():
    return sorted(p.name for p in BENCH.glob('*.py') if "__name__ == '__main__'" in p.read_text())


def test_every_bench_script_has_a_quick_run_here():
    scripts = _scripts()
    assert set(QUICK_RUNS) == set(scripts), 'a bench script without its smoke run here (or a stale row)'
    for name in scripts:
        assert '--quick' in (BENCH / name).read_text(), f'{name} has no --quick mode'


@pytest.mark.parametrize('name', [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in sorted(QUICK_RUNS)])
def test_quick_mode_runs_and_prints_its_table(name, tmp_path):
    arguments, table = QUICK_RUNS[name]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED='1')
    done = subprocess.run([sys.executable, str(BENCH / name)] + arguments, cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    if done.returncode == 2 and name in MAY_SKIP:
        assert f'skipped: needs {MAY_SKIP[name]}' in done.stdout, output[-3000:]
        pytest.skip(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0, f'{name} exited {done.returncode}:\n{output[-3000:]}'
    assert re.search(table, done.stdout), f'{name} did not print its table:\n{done.stdout[-3000:]}'
    assert 'Traceback' not in output, output[-3000:]
    if name == 'gpu_checks.py':                  # what a user with a GPU reads: the JSON, every check in it
        results = json.loads((tmp_path / 'gpu_checks.json').read_text())
        assert results['dry_run'] and results['failures'] == [] and len(results['checks']) > 50
        assert any(check['name'].startswith('warm-up captured every bucket') for check in results['checks'])
