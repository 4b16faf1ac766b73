"""Papercuts a new user hit: git status after a colcon build, the demo's progress line, the set-up's pip noise."""
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize('path', ['ws/src/x', 'build/x', 'install/setup.bash', 'log/latest'])
def test_colcon_folders_are_ignored(path):
    if not (ROOT / '.git').exists():
        pytest.skip('not a git checkout')
    done = subprocess.run(['git', 'check-ignore', '-q', path], cwd=ROOT, timeout=30)
    assert done.returncode == 0, f'{path} is not ignored'


def test_the_module_the_launch_ros_warning_names_is_installed():
    # The set-up ends with pip's "launch-ros requires ament_index_python, which is not installed": the wheel
    # names the distribution ament_index_python, PyPI's is ros-ament-index-python. The module is there
    # (Makefile comment), so launch_ros works; this fails if it really went missing.
    pytest.importorskip('launch_ros', reason='the ros-tools wheels are not installed')
    import ament_index_python
    assert callable(ament_index_python.get_package_share_directory)


def test_demo_progress_line_takes_ticks_and_published_from_one_diagnostics_message():
    from vla_policy_node.demo import progress_text
    line = progress_text(2.0, 6.0, {'ticks': '18', 'chunks_published': '17', 'ticks_skipped': '1',
                                    'cache_hit_rate': '0.5', 'latency_total_p50_ms': '22.25'}, 0.2, 19)
    assert 'node: ticks 18, published 17, skipped 1, cache hit rate 50%, latency p50 22.2 ms (0.2 s ago)' in line
    assert line.endswith('| received 19 trajectories')
    assert 'no /diagnostics yet' in progress_text(0.1, 6.0, {}, None, 0)


def test_outputs_page_examples_are_valid_params_files(tmp_path):
    import re

    from vla_policy_node.params import load_params_file, problems, resolve_values
    page = (ROOT / 'docs' / 'outputs.md').read_text()
    blocks = [b for b in re.findall(r'```yaml\n(.*?)```', page, re.S) if 'outputs:' in b]
    assert len(blocks) >= 2, 'the UR + gripper and the bimanual examples'
    for k, block in enumerate(blocks):
        path = tmp_path / f'example{k}.yaml'
        path.write_text(block)
        values = resolve_values(load_params_file(path))
        assert problems(values) == [], block
        assert len(values['outputs']) in (2, 4)


def test_shipped_yaml_comments_first_run_values_for_the_safety_parameters():
    from vla_policy_node.params import FIRST_RUN, SPECS
    shipped = (ROOT / 'config' / 'vla_policy.yaml').read_text()
    assert set(FIRST_RUN) <= set(SPECS)
    for name in ('dry_run', 'require_enable', 'ramp_in_sec', 'max_velocity', 'max_position_step', 'limit_mode'):
        assert f'# FIRST RUN ON A REAL ARM: {FIRST_RUN[name]}' in shipped, name


def test_demo_progress_line_prints_a_dash_until_there_is_a_latency_and_counts_holds():
    from vla_policy_node.demo import ms_text, progress_text
    line = progress_text(0.0, 6.0, {'ticks': '0', 'chunks_published': '0', 'latency_total_p50_ms': 'nan'}, 0.2, 0)
    assert 'latency p50 - (0.2 s ago)' in line and 'nan' not in line
    assert progress_text(6.0, 6.0, {}, 0.2, 11, holds=1).endswith('| received 11 trajectories (1 hold)')
    assert ms_text('10.7476') == '10.7 ms' and ms_text(None) == '-' and ms_text('?') == '-'


def test_demo_error_table_columns_fit_their_titles():
    from vla_policy_node.demo import error_table
    errors = {'joint_1': {'rmse': 0.25}, 'joint_2': {'rmse': 0.5}}
    columns = {'smolvla (random) offline': errors, 'pi0 random offline': errors, 'smolvla (random) live': None}
    lines = error_table(columns)
    header = lines[0]
    for title in columns:
        assert f'  {title}' in header, header
    assert all(len(line) == len(header) for line in lines), lines
    assert lines[-1].split() == ['mean', '0.3750', '0.3750', '-']
    trained = error_table({'trained offline': errors, 'pi0 random offline': errors}, ratio=('trained offline',
                                                                                            'pi0 random offline'))
    assert trained[0].split()[-2:] == ['trained/pi0', 'random'] and trained[1].endswith('100.0%')


def test_each_kind_of_demo_run_has_its_own_folder(tmp_path):
    from vla_policy_node.demo import run_folder
    folders = {run_folder(tmp_path, policy, remote) for policy in ('demo', 'pi0', 'pi05', 'smolvla')
               for remote in (False, True)}
    assert len(folders) == 8 and all(folder.parent == tmp_path for folder in folders - {tmp_path})
    assert run_folder(tmp_path, 'demo', False) == tmp_path          # the README's artifacts/demo/report/...
    assert run_folder(tmp_path, 'demo', True) == tmp_path / 'remote'
    assert run_folder(tmp_path, 'smolvla', True) == tmp_path / 'smolvla_remote'


def test_demo_closing_note_fits_the_run():
    from pathlib import Path

    from vla_policy_node.demo import closing_note
    assert 'builtin:demo) is a tiny pi0 trained' in closing_note('demo', Path('x'))
    note = closing_note('smolvla', Path('artifacts/demo/tiny_smolvla'))
    assert 'tiny smolvla with RANDOM weights' in note and 'meaningless' in note
    assert 'SmolVLA or GR00T N1.7 pretrained_model folder' in note
