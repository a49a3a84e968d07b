"""`launch up` (start a run and supervise it to the end) and `launch scale` (change the number of
workers of a running one). How a backend runs the tasks is its own (launch/run/launching.py makes the strategy)."""
from __future__ import annotations

import os
import time

from cluster.runtime.rundir import EXIT_FAILED, EXIT_OK
from cluster.spec import ClusterSpec
from cluster.spec.load import recorded_override
from launch.commands.flags import ScaleFlags, UpFlags
from launch.commands.request import Request
from launch.errors import CommandFailed, UsageError
from launch.planning.plan import state_path
from launch.run import launching, registry
from launch.run.console import Console
from launch.run.lifecycle import Lifecycle


def check_workers(spec: ClusterSpec, workers: int | None, flag: str = '--workers') -> None:
    """A worker count for `up --workers` or `scale --workers`: 1..the spec's pool, else UsageError.
    A coordinator run takes none: ParameterServerStrategy fixes its workers when the chief builds
    the strategy, so scaling it would mean restarting the chief into a new TF_CONFIG, mid-run,
    with nothing gained over stopping and starting again with the new worker list."""
    if workers is not None and spec.coordinator:
        raise UsageError(f'{flag} {workers}: {spec.path} is a coordinator run (it has a chief): '
                         'ParameterServerStrategy fixes the worker count when the strategy is built, so it '
                         'always runs every worker of cluster.worker; change that list and start again '
                         '(the chief resumes from its checkpoint)')
    if workers is not None and not 1 <= workers <= spec.num_workers:
        raise UsageError(f'{flag} {workers}: expected 1..{spec.num_workers}, the workers {spec.path} lists '
                         '(the pool; worker 0, the chief, always runs)')


def _check_fewer_workers(spec: ClusterSpec, kind: registry.Kind, workers: int) -> None:
    """`up --workers N` with N below the pool: the backend and the training must allow it."""
    if kind.mode == registry.DELEGATED:
        raise UsageError(f'--workers {workers}: the {kind.name} scheduler runs every worker of the spec; '
                         'change the spec\'s worker list instead')
    r = spec.train.replicas_to_aggregate
    if spec.train.sync and r and workers < r:
        raise UsageError(f'--workers {workers}: fewer than train.replicas_to_aggregate ({r}), which each '
                         'sync step needs')
    if spec.train.command:
        raise UsageError(f'--workers {workers}: a train.command gets every worker of the spec')


def cmd_up(spec: ClusterSpec, req: Request[UpFlags]) -> int:
    """Run the spec to the end on the backend the registry says; the run's exit code."""
    flags = req.flags
    if flags.rehearse:
        from launch.run.rehearsal import rehearsal_spec
        spec = rehearsal_spec(spec)
    check_workers(spec, flags.workers)
    spares = spec.num_workers - flags.workers if flags.workers else 0
    console = Console(verbose=flags.verbose, tasks=len(spec.tasks) - spares, chief=spec.chief.name)
    if flags.workers not in (None, spec.num_workers):
        _check_fewer_workers(spec, registry.kind(req.backend), flags.workers)
    settings = launching.UpSettings(workers=flags.workers, start_timeout=flags.start_timeout,
                                    finish_timeout=flags.finish_timeout, say=console.say, rehearse=flags.rehearse)
    with launching.strategy(spec, req.backend, req.options, settings) as launch:
        recorded = [recorded_override(o) for o in flags.overrides]     # no secret in events.jsonl
        life = Lifecycle(spec, console, launch.backend, launch.spec_yaml, overrides=recorded)
        return life.up(launch.strategy).exit_code


def _addressee(spec: ClusterSpec, poll: float = 0.2) -> dict | None:
    """The launcher that runs the spec now, as a request's addressee (launch/run/control.py): the
    live process its state file names, waited for while a launcher holds the train_dir (one
    that is still starting has written no state yet; a dead one's state is replaced by the next
    launcher's). None once no launcher holds it."""
    from launch.records.lock import TrainDirLock
    from launch.run import control
    from launch.run.state import LaunchState
    while True:
        launcher = control.addressee(LaunchState.load(state_path(spec)))
        if launcher is not None:
            return launcher
        if TrainDirLock.held(spec.train.train_dir) is None:
            return None
        time.sleep(poll)


def cmd_scale(spec: ClusterSpec, req: Request[ScaleFlags]) -> int:
    """Ask the running launcher of the run for M workers; wait until the change took effect."""
    from launch.run import control
    from launch.records.lock import LockBusy, TrainDirLock
    workers = req.flags.workers
    check_workers(spec, workers)
    train_dir = spec.train.train_dir
    if registry.kind(req.backend).mode == registry.DELEGATED:
        raise UsageError(f'launch scale: the {registry.kind(req.backend).name} scheduler owns the size of the job')
    if TrainDirLock.held(train_dir) is None:
        raise UsageError(f'launch scale: no launcher runs {spec.path} (train_dir {train_dir}); '
                         f'`launch up {spec.path} --workers {workers}` starts it with {workers}')
    lock = TrainDirLock(train_dir, control.LOCK_FILE)
    try:
        lock.acquire(f'launch scale (pid {os.getpid()}) to {workers} workers')
    except LockBusy as e:
        raise UsageError(f'launch scale: another scale of this run is under way ({e})') from None
    try:
        launcher = _addressee(spec)
        reply = None
        if launcher is not None:
            ident = control.send(train_dir, workers, launcher)
            reply = control.wait(train_dir, ident, lambda: TrainDirLock.held(train_dir) is not None)
    finally:
        lock.release()
    if reply is None:
        raise CommandFailed(f'the launcher of {spec.path} ended before it carried out the change')
    for line in reply.lines:
        print(line)
    return EXIT_OK if reply.state == control.DONE else EXIT_FAILED
