"""Whether the user's code a task runs (`train.program`, `train.command`, `train.evaluator`) can be
found: read from the files, never run or imported, so the launcher's pre-flight checks it before
anything starts (for tasks on its machine) and every task again on its own host as it starts.
Nothing here imports TensorFlow."""
from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import sys

from cluster.spec import ClusterSpec, TaskSpec


PYTHON_NAMES = ('python', 'python3')     # in a command, these mean the task's own interpreter


class ProgramError(Exception):
    """The program or command cannot be run as given: one line."""


PROGRAM_IS = 'a program is a Python function `def train(ctx)` in a .py module (docs/own-code.md)'


def split_program(ref: str) -> tuple[str, str]:
    module, _, function = ref.partition(':')
    return module, function


def check_program(ref: str, search_path: list[str] | None = None) -> None:
    """Raise ProgramError unless `ref` names a module that can be found and a function defined at
    its top level. The module is found, not imported (its parent packages are: that is how Python
    finds a submodule), and its source is parsed for the name, so no user code runs here."""
    module, function = split_program(ref)
    saved = sys.path[:]
    if search_path is not None:
        sys.path[:0] = search_path
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as e:      # a parent package that is missing or fails to import
        raise ProgramError(f'cannot find module {module!r}: {e}') from None
    finally:
        sys.path[:] = saved
    if found is None:
        where = ', '.join(search_path or []) or 'sys.path'
        raise ProgramError(f'no module named {module!r} (looked in {where} and the installed packages; a '
                           'relative module is found from the directory the task runs in)')
    if not found.origin or not found.origin.endswith('.py') or not os.path.isfile(found.origin):
        kind = found.origin if found.origin in ('built-in', 'frozen') else \
            'a namespace package' if not found.origin or found.origin == 'namespace' else \
            f'in {found.origin}' if found.origin.endswith('.py') else 'compiled'
        raise ProgramError(f'module {module!r} has no Python source ({kind}), so {function!r} cannot be checked '
                           f'without running it: {PROGRAM_IS}')
    try:
        with open(found.origin, 'rb') as f:
            tree = ast.parse(f.read(), found.origin)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ProgramError(f'cannot read module {module!r} ({found.origin}): {e}') from None
    bindings = _top_level_bindings(tree).get(function)
    if not bindings:
        raise ProgramError(f'module {module!r} ({found.origin}) defines no function {function!r}')
    why = [_not_a_program(node) for node in bindings]
    if all(why):        # some other binding (an import, an assignment) is checked when it is loaded
        node = bindings[-1]
        raise ProgramError(f'{module}.{function} ({found.origin}:{node.lineno}) {why[-1]}: {PROGRAM_IS}')


def _top_level_bindings(tree: ast.Module) -> dict[str, list[ast.stmt]]:
    """name -> the statements at the module's top level (or under an if/try/with there) that bind it."""
    names: dict[str, list[ast.stmt]] = {}

    def bind(name: str, node: ast.stmt) -> None:
        names.setdefault(name, []).append(node)

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bind(node.name, node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bind(target.id, node)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
                bind(node.target.id, node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    bind((alias.asname or alias.name).split('.')[0], node)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):     # definitions under a guard count too
                walk([child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)])
                for handler in getattr(node, 'handlers', []):
                    walk(handler.body)
    walk(tree.body)
    return names


def _not_a_program(node: ast.stmt) -> str | None:
    """Why the statement binding a program's name surely does not make a function that can be
    called as f(ctx), or None where it does or where only running it would tell (an import, an
    assignment, a decorated def: checked by load_program in the worker)."""
    if isinstance(node, ast.ClassDef):
        return 'is a class'
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.decorator_list:
        return None
    if isinstance(node, ast.AsyncFunctionDef):
        return 'is an async def (calling it runs nothing)'
    a = node.args
    positional = a.posonlyargs + a.args
    required = len(positional) - len(a.defaults)
    kwonly_required = [arg.arg for arg, default in zip(a.kwonlyargs, a.kw_defaults) if default is None]
    if required > 1 or (not positional and not a.vararg) or kwonly_required:
        return f'takes ({ast.unparse(a)}), not one argument'
    return None


def check_command(command: tuple[str, ...], cwd: str = '.') -> None:
    """Raise ProgramError unless the command's program can be found (a bare name on PATH, a path
    relative to `cwd`), and, for `python script.py`, unless the script exists."""
    exe = command[0]
    if exe in PYTHON_NAMES:
        exe = sys.executable
    if os.sep in exe:
        path = os.path.join(cwd, exe)
        if not os.path.isfile(path):
            raise ProgramError(f'{command[0]}: no such file (relative to {os.path.abspath(cwd)})')
        if not os.access(path, os.X_OK):
            raise ProgramError(f'{command[0]}: not executable (chmod +x, or start the command with its interpreter)')
    elif shutil.which(exe) is None:
        raise ProgramError(f'{exe}: command not found on PATH')
    if command[0] in PYTHON_NAMES or os.path.basename(exe).startswith('python'):
        script = next((a for a in command[1:] if not a.startswith('-')), None)
        if script is not None and script.endswith('.py') and not os.path.isfile(os.path.join(cwd, script)):
            raise ProgramError(f'{script}: no such file (relative to {os.path.abspath(cwd)})')


def uses_keras(ref: str, search_path: list[str] | None = None) -> bool:
    """Whether the program's module imports Keras or reaches for `tf.keras` (read from its source,
    nothing run): under ParameterServerStrategy that must be Keras 2 (tf-keras)."""
    module, _ = ref.partition(":")[::2]
    saved = sys.path[:]
    if search_path is not None:
        sys.path[:0] = search_path
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    finally:
        sys.path[:] = saved
    if found is None or not found.origin or not found.origin.endswith('.py'):
        return False
    try:
        with open(found.origin, 'rb') as f:
            tree = ast.parse(f.read(), found.origin)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ''] if isinstance(node, ast.ImportFrom) else []
        if any(n.split('.')[0] in ('keras', 'tf_keras') for n in names):
            return True
        if isinstance(node, ast.Attribute) and node.attr == 'keras':
            return True
    return False


def check_keras(ref: str, search_path: list[str] | None = None) -> None:
    """A Keras program under ParameterServerStrategy needs tf-keras installed (Keras 3 has no PSS)."""
    if uses_keras(ref, search_path) and importlib.util.find_spec('tf_keras') is None:
        raise ProgramError(f'{ref} uses Keras, and Keras under ParameterServerStrategy needs Keras 2: '
                           "install tf-keras (pip install -e '.[keras]')")


def user_code(spec: ClusterSpec, task: TaskSpec) -> tuple[str, str | tuple[str, ...] | None]:
    """The spec key and what `task` runs of the user's: a program, a command, or None (it serves,
    or runs the built-in trainer). A coordinator run's chief runs train.program or train.command,
    its evaluator train.evaluator, its ps and workers nothing; else every worker runs the program
    and every task the command."""
    train = spec.train
    if spec.coordinator:
        if task.job == 'chief':
            return ('train.program', train.program) if train.program else ('train.command', train.command)
        return ('train.evaluator', train.evaluator) if task.job == 'evaluator' else ('train.program', None)
    if train.program:
        return 'train.program', train.program if task.job == 'worker' else None
    return 'train.command', train.command


def imports_keras(spec: ClusterSpec, task: TaskSpec) -> bool | None:
    """How the task imports TensorFlow (cluster/task.py): with Keras (it runs the user's program),
    without (it serves, or runs the built-in trainer), or None: not at all (it runs a command).
    A warm standby (cluster/runtime/standby.py) serves only a task that imports as it did."""
    code = user_code(spec, task)[1]
    return None if isinstance(code, tuple) else code is not None


def check_user_code(spec: ClusterSpec, task: TaskSpec, cwd: str = '.') -> None:
    """What the task runs of the user's (user_code) can be found here: else SpecError."""
    key, code = user_code(spec, task)
    try:
        if isinstance(code, str):
            check_program(code, [os.path.abspath(cwd)])
            if spec.coordinator:
                check_keras(code, [os.path.abspath(cwd)])
        elif code is not None:
            check_command(code, cwd)
    except ProgramError as e:
        raise spec.error(key, str(e)) from None
