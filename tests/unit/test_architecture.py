"""The shape of the code: the import contracts of setup.cfg (import-linter), ruff and mypy clean,
no module, class or function past its size limit; no backend name
compared outside the backend registry and the backends' own modules; and every test that starts
processes is marked `slow`, so that `pytest -m "not slow"` is the fast tier. Each check lists every
offender, file:line and what, so that one run is the whole to-do list."""
from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# A backend's own module and the registry may name backends; nothing else may switch on one (a new
# backend is one module plus one registry entry, with no `if backend == ...` to find elsewhere).
BACKEND_MODULES = ('launch/run/registry.py', 'launch/backends/')      # a path, or a folder (ends in /)
BACKEND_NAMES = frozenset({'local', 'ssh', 'compose', 'slurm'})

REPO = Path(__file__).resolve().parents[2]
# The two tiers of tests: tests/unit fast (`pytest -m "not slow"`), tests/system slow (`-m slow`).
TIERS = ('unit', 'system')
PACKAGES = ('cluster', 'launch')


def _sources(*packages: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages (a package is its __init__)."""
    found = {}
    for package in packages:
        for path in sorted((REPO / package).rglob('*.py')):
            parts = path.relative_to(REPO).with_suffix('').parts
            found['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    return found


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding='utf-8'), filename=str(path))


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _where(path: Path, node: ast.AST) -> str:
    return f'{_name(path)}:{node.lineno}'


# -- imports, lint, types ---------------------------------------------------------------------------

def _tool(*argv: str) -> subprocess.CompletedProcess:
    """Run a console tool installed beside this interpreter (the test extra installs them all)."""
    exe = Path(sys.executable).with_name(argv[0])
    if not exe.exists():
        pytest.fail(f'{argv[0]} is not installed: pip install -e ".[test]"', pytrace=False)
    return subprocess.run([str(exe), *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_import_contracts_hold():
    """setup.cfg's import-linter contracts: cluster never imports launch, the layers of each package
    import only downwards, and no package has an import cycle among its modules."""
    done = _tool('lint-imports', '--config', 'setup.cfg', '--no-cache')
    assert done.returncode == 0, done.stdout[done.stdout.find('Broken contracts'):] or done.stderr
    assert 'BROKEN' not in done.stdout and done.stdout.count('KEPT') >= 4, done.stdout


def test_ruff_finds_nothing():
    done = _tool('ruff', 'check', '--quiet', 'cluster', 'launch', 'tests', 'benchmarks', 'examples')
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing():
    done = _tool('mypy', '--no-error-summary', '--cache-dir', str(Path(tempfile.gettempdir()) / 'tfcluster-mypy'))
    assert done.returncode == 0, done.stdout + done.stderr


# -- sizes ---------------------------------------------------------------------------------------

MAX_MODULE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 500, 400, 60
# Anything allowed past those limits, with the reason; empty is the aim.
SIZE_EXCEPTIONS: dict[str, str] = {}


def oversized(path: Path) -> list[str]:
    """file[:line]: what, for the module, each class and each function past its limit."""
    text = path.read_text(encoding='utf-8')
    out = []
    if (n := len(text.splitlines())) > MAX_MODULE_LINES:
        out.append(f'{_name(path)}: module of {n} lines (limit {MAX_MODULE_LINES})')
    for node in ast.walk(ast.parse(text)):
        limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f'{_where(path, node)}: {node.name} of {n} lines (limit {limit})')
    return out


def test_no_module_class_or_function_is_too_long_to_hold_in_ones_head():
    found = [line for path in _sources(*PACKAGES).values() for line in oversized(path)
             if line.split(': ')[0].split(':')[0] not in SIZE_EXCEPTIONS and
             line.split(': ')[0] not in SIZE_EXCEPTIONS]
    if found:
        pytest.fail(f'{len(found)} piece(s) too long:\n' + '\n'.join(found), pytrace=False)


# -- backend names -------------------------------------------------------------------------------

def _is_command(node: ast.AST) -> bool:
    """`command` or `args.command`: the subcommand, one of which (`launch compose`) is spelled
    like a backend; comparing it is no switch on a backend."""
    return isinstance(node, ast.Name) and node.id == 'command' or \
        isinstance(node, ast.Attribute) and node.attr == 'command'


def _backend_literals(node: ast.AST) -> list[str]:
    """The backend names among a comparison operand: a string literal, or one inside a literal
    tuple, list or set (`x in ('ssh', 'compose')`)."""
    if isinstance(node, ast.Constant) and node.value in BACKEND_NAMES:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n.value for n in node.elts if isinstance(n, ast.Constant) and n.value in BACKEND_NAMES]
    return []


def backend_comparisons(path: Path) -> list[str]:
    out = []
    for node in sorted((n for n in ast.walk(_parse(path)) if hasattr(n, 'lineno')),
                       key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Compare) and not any(_is_command(n) for n in (node.left, *node.comparators)):
            names = [name for operand in (node.left, *node.comparators) for name in _backend_literals(operand)]
            if names:
                out.append(f'{_where(path, node)}: {ast.unparse(node)}')
    return out


def test_no_backend_name_is_compared_outside_the_registry_and_the_backends():
    checked, offenders = 0, []
    for path in _sources(*PACKAGES).values():
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(tuple(m for m in BACKEND_MODULES if m.endswith('/'))) or relative in BACKEND_MODULES:
            continue
        checked += 1
        offenders += backend_comparisons(path)
    assert checked > 5, checked
    if offenders:
        pytest.fail(f'{len(offenders)} comparison(s) with a backend name outside {", ".join(BACKEND_MODULES)} (ask '
                    'the backend registry or the backend instead):\n' + '\n'.join(sorted(offenders)), pytrace=False)


def test_the_backend_name_finder_finds_comparisons(tmp_path):
    file = tmp_path / 'x.py'
    file.write_text("if a == 'ssh' or 'compose' != b:\n    pass\n"
                    "ok = kind in ('local', 'slurm')\n"
                    "fine = table.get('compose'), name == 'other', {'ssh': 1}['ssh']\n"
                    "if args.command == 'compose' or command in ('plan', 'compose'):\n    pass\n")
    found = [line.split(': ', 1)[1] for line in backend_comparisons(file)]
    assert found == ["a == 'ssh'", "'compose' != b", "kind in ('local', 'slurm')"]


# -- the slow marker -----------------------------------------------------------------------------

# A test that asks for one of these fixtures starts processes (sshd, Slurm, dockerd, containers).
PROCESS_FIXTURES = frozenset({'ssh_hosts', 'slurm_cluster', 'docker_engine', 'compose_image', 'compose_project'})
# Helpers that run a static checker over the source (ruff, mypy, import-linter) or the docs (mkdocs
# build --strict): a short process that reads files, starts no server and belongs in the fast tier.
STATIC_TOOLS = frozenset({'_tool', 'mkdocs_build'})
# Classes of the test helpers that start a server when made.
PROCESS_CLASSES = frozenset({'SSHHosts'})


def _is_slow_mark(node: ast.AST) -> bool:
    """`pytest.mark.slow` (or `mark.slow`), as a decorator, in `pytestmark` or in a list there."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_slow_mark(n) for n in node.elts)
    return isinstance(node, ast.Attribute) and node.attr == 'slow' and (
        isinstance(node.value, ast.Attribute) and node.value.attr == 'mark'
        or isinstance(node.value, ast.Name) and node.value.id == 'mark')


def _starts(function: ast.FunctionDef, helpers: frozenset[str]) -> list[str]:
    """What in a function starts processes: any use of `subprocess.`, a call of a helper that does
    (conftest's launch, launch_bg, run_by_hand and the like) or of a class that does, or a fixture
    that does."""
    takes_fixtures = function.name.startswith('test_') or any(
        'fixture' in ast.unparse(d) for d in function.decorator_list)      # a helper's argument is no fixture
    found = [f'fixture {a.arg}' for a in function.args.args if takes_fixtures and a.arg in PROCESS_FIXTURES | helpers]
    for node in (n for statement in function.body for n in ast.walk(statement)):     # not the annotations
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id in helpers | PROCESS_CLASSES:
            found.append(f'{node.func.id}()')
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) and \
                node.func.value.id == 'subprocess':
            found.append(f'subprocess.{node.func.attr}()')
    return list(dict.fromkeys(found))


_HELPERS: dict[str, frozenset[str]] = {}       # tests module -> its process_helpers


def process_helpers(module: str) -> frozenset[str]:
    """Names usable in a tests module that start processes when called: its own functions that do
    (to a fixed point: a helper calling a helper), and those it imports from other tests modules."""
    if module not in _HELPERS:
        _HELPERS[module] = frozenset()          # an import cycle among test modules ends here
        path = REPO / (module.replace('.', '/') + '.py')
        tree = _parse(path)
        helpers: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('tests.'):
                there = process_helpers(node.module)
                helpers |= {a.asname or a.name for a in node.names if a.name in there}
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith('test_')]
        functions = [f for f in functions if f.name not in STATIC_TOOLS]
        while more := {f.name for f in functions if f.name not in helpers and _starts(f, frozenset(helpers))}:
            helpers |= more
        _HELPERS[module] = frozenset(helpers)
    return _HELPERS[module]


def plugin_process_fixtures() -> frozenset[str]:
    """The fixtures that start processes among those of the modules conftest names in
    `pytest_plugins`: a test asks for them by name and imports none, so no import leads to them."""
    tree = _parse(REPO / 'tests' / 'conftest.py')
    plugins = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
               and any(getattr(t, 'id', None) == 'pytest_plugins' for t in n.targets)]
    found: set[str] = set()
    for module in (m for names in plugins for m in names):
        fixtures = {f.name for f in _parse(REPO / (module.replace('.', '/') + '.py')).body
                    if isinstance(f, ast.FunctionDef) and any('fixture' in ast.unparse(d) for d in f.decorator_list)}
        found |= fixtures & process_helpers(module)
    return frozenset(found)


def tier_test_files() -> list[Path]:
    """Every test module: tests/unit and tests/system mirror the packages (docs/contributing.md)."""
    return sorted(path for tier in TIERS for path in (REPO / 'tests' / tier).rglob('test_*.py'))


def unmarked_process_tests(path: Path) -> list[str]:
    """file:line: test uses what, for each test of the file that starts processes and is not slow."""
    tree = _parse(path)
    if any(isinstance(n, ast.Assign) and any(getattr(t, 'id', None) == 'pytestmark' for t in n.targets)
           and _is_slow_mark(n.value) for n in tree.body):
        return []
    helpers = process_helpers('.'.join(path.relative_to(REPO).with_suffix('').parts)) | plugin_process_fixtures()
    out = []
    for f in tree.body:
        if isinstance(f, ast.FunctionDef) and f.name.startswith('test_') and \
                not any(_is_slow_mark(d) for d in f.decorator_list):
            why = _starts(f, helpers)
            if why:
                out.append(f'{_where(path, f)}: {f.name} uses {", ".join(why)}')
    return out


def test_every_test_that_starts_processes_is_marked_slow():
    """The static half of the fast tier's guard (conftest's fast_tests_start_no_process is the
    run-time half): a test that calls launch(), launch_bg(), run_by_hand(), a helper that does,
    `subprocess.` anything, or asks for sshd, Slurm or Docker, carries `@pytest.mark.slow`."""
    assert 'launch' in process_helpers('tests.conftest'), process_helpers('tests.conftest')
    assert 'ssh_hosts' in plugin_process_fixtures(), plugin_process_fixtures()
    offenders = []
    for path in tier_test_files():
        offenders += unmarked_process_tests(path)
    if offenders:
        pytest.fail(f'{len(offenders)} test(s) start processes but are not marked @pytest.mark.slow '
                    '(`pytest -m "not slow"` must start none):\n' + '\n'.join(offenders), pytrace=False)


# -- the test tree -------------------------------------------------------------------------------
# Fast tests in tests/unit, slow ones in tests/system, each mirroring the package it tests; what
# tests share lives in tests/harness (and tests/conftest.py). Read from the files, not run: a test
# in the wrong tree is named here even when it is skipped.

def _is_pytestmark_slow(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Assign) and any(getattr(t, 'id', None) == 'pytestmark' for t in n.targets)
               and _is_slow_mark(n.value) for n in tree.body)


def _tests(tree: ast.Module) -> list[tuple[ast.FunctionDef, bool]]:
    """(test function, marked slow by itself or by its class) for each test of a module."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith('test_'):
            found.append((node, any(_is_slow_mark(d) for d in node.decorator_list)))
        elif isinstance(node, ast.ClassDef) and node.name.startswith('Test'):
            slow_class = any(_is_slow_mark(d) for d in node.decorator_list)
            found += [(f, slow_class or any(_is_slow_mark(d) for d in f.decorator_list)) for f in node.body
                      if isinstance(f, ast.FunctionDef) and f.name.startswith('test_')]
    return found


def misplaced_tests(path: Path) -> list[str]:
    """file:line: why, for each test of tests/unit marked slow and each of tests/system that is not."""
    tree = _parse(path)
    tier = path.relative_to(REPO / 'tests').parts[0]
    whole_module = _is_pytestmark_slow(tree)
    out = []
    for function, slow in _tests(tree):
        slow = slow or whole_module
        if tier == 'unit' and slow:
            out.append(f'{_where(path, function)}: {function.name} is marked slow (slow tests go in tests/system)')
        elif tier == 'system' and not slow:
            out.append(f'{_where(path, function)}: {function.name} is not marked slow (fast tests go in tests/unit)')
    return out


def test_the_fast_tests_are_in_tests_unit_and_the_slow_ones_in_tests_system():
    files = tier_test_files()
    assert len(files) > 40 and {p.relative_to(REPO / 'tests').parts[0] for p in files} == set(TIERS), files
    strays = sorted(p.relative_to(REPO).as_posix() for p in (REPO / 'tests').glob('test_*.py'))
    offenders = [line for path in files for line in misplaced_tests(path)]
    offenders += [f'{name}: a test module outside tests/unit and tests/system' for name in strays]
    offenders += [f'{d.relative_to(REPO).as_posix()}: no __init__.py (same-named modules of the two trees collide)'
                  for tier in TIERS for d in sorted((REPO / 'tests' / tier).rglob('*'))
                  if d.is_dir() and d.name != '__pycache__' and not (d / '__init__.py').is_file()]
    if offenders:
        pytest.fail(f'{len(offenders)} test(s) in the wrong place:\n' + '\n'.join(offenders), pytrace=False)


def test_the_tree_finder_finds_a_misplaced_test(tmp_path, monkeypatch):
    for tier, text in (('unit', 'import pytest\n\n@pytest.mark.slow\ndef test_a():\n    pass\n\n\ndef test_b():\n    pass\n'),
                       ('system', 'import pytest\n\ndef test_c():\n    pass\n\n\nclass TestD:\n'
                                  '    @pytest.mark.slow\n    def test_e(self):\n        pass\n')):
        (tmp_path / 'tests' / tier).mkdir(parents=True)
        (tmp_path / 'tests' / tier / 'test_x.py').write_text(text)
    monkeypatch.setitem(globals(), 'REPO', tmp_path)
    assert [line.split(': ', 1)[1] for tier in TIERS for line in misplaced_tests(tmp_path / 'tests' / tier / 'test_x.py')] == [
        'test_a is marked slow (slow tests go in tests/system)', 'test_c is not marked slow (fast tests go in tests/unit)']


def imports_of_tests(path: Path) -> list[str]:
    """file:line: module, for each import of a test module (tests.* but tests.harness.* and tests.conftest)."""
    out = []
    for node in ast.walk(_parse(path)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ''] if isinstance(node, ast.ImportFrom) and not node.level else ['tests.(a relative import)'] \
            if isinstance(node, ast.ImportFrom) else []
        for name in names:
            if (name == 'tests' or name.startswith('tests.')) and not (
                    name == 'tests.conftest' or name == 'tests.harness' or name.startswith('tests.harness.')):
                out.append(f'{_where(path, node)}: {name}')
    return out


def test_no_test_module_imports_another():
    """A helper two test modules need lives in tests/harness: a test module that imports another
    makes the fast tier depend on a slow module (and its fixtures) and hides what is shared."""
    files = tier_test_files() + sorted((REPO / 'tests' / 'harness').rglob('*.py'))
    offenders = [line for path in files for line in imports_of_tests(path)]
    if offenders:
        pytest.fail(f'{len(offenders)} import(s) of a test module (move what they share into tests/harness):\n'
                    + '\n'.join(offenders), pytrace=False)
