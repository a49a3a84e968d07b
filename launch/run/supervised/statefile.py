"""The state file `launch status` reads while a run goes on (launch-state.json, launch/run/state.py):
written from the supervisor's state when tasks start, at most once a second while it runs (and then
only when what it says changed), and once more at the end of each batch of starts. A change of the
newest step alone is written at most every PROGRESS_SECS per TASKS_PER_PROGRESS_SEC tasks: the
whole file goes each time, and at 1,000 tasks a write a second was an eighth of the launcher's CPU."""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from cluster.spec import ClusterSpec
from launch.backends.procstat import process_ident
from launch.planning.plan import state_path
from launch.run.state import LaunchState, WorkerPool
from launch.run.supervised.state import SupervisorState

PROGRESS_SECS = 1.0             # the newest step alone: written at most this often per ...
TASKS_PER_PROGRESS_SEC = 100    # ... this many tasks (a 1,000-task run's step is up to 10 s old in the file)


class StateFile:
    """One run's state file; a write that fails is said once (unless `disk_full()` already
    named the cause: a full disk has its own watch), and said again only after a write succeeded."""

    def __init__(self, spec: ClusterSpec, say: Callable[[str], None], disk_full: Callable[[], bool]):
        self.spec, self.say, self.disk_full = spec, say, disk_full
        self.launch_state = LaunchState.new(spec.path, process_ident(os.getpid()) or '')
        self._error = False
        self._saved: tuple | None = None                 # the fingerprint as last written
        self._saved_at = 0.0

    def save(self, state: SupervisorState, asked: int | None, changed_only: bool = False) -> None:
        """Write the tasks, the newest step, the restarts and the workers (`asked`: the workers a
        scale asked for); `changed_only`: not when it would say what it says."""
        written = self.launch_state
        written.tasks = list(state.records)
        progress = state.attempt.progress_record(self.spec.train.steps)
        if progress is not None:
            written.progress = progress
        written.restarts = state.restarts
        written.preemptions = state.preemptions
        written.standbys = [{'host': h, 'pid': p, 'state': s} for views in list(state.standbys.values())
                            for h, p, s in views]
        written.workers = WorkerPool(self.spec.num_workers, list(state.members.indices), asked)
        fingerprint = written.fingerprint()
        if changed_only and self._same(fingerprint, len(written.tasks)):
            return
        try:
            written.save(state_path(self.spec))
            self._saved, self._saved_at, self._error = fingerprint, time.monotonic(), False
        except OSError as e:        # a full disk (named by the disk's watch), or a train_dir removed (checked apart)
            if not self._error and not self.disk_full():
                self.say(f'warning: cannot write {state_path(self.spec)}: {e.strerror}')
            self._error = True

    def _same(self, now: tuple, tasks: int) -> bool:
        """Whether the file needs no write: it says this already, or all but a newer step, written
        less than the step's pace for this many tasks ago."""
        if now == self._saved:
            return True
        progress_only = self._saved is not None and now[:1] + now[2:] == self._saved[:1] + self._saved[2:]
        pace = PROGRESS_SECS * max(1.0, tasks / TASKS_PER_PROGRESS_SEC)
        return progress_only and time.monotonic() - self._saved_at < pace
