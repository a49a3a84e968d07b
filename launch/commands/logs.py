"""`launch logs`: print a task's log, or every task's, once or following them (`-f`) across the
restarts that move a task to a new log file."""
from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Mapping

from cluster.runtime import rundir
from cluster.spec import ClusterSpec
from launch.backends.base import Backend, TaskRecord
from launch.commands.flags import LogsFlags
from launch.commands.request import Request, backends_for, plans_of
from launch.errors import UsageError
from launch.planning.plan import TaskPlan, log_path, state_path
from launch.run import registry
from launch.run.console import Console
from launch.run.state import LaunchState, StateError


def cmd_logs(spec: ClusterSpec, req: Request[LogsFlags]) -> int:
    flags = req.flags
    plans = _chosen(spec, plans_of(spec, req), flags.task)
    state = LaunchState.load(state_path(spec))
    records = {r.name: r for r in (state.tasks if state else [])}
    if flags.attempt is not None:        # an earlier attempt's files, not what the running tasks write
        plans, records = _of_attempt(spec, plans, flags.attempt), {}
    logs_dir = os.path.dirname(log_path(spec, spec.tasks[0]))
    if state is None and all(registry.kind(p.backend).logs_here for p in plans) and not os.path.isdir(logs_dir):
        raise UsageError(f'{spec.path}: no logs in {os.path.abspath(logs_dir)}: this spec was never started '
                         'here (a relative train_dir is relative to the directory `launch up` ran in)')
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    with backends_for(spec, req, plans, state) as backends:
        shower = _Shower(spec, backends, records, Console(), flags.follow, len(plans) > 1, stop)
        threads = [threading.Thread(target=shower.show, args=(p,), daemon=True) for p in plans]
        for t in threads:
            t.start()
            if not flags.follow:
                t.join()
        while any(t.is_alive() for t in threads):
            time.sleep(0.1)
    return 0


def _chosen(spec: ClusterSpec, plans: list[TaskPlan], task: str | None) -> list[TaskPlan]:
    """The plan of the task named (UsageError if there is none), or every plan."""
    if not task:
        return plans
    chosen = [p for p in plans if p.name == task]
    if not chosen:
        raise UsageError(f'{spec.path}: no task {task!r}; tasks are {", ".join(p.name for p in plans)}')
    return chosen


def _of_attempt(spec: ClusterSpec, plans: list[TaskPlan], attempt: int) -> list[TaskPlan]:
    """The plans with the log files of an earlier attempt; UsageError if it kept none here."""
    attempts = rundir.attempts(spec.train.train_dir)
    here = all(registry.kind(p.backend).logs_here for p in plans)
    if attempt not in attempts and (attempts or here):
        held = f'the logs hold attempt(s) {", ".join(map(str, attempts))}' if attempts else 'no attempt is kept here'
        raise UsageError(f'{spec.path}: no attempt {attempt}: {held}')
    return [dataclasses.replace(p, log_path=dataclasses.replace(p, attempt=attempt).attempt_log_path) for p in plans]


@dataclasses.dataclass
class _Shower:
    """Prints the log of one task per thread; several tasks' lines prefixed with their names."""
    spec: ClusterSpec
    backends: Mapping[str, Backend]
    records: dict[str, TaskRecord]      # the tasks the state file knows: where they log now
    console: Console
    follow: bool
    prefixed: bool
    stop: threading.Event

    def show(self, plan: TaskPlan) -> None:
        record = self.records.get(plan.name) or self.backends[plan.backend].log_record(plan)  # where a started task logs
        while True:
            moved = threading.Event()       # following: a cluster restart moved the task to a new log
            if self.follow and plan.name in self.records:
                threading.Thread(target=_watch_moves, args=(self.spec, record, self.stop, moved), daemon=True).start()
            for line in self.backends[record.backend].lines(record, follow=self.follow,
                                                               stop=_either(self.stop, moved)):
                if self.prefixed:
                    self.console.line(plan.name, line)
                else:
                    print(line, flush=True)
            if not moved.is_set() or self.stop.is_set():
                return
            record = _current_record(self.spec, plan.name) or record


def _current_record(spec: ClusterSpec, task: str) -> TaskRecord | None:
    """The task's record in the state file now (None once the run is over)."""
    try:
        state = LaunchState.load(state_path(spec))
    except StateError:
        return None
    return next((r for r in (state.tasks if state else []) if r.name == task), None)


def _watch_moves(spec: ClusterSpec, record: TaskRecord, stop: threading.Event, moved: threading.Event) -> None:
    """Set `moved` once the launcher has started the task anew with another log file."""
    while not stop.wait(1.0):
        now = _current_record(spec, record.name)
        if now is not None and now.log != record.log:
            moved.set()
            return


def _either(*events: threading.Event) -> threading.Event:
    """An event set as soon as any of `events` is."""
    both = threading.Event()

    def wait() -> None:
        while not any(e.wait(0.2) for e in events):
            pass
        both.set()
    threading.Thread(target=wait, daemon=True).start()
    return both
