"""A figure in the docs that names a deterministic command is that command's output: each test here runs the
command the page names and compares the page's table with what it gives, so a figure cannot drift silently
when the code under it changes.

Deterministic means the same on any CPU: the demo policy's replays in fp32 (README's RMSE tables) and the
hand-over table of bench/bench_rtc.py (docs/control.md) give the same digits with the default ISA and with
``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2``. A printed figure may still move by one in its last
digit on another CPU, so numbers compare within 1.5 units of that digit, words and counts exactly. Timings
and the bf16 / int8 accuracy figures (measured per CPU, each with its machine and date) are benchmarks, not
checked here.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def table_after(text: str, anchor: str) -> List[List[str]]:
    """The rows (cells stripped, the header rule left out) of the first markdown table after the first line
    that contains ``anchor``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if anchor in line)
    first = next(i for i in range(start + 1, len(lines)) if lines[i].startswith('|'))
    rows = []
    for line in lines[first:]:
        if not line.startswith('|'):
            break
        cells = [cell.strip() for cell in line.strip().strip('|').split('|')]
        if not all(set(cell) <= set('-: ') for cell in cells):
            rows.append(cells)
    return rows


def _number(cell: str):
    try:
        return float(cell)
    except ValueError:
        return None


def figure_problems(shown: List[List[str]], computed: List[List[str]]) -> List[str]:
    """Where the page's cells differ from the computed ones: numbers by more than 1.5 units of the page's
    last digit, anything else at all."""
    if len(shown) != len(computed):
        return [f'{len(shown)} rows on the page, {len(computed)} computed']
    problems = []
    for row, (page_row, run_row) in enumerate(zip(shown, computed)):
        if len(page_row) != len(run_row):
            problems.append(f'row {row}: {page_row} vs {run_row}')
            continue
        for page_cell, run_cell in zip(page_row, run_row):
            a, b = _number(page_cell), _number(run_cell)
            if a is not None and b is not None and '.' in page_cell:
                unit = 10.0 ** -len(page_cell.split('.')[1])
                if abs(a - b) > 1.5 * unit:
                    problems.append(f'row {row} ({page_row[0]}): the page says {page_cell}, the command gives '
                                    f'{run_cell}')
            elif page_cell != run_cell:
                problems.append(f'row {row}: the page says {page_cell!r}, the command gives {run_cell!r}')
    return problems


def test_the_comparison_sees_a_drifted_figure():
    shown = [['0 ms', 'independent', '53', '0.2745']]
    assert figure_problems(shown, [['0 ms', 'independent', '53', '0.2746']]) == []
    assert figure_problems(shown, [['0 ms', 'independent', '53', '0.6661']])
    assert figure_problems(shown, [['0 ms', 'rtc', '53', '0.2745']])
    assert figure_problems(shown, [['0 ms', 'independent', '54', '0.2745']])
    assert table_after('x\nthe command\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nafter\n', 'command') == [
        ['a', 'b'], ['1', '2']]


def _run(command: str, cwd: Path, timeout: int = 900) -> str:
    env = dict(os.environ, PATH=f'{BIN}{os.pathsep}{os.environ.get("PATH", "")}', PYTHONPATH=str(ROOT),
               OMP_NUM_THREADS='1')
    done = subprocess.run(['bash', '-ec', command], cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f'{command} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}'
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_handover_table_of_the_control_page_is_bench_rtc_output(tmp_path):
    command = 'python bench/bench_rtc.py --handover-only'
    text = (ROOT / 'docs' / 'control.md').read_text()
    assert f'`{command}`' in text
    output = _run(f'python {ROOT / "bench" / "bench_rtc.py"} --handover-only', tmp_path)
    computed = [[cell.strip() for cell in line.strip().strip('|').split('|')]
                for line in output.splitlines() if line.startswith('|') and not line.startswith('|---')]
    problems = figure_problems(table_after(text, f'`{command}`'), computed)
    assert not problems, f'docs/control.md is not what `{command}` prints now:\n' + '\n'.join(problems) + \
        '\n' + output


def _readme_block(text: str, first_command: str) -> str:
    """The ```bash block of the README that starts with ``first_command``."""
    start = text.index(f'```bash\n{first_command}') + len('```bash\n')
    return text[start:text.index('```', start)]


def _rmse_row(report: Path) -> List[str]:
    errors = json.loads((report / 'summary.json').read_text())['command_error']
    values = [errors[f'joint_{i}']['rmse'] for i in range(1, 7)]
    return [f'{v:.4f}' for v in values] + [f'{sum(values) / len(values):.4f}']


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_rmse_tables_are_what_their_commands_give(tmp_path):
    """The held-out block of the README, run as written from a folder like the clone's root (its config/),
    gives the held-out table, row by row through the report folder each row names; the first table's
    offline rows are `make demo`'s replays of the same bag (seed 0, 6 s) with builtin:demo and builtin:tiny."""
    text = (ROOT / 'README.md').read_text()
    (tmp_path / 'config').symlink_to(ROOT / 'config')
    block = _readme_block(text, 'vla_policy_make_bag artifacts/heldout/demo_bag')
    _run(block, tmp_path)
    heldout = tmp_path / 'artifacts' / 'heldout'
    shown = table_after(text, 'vla_policy_replay --dataset artifacts/heldout/dataset --episodes 1')
    computed = [shown[0]]
    for row in shown[1:]:
        report = re.search(r'`(\w+_report)`', row[0]).group(1)
        computed.append([row[0]] + _rmse_row(heldout / report))
    problems = figure_problems(shown, computed)
    _run(f'vla_policy_replay {heldout / "demo_bag"} --params config/demo.yaml --checkpoint builtin:tiny '
         f'--output {tmp_path / "random_on_demo_bag"} --no-progress', tmp_path)
    first = table_after(text, 'Per-joint RMSE against the recorded command over the demo')
    offline = {'builtin:demo, offline replay': heldout / 'demo_bag_report',
               'builtin:tiny (random), offline': tmp_path / 'random_on_demo_bag'}
    rows = [row for row in first if row[0] in offline]
    assert len(rows) == 2, first
    problems += figure_problems(rows, [[row[0]] + _rmse_row(offline[row[0]]) for row in rows])
    assert not problems, 'the README is not what its commands give now:\n' + '\n'.join(problems)
