"""What `launch` does with the backends the registry lists (launch/run/registry.py), whichever
they are: plan the tasks, check what a backend refuses, open the supervised backends, and make
the strategy `launch up` runs (the supervised one over those backends, or a delegated backend's
own). Every decision here reads a backend's capabilities (launch/backends/kind.py), never its name.

`local` and `ssh` plan alike: each task is a local process or an SSH task as its host says
(launch/planning/plan.py is_local), so `--backend local`, `--backend ssh` and no --backend are one choice.
"""
from __future__ import annotations

import posixpath
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from cluster.checks.code import PYTHON_NAMES
from cluster.runtime.masking import spec_masker
from cluster.spec import ClusterSpec
from launch.backends.base import Backend
from launch.backends.kind import SUPERVISED, Options
from launch.backends.strategy import Strategy
from launch.errors import UsageError
from launch.planning import gpus, limits, ps_load
from launch.planning.plan import TaskPlan, task_spec
from launch.run import preflight
from launch.run import registry, standbys
from launch.run.registry import kind


def backend_help() -> str:
    """`--backend`'s help: what each backend is, the default last."""
    said = [k.summary for k in registry.BACKENDS if k.summary and k.name != registry.DEFAULT]
    return '; '.join(said + [kind(None).summary])


@dataclass(frozen=True)
class UpSettings:
    """What `launch up` says about the run beyond the spec and the backend options."""
    workers: int | None = None          # the first N workers of the pool run (None: all)
    start_timeout: float = 120.0
    finish_timeout: float = 60.0
    say: Callable[[str], None] = print  # a line on the console
    rehearse: bool = False              # every task a stand-in (launch/run/rehearsal.py)


@dataclass(frozen=True)
class Launch:
    """A strategy ready for Lifecycle.up, with what the run records of it."""
    strategy: Strategy[Any]
    backend: str            # the backend(s) the run names (events.jsonl's run_started)
    spec_yaml: str          # the effective spec its tasks read


def plans(spec: ClusterSpec, name: str | None, opts: Options, counts: dict[str, int] | None = None) -> list[TaskPlan]:
    """What every task of the spec runs where, for the backend chosen (None: per host). `counts`:
    the GPUs the hosts said they have (Backend.gpu_counts); without, the spec's `gpus:` or unknown."""
    k = kind(name)
    planned = k.plan(spec, k.addresses(spec, opts), counts or {})
    if planned is None:
        raise UsageError(f'the {k.name} backend places the tasks itself; nothing is planned here')
    return list(planned)


def check_limits(spec: ClusterSpec, planned: Iterable[TaskPlan]) -> None:
    """SpecError, naming the key, when a task could not be started for its command line and
    environment (launch/planning/limits.py): `plan`, `check`, `compose` and `up` say so before
    anything is written."""
    limits.check(spec, planned, lambda p: kind(p.backend).inherits(p), lambda p: kind(p.backend).start_text(p))


def gpu_counts(spec: ClusterSpec, plans: list[TaskPlan], backends: Mapping[str, Backend]) -> dict[str, int]:
    """Ask the hosts of the workers how many GPUs they have, when train.devices wants any."""
    if not gpus.wants_gpus(spec):
        return {}
    counts: dict[str, int] = {}
    for name, backend in backends.items():
        counts.update(backend.gpu_counts([p for p in plans if p.backend == name and p.task.job == 'worker']))
    return counts


def with_gpus(spec: ClusterSpec, name: str | None, opts: Options, planned: list[TaskPlan],
              backends: Backends) -> list[TaskPlan]:
    """The plans again with the GPUs the workers' hosts say they have (launch/planning/gpus.py): each
    worker of a host its own. Raises SpecError when a host has too few."""
    counts = gpu_counts(spec, planned, backends)
    return plans(spec, name, opts, counts) if counts else planned


def strategy(spec: ClusterSpec, name: str | None, opts: Options, up: UpSettings) -> ContextManager[Launch]:
    """How `launch up` runs the spec on the backend chosen (None: per host): `with` it, run it."""
    ignored = standbys.ignored(spec, name)
    load = ps_load.builtin_load(spec)
    for line in (ignored, ps_load.warning(load) if load else None):
        if line:
            up.say(line)
    return (_supervised if kind(name).mode == SUPERVISED else _delegated)(spec, name, opts, up)


@contextmanager
def _supervised(spec: ClusterSpec, name: str | None, opts: Options, up: UpSettings) -> Iterator[Launch]:
    """The supervised strategy (launch/run/supervised/loop.py) over the backends the plans need, with
    the GPUs their hosts say they have (too few: SpecError, nothing started)."""
    from launch.run.supervised import SupervisedRun
    from launch.run.supervised.placing import Placement
    planned = plans(spec, name, opts)
    check_limits(spec, planned)
    spec_yaml = tasks_spec_yaml(spec, name, opts)
    with make_backends(spec, opts, {p.backend for p in planned}) as backends:
        placed = with_gpus(spec, name, opts, planned, backends)
        strategy_class, stand_ins = SupervisedRun, (lambda p: p)
        if up.rehearse:
            from launch.run import rehearsal
            rehearsal.check_backends(backends)
            strategy_class, stand_ins = rehearsal.RehearsedRun, rehearsal.stand_ins

        def place() -> Placement | None:
            """The tasks placed by the backends that place them themselves (Ray: nodes and ports)."""
            where, why = None, {}
            for backend in backends.values():
                got = backend.place(spec, placed, up.start_timeout)
                if got is not None:
                    where = got
                    why.update(backend.moved())
            if where is None:
                return None
            return Placement(where, tasks_spec_yaml(where, name, opts), stand_ins(plans(where, name, opts)), why)

        first = place()
        run_spec, run_yaml, run_plans = (spec, spec_yaml, stand_ins(placed)) if first is None else \
            (first.spec, first.spec_yaml, first.plans)
        run = strategy_class(run_spec, run_yaml, run_plans, backends, start_timeout=up.start_timeout,
                            finish_timeout=up.finish_timeout,
                            checks=lambda: preflight.checks_before_up(run_spec, run_plans, backends, up.say),
                            warn=lambda: preflight.warn_exposure(run_plans, short=True),
                            workers=up.workers, place_again=None if first is None else place)
        yield Launch(run, ','.join(sorted({p.backend for p in placed})), spec_yaml)


@contextmanager
def _delegated(spec: ClusterSpec, name: str | None, opts: Options, up: UpSettings) -> Iterator[Launch]:
    """A delegated backend's own strategy: its scheduler runs the tasks."""
    k = kind(name)
    if up.rehearse:
        raise UsageError(f'--rehearse: the {k.name} scheduler starts the tasks itself; rehearse on the local or '
                         'ssh backend')
    run, spec_yaml = k.delegate(spec, opts)
    yield Launch(run, k.name, spec_yaml)


def tasks_spec_yaml(spec: ClusterSpec, name: str | None, opts: Options) -> str:
    """The effective spec as the tasks read it: hosts at the addresses tasks reach them at, and no
    `hosts` section (users, keys and SSH ports are the launcher's business, not every host's)."""
    return task_spec(spec, kind(name).addresses(spec, opts)).to_yaml()


PLACING = ('up', 'check', 'plan', 'compose')     # the commands that place the tasks on a backend
def check_user_code_place(spec: ClusterSpec, command: str, name: str | None) -> None:
    """SpecError, naming the key, when the backend the command places the tasks on cannot run
    the user's code (the compose image holds only tfcluster and examples/): the one decision
    `launch compose`, `launch plan --backend compose` and `launch up --backend compose` share."""
    if command not in PLACING:
        return
    k = kind('compose' if command == 'compose' else name)
    if not k.user_code_refusal:
        return
    from cluster.checks.code import user_code
    for task in spec.tasks:
        key, code = user_code(spec, task)
        missing = None if code is None else _not_shipped(code, k.ships)
        if missing:
            raise spec.error(key, k.user_code_refusal.format(code=missing))


def check_labels_place(spec: ClusterSpec, command: str, name: str | None) -> None:
    """SpecError, naming the key, for a host with `labels` whose tasks the command places on a
    backend that cannot pick a node by its labels: there they would run on the host by its name,
    a placement other than the one the spec asks for, without a word."""
    if command not in PLACING:
        return
    k = kind('compose' if command == 'compose' else name)
    if k.places_by_labels:
        return
    for task in spec.tasks:
        host = spec.hosts.get(task.host)
        if host is not None and host.labels:
            given = f'with --backend {name}' if name else ('in a compose file' if command == 'compose'
                                                           else 'without --backend')
            raise spec.error(f'hosts.{task.host}.labels',
                             f'node labels place tasks with --backend ray only; {given}, {task.name} would run on '
                             f'{task.host} itself: use --backend ray, or drop them '
                             f'(--set hosts.{task.host}.labels=null)')


def _not_shipped(code: str | tuple[str, ...], ships: tuple[str, ...]) -> str | None:
    """What of a program (package.module:function) or a command line lies outside the folders
    `ships`, said as the user wrote it; None when all of it is in them (a command naming no file
    of the user's, such as `python -c ...`, holds nothing to miss)."""
    def shipped(path: str) -> bool:
        parts = posixpath.normpath(path).split('/')
        return not posixpath.isabs(path) and parts[0] in ships

    if isinstance(code, str):
        module = code.partition(':')[0]
        return None if module.split('.')[0] in ships else f'the module {module}'
    program, args = code[0], list(code[1:])
    if program not in PYTHON_NAMES:
        return None if shipped(program) else program
    while args and args[0].startswith('-') and args[0] not in ('-m', '-c'):
        args.pop(0)         # the interpreter's own flags (-u, -O, ...)
    if not args or args[0] == '-c':
        return None
    if args[0] == '-m':
        module = args[1] if len(args) > 1 else ''
        return None if module.split('.')[0] in ships else f'the module {module}'
    return None if shipped(args[0]) else args[0]


def check_options(spec: ClusterSpec, command: str, name: str | None, opts: Options) -> None:
    """Options of one backend given to another, values it cannot take, and commands a backend
    cannot serve: UsageError."""
    chosen = kind(name)
    if command == 'up':
        problem = chosen.check(spec, opts)
        if problem:
            raise UsageError(problem)
    for k in registry.KINDS.values():
        if k is chosen or command != 'up':
            continue
        flag = k.given_exclusive(opts)
        if flag:
            raise UsageError(f'--{flag.replace("_", "-")} is for {k.options_label}: add --backend {k.name}, '
                             'or drop it')
    if name is not None:
        problem = chosen.unsupported(command, spec)
        if problem:
            raise UsageError(problem)


class Backends(dict[str, Backend]):
    """name -> Backend; used as a context manager it closes every connection on the way out."""

    def __enter__(self) -> Backends:
        return self

    def __exit__(self, *exc: object) -> None:
        for backend in self.values():
            backend.close()


def make_backends(spec: ClusterSpec, opts: Options, names_needed: Iterable[str]) -> Backends:
    """The backends these names need, the local one always first (its pre-flight comes first)."""
    backends = Backends()
    for name in [registry.DEFAULT] + sorted(set(names_needed) - {registry.DEFAULT}):
        backends[name] = registry.KINDS[name].make(spec, opts)
        backends[name].masker = spec_masker(spec)       # the lines it reads, as shown: values hidden
    return backends
