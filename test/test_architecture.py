"""The package's shape, checked from its source: layers that point one way, and a family seam with no leaks.

docs/architecture.md draws the same layers and seams; when a module moves, both change together.

- The import graph (ast over vla_policy_node/, every import statement, function-level ones included; tests
  are not part of it) has no cycle, not even through the imports under ``if TYPE_CHECKING:`` (annotations
  point one way too: a Protocol in the lower module, as runtime/view.py), and no module imports a module of a
  higher layer.
- Outside policy/families/ no code names a policy family: no identifier, no string that is a name or key
  (no whitespace) and no imported name of a family module; prose (comments, docstrings, messages with
  spaces) may mention one as an example. The places allowed to name one are listed with the reason.
- Every registered family offers what policy/family.py declares, and the registry refuses what no family
  knows.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'vla_policy_node'

# ---- layers, lowest first ---------------------------------------------------------------------------------
#
# A pattern is a module name (that module) or a name ending in '.*' (every module below it); the most
# specific pattern a module matches gives its layer. A module may import its own layer and the ones below.
LAYERS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ('contracts', ('vla_policy_node', 'vla_policy_node.observation', 'vla_policy_node.stamp_clock',
                   'vla_policy_node.images', 'vla_policy_node.observation_checks')),
    ('cache', ('vla_policy_node.cache', 'vla_policy_node.cache.*')),
    ('model blocks', ('vla_policy_node.policy', 'vla_policy_node.policy.*')),
    ('family seam', ('vla_policy_node.policy.family',)),
    ('families', ('vla_policy_node.policy.families.*',)),
    ('family registry', ('vla_policy_node.policy.families',)),
    ('model tools', ('vla_policy_node.policy.tiny_default', 'vla_policy_node.policy.builtin')),
    ('wire', ('vla_policy_node.wire', 'vla_policy_node.wire.*')),
    ('backends', ('vla_policy_node.backends', 'vla_policy_node.fast_path', 'vla_policy_node.graph_capture',
                  'vla_policy_node.runtime',
                  'vla_policy_node.runtime.*', 'vla_policy_node.remote', 'vla_policy_node.remote.*')),
    ('control', ('vla_policy_node.trajectory', 'vla_policy_node.handover', 'vla_policy_node.safety',
                 'vla_policy_node.outputs', 'vla_policy_node.tick')),
    ('parameters', ('vla_policy_node.params',)),
    ('configure', ('vla_policy_node.settings', 'vla_policy_node.remote_settings')),
    ('bags', ('vla_policy_node.bags', 'vla_policy_node.bags.*')),
    ('applications', ('vla_policy_node.ros', 'vla_policy_node.ros.*', 'vla_policy_node.replay',
                      'vla_policy_node.replay.*', 'vla_policy_node.dataset', 'vla_policy_node.dataset.*',
                      'vla_policy_node.doctor', 'vla_policy_node.demo', 'vla_policy_node.train_demo',
                      'vla_policy_node.fleet', 'vla_policy_node.fleet.*')),
)
# A family folder imports another family's modules only where one is built on the other.
FAMILY_BUILT_ON = {('pi05', 'pi0')}


def module_files(package: Path = PACKAGE) -> Dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its __init__.py)."""
    modules = {}
    for path in sorted(package.rglob('*.py')):
        parts = path.relative_to(package.parent).with_suffix('').parts
        if parts[-1] == '__init__':
            parts = parts[:-1]
        modules['.'.join(parts)] = path
    return modules


def _type_checking_only(tree: ast.AST) -> Set[int]:
    """The import statements under ``if TYPE_CHECKING:`` (annotations only: they never run)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test):
            found.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return found


def imported_modules(name: str, path: Path, modules: Set[str], annotations: bool = False) -> Set[str]:
    """The package's modules that ``name`` imports anywhere in its file, function-level imports included, those
    under ``if TYPE_CHECKING:`` only with ``annotations`` (as grimp records them: ``from X import Y`` is X.Y when
    that is a module, else X)."""
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    found: Set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    annotations_only = set() if annotations else _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')
                base = base[:len(base) - (node.level - 1)]
                source = '.'.join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ''
            for alias in node.names:
                found.add(f'{source}.{alias.name}' if f'{source}.{alias.name}' in modules else source)
    return {module for module in found if module in modules and module != name}


def import_graph(package: Path = PACKAGE, annotations: bool = False) -> Dict[str, Set[str]]:
    """Module -> the modules it imports; ``annotations``: with those under ``if TYPE_CHECKING:``."""
    files = module_files(package)
    return {name: imported_modules(name, path, set(files), annotations) for name, path in files.items()}


def layer_of(module: str) -> Optional[int]:
    """The index in LAYERS of the most specific pattern ``module`` matches, or None."""
    best: Tuple[int, int] = (-1, -1)
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if pattern.endswith('.*'):
                stem = pattern[:-2]
                matched = module.startswith(stem + '.')
                specificity = len(stem)
            else:
                matched = module == pattern
                specificity = len(pattern) + 1           # an exact name beats a wildcard on the same stem
            if matched and specificity > best[0]:
                best = (specificity, index)
    return best[1] if best[0] >= 0 else None


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Every strongly connected group of more than one module (Tarjan), each as a sorted list."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_violations(graph: Dict[str, Set[str]]) -> List[str]:
    """'a (layer) -> b (higher layer)' for every import that runs up, and every module no layer holds."""
    problems = [f'{module} is in no layer of LAYERS' for module in sorted(graph) if layer_of(module) is None]
    for module, targets in sorted(graph.items()):
        source = layer_of(module)
        for target in sorted(targets):
            destination = layer_of(target)
            if source is not None and destination is not None and destination > source:
                problems.append(f'{module} ({LAYERS[source][0]}) imports {target} ({LAYERS[destination][0]})')
    return problems


def family_folder(module: str) -> Optional[str]:
    prefix = 'vla_policy_node.policy.families.'
    return module[len(prefix):].split('.')[0] if module.startswith(prefix) else None


def cross_family_imports(graph: Dict[str, Set[str]]) -> List[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            mine, theirs = family_folder(module), family_folder(target)
            if mine and theirs and mine != theirs and (mine, theirs) not in FAMILY_BUILT_ON:
                problems.append(f'{module} imports {target}: family {mine} is not built on {theirs}')
    return problems


def test_the_import_graph_has_no_cycle():
    found = cycles(import_graph(annotations=True))
    assert not found, 'import cycles: ' + '; '.join(' <-> '.join(group) for group in found)


def folder_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """The import graph between the package's folders (a module outside a folder stands for itself): an
    edge where any module of one imports any module of the other."""
    def folder(module: str) -> str:
        parts = module.split('.')
        return '.'.join(parts[:2]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in FOLDERS) else module

    folders: Dict[str, Set[str]] = {}
    for module, targets in graph.items():
        mine = folder(module)
        folders.setdefault(mine, set()).update(folder(t) for t in targets if folder(t) != mine)
    return folders


FOLDERS = {path.name for path in PACKAGE.iterdir() if (path / '__init__.py').is_file()}


def test_the_folders_lean_one_way():
    """Two folders never import each other, at any depth (the replay imports the dataset reader, so the
    converter takes the bag I/O and the bag-time ticks from bags/, below both)."""
    found = cycles(folder_graph(import_graph(annotations=True)))
    assert not found, 'folders that import each other: ' + '; '.join(' <-> '.join(group) for group in found)


def test_no_import_runs_up_a_layer():
    problems = layer_violations(import_graph()) + cross_family_imports(import_graph())
    assert not problems, '\n'.join(problems)


def test_rclpy_is_imported_by_applications_only():
    """Everything below the node, the replay tools and the demo runs without ROS (the replay, the server,
    the benchmarks, the tests of the model)."""
    applications = len(LAYERS) - 1
    found = []
    for name, path in module_files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                       [node.module or ''] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(module.split('.')[0] == 'rclpy' for module in modules) and layer_of(name) != applications:
                found.append(name)
    assert not found, f'rclpy below the applications: {sorted(set(found))}'


def test_the_architecture_page_lists_the_same_layers():
    """docs/architecture.md's layer table names the layers of LAYERS, in the same order."""
    text = (ROOT / 'docs' / 'architecture.md').read_text()
    section = text.split('\n## Layers\n', 1)[1].split('\n## ', 1)[0]
    rows = [line.split('|')[1].strip() for line in section.splitlines() if line.startswith('| ')]
    assert rows[2:] == [name for name, _ in LAYERS], rows      # after the header and its rule


def test_the_checks_find_a_cycle_and_an_upward_import(tmp_path):
    """The graph checks can fail: a small package with a circle and a model module importing the node."""
    package = tmp_path / 'vla_policy_node'
    (package / 'policy').mkdir(parents=True)
    (package / '__init__.py').write_text('')
    (package / 'policy' / '__init__.py').write_text('')
    (package / 'policy' / 'a.py').write_text('from . import b\n')
    (package / 'policy' / 'b.py').write_text('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n'
                                             '    from ..settings import configure\n'
                                             'def f():\n    from .a import x\n    from ..params import SPECS\n')
    (package / 'params.py').write_text('')
    (package / 'settings.py').write_text('')
    (package / 'policy' / 'c.py').write_text('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n'
                                             '    from .d import D\n')
    (package / 'policy' / 'd.py').write_text('from . import c\n')
    graph = import_graph(package)
    assert cycles(graph) == [['vla_policy_node.policy.a', 'vla_policy_node.policy.b']]
    assert cycles(import_graph(package, annotations=True)) == [
        ['vla_policy_node.policy.a', 'vla_policy_node.policy.b'],
        ['vla_policy_node.policy.c', 'vla_policy_node.policy.d']]
    assert layer_violations(graph) == ['vla_policy_node.policy.b (model blocks) imports vla_policy_node.params '
                                       '(parameters)']


# ---- the family seam: nothing outside the family folders names a family ----------------------------------

FAMILY_DIR = PACKAGE / 'policy' / 'families'
# The places outside policy/families/ allowed to name a family, each with the reason (path relative to the
# package -> (the names it may use, or None for any; why)).
ALLOWED: Dict[str, Tuple[Optional[Set[str]], str]] = {
    'params.py': ({'pi05_padded_state_prompt'},
                  "a family's option is a node parameter (family_option=True): the table lists every parameter"),
    'train_demo.py': (None, 'the trainer of the embedded demo checkpoint: one model by design, the tiny pi0 '
                            '(its training forward is policy/families/pi0/training.py)'),
}


def family_words() -> re.Pattern:
    """The registered type names and the family-specific spellings (backbones, tokenizers) as one pattern."""
    from vla_policy_node.policy.families import known_types
    words = set(known_types()) | {'pi0', 'pi05', 'smolvla', 'smolvlm', 'paligemma', 'gr00t', 'qwen', 'cosmos'}
    return re.compile('|'.join(sorted(map(re.escape, words), key=len, reverse=True)), re.I)


def family_defined_names() -> Set[str]:
    """Every top-level class, function and constant a family module defines (public names only)."""
    names: Set[str] = set()
    for path in FAMILY_DIR.rglob('*.py'):
        if path.parent == FAMILY_DIR:
            continue                                   # the registry's own helpers are the interface
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return {name for name in names if not name.startswith('_')}


def _docstrings(tree: ast.AST) -> Set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def code_names(source: str) -> Iterator[Tuple[int, str, bool]]:
    """(line, text, is_a_plain_name) for every identifier and every string constant without whitespace
    (a key, a type, a path) of the source; docstrings and strings with whitespace (prose) are left out."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        line = getattr(node, 'lineno', 0)
        if isinstance(node, ast.Name):
            yield line, node.id, True
        elif isinstance(node, ast.Attribute):
            yield line, node.attr, False
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield line, node.name, False
        elif isinstance(node, ast.arg):
            yield line, node.arg, False
        elif isinstance(node, ast.keyword) and node.arg:
            yield line, node.arg, False
        elif isinstance(node, ast.alias):
            yield line, node.name, True
            if node.asname:
                yield line, node.asname, True
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield line, node.module, False
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value and not any(char.isspace() for char in node.value):
                yield line, node.value, False


def family_names_outside_the_families(package: Path = PACKAGE) -> List[str]:
    """'path:line: text' for every name of a family in the package's code outside policy/families/."""
    words, defined = family_words(), family_defined_names()
    found = []
    for path in sorted(package.rglob('*.py')):
        relative = path.relative_to(package).as_posix()
        if relative.startswith('policy/families/'):
            continue
        allowed, _ = ALLOWED.get(relative, (set(), ''))
        if allowed is None:
            continue
        for line, text, plain in code_names(path.read_text()):
            leak = bool(words.search(text)) or (plain and text in defined)
            if leak and text not in allowed:
                found.append(f'{relative}:{line}: {text}')
    return found


def test_no_file_outside_the_family_folders_names_a_family():
    found = family_names_outside_the_families()
    assert not found, ('code outside policy/families/ names a policy family (ask the family through '
                       'policy/family.py or the registry, or list the place in ALLOWED with the reason):\n'
                       + '\n'.join(found))


def test_the_family_grep_finds_a_leak(tmp_path):
    """The grep can fail: a type string, a family module's class and a family import path are each found."""
    package = tmp_path / 'vla_policy_node'
    package.mkdir()
    (package / 'leaky.py').write_text(
        '"""Prose may say pi0."""\n'
        "from .policy.families.smolvla.config import SmolVLAConfig\n"
        "KIND = 'pi05'\n"
        "MESSAGE = 'a pi0 message is prose'\n"
        'def f(config):\n'
        '    return isinstance(config, PolicyConfig)\n')
    found = family_names_outside_the_families(package)
    assert found == ['leaky.py:2: policy.families.smolvla.config', 'leaky.py:2: SmolVLAConfig',
                     'leaky.py:3: pi05', 'leaky.py:6: PolicyConfig']


def test_every_allowed_place_still_needs_its_exemption():
    """An ALLOWED entry whose file no longer names a family is stale: remove it."""
    words, defined = family_words(), family_defined_names()
    for relative, (allowed, _) in ALLOWED.items():
        names = [text for _, text, plain in code_names((PACKAGE / relative).read_text())
                 if words.search(text) or (plain and text in defined)]
        assert names, f'{relative} names no family any more: drop it from ALLOWED'
        if allowed is not None:
            assert set(names) <= allowed and allowed <= set(names), (relative, names)


# ---- the declared interface --------------------------------------------------------------------------------

def registered_families():
    from vla_policy_node.policy.families import family_class, known_types
    return [family_class(type_name) for type_name in known_types()]


def declarations():
    """(base, what it declares for a subclass to give): the abstract members (``__abstractmethods__``) and, for
    the family, the class attributes declared without a value, read from policy/family.py's classes."""
    from vla_policy_node.policy.family import PolicyFamily, PolicyLevelConfig, PolicyModel, required_class_attributes
    return [(PolicyFamily, PolicyFamily.__abstractmethods__ | required_class_attributes(PolicyFamily)),
            (PolicyModel, PolicyModel.__abstractmethods__), (PolicyLevelConfig, PolicyLevelConfig.__abstractmethods__)]


@pytest.mark.parametrize('family', registered_families(), ids=lambda family: family.type_name)
def test_every_family_implements_the_declared_interface(family):
    """What policy/family.py declares is implemented by the family, its model and its config (read from the
    classes, so a member added there is checked here without a list to update), and the class-level calls
    answer."""
    config = family.tiny_config()
    for (base, declared), cls in zip(declarations(), (family, family.model_class, type(config))):
        assert declared and issubclass(cls, base) and not cls.__abstractmethods__, (cls, cls.__abstractmethods__)
        assert all(getattr(cls, name, None) is not None for name in declared)
    assert config.policy_type == family.type_name
    flops = family.stage_flops(config, 3)
    assert set(flops) == {'prefix', 'denoise'} and min(flops.values()) > 0
    source = family.tokenizer_source(config)
    assert source.file_name in ('tokenizer.model', 'tokenizer.json') and source.hub_name


@pytest.mark.parametrize('which', ['family', 'model', 'config'])
def test_a_class_missing_a_declared_member_fails_where_it_is_defined(which):
    """Every declared member, taken away from a working subclass one at a time, makes the class statement
    itself a TypeError naming it (the registry calls classmethods on classes it never instantiates)."""
    from vla_policy_node.policy.families import family_class
    family = family_class(registered_families()[0].type_name)
    base, declared = dict(zip(('family', 'model', 'config'), declarations()))[which]
    working = {'family': family, 'model': family.model_class, 'config': type(family.tiny_config())}[which]
    type('StillWhole', (working,), {})                                  # the working class subclasses fine
    type('OnPurpose', (base,), {}, abstract=True)                       # an abstract base on purpose too
    for name in sorted(declared):
        stub = vars(base).get(name)                                     # the abstract stub, or no value at all
        with pytest.raises(TypeError, match=f'does not implement.*{name}'):
            type('Missing', (working,), {name: stub})


def test_a_family_with_a_model_that_is_no_policy_model_is_refused():
    family = registered_families()[0]
    with pytest.raises(TypeError, match='model_class must be a PolicyModel'):
        type('Wrong', (family,), {'model_class': dict})


def test_presets_are_unique_across_the_registry_and_each_builds():
    from vla_policy_node.policy.families import preset_config
    names = [name for family in registered_families() for name in family.preset_names]
    assert len(names) == len(set(names)), names
    for family in registered_families():
        for name in family.preset_names:
            assert preset_config(name).policy_type == family.type_name


def test_every_family_option_is_a_node_parameter_and_back():
    from vla_policy_node.params import FAMILY_OPTIONS
    from vla_policy_node.policy.families import family_options
    assert set(FAMILY_OPTIONS) == set(family_options())


def test_an_option_no_family_knows_is_refused_as_unknown(tmp_path):
    import torch

    from vla_policy_node.policy.families import EMBEDDED_TYPE, load_policy
    from vla_policy_node.policy.tiny_default import write_tiny_default
    from vla_policy_node.runtime import PolicyRuntime
    folder = write_tiny_default(tmp_path / 'tiny', EMBEDDED_TYPE)
    # A misspelt runtime keyword reaches the families: it is named as unknown, with the options that exist.
    with pytest.raises(ValueError, match="unknown option 'cache_max_byte'.*pi05_padded_state_prompt"):
        PolicyRuntime.from_pretrained(folder, device='cpu', dtype='float32', cache_max_byte=1 << 20)
    with pytest.raises(ValueError, match="unknown options 'a_b', 'z'"):
        load_policy(folder, torch.device('cpu'), torch.float32, z=False, a_b=1)


def test_a_remote_policy_offers_the_policy_level_fields_from_the_one_declaration():
    """RemoteConfig is a PolicyLevelFields (no field copied by hand): every field the tick and the parameter
    table read, with the robot's dimensions unpadded and the whole chunk executable."""
    import dataclasses

    from vla_policy_node.policy.family import PolicyLevelFields
    from vla_policy_node.remote_settings import RemoteConfig
    config = RemoteConfig(camera_names=('top',), state_dim=7, action_dim=6, chunk_size=30)
    assert isinstance(config, PolicyLevelFields)
    assert {f.name for f in dataclasses.fields(PolicyLevelFields)} <= {f.name for f in dataclasses.fields(config)}
    assert (config.max_state_dim, config.max_action_dim, config.n_action_steps) == (7, 6, 30)
    assert config.all_camera_names == ('top',) and config.policy_level_problems() is None
