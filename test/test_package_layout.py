"""The ament_python layout that colcon and ros2 run rely on, checked without colcon."""
import ast
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_package_xml_is_format_3_with_runtime_dependencies():
    root = ET.parse(ROOT / 'package.xml').getroot()
    assert root.get('format') == '3'
    assert root.findtext('name') == 'vla_policy_node'
    assert root.find('export/build_type').text == 'ament_python'
    exec_deps = {e.text for e in root.findall('exec_depend')}
    # Every ROS package the code imports must be declared for rosdep.
    imported = set()
    for path in (ROOT / 'vla_policy_node').rglob('*.py'):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level == 0):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or '']
                imported |= {n.split('.')[0] for n in names}
    ros_roots = ('rclpy', 'rcl_interfaces', 'builtin_interfaces')
    ros_packages = {n for n in imported if n.endswith('_msgs') or n in ros_roots}
    assert ros_packages <= exec_deps, f'undeclared: {sorted(ros_packages - exec_deps)}'


def test_setup_installs_marker_launch_config_and_console_scripts():
    text = (ROOT / 'setup.py').read_text()
    assert "'resource/' + package_name" in text
    for folder in ('launch', 'config'):
        assert f"'{folder}'" in text
    scripts = set(re.findall(r"'(vla_policy_\w+) = ", text))
    assert {'vla_policy_node', 'vla_policy_replay', 'vla_policy_play', 'vla_policy_make_bag'} <= scripts
    assert (ROOT / 'resource' / 'vla_policy_node').is_file()
    cfg = (ROOT / 'setup.cfg').read_text()
    assert 'script_dir=$base/lib/vla_policy_node' in cfg
    assert 'install_scripts=$base/lib/vla_policy_node' in cfg


def test_torch_is_never_pinned_exactly():
    text = (ROOT / 'setup.py').read_text()
    assert not re.search(r"'torch\s*==", text), 'robots take torch from the vendor; use a range'


def test_config_yaml_documents_every_parameter():
    from vla_policy_node.params import yaml_document

    assert (ROOT / 'config' / 'vla_policy.yaml').read_text().splitlines() == yaml_document(), \
        'config/vla_policy.yaml is stale: python -m vla_policy_node.params --yaml > config/vla_policy.yaml'


def test_parameters_page_tables_are_generated_from_the_declared_parameters():
    from vla_policy_node.params import DOCS_PAGE, markdown_table, topics_table

    page = (ROOT / DOCS_PAGE).read_text()
    stale = f'{DOCS_PAGE} is stale: python -m vla_policy_node.params --docs {DOCS_PAGE}'
    assert markdown_table() in page, f'the parameter table of {stale}'
    assert topics_table() in page, f'the topics table of {stale}'


def test_the_docs_generator_rewrites_both_tables_in_place(tmp_path):
    from vla_policy_node.params import main, markdown_table, topics_table

    page = tmp_path / 'page.md'
    old_parameters = '| parameter | type | default | live | range / choices | description |\n|---|\n| `x` |'
    page.write_text(f'# t\n\n{old_parameters}\n\ntext\n\n| | topic | type | QoS |\n| old |\n\nend\n')
    assert main(['--docs', str(page)]) == 0
    assert page.read_text() == f'# t\n\n{markdown_table()}\n\ntext\n\n{topics_table()}\n\nend\n'
    (tmp_path / 'readme.md').write_text('# no tables here\n')
    with pytest.raises(SystemExit, match='the generated tables live in docs/parameters.md'):
        main(['--docs', str(tmp_path / 'readme.md')])


def test_policy_runtime_keeps_to_its_one_job():
    """PolicyRuntime is observation in, chunk out, cache and timing; warm-up, self-description, the denoise
    inputs and the content checks have modules of their own, and the family's options stay on the family."""
    tree = ast.parse((ROOT / 'vla_policy_node' / 'runtime' / 'policy_runtime.py').read_text())
    runtime = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == 'PolicyRuntime')
    lines = runtime.end_lineno - runtime.lineno + 1
    assert lines <= 250, f'PolicyRuntime is {lines} lines; give the new work its own module under runtime/'
    copied = [node.lineno for node in ast.walk(runtime)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'setattr']
    assert not copied, f'setattr at line(s) {copied}: read the family options from runtime.policy.options'


def _imports_the_package(node: ast.AST) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Import) and any(a.name.split('.')[0] == 'vla_policy_node' for a in inner.names):
            return True
        if isinstance(inner, ast.ImportFrom) and (inner.module or '').split('.')[0] == 'vla_policy_node':
            return True
    return False


def test_no_test_skips_when_the_package_itself_does_not_import():
    """A broken import of this package must fail the suite, not skip it: importorskip is for optional
    third-party modules (rclpy, pyarrow, transformers, ...), never for vla_policy_node's own modules, and no
    ``except ImportError`` wraps an import of them."""
    found = []
    for path in sorted((ROOT / 'test').glob('*.py')):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, 'attr', getattr(node.func, 'id', '')) == \
                    'importorskip' and node.args and isinstance(node.args[0], ast.Constant) and \
                    str(node.args[0].value).split('.')[0] == 'vla_policy_node':
                found.append(f'{path.name}:{node.lineno} importorskip({node.args[0].value!r})')
            if isinstance(node, ast.Try) and any(_imports_the_package(statement) for statement in node.body):
                caught = ' '.join(ast.unparse(handler.type) for handler in node.handlers if handler.type is not None)
                if 'ImportError' in caught or 'ModuleNotFoundError' in caught or any(
                        handler.type is None for handler in node.handlers):
                    found.append(f'{path.name}:{node.lineno} an import of vla_policy_node under try/{caught}')
    assert not found, 'tests that would skip (or pass) when the package breaks:\n' + '\n'.join(found)
