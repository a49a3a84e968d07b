"""What the supervisor keeps of one attempt of a run: the first start, each restart of the
cluster, each sync scale. A new attempt starts from a new `Attempt`, so nothing one attempt
saw (a lost task, a worker waiting to start again, the global step) leaks into the next."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping, Sequence

from cluster.runtime.contract import EXIT_PREEMPTED
from launch.backends.base import ENDED, UNKNOWN, Backend, TaskRecord, status_all
from launch.run.disk import Pulses, Refusals
from launch.run.lifecycle import Failure
from launch.run.policy import Progress, TaskState, TaskStatus
from launch.run.state import StepSeen


@dataclass(frozen=True)
class Notice:
    """A task's preemption notice, as its log said it (cluster/runtime/messages.py Preempted):
    when it was seen here, the task's grace, its step then, and the newest checkpoint then."""
    task: str
    at: float
    grace: float
    step: int | None
    saved: int | None


@dataclass
class Attempt:
    """One attempt's view of its tasks and its training; a new attempt makes a new one."""
    failures: list[Failure] = field(default_factory=list)         # every task lost in this attempt
    tolerated: set[str] = field(default_factory=set)              # workers lost and let go
    due: dict[str, float] = field(default_factory=dict)           # tasks to start again, and when (backoff)
    unknown_since: dict[str, float] = field(default_factory=dict)     # tasks whose host cannot be asked, since
    frozen_since: dict[str, float] = field(default_factory=dict)      # tasks seen stopped (SIGSTOP, paused), since
    warned_step: int | None = -1                                  # the step a stall warning was given at
    step: int | None = None                                       # the newest global step seen
    step_at: float = field(default_factory=time.monotonic)        # when `step` last changed (or the attempt began)
    saved: int | None = None                                      # the newest checkpoint the chief logged
    saved_at: float | None = None                                 # ... when it was seen (time.monotonic())
    from_step: int | None = None                                  # the checkpoint this attempt resumed from
    disk: str | None = None                                       # why the disk refuses the tasks' files, while it does
    pulses: Pulses = field(default_factory=Pulses)                # the tasks' pulses, as read so far
    refusals: Refusals = field(default_factory=Refusals)          # tasks lost to a full disk, by their own error
    told_disk: bool = False                                       # a refusal only the tasks could see: said
    failed_seen: set[str] = field(default_factory=set)            # tasks seen ended badly at the last look
    notices: dict[str, Notice] = field(default_factory=dict)      # tasks that got a preemption notice (preemption.py)
    told: set[str] = field(default_factory=set)                   # ... whose notice the run has told and acted on
    done: set[str] = field(default_factory=set)                   # ... whose save is done or whose grace is up
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def saw_step(self, step: int) -> None:
        """A worker logged `step` (from a log follower's thread)."""
        with self._lock:
            if self.step is None or step > self.step:
                self.step, self.step_at = step, time.monotonic()

    def saw_saved(self, step: int) -> None:
        """The chief logged a checkpoint at `step` (from a log follower's thread)."""
        with self._lock:
            self.saved, self.saved_at = step, time.monotonic()

    def saw_notice(self, task: str, grace: float, step: int | None) -> None:
        """A task's log said it got a preemption notice (from a log follower's thread); a task that
        does not know the global step (a ps) is given the newest this attempt saw."""
        with self._lock:
            self.notices[task] = Notice(task, time.monotonic(), grace, self.step if step is None else step, self.saved)

    def notices_now(self) -> list[Notice]:
        with self._lock:
            return list(self.notices.values())

    def forget_notice(self, task: str) -> None:
        """`task` starts again: a notice of its start before is done with."""
        with self._lock:
            self.notices.pop(task, None)
        self.told.discard(task)
        self.done.discard(task)

    def restarted_chief(self) -> None:
        """The chief starts again from a checkpoint: the steps it reports from there are progress,
        even below the newest seen before (the stall clock starts again too)."""
        with self._lock:
            self.step, self.step_at, self.saved = None, time.monotonic(), None

    @property
    def global_step(self) -> int | None:
        """The cluster's global step as far as this attempt knows it: the newest it saw, else the
        checkpoint it resumed from (an attempt that failed while starting still stood there)."""
        with self._lock:
            return self.step if self.step is not None else self.from_step

    def progress(self, total: int) -> Progress:
        with self._lock:
            return Progress(self.step, total, time.monotonic() - self.step_at, self.saved,
                            self.disk or self.refusals.full)

    def progress_record(self, total: int) -> StepSeen | None:
        """The state file's `progress` (the step and when, in epoch seconds), None before a step."""
        with self._lock:
            if self.step is None:
                return None
            return StepSeen(self.step, total, time.time() - (time.monotonic() - self.step_at))

    def observe(self, records: Sequence[TaskRecord], backends: Mapping[str, Backend],
                say: Callable[[str], None]) -> list[TaskStatus]:
        """Every task's state now; a host that cannot be asked makes its tasks UNKNOWN (for how
        long: `since`), a task seen stopped counts how long in `frozen`."""
        out = []
        now = time.monotonic()
        looked = status_all(records, backends)
        for r in records:
            seen = looked[r.name]
            if seen.state == UNKNOWN:
                first = self.unknown_since.setdefault(r.name, now)
                if now - first < 1:
                    say(f'warning: cannot ask about {r.name} ({seen.error}); retrying')
                out.append(TaskStatus(r.name, r.job, r.index, TaskState.UNKNOWN, since=now - first,
                                      movable=seen.movable))
                continue
            if self.unknown_since.pop(r.name, None) is not None:
                say(f'{r.name} can be reached again')
            if seen.state == ENDED:
                state = TaskState.SUCCEEDED if seen.exit_code == 0 else TaskState.FAILED
            else:
                state = TaskState.RUNNING
            frozen = 0.0
            if seen.frozen:
                frozen = now - self.frozen_since.setdefault(r.name, now)
            else:
                self.frozen_since.pop(r.name, None)
            code = seen.exit_code if seen.state == ENDED else None
            out.append(TaskStatus(r.name, r.job, r.index, state, exit_code=code, frozen=frozen,
                                  preempted=state is TaskState.FAILED and (code == EXIT_PREEMPTED or r.name in self.notices)))
        failed = {t.name for t in out if t.state is TaskState.FAILED}
        if self.pulses.due() or failed - self.failed_seen:     # a fault is judged on the disk as it is now
            self.feel(records, backends, say)
        self.failed_seen = failed
        return out

    def feel(self, records: Sequence[TaskRecord], backends: Mapping[str, Backend],
             say: Callable[[str], None]) -> None:
        """The tasks' pulses and the disk under them (launch/run/disk.py): a step their logs could
        not carry is progress all the same, and a disk that refuses their files is kept for the
        policy. A refusal only the tasks can see (their host is another) is said once; one the
        launcher sees itself is said by its own watch of the disk (launch/run/disk.py DiskWatch)."""
        with self._lock:
            quiet = time.monotonic() - self.step_at
        step, self.disk, seen_here = self.pulses.read(records, backends, quiet)
        if step is not None:
            self.saw_step(step)
        if self.disk and not seen_here and not self.told_disk:
            self.told_disk = True
            say(f'warning: {self.disk}; its steps are read from its pulse file meanwhile (a checkpoint fails '
                'while the disk is full: free space there)')
