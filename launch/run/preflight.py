"""What `launch up` checks before anything starts, and `launch check` with it (one function,
preflight()): one clear line and exit code 2 for each problem (UsageError or SpecError), nothing
started and nothing left behind."""
from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable, Mapping

from cluster.checks import memory
from cluster.spec import ClusterSpec
from cluster.rehearsal.argv import is_stand_in
from launch.run import exposure
from launch.backends import netns
from launch.run import registry
from launch.backends.base import Backend, HostCheck, refusal, stop_all
from launch.backends.procstat import process_ident
from launch.errors import UsageError
from launch.planning.plan import TaskPlan, state_path
from launch.records import ownership
from launch.records.lock import TrainDirLock, in_use
from launch.run.state import LaunchState
from launch.system import poll_until


def launcher_alive(state: LaunchState) -> bool:
    ident = process_ident(state.launcher_pid)
    return ident is not None and ident == state.launcher_ident and state.launcher_pid != os.getpid()


def running_state(spec: ClusterSpec, backends: Mapping[str, Backend]) -> LaunchState | None:
    """The state of a run of this spec whose launcher or tasks still live, else None."""
    state = LaunchState.load(state_path(spec))
    if state is None:
        return None
    if launcher_alive(state) or any(r.backend in backends and backends[r.backend].status(r).alive
                                    for r in state.tasks):
        return state
    return None


def take_over(spec: ClusterSpec, backends: Mapping[str, Backend], say: Callable[[str], None]) -> bool:
    """An earlier run of this spec whose launcher is dead (killed hard: it could not stop its tasks)
    is taken over: what is left of its tasks is stopped (a compose project's containers and network
    removed), its state file removed, and the user told. Called under the train_dir's lock, so no
    other launcher can be managing those tasks."""
    state = LaunchState.load(state_path(spec))
    if state is None or launcher_alive(state):
        return False
    others = sorted({r.backend for r in state.tasks if r.backend not in backends})
    if others:
        raise UsageError(f'{spec.path}: the launcher of an earlier run (pid {state.launcher_pid}) is gone, and its '
                         f'tasks ran on {", ".join(others)}: stop what is left with `launch down {spec.path}` first')
    left = [r for r in state.tasks
            if registry.kind(r.backend).leaves_resources or backends[r.backend].status(r).alive]
    if left:
        alive = [r.name for r in left if backends[r.backend].status(r).alive]
        say(f'the launcher of an earlier run of this spec (pid {state.launcher_pid}) is gone; '
            + (f'stopping what it left running ({", ".join(alive)})' if alive else 'removing what it left behind'))
        stop_all(left, backends)
        still = [r.name for r in left if backends[r.backend].status(r).alive]
        if still:
            raise UsageError(f'{spec.path}: could not stop {", ".join(still)}, left by the dead launcher pid '
                             f'{state.launcher_pid}; try `launch down {spec.path}`')
    try:
        os.remove(state_path(spec))
    except FileNotFoundError:
        pass
    return bool(left)


FILES_PER_TASK = 4         # a task's log, its channel, its readiness socket, and one spare (an event, a read)
FILES_OWN = 256             # the launcher's own: Python, its modules, its event log, SSH, a probe


def files_needed(tasks: int) -> int:
    """About how many files the launcher holds open at once for a run of `tasks` tasks."""
    return FILES_PER_TASK * tasks + FILES_OWN


def check_open_files(spec: ClusterSpec, tasks: int, raise_soft: bool = True) -> None:
    """The launcher can open the files a run of this size needs: `launch up` raises its soft
    RLIMIT_NOFILE to the hard limit (the soft 1024 of many shells runs out near 250 tasks, part way
    into the start); below what the run needs even then, refused in one line, nothing started."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = files_needed(tasks)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard) and raise_soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):       # some systems cap the soft limit below an unlimited hard one
            pass
    if hard != resource.RLIM_INFINITY and hard < need:
        raise UsageError(f'{spec.path}: {tasks} tasks need about {need} open files in the launcher, but its '
                         f'limit is {hard} (ulimit -Hn): raise the hard limit or start fewer tasks')


TAKE_OVER_SECS = 10.0       # how long the ports of a dead launcher's stopped tasks may take to be free


def check_isolation(spec: ClusterSpec, command: str, backend: str | None) -> None:
    """`isolation: netns` needs local processes and the right to make network namespaces."""
    if spec.isolation != 'netns' or command not in ('up', 'check', 'plan', 'compose'):
        return
    refusal = registry.kind('compose' if command == 'compose' else backend).netns_refusal
    if refusal:
        raise UsageError(f'{spec.path}: {refusal}')
    why = netns.unavailable() if command in ('up', 'check') else None
    if why:
        raise UsageError(f'{spec.path}: isolation: netns {why}')


def check_user_code(spec: ClusterSpec, plans: list[TaskPlan]) -> None:
    """A `train.program` or `train.command` can be found where local tasks run (remote tasks check
    on their own host as they start). Whether the backend can run it at all is decided before
    (launching.check_user_code_place, for every command that places tasks)."""
    from cluster.checks.code import check_user_code as check
    for plan in plans:
        if registry.kind(plan.backend).on_this_machine:
            check(spec, plan.task, plan.cwd)


def prepare_data(spec: ClusterSpec, plans: list[TaskPlan], write: bool = True) -> None:
    """Check the data set once, before local workers would race for it; with `write`, make the
    synthetic one (`launch up`; `launch check` writes nothing: up makes it where it is missing)."""
    if spec.train.program or spec.train.command or (not write and spec.train.data == 'synthetic'):
        return      # the user's code reads its own data
    if all(is_stand_in(p.argv) for p in plans):
        return      # a rehearsal's stand-ins read no data (the real run makes it)
    if any(registry.kind(p.backend).on_this_machine and p.task.job == 'worker' for p in plans):
        from cluster.checks import data
        data.resolve_spec_data(spec)


def preflight(spec: ClusterSpec, plans: list[TaskPlan], backends: Mapping[str, Backend],
              say: Callable[[str], None] = print,
              show: Callable[[dict[str, list[HostCheck]]], None] | None = None) -> None:
    """The one pre-flight of `launch up` and `launch check`: everything that can be wrong before
    anything starts, in the same order, each problem the same one line (UsageError or SpecError:
    exit 2). The spec itself, its plans' limits and the GPUs are checked before it (the command
    line, launching.check_limits, launching.with_gpus); this is the rest: the train_dir, a run
    already going, the user's code, the batch's memory, every host, the data set.

    `launch up` runs it under the train_dir's lock (its train_dir checked as it took the lock):
    a dead launcher's tasks are stopped first (`take_over`, saying so), each backend checks its
    hosts, and the synthetic data set is written. `launch check` passes `show`, which is handed
    every host's verdict (backend name -> its hosts', TensorFlow and tfcluster imported for
    real) before a failed one is refused; it touches nothing: no lock and no take-over (the
    train_dir's checks and its lock are probed instead), no data written."""
    checking = show is not None
    took_over = False
    check_open_files(spec, len(plans), raise_soft=not checking)
    if checking:
        ownership.check_train_dir(spec)
        holder = TrainDirLock.held(spec.train.train_dir)
        if holder is not None:
            raise UsageError(in_use(spec.path, spec.train.train_dir, holder))
    else:
        took_over = take_over(spec, backends, say)
    running = running_state(spec, backends)
    if running is not None and (not checking or launcher_alive(running)):   # a dead one's: up takes it over
        raise UsageError(f'{spec.path}: a cluster of this spec is already running (launcher pid '
                         f'{running.launcher_pid}, state in {state_path(spec)}); '
                         f'stop it with `launch down {spec.path}`')
    check_user_code(spec, plans)
    memory.check_batch_memory(spec, [p.task for p in plans if registry.kind(p.backend).on_this_machine])
    if show is not None:
        verdicts = {name: b.check([p for p in plans if p.backend == name], imports=True)
                    for name, b in backends.items()}
        show(verdicts)
        for found in verdicts.values():     # as up: the first backend with a failed host
            failed = [c for c in found if not c.ok]
            if failed:
                raise UsageError(refusal(spec, failed))
    else:
        for name, backend in backends.items():
            _host_checks(spec, [p for p in plans if p.backend == name], backend, took_over)
    prepare_data(spec, plans, write=not checking)


def _host_checks(spec: ClusterSpec, plans: list[TaskPlan], backend: Backend, took_over: bool) -> None:
    """One backend's hosts for `launch up`; after a take-over, the stopped tasks' ports are
    waited for a moment (their processes ended, the kernel frees the ports just after)."""
    if not took_over:
        backend.preflight(spec, plans)
        return
    refused: list[UsageError] = []

    def passes() -> bool:
        try:
            backend.preflight(spec, plans)
            return True
        except UsageError as e:
            refused[:] = [e]
            return False
    if not poll_until(passes, time.monotonic() + TAKE_OVER_SECS, poll=0.2):
        raise refused[0]


def checks_before_up(spec: ClusterSpec, plans: list[TaskPlan], backends: Mapping[str, Backend],
                     say: Callable[[str], None] = print) -> None:
    """The supervised `launch up`'s pre-flight, which launching's supervised strategy runs under
    the train_dir's lock."""
    preflight(spec, plans, backends, say=say)


def warn_exposure(plans: list[TaskPlan], short: bool = False) -> None:
    """One warning line when a task port can be reached from another machine (docs/security.md):
    in full for `launch check`, short for `launch up` (once per run)."""
    text = (exposure.short_warning if short else exposure.warning)(plans, exposure.machine_addresses())
    if text:
        print(f'launch: WARNING: {text}', file=sys.stderr, flush=True)
