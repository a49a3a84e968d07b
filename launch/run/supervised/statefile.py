"""The state file `launch status` reads while a run goes on (launch-state.json, launch/run/state.py):
written from the supervisor's state when tasks start, at most once a second while it runs (and then
only when what it says changed), and once more at the end of each batch of starts."""
from __future__ import annotations

import os
from collections.abc import Callable

from cluster.spec import ClusterSpec
from launch.backends.procstat import process_ident
from launch.planning.plan import state_path
from launch.run.state import LaunchState, WorkerPool
from launch.run.supervised.state import SupervisorState


class StateFile:
    """One run's state file; a write that fails is said once (unless `disk_full()` already
    named the cause: a full disk has its own watch), and said again only after a write succeeded."""

    def __init__(self, spec: ClusterSpec, say: Callable[[str], None], disk_full: Callable[[], bool]):
        self.spec, self.say, self.disk_full = spec, say, disk_full
        self.launch_state = LaunchState.new(spec.path, process_ident(os.getpid()) or '')
        self._error = False
        self._saved: tuple | None = None                 # the fingerprint as last written

    def save(self, state: SupervisorState, asked: int | None, changed_only: bool = False) -> None:
        """Write the tasks, the newest step, the restarts and the workers (`asked`: the workers a
        scale asked for); `changed_only`: not when it would say what it says."""
        written = self.launch_state
        written.tasks = list(state.records)
        progress = state.attempt.progress_record(self.spec.train.steps)
        if progress is not None:
            written.progress = progress
        written.restarts = state.restarts
        written.workers = WorkerPool(self.spec.num_workers, list(state.members.indices), asked)
        if changed_only and written.fingerprint() == self._saved:
            return
        try:
            written.save(state_path(self.spec))
            self._saved, self._error = written.fingerprint(), False
        except OSError as e:        # a full disk (named by the disk's watch), or a train_dir removed (checked apart)
            if not self._error and not self.disk_full():
                self.say(f'warning: cannot write {state_path(self.spec)}: {e.strerror}')
            self._error = True
