"""The stand-in's command line: a task's own (cluster/runtime/contract.py `task_argv`, parsed by
`parse_task_argv`), run as `-m cluster.rehearsal` instead of `-m cluster.task`. One builder and
one parser for both: a rehearsal runs exactly what `launch up` would, but for the module."""
from __future__ import annotations

from collections.abc import Sequence

from cluster.runtime.contract import TASK_MODULE

REHEARSAL_MODULE = 'cluster.rehearsal'


def rehearsal_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """`python -m cluster.task ARGS` -> `python -m cluster.rehearsal ARGS`; ValueError for a
    command line that does not run the task module (a plan the rehearsal cannot stand in for)."""
    argv = tuple(argv)
    for i in range(len(argv) - 1):
        if argv[i] == '-m' and argv[i + 1] == TASK_MODULE:
            return argv[:i + 1] + (REHEARSAL_MODULE,) + argv[i + 2:]
    raise ValueError(f'not a task command line (no -m {TASK_MODULE}): {" ".join(argv)}')


def task_module(argv: Sequence[str]) -> str:
    """The module a task's command line runs (`-m M`): cluster.task, or a stand-in's cluster.rehearsal."""
    argv = tuple(argv)
    for i in range(len(argv) - 1):
        if argv[i] == '-m':
            return argv[i + 1]
    return TASK_MODULE


def is_stand_in(argv: Sequence[str]) -> bool:
    """Whether a task's command line runs a rehearsal's stand-in."""
    return task_module(argv) == REHEARSAL_MODULE
