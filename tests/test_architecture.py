"""The shape of the code, checked from its source with `ast` (nothing is imported, nothing runs):
no import cycle among the project's modules and cluster/ never imports launch/; no backend name
compared outside the backend registry and the backends' own modules; and every test that starts
processes is marked `slow`, so that `pytest -m "not slow"` is the fast tier. Each check lists every
offender, file:line and what, so that one run is the whole to-do list."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

# A backend's own module and the registry may name backends; nothing else may switch on one (a new
# backend is one module plus one registry entry, with no `if backend == ...` to find elsewhere).
BACKEND_MODULES = ('launch/run/registry.py', 'launch/backends/local.py', 'launch/backends/ssh.py', 'launch/backends/compose.py',
                   'launch/render/compose.py', 'launch/render/sbatch.py', 'launch/run/slurm.py', 'launch/backends/netns.py')
BACKEND_NAMES = frozenset({'local', 'ssh', 'compose', 'slurm'})

REPO = Path(__file__).resolve().parent.parent
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


# -- imports -----------------------------------------------------------------------------------

def imports_of(module: str, tree: ast.Module, is_package: bool, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(project module imported, line) for every import in the file, at module level or inside a
    function: a lazy import is still a dependency. `from pkg import name` is the module pkg.name
    when there is one, else pkg itself; relative imports are resolved against the module's package."""
    package = module if is_package else module.rpartition('.')[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = '.'.join(anchor + ([base] if base else []))
            targets = [f'{base}.{alias.name}' if f'{base}.{alias.name}' in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            # `import a.b.c` of a name that is no module file: the longest prefix that is one
            while target and target not in modules:
                target = target.rpartition('.')[0]
            if target and target != module:
                out.append((target, node.lineno))
    return out


def import_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    """module -> {module it imports: the first line that does}."""
    modules = _sources(*PACKAGES)
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for module, path in modules.items():
        for target, line in imports_of(module, _parse(path), path.name == '__init__.py', modules):
            graph[module].setdefault(target, line)
    return graph, modules


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): every component of more than one module, or of one module
    that imports itself; each sorted, the list sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return sorted(found)


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """The shortest cycle through the component's first module, inside the component (breadth first)."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for child in sorted(graph[node]):
            if child == start:
                return paths[node] + [start]
            if child in members and child not in paths:
                paths[child] = paths[node] + [child]
                todo.append(child)
    raise AssertionError(f'no cycle through {start} in {component}')


def test_no_import_cycle_and_cluster_never_imports_launch():
    graph, modules = import_graph()
    assert 'cluster.spec' in graph and 'launch.cli' in graph, sorted(graph)     # the walk found the project
    problems = []
    for component in strongly_connected(graph):
        cycle = shortest_cycle(graph, component)
        edges = [(a, b) for a in component for b in component if b in graph[a]]     # every import inside it
        where = '; '.join(f'{_name(modules[a])}:{graph[a][b]} imports {b}' for a, b in edges)
        among = f' (one of the cycles among {", ".join(component)})' if len(component) > len(cycle) - 1 else ''
        problems.append(f'import cycle {" -> ".join(cycle)}{among}: {where}')
    for module, targets in sorted(graph.items()):
        if module.split('.')[0] == 'cluster':
            for target, line in sorted(targets.items(), key=lambda t: t[1]):
                if target.split('.')[0] == 'launch':
                    problems.append(f'{modules[module].relative_to(REPO)}:{line}: cluster/ imports {target} '
                                    '(launch/ imports cluster/, never the reverse)')
    if problems:
        pytest.fail(f'{len(problems)} import problem(s):\n' + '\n'.join(problems), pytrace=False)


def test_the_cycle_finder_finds_cycles():
    """The check above would pass on a graph walk that found nothing: a graph with known cycles."""
    graph = {'a': {'b': 1}, 'b': {'a': 1, 'c': 1}, 'c': {'d': 1}, 'd': {'c': 1, 'e': 1}, 'e': {}, 'f': {'f': 1}}
    assert strongly_connected(graph) == [['a', 'b'], ['c', 'd'], ['f']]
    assert shortest_cycle(graph, ['a', 'b']) == ['a', 'b', 'a']
    modules = {'launch': Path('launch/__init__.py'), 'launch.x': Path('launch/x.py'), 'launch.y': Path('launch/y.py')}
    source = ('from launch import x, not_a_module\nimport launch.y.attr\n'
              'def f():\n    from . import x\n    from .y import thing\n')
    found = sorted(imports_of('launch.z', ast.parse(source), False, modules), key=lambda t: t[1])
    assert found == [('launch.x', 1), ('launch', 1), ('launch.y', 2), ('launch.x', 4), ('launch.y', 5)]


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
        if relative in BACKEND_MODULES:
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
    for path in sorted((REPO / 'tests').glob('test_*.py')):
        offenders += unmarked_process_tests(path)
    if offenders:
        pytest.fail(f'{len(offenders)} test(s) start processes but are not marked @pytest.mark.slow '
                    '(`pytest -m "not slow"` must start none):\n' + '\n'.join(offenders), pytrace=False)
