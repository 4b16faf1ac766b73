"""The documentation tells the truth: README.md and docs/*.md, checked against the code.

- every ```yaml block is a params file the node would take (through the one parameter table, and against
  the checkpoint where it names one that exists); a block marked as a fragment is merged into the shipped
  config/vla_policy.yaml first;
- every documented command of this package (console scripts, bench scripts, `python -m`, make targets,
  launch arguments) uses options that exist;
- config/demo_outputs.yaml is the file docs/outputs.md shows, and the page's replay command runs and feeds
  both controllers what they accept;
- links between pages resolve, the README stays short, and no page talks about how it was written.
"""
import contextlib
import importlib
import io
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest
import yaml

from vla_policy_node.params import ParameterError, flatten, load_params_file, resolve_values, validate

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHIPPED = ROOT / 'config' / 'vla_policy.yaml'
FRAGMENT = '# fragment: merged into config/vla_policy.yaml'
# Pages the map links to that other changes bring (the map may name them before they land).
PENDING_PAGES: set = set()
README_MAX_LINES = 300


def pages() -> List[Path]:
    return [ROOT / 'README.md'] + sorted((ROOT / 'docs').glob('*.md'))


def fenced(text: str, language: str) -> List[str]:
    """The bodies of the ```<language> blocks of a markdown text, indented ones (in a list item) dedented."""
    blocks = []
    for match in re.finditer(rf'^([ \t]*)```{language}\n(.*?)^\1```', text, re.M | re.S):
        indent = len(match.group(1))
        blocks.append(''.join(line[indent:] if line[:indent].strip() == '' else line
                              for line in match.group(2).splitlines(keepends=True)))
    return blocks


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def yaml_blocks() -> List[Tuple[str, str]]:
    return [(f'{_name(page)}#{k}', block)
            for page in pages() for k, block in enumerate(fenced(page.read_text(), 'yaml'))]


# ---- YAML blocks --------------------------------------------------------------------------------------------

def block_problems(block: str, tmp_path: Path) -> List[str]:
    """Why the node would not take this block as its params file (empty: it would)."""
    try:
        document = yaml.safe_load(block)
    except yaml.YAMLError as exc:
        return [f'not YAML: {exc}']
    if block.lstrip().startswith(FRAGMENT):
        if not isinstance(document, dict) or any(str(key).startswith('/') for key in document):
            return ['a fragment holds bare parameters (no "/**: ros__parameters:" header)']
        raw = load_params_file(SHIPPED)
        raw.update(flatten(document))
    else:
        sections = ('/**', '/**/vla_policy')
        if (not isinstance(document, dict) or len(document) != 1 or next(iter(document)) not in sections
                or not isinstance(next(iter(document.values())), dict)
                or set(next(iter(document.values()))) != {'ros__parameters'}):
            return [f'not a complete params file: one of {sections} with ros__parameters (or a first line '
                    f'"{FRAGMENT}")']
        path = tmp_path / 'block.yaml'
        path.write_text(block)
        raw = load_params_file(path)
        missing = [name for name in ('joint_names', 'checkpoint_path') if name not in raw
                   and not (name == 'checkpoint_path' and raw.get('backend') == 'remote')]
        if missing:
            return [f'a complete file sets {missing}']
    try:
        values = resolve_values(raw)
        validate(values)
        config = _checkpoint_config(values)
        if config is not None:
            validate(values, config)
    except ParameterError as exc:
        return [str(exc)]
    return []


def _checkpoint_config(values: Dict) -> Optional[object]:
    """The config of the checkpoint a block names, where it exists here (builtin:demo, builtin:tiny, a folder)."""
    if values['backend'] != 'local':
        return None
    from vla_policy_node.policy.families import folder_config
    from vla_policy_node.settings import checkpoint_folder

    folder = checkpoint_folder(values['checkpoint_path'])
    return folder_config(folder) if (folder / 'config.json').is_file() else None


@pytest.mark.parametrize('where, block', yaml_blocks(), ids=[where for where, _ in yaml_blocks()])
def test_every_yaml_block_is_a_params_file_the_node_takes(where, block, tmp_path):
    assert block_problems(block, tmp_path) == [], f'{where}:\n{block}'


def test_the_yaml_check_refuses_broken_blocks(tmp_path):
    demo = '/**:\n  ros__parameters:\n    checkpoint_path: "builtin:demo"\n'
    assert block_problems(demo + '    joint_names: [a, b, c, d, e, f]\n', tmp_path) == []
    # The checkpoint has 6 actions: 7 joints are refused against it, not by the table alone.
    seven = demo + '    joint_names: [a, b, c, d, e, f, g]\n'
    assert 'joint_names has 7 entries; the checkpoint has action_dim 6' in block_problems(seven, tmp_path)[0]
    assert 'not a complete params file' in block_problems('    backend: remote\n    joint_names: [a]\n',
                                                          tmp_path)[0]
    assert "sets ['joint_names']" in block_problems(demo, tmp_path)[0]
    typo = demo + '    joint_names: [a, b, c, d, e, f]\n    contrl_rate_hz: 10.0\n'
    assert 'unknown parameter' in block_problems(typo, tmp_path)[0]
    assert 'control_rate_hz' in block_problems(f'{FRAGMENT}\ncontrol_rate_hz: 1000.0\n', tmp_path)[0]
    assert block_problems(f'{FRAGMENT}\ncontrol_rate_hz: 5.0\n', tmp_path) == []
    assert 'bare parameters' in block_problems(f'{FRAGMENT}\n{demo}', tmp_path)[0]
    # A fragment is merged into the shipped file, whose 6 joints a 4-joint limit list does not fit.
    assert 'max_velocity has 4 entries' in block_problems(f'{FRAGMENT}\nmax_velocity: [1.0, 1.0, 1.0, 1.0]\n',
                                                          tmp_path)[0]


def test_indented_blocks_are_found_and_dedented():
    text = 'x\n\n1. step\n\n   ```yaml\n   a: 1\n   b: [2]\n   ```\n\n```yaml\nc: 3\n```\n'
    assert fenced(text, 'yaml') == ['a: 1\nb: [2]\n', 'c: 3\n']


# ---- commands -----------------------------------------------------------------------------------------------

def console_scripts() -> Dict[str, str]:
    text = (ROOT / 'setup.py').read_text()
    return dict(re.findall(r"'(vla_policy_\w+) = ([\w.]+):main'", text))


def documented_commands() -> List[Tuple[str, List[str]]]:
    """(page, words) of each command line of this package in the pages' bash blocks and inline code."""
    scripts = console_scripts()
    found = []
    for page in pages():
        text = page.read_text()
        lines = [line for block in fenced(text, 'bash') for line in block.replace('\\\n', ' ').splitlines()]
        lines += re.findall(r'(?<!`)`([^`\n]+)`(?!`)', re.sub(r'```.*?```', '', text, flags=re.S))
        for line in lines:
            for words in _commands(line):
                head = words[0]
                ours = head in ('python', 'python3') and len(words) > 1 and (
                    words[1].startswith('bench/') or words[1:3] == ['-m', words[2] if len(words) > 2 else '']
                    and words[2].startswith('vla_policy_node'))
                if head in scripts or head == 'make' or ours or (words[:2] == ['ros2', 'launch'] and len(words) > 3):
                    found.append((_name(page), words))
    return found


def _commands(line: str) -> List[List[str]]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:           # an unbalanced quote: not a command line
        return []
    commands, current = [], []
    for token in tokens + [';']:
        if token in ('&&', '||', ';', '|', '&', '(', ')'):
            while current and (re.match(r'^[A-Z_]+=', current[0]) or current[0] in ('nice', 'sudo', 'time')):
                current = current[3:] if current[0] == 'nice' and current[1:2] == ['-n'] else current[1:]
            if current:
                commands.append(current)
            current = []
        else:
            current.append(token)
    return commands


def _help(target: List[str]) -> str:
    """`--help` of a console script, a bench script or a module, run in this process (torch imports once)."""
    out = io.StringIO()
    argv = sys.argv
    try:
        sys.argv = [target[1], *target[2:], '--help']          # target[2:]: a subcommand (vla_policy_fleet up)
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            if target[0] == 'path':
                runpy.run_path(str(ROOT / target[1]), run_name='__main__')
            else:
                importlib.import_module(target[1]).main()
    finally:
        sys.argv = argv
    return out.getvalue()


def _options(words: List[str]) -> List[str]:
    if '--ros-args' in words:
        words = words[:words.index('--ros-args')]
    return [word.strip('[]').split('=')[0] for word in words if word.strip('[]').startswith('--')]


def test_documented_commands_use_options_that_exist():
    scripts = console_scripts()
    makefile = (ROOT / 'Makefile').read_text()
    targets = set(re.findall(r'^([a-z][a-z0-9-]*):', makefile, re.M))
    variables = set(re.findall(r'^([A-Z_]+) \?=', makefile, re.M))
    launch_file = (ROOT / 'launch' / 'vla_policy.launch.py').read_text()
    launch_args = set(re.findall(r"DeclareLaunchArgument\(\s*'(\w+)'", launch_file))
    helps: Dict[Tuple[str, str], str] = {}
    wrong, checked = [], 0
    for page, words in documented_commands():
        if words[0] == 'make':
            bad = [w for w in words[1:] if ('=' in w and w.split('=')[0] not in variables)
                   or ('=' not in w and w not in targets)]
        elif words[:2] == ['ros2', 'launch']:
            bad = [w for w in words[4:] if ':=' in w and w.split(':=')[0] not in launch_args]
            bad += [] if words[2:4] == ['vla_policy_node', 'vla_policy.launch.py'] else [' '.join(words[2:4])]
        else:
            if words[0] in scripts:
                target, rest = ('module', scripts[words[0]]), words[1:]
            elif words[1] == '-m':
                target, rest = ('module', words[2]), words[3:]
            else:
                target, rest = ('path', words[1]), words[2:]
            while rest and not rest[0].startswith('-') and re.fullmatch(r'[a-z][a-z-]*', rest[0]):
                target, rest = target + (rest[0],), rest[1:]          # a subcommand's own options
            options = _options(rest)
            if not options:
                continue
            if target not in helps:
                helps[target] = _help(list(target))
            bad = [option for option in options if not re.search(rf'(?<![\w-]){re.escape(option)}(?![\w-])',
                                                                 helps[target])]
        checked += 1
        if bad:
            wrong.append(f'{page}: {" ".join(words)}: {bad}')
    assert checked >= 20, checked           # the extraction found the pages' commands
    assert wrong == []


def test_the_command_check_sees_a_wrong_option():
    assert _options(['BAG', '--params', 'x', '[--seed', '0]', '--latency-ms=5']) == ['--params', '--seed',
                                                                                     '--latency-ms']
    assert _commands('BAG=x nice -n 10 vla_policy_play $BAG --rate 0.5 & kill -INT %1') == [
        ['vla_policy_play', '$BAG', '--rate', '0.5'], ['kill', '-INT', '%1']]
    assert '--wait-for-subscribers' in _help(['module', 'vla_policy_node.replay.play'])
    assert '--no-such-option' not in _help(['module', 'vla_policy_node.replay.play'])


# ---- the outputs example ------------------------------------------------------------------------------------

def test_outputs_page_shows_the_shipped_demo_outputs_file():
    shown = fenced((ROOT / 'docs' / 'outputs.md').read_text(), 'yaml')
    assert (ROOT / 'config' / 'demo_outputs.yaml').read_text() in shown


@pytest.mark.timeout(300)
def test_outputs_page_replay_command_feeds_both_controllers(tmp_path):
    pytest.importorskip('rclpy')
    from dds_helpers import check_jtc
    from vla_policy_node.bags.bag_io import read_messages
    from vla_policy_node.replay.make_bag import write_sample_bag
    from vla_policy_node.train_demo import DEMO_BAG_SPEC

    commands = [words for page, words in documented_commands()
                if page == 'docs/outputs.md' and words[0] == 'vla_policy_replay']
    assert len(commands) == 1, commands
    words = commands[0]
    bag, output = tmp_path / 'sample_bag', tmp_path / 'report'
    write_sample_bag(bag, DEMO_BAG_SPEC)
    words = [str(bag) if w == 'artifacts/demo/sample_bag' else str(output) if w == 'artifacts/demo_outputs'
             else w for w in words]
    assert str(bag) in words and str(output) in words, words
    done = subprocess.run([str(BIN / words[0]), *words[1:], '--no-progress'], cwd=ROOT, capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    arm = list(read_messages(output / 'trajectories', ['/arm_controller/joint_trajectory']))
    gripper = list(read_messages(output / 'trajectories', ['/gripper_controller/commands']))
    assert len(arm) == len(gripper) > 20
    arm_joints = [f'joint_{i}' for i in range(1, 6)]
    for a, g in zip(arm, gripper):
        assert a.timestamp_ns == g.timestamp_ns                         # one publication, one plan
        check_jtc(a.msg, arm_joints, now_ns=a.timestamp_ns)             # what joint_trajectory_controller takes
        assert len(a.msg.points) > 1
        # forward_command_controller takes one finite value per joint it owns.
        assert len(g.msg.data) == 1 and np.isfinite(g.msg.data).all()
    # The gripper follows joint 6 of the same plans: the values move, they are not a constant.
    assert np.ptp([g.msg.data[0] for g in gripper]) > 0.1


# ---- links, length, wording ---------------------------------------------------------------------------------

def test_links_between_pages_resolve():
    broken = []
    for page in pages():
        for target in re.findall(r'\]\(([^)#\s]+)(?:#[^)]*)?\)', page.read_text()):
            if re.match(r'^[a-z]+://', target):
                continue
            path = (page.parent / target).resolve()
            if not path.exists() and _name(path) not in PENDING_PAGES:
                broken.append(f'{_name(page)} -> {target}')
    assert broken == []


def test_anchors_between_pages_resolve():
    def anchors(path: Path) -> set:
        headings = re.findall(r'^#+ (.+)$', re.sub(r'```.*?```', '', path.read_text(), flags=re.S), re.M)
        return {re.sub(r'[^\w\- ]', '', h.lower()).replace(' ', '-') for h in headings}

    broken = []
    for page in pages():
        for target, anchor in re.findall(r'\]\(([^)#\s]*)#([^)\s]+)\)', page.read_text()):
            path = (page.parent / target).resolve() if target else page
            if path.exists() and anchor not in anchors(path):
                broken.append(f'{_name(page)} -> {target}#{anchor}')
    assert broken == []


def test_the_commands_the_user_journey_runs_are_on_the_pages():
    # test_user_journey.py runs these as written; here the pages are held to them.
    readme, install = (ROOT / 'README.md').read_text(), (ROOT / 'docs' / 'install.md').read_text()
    shipped = 'vla_policy_node --ros-args --params-file config/vla_policy.yaml'
    assert shipped in readme and shipped in install
    assert 'mkdir -p ws/src && ln -s "$PWD" ws/src/vla_policy_node' in install
    assert '(cd ws && colcon build --packages-select vla_policy_node) && . ws/install/setup.bash' in install


def test_readme_is_short():
    lines = len((ROOT / 'README.md').read_text().splitlines())
    assert lines <= README_MAX_LINES, f'README.md has {lines} lines: move the detail to a page under docs/'


@pytest.mark.parametrize('phrase', ['this round', 'previous round', 'last round', "this project's",
                                    'this session', 'previous session', 'our machine', 'this machine',
                                    'on disk here'])
def test_no_page_speaks_of_how_it_was_made(phrase):
    found = [_name(page) for page in pages() if re.search(rf'\b{phrase}\b', page.read_text(), re.I)]
    assert found == [], f'{phrase!r}: a figure names its command, machine and date instead'
