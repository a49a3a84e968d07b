"""The backend registry: every way `launch` can run a cluster, by name, with what it can do.

Each entry says how a spec becomes task plans, how its Backend is made (a supervised backend),
how `launch up` runs it (`strategy`: the supervised strategy over its backends, or the scheduler's
own, delegated), and its capabilities. The commands ask the registry, never a backend's name: a
new backend is one module plus one entry here.

`local` and `ssh` plan alike: each task is a local process or an SSH task as its host says
(launch/planning/plan.py is_local), so `--backend local`, `--backend ssh` and no --backend are one choice.
"""
from __future__ import annotations

import enum
import os
import posixpath
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from contextlib import AbstractContextManager as ContextManager
from collections.abc import Callable, Iterable, Iterator, Mapping

from cluster.checks.code import PYTHON_NAMES
from cluster.runtime.masking import spec_masker
from cluster.spec import ClusterSpec, TaskSpec
from launch.backends.base import Backend
from launch.errors import UsageError
from launch.planning import gpus, limits
from launch.planning.plan import TaskPlan, is_local, plan_cluster, plan_compose, service_name, task_spec
from launch.render.options import RenderOptions
from launch.run.lifecycle import Strategy

class Mode(str, enum.Enum):
    """Who owns a run's tasks: the launcher through a backend, or a scheduler it hands them to."""
    SUPERVISED = 'supervised'
    DELEGATED = 'delegated'

    def __str__(self) -> str:
        return self.value


SUPERVISED, DELEGATED = Mode.SUPERVISED, Mode.DELEGATED


@dataclass(frozen=True)
class Options:
    """What the command line says beyond the spec: how to reach hosts, how to submit a job."""
    ssh_config: str | None = None
    accept_any_host_key: bool = False
    partition: str | None = None
    time_limit: str | None = None
    port_base: int | None = None

    def render_options(self) -> RenderOptions:
        """The options the batch script of `up --backend slurm` is rendered with."""
        return RenderOptions(partition=self.partition, time_limit=self.time_limit, port_base=self.port_base)


def _no_checks(spec: ClusterSpec, plans: list[TaskPlan], backends: Backends, say: Callable[[str], None]) -> None:
    pass


@dataclass(frozen=True)
class UpSettings:
    """What `launch up` says about the run beyond the spec and the backend options."""
    workers: int | None = None          # the first N workers of the pool run (None: all)
    start_timeout: float = 120.0
    finish_timeout: float = 60.0
    say: Callable[[str], None] = print  # a line on the console
    # The supervised strategy's pre-flight, before anything starts, and its warning once the tasks
    # run. They are the caller's to give (launch/run/preflight.py) because the pre-flight asks this
    # registry what each backend can do: importing it here would be an import cycle.
    checks: Callable[[ClusterSpec, list[TaskPlan], Backends, Callable[[str], None]], None] = _no_checks
    warn: Callable[[list[TaskPlan]], None] = lambda plans: None


@dataclass(frozen=True)
class Launch:
    """A strategy ready for Lifecycle.up, with what the run records of it."""
    strategy: Strategy
    backend: str            # the backend(s) the run names (events.jsonl's run_started)
    spec_yaml: str          # the effective spec its tasks read


# spec, the backend as given (None: per host), its options, the run's settings -> the strategy,
# valid inside the `with` (the supervised one holds its backends' connections open till then)
StrategyFactory = Callable[[ClusterSpec, 'str | None', Options, UpSettings], ContextManager[Launch]]


@dataclass(frozen=True)
class Kind:
    name: str
    mode: Mode
    strategy: StrategyFactory
    addresses: Callable[[ClusterSpec, Options], dict[str, str]] = lambda spec, opts: {}
    # spec, addresses, GPU counts (a spec host or machine -> count, where asked) -> the task plans
    plan: Callable[[ClusterSpec, dict[str, str], dict[str, int]], tuple[TaskPlan, ...]] | None = None
    make: Callable[[ClusterSpec, Options], Backend] | None = None           # supervised: the backend
    where: Callable[[TaskPlan, TaskSpec, Options], str] = lambda plan, task, opts: ''
    # Capabilities.
    on_this_machine: bool = False      # its tasks run here: they see this machine's files and ports
    logs_here: bool = False            # its tasks' logs land in this machine's train_dir
    isolates_ports: bool = False       # nothing outside reaches its tasks' ports (a private network)
    remembered: bool = False           # a run remembers it (state file, events): no --backend needed later
    leaves_resources: bool = False     # stopped tasks leave something (containers, a network) that `down` removes
    # Why train.program / train.command / train.evaluator cannot run there ('': they can), with {code}
    # for what is missing, unless it is in one of the folders it holds all the same (`ships`: the image's examples).
    user_code_refusal: str = ''
    ships: tuple[str, ...] = ()
    netns_refusal: str = ''            # why `isolation: netns` cannot apply ('' : it can)
    options: tuple[str, ...] = ()      # the command-line options that are its own (Options fields)
    options_label: str = ''            # 'Slurm jobs': what those options are for
    unsupported: Callable[[str, ClusterSpec], str | None] = lambda command, spec: None
    check: Callable[[ClusterSpec, Options], str | None] = lambda spec, opts: None    # its options' values
    # What a task starts with beyond its plan's env (a local one: part of the launcher's environment),
    # and the text its start sends as one string (over SSH: the remote shell's command), if any:
    # both count against the OS's limits for starting a process (launch/planning/limits.py).
    inherits: Callable[[TaskPlan], Mapping[str, str]] = lambda plan: {}
    start_text: Callable[[TaskPlan], str | None] = lambda plan: None

    def backend(self, spec: ClusterSpec, opts: Options) -> Backend:
        """A Backend of this kind: only a supervised kind has one (a delegated one's scheduler runs the tasks)."""
        if self.make is None:
            raise ValueError(f'the {self.name} backend is {self.mode}: no Backend runs its tasks')
        return self.make(spec, opts)


def _ssh_addresses(spec: ClusterSpec, opts: Options) -> dict[str, str]:
    """Where tasks reach each SSH host (hosts.X.address, else the ssh config's HostName)."""
    if all(is_local(spec, t.host) for t in spec.tasks):
        return {}
    from launch.backends.ssh import host_addresses
    return host_addresses(spec, opts.ssh_config)


def _plan_hosts(spec: ClusterSpec, addresses: dict[str, str], counts: dict[str, int]) -> tuple[TaskPlan, ...]:
    return plan_cluster(spec, addresses=addresses, counts=counts)


def _plan_compose(spec: ClusterSpec, addresses: dict[str, str], counts: dict[str, int]) -> tuple[TaskPlan, ...]:
    return plan_compose(spec, counts)


def _make_local(spec: ClusterSpec, opts: Options) -> Backend:
    from launch.backends.local import LocalBackend
    return LocalBackend()


def _make_ssh(spec: ClusterSpec, opts: Options) -> Backend:
    from launch.backends.ssh import SSHBackend
    if opts.accept_any_host_key:
        print('launch: WARNING: SSH host keys are NOT checked (--insecure-accept-any-host-key): '
              'anyone on the network path can impersonate these hosts', file=sys.stderr)
    return SSHBackend(spec, ssh_config=opts.ssh_config, check_host_keys=not opts.accept_any_host_key)


def _make_compose(spec: ClusterSpec, opts: Options) -> Backend:
    from launch.backends.compose import ComposeBackend
    return ComposeBackend(spec)


def _local_inherits(plan: TaskPlan) -> dict[str, str]:
    from launch.backends.local import inherited
    return inherited(os.environ)


def _ssh_start_text(plan: TaskPlan) -> str | None:
    from launch.backends.ssh.backend import start_script_size_text
    return start_script_size_text(plan)


def _ssh_where(plan: TaskPlan, task: TaskSpec, opts: Options) -> str:
    from launch.backends.ssh import ssh_target
    return f'ssh {ssh_target(plan, opts.ssh_config)}'


def _slurm_unsupported(command: str, spec: ClusterSpec) -> str | None:
    """Slurm runs the tasks of `up --backend slurm`; the commands that would find or stop them
    through the launcher's state do not know its jobs: say where to look instead."""
    if command in ('up', 'render', 'eval', 'report'):
        return None
    if command == 'scale':
        return ('launch scale: the Slurm scheduler owns the size of the job (the spec\'s worker list): stop it '
                'and submit it again with another worker list to change it')
    if command in ('plan', 'check', 'compose'):
        return (f'launch {command} --backend slurm is not supported: Slurm places the tasks when the job starts; '
                f'`launch render {spec.path} --format sbatch` shows what the job runs')
    import os
    from cluster.runtime import rundir
    from launch.render.sbatch import job_name
    if command == 'debug':      # its tasks install the dump all the same (not scancel --signal: it reaches
        # the shell a coordinator run's chief rank waits in, which SIGUSR1 would end)
        return (f'launch debug --backend slurm is not supported: Slurm runs that job; on a task\'s node, '
                f'`kill -USR1 PID` of its Python process writes its stacks under '
                f'{os.path.join(os.path.abspath(spec.train.train_dir), rundir.STACKS_DIR)}')
    return (f'launch {command} --backend slurm is not supported: Slurm runs that job; '
            f'`squeue --name {job_name(spec)}` shows it, `scancel --name {job_name(spec)}` stops it, '
            f'and its logs are in {rundir.logs_dir(os.path.abspath(spec.train.train_dir))}')


@contextmanager
def _supervised(spec: ClusterSpec, name: str | None, opts: Options, up: UpSettings) -> Iterator[Launch]:
    """The supervised strategy (launch/run/supervised.py) over the backends the plans need, with
    the GPUs their hosts say they have (too few: SpecError, nothing started)."""
    from launch.run.supervised import SupervisedRun
    planned = plans(spec, name, opts)
    check_limits(spec, planned)
    spec_yaml = tasks_spec_yaml(spec, name, opts)
    with make_backends(spec, opts, {p.backend for p in planned}) as backends:
        placed = with_gpus(spec, name, opts, planned, backends)
        run = SupervisedRun(spec, spec_yaml, placed, backends, start_timeout=up.start_timeout,
                            finish_timeout=up.finish_timeout, checks=lambda: up.checks(spec, placed, backends, up.say),
                            warn=lambda: up.warn(placed), workers=up.workers)
        yield Launch(run, ','.join(sorted({p.backend for p in placed})), spec_yaml)


@contextmanager
def _slurm_strategy(spec: ClusterSpec, name: str | None, opts: Options, up: UpSettings) -> Iterator[Launch]:
    from launch.run.slurm import make_strategy
    run = make_strategy(spec, opts.render_options())
    yield Launch(run, kind(name).name, run.effective_spec)


def _slurm_check(spec: ClusterSpec, opts: Options) -> str | None:
    from launch.render.sbatch import option_problem
    return option_problem(spec, opts.render_options())


KINDS: dict[str, Kind] = {k.name: k for k in (
    # local and ssh plan alike (each task as its host says): one planner, one address lookup
    Kind('local', SUPERVISED, _supervised, addresses=_ssh_addresses, plan=_plan_hosts, make=_make_local,
         where=lambda plan, task, opts: 'local process', on_this_machine=True, logs_here=True,
         inherits=_local_inherits),
    Kind('ssh', SUPERVISED, _supervised, addresses=_ssh_addresses, plan=_plan_hosts, make=_make_ssh,
         where=_ssh_where, start_text=_ssh_start_text),
    Kind('compose', SUPERVISED, _supervised, plan=_plan_compose, make=_make_compose,
         where=lambda plan, task, opts: f'compose service {service_name(task)}, was {task.address} in the spec',
         isolates_ports=True, logs_here=True, remembered=True, leaves_resources=True,
         user_code_refusal='the compose backend runs the tfcluster image, which holds tfcluster and the examples/ '
                           'folder only, not {code}: run it with the local or SSH backend, or on Kubernetes from an '
                           'image built FROM tfcluster with your code (docs/own-code.md)',
         ships=('examples',),
         netns_refusal='isolation: netns is for local processes; the compose backend runs the tasks on its own '
                       'internal network already, which nothing outside reaches: drop isolation (--set '
                       'isolation=none) to use it'),
    Kind('slurm', DELEGATED, _slurm_strategy, remembered=True,
         netns_refusal='isolation: netns is for local processes; Slurm places the tasks on its nodes: drop '
                       'isolation (--set isolation=none) to use --backend slurm',
         options=('partition', 'time_limit', 'port_base'), options_label='Slurm jobs',
         unsupported=_slurm_unsupported, check=_slurm_check, logs_here=True),
)}
DEFAULT = 'local'       # with no --backend: local processes, or SSH for hosts that are not this machine


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def kind(name: str | None) -> Kind:
    return KINDS[name or DEFAULT]


def plans(spec: ClusterSpec, name: str | None, opts: Options, counts: dict[str, int] | None = None) -> list[TaskPlan]:
    """What every task of the spec runs where, for the backend chosen (None: per host). `counts`:
    the GPUs the hosts said they have (Backend.gpu_counts); without, the spec's `gpus:` or unknown."""
    k = kind(name)
    if k.plan is None:
        raise UsageError(f'the {k.name} backend places the tasks itself; nothing is planned here')
    return list(k.plan(spec, k.addresses(spec, opts), counts or {}))


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
    return kind(name).strategy(spec, name, opts, up)


def tasks_spec_yaml(spec: ClusterSpec, name: str | None, opts: Options) -> str:
    """The effective spec as the tasks read it: hosts at the addresses tasks reach them at, and no
    `hosts` section (users, keys and SSH ports are the launcher's business, not every host's)."""
    k = kind(name)
    return task_spec(spec, k.addresses(spec, opts)).to_yaml()


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
    for k in KINDS.values():
        if k is chosen or command != 'up':
            continue
        flag = next((f for f in k.options if getattr(opts, f) is not None), None)
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
    for name in [DEFAULT] + sorted(set(names_needed) - {DEFAULT}):
        backends[name] = KINDS[name].backend(spec, opts)
        backends[name].masker = spec_masker(spec)       # the lines it reads, as shown: values hidden
    return backends


def remembered(names_recorded: Iterable[object]) -> str | None:
    """The backend a state file's tasks (or a run's events, as written) name when `status`, `down`
    and `logs` need no --backend."""
    return next((n for n in names_recorded if isinstance(n, str) and n in KINDS and KINDS[n].remembered), None)

