"""`launch status`: a run's state and each of its tasks, as text or JSON."""
from __future__ import annotations

import dataclasses
import os
import time

from cluster.runtime import runjson
from cluster.runtime.rundir import EXIT_FAILED, EXIT_OK
from cluster.spec import ClusterSpec
from launch.backends import standby
from launch.backends.base import BackendError, stop_all
from launch.commands import status_view
from launch.commands.flags import StatusFlags
from launch.commands.status_view import TaskRow
from launch.commands.request import Request, backends_for, plans_of
from launch.errors import EXIT_NO_RUN
from launch.planning.plan import TaskPlan, state_path
from launch.records import preemptions, runs, telemetry
from launch.records.event_types import Straggler
from launch.records.result import RunState
from launch.run import registry
from launch.run.disk import read_pulse
from launch.run.preflight import launcher_alive
from launch.run.state import LaunchState


def no_state(spec: ClusterSpec) -> str:
    """Why no cluster of the spec is known here, in words."""
    return (f'no cluster of {spec.path} is known here (no {os.path.abspath(state_path(spec))}; a relative '
            'train_dir is relative to the directory `launch up` ran in)')


def cmd_status(spec: ClusterSpec, req: Request[StatusFlags]) -> int:
    """The run's state and its tasks. Exit code 0: running or done; 1: failed or interrupted;
    3: no run of this spec is known in its train_dir. A run of more than a dozen tasks is shown one
    line per job (`--all`: a row per task)."""
    plans = plans_of(spec, req)
    state = LaunchState.load(state_path(spec))
    info = runs.describe(spec.train.train_dir)
    tasks = _task_status(spec, req, plans, state)
    preempted = preemptions.of_run(spec.train.train_dir) if info is not None else []
    slow = telemetry.stragglers(telemetry.of_run(spec.train.train_dir), info.attempts) if info is not None else []
    tasks = _named_stragglers(tasks, slow)
    code = EXIT_NO_RUN if info is None and state is None else \
        EXIT_OK if info is None or info.state in (RunState.RUNNING, RunState.DONE) else EXIT_FAILED
    if req.flags.json:
        print(runjson.dumps({'run': info.to_json() if info else None,
                          'launcher': {'pid': state.launcher_pid, 'alive': launcher_alive(state)} if state else None,
                          'progress': state.progress.to_json() if state and state.progress else None,
                          'restarts': state.restarts if state else 0,
                          'preemptions': state.preemptions if state else 0,
                          'preempted': [p.to_json() for p in preempted],
                          'stragglers': [{'task': e.task, 'time': e.time, 'steps_per_sec': e.steps_per_sec,
                                          'median': e.median, 'cause': e.cause} for e in slow],
                          'workers': state.workers.to_json() if state and state.workers else None,
                          'standby': _standby_json(state),
                          'tasks': [t.to_json() for t in tasks]},
                         indent=1))
        return code
    if info is not None:        # the step once: here, or with the launcher's lines when it has a state file
        print(f'run {info.id}: {info.state}, attempt {info.attempts}'
              + (f', global step {info.global_step}' if info.global_step is not None and state is None else '')
              + f' ({os.path.abspath(spec.train.train_dir)})')
        if preempted:
            print(preemptions.summary(preempted))
    _print_launcher(spec, req, plans, state, tasks, info)
    if req.flags.all or len(tasks) <= status_view.GROUP_ABOVE:
        print('\n'.join(status_view.table(tasks) + status_view.telemetry(tasks)))
    else:
        print('\n'.join(status_view.grouped(tasks)))
        print(f'({len(tasks)} tasks, one line per job; `launch status --all` lists each task)')
    return code


def _print_launcher(spec: ClusterSpec, req: Request[StatusFlags], plans: list[TaskPlan], state: LaunchState | None,
                    tasks: list[TaskRow], info: runs.RunInfo | None) -> None:
    """The lines about the run's launcher and its progress (`info`: the run's records, if any)."""
    if state is None:
        print(f'no cluster of {spec.path} is running: no task of it is left to show' if info else no_state(spec))
        return
    if launcher_alive(state):
        restarts = (f', {state.restarts} restart(s)' if state.restarts else '') + \
            (f', {state.preemptions} preemption(s)' if state.preemptions else '')
        print(f'launcher pid {state.launcher_pid}, started {time.ctime(state.started)}{restarts}')
        if state.standbys:
            ready, starting = standby.counts(state.standbys)
            print(f'standby: {ready} ready, {starting} starting')
        w = state.workers
        if w and len(w.live) != w.pool:
            print(f'workers: {len(w.live)} of a pool of {w.pool} run '
                  f'({", ".join(f"worker:{i}" for i in w.live)})'
                  + (f'; scaling to {w.scaling}' if w.scaling else ''))
    else:
        cleaned = _clean_up_after(spec, req, plans, state, tasks)
        print(f'launcher pid {state.launcher_pid} is gone; '
              + (cleaned or f'`launch down {spec.path}` stops what is left'))
    p = state.progress
    if p:
        seen = f', seen {max(0.0, time.time() - p.at):.0f}s ago' if p.at is not None else ''
        print(f'global step {p.global_step}/{p.steps}{seen}')
    elif info is not None and info.global_step is not None:
        # The launcher's newest step is of this attempt (none yet: it starts again, or was killed
        # before it saw one); the run's records have the step it reached before.
        print(f'global step {info.global_step} (the event log\'s newest; none seen since attempt {info.attempts} '
              'began)')
    else:
        print('global step: none seen yet')


def _named_stragglers(tasks: list[TaskRow], slow: list[Straggler]) -> list[TaskRow]:
    """The rows of running workers this attempt named stragglers, noted so (the newest naming)."""
    named = {e.task: e for e in slow}
    return [dataclasses.replace(t, note='; '.join(filter(None, (t.note, telemetry.note(named[t.task])))))
            if t.task in named and t.alive else t for t in tasks]


def _standby_json(state: LaunchState | None) -> dict[str, int] | None:
    """`launch status --json`'s standbys: how many wait ready, how many import (None: no launcher state)."""
    if state is None:
        return None
    ready, starting = standby.counts(state.standbys)
    return {'ready': ready, 'starting': starting}


def _clean_up_after(spec: ClusterSpec, req: Request[StatusFlags], plans: list[TaskPlan], state: LaunchState,
                    tasks: list[TaskRow]) -> str:
    """A dead launcher whose tasks have all ended (by their lease) may have left resources behind
    (a compose project's exited containers and network): remove them, idempotently. Returns what
    was done, in words, or ''."""
    if any(t.alive is not False or t.left for t in tasks):
        return ''
    kinds = {r.backend for r in state.tasks if registry.kind(r.backend).leaves_resources}
    if not kinds:
        return ''
    with backends_for(spec, req, plans, state) as backends:
        try:
            stop_all([r for r in state.tasks if r.backend in kinds], backends)
        except BackendError as e:
            return f'could not remove what it left ({e}); `launch down {spec.path}` tries again'
    return f'its tasks have ended, and what they left on {", ".join(sorted(kinds))} is removed'


def _task_status(spec: ClusterSpec, req: Request[StatusFlags], plans: list[TaskPlan],
                 state: LaunchState | None) -> list[TaskRow]:
    """Each task as `launch status` shows it: alive (None: cannot tell), listening, a note. The
    tasks are asked in parallel (status_view.ask_all): in series a frozen host's probe cost 0.5 s
    per task."""
    records = {r.name: r for r in (state.tasks if state else [])}
    live = state.workers.live if state and state.workers else None
    with backends_for(spec, req, plans, state) as backends:
        def ask(plan: TaskPlan) -> TaskRow:
            r = records.get(plan.name)
            backend = backends[r.backend if r else plan.backend]
            # compose: the record has its container's address; SSH: the address tasks reach it at; a
            # private network namespace: asked from inside
            seen = backend.status(r) if r else None
            listening = backend.probe(r or backend.log_record(plan), 0.5, handshake=False)
            alive, note = status_view.seen_words(seen)
            if not note and plan.task.job == 'worker' and live is not None and plan.task.index not in live:
                note = 'spare: in the pool, not running (`launch scale`)'
            where = r.endpoint if r and registry.kind(r.backend).places else plan.task.address
            beat = read_pulse(r, backend) if r and alive else None
            return TaskRow(plan.name, where, plan.backend, r.pid if r else None, alive, listening, note,
                           seen.left if seen else (), seen.exit_code if seen else None, beat.sample if beat else None)
        return status_view.ask_all(ask, plans)
