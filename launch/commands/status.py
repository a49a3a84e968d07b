"""`launch status`: a run's state and each of its tasks, as text or JSON."""
from __future__ import annotations

import os
import time

from cluster.runtime import runjson
from cluster.runtime.contract import job_of
from cluster.runtime.rundir import EXIT_FAILED, EXIT_OK
from cluster.spec import ClusterSpec
from launch.backends.base import BackendError, Observation, stop_all
from launch.commands.flags import JsonFlags
from launch.commands.request import Request, backends_for, plans_of
from launch.errors import EXIT_NO_RUN
from launch.planning.plan import TaskPlan, state_path
from launch.records import runs
from launch.records.result import RunState
from launch.run import registry
from launch.run.preflight import launcher_alive
from launch.run.state import LaunchState


def no_state(spec: ClusterSpec) -> str:
    """Why no cluster of the spec is known here, in words."""
    return (f'no cluster of {spec.path} is known here (no {os.path.abspath(state_path(spec))}; a relative '
            'train_dir is relative to the directory `launch up` ran in)')


def cmd_status(spec: ClusterSpec, req: Request[JsonFlags]) -> int:
    """The run's state and its tasks. Exit code 0: running or done; 1: failed or interrupted;
    3: no run of this spec is known in its train_dir."""
    plans = plans_of(spec, req)
    state = LaunchState.load(state_path(spec))
    info = runs.describe(spec.train.train_dir)
    tasks = _task_status(spec, req, plans, state)
    code = EXIT_NO_RUN if info is None and state is None else \
        EXIT_OK if info is None or info.state in (RunState.RUNNING, RunState.DONE) else EXIT_FAILED
    if req.flags.json:
        print(runjson.dumps({'run': info.to_json() if info else None,
                          'launcher': {'pid': state.launcher_pid, 'alive': launcher_alive(state)} if state else None,
                          'progress': state.progress.to_json() if state and state.progress else None,
                          'restarts': state.restarts if state else 0,
                          'workers': state.workers.to_json() if state and state.workers else None, 'tasks': tasks},
                         indent=1))
        return code
    if info is not None:        # the step once: here, or with the launcher's lines when it has a state file
        print(f'run {info.id}: {info.state}, attempt {info.attempts}'
              + (f', global step {info.global_step}' if info.global_step is not None and state is None else '')
              + f' ({os.path.abspath(spec.train.train_dir)})')
    _print_launcher(spec, req, plans, state, tasks, info)
    width = max([10] + [len(t['task']) for t in tasks])      # evaluator:0 is 11
    print(f'{"TASK":<{width}} {"ADDRESS":<22} {"BACKEND":<7} {"PID":>7}  {"ALIVE":<5}  {"LISTENING":<9}  NOTE')
    for t in tasks:
        shown = {True: 'yes', False: 'no', None: '?'}[t['alive']]
        # An evaluator serves no port: its LISTENING means nothing.
        listening = '-' if job_of(t['task']) == 'evaluator' else 'yes' if t['listening'] else 'no'
        print(f'{t["task"]:<{width}} {t["address"]:<22} {t["backend"]:<7} {t["pid"] or "-":>7}  '
              f'{shown:<5}  {listening:<9}  {t["note"]}'.rstrip())
    return code


def _print_launcher(spec: ClusterSpec, req: Request[JsonFlags], plans: list[TaskPlan], state: LaunchState | None,
                    tasks: list[dict], info: runs.RunInfo | None) -> None:
    """The lines about the run's launcher and its progress (`info`: the run's records, if any)."""
    if state is None:
        print(f'no cluster of {spec.path} is running: no task of it is left to show' if info else no_state(spec))
        return
    if launcher_alive(state):
        restarts = f', {state.restarts} restart(s)' if state.restarts else ''
        print(f'launcher pid {state.launcher_pid}, started {time.ctime(state.started)}{restarts}')
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


def _clean_up_after(spec: ClusterSpec, req: Request[JsonFlags], plans: list[TaskPlan], state: LaunchState,
                    tasks: list[dict]) -> str:
    """A dead launcher whose tasks have all ended (by their lease) may have left resources behind
    (a compose project's exited containers and network): remove them, idempotently. Returns what
    was done, in words, or ''."""
    if any(t['alive'] is not False or t['left'] for t in tasks):
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


def _task_status(spec: ClusterSpec, req: Request[JsonFlags], plans: list[TaskPlan],
                 state: LaunchState | None) -> list[dict]:
    """Each task as `launch status` shows it: alive (None: cannot tell), listening, a note."""
    records = {r.name: r for r in (state.tasks if state else [])}
    live = state.workers.live if state and state.workers else None
    out = []
    with backends_for(spec, req, plans, state) as backends:
        for plan in plans:
            r = records.get(plan.name)
            backend = backends[r.backend if r else plan.backend]
            # compose: the record has its container's address; SSH: the address tasks reach it at; a
            # private network namespace: asked from inside
            seen = backend.status(r) if r else None
            listening = backend.probe(r or backend.log_record(plan), 0.5, handshake=False)
            alive, note = _seen(seen)
            if not note and plan.task.job == 'worker' and live is not None and plan.task.index not in live:
                note = 'spare: in the pool, not running (`launch scale`)'
            out.append({'task': plan.name, 'address': plan.task.address, 'backend': plan.backend,
                        'pid': r.pid if r else None, 'alive': alive, 'listening': listening, 'note': note,
                        'left': list(seen.left) if seen else []})
    return out


def _seen(seen: Observation | None) -> tuple[bool | None, str]:
    """Whether a task is alive (None: cannot tell) and what to note about it, from what its
    backend observed (None: it was never started)."""
    if seen is None:
        return False, ''
    alive = {'running': True, 'ended': False, 'unknown': None}[seen.state]
    if seen.left:       # the task is gone, what it started is not (and may hold its port)
        return alive, (f'ended, but its process group still runs (pid {", ".join(map(str, seen.left))}): '
                       '`launch down` stops it')
    return alive, (seen.stopped or '') if alive else f'unknown: {seen.error}' if alive is None else ''
