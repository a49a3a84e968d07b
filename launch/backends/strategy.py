"""What a backend's way of running a whole `launch up` is to the run's lifecycle: a Strategy, the
Outcome it comes to, and `Life`, what a strategy may use of the lifecycle that runs it.

It lives below launch/run/ so that a backend that hands its tasks to a scheduler (a delegated
one, launch/backends/slurm/) can make its own strategy in its own folder; the lifecycle
(launch/run/lifecycle.py) drives any strategy and re-exports these names."""
from __future__ import annotations

import abc
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from cluster.runtime import messages, rundir
from cluster.runtime.rundir import EXIT_OK
from cluster.spec import ClusterSpec
from launch.backends.tail import LogTail
from launch.records.event_types import Event, EventKind
from launch.records.rehearsal import Rehearsal
from launch.records.result import Failure, MendedFault, RunState

CHECKPOINT_GRACE_SECS = 25.0    # a stopping chief's time to write its checkpoint before the rest stop


@dataclass
class Outcome:
    """What a strategy's run came to; the lifecycle turns it into the RunResult and closing line."""
    exit_code: int
    headline: str = ''                  # done: 'done in 12.3s (sync, 2 workers)'; else empty
    restarts: int = 0
    failures: list[Failure] = field(default_factory=list)
    lost: tuple[str, ...] = ()          # workers the training went on without (their figures left out)
    global_step: int | None = None      # the newest step the launcher knows of (a failed run's run.json keeps it)
    recoveries: list[MendedFault] = field(default_factory=list)     # the faults mended, with their times
    rehearsal: Rehearsal | None = None  # a rehearsal's findings (launch/run/rehearsal.py)
    resume: str | None = None           # interrupted: what a new `launch up` does, where resume_hint's words are not it
    preemptions: int = 0                # preemption notices (none counted among the restarts)

    @property
    def state(self) -> RunState:
        if self.exit_code == EXIT_OK:
            return RunState.DONE
        return RunState.INTERRUPTED if self.exit_code in (128 + signal.SIGINT, 128 + signal.SIGTERM,
                                                          128 + signal.SIGHUP) else RunState.FAILED


class Says(Protocol):
    def say(self, text: str) -> None: ...


class Life(Protocol):
    """What a strategy uses of the lifecycle that runs it (launch/run/lifecycle.py Lifecycle)."""
    attempt: int
    signum: int
    interrupted: threading.Event

    @property
    def console(self) -> Says: ...

    @property
    def signal_name(self) -> str: ...

    def emit(self, event: Event | EventKind | str, **fields: Any) -> None: ...

    def task_started(self, task: str, **where: Any) -> None: ...

    def saw_line(self, task: str, line: str, worker: bool, chief: bool) -> dict | None: ...

    def checkpoint_step(self) -> int | None: ...

    def next_attempt(self, cause: str, from_step: int | None) -> None: ...

    def follow(self, name: str, lines: LogTail | Callable[[threading.Event], Iterable[str]],
               on_line: Callable[[str], None] | None = None, channel: messages.Channel | None = None, group: str = '') -> None: ...

    def unfollow(self, names: Iterable[str]) -> None: ...


L = TypeVar('L', bound=Life)


class Strategy(abc.ABC, Generic[L]):
    """How one backend runs the tasks of a run: the part of `launch up` that differs. `L`: what
    it needs of the lifecycle (the supervised strategy, in launch/run/, takes the Lifecycle itself)."""

    def prepare(self, life: L) -> None:  # noqa: B027 (optional hook: most strategies need none)
        """Everything that can go wrong before anything starts (raise UsageError or SpecError:
        exit 2, and the lifecycle leaves no trace of the run); writes what the tasks need.
        life.run_id and life.attempt are known by then."""

    def stale_files(self) -> list[str]:
        """An earlier run's files in the train_dir that must not pass for this run's."""
        return [rundir.result_path(self.spec.train.train_dir, i) for i in range(self.spec.num_workers)]

    @abc.abstractmethod
    def run(self, life: L) -> Outcome:
        """Start, watch and end the tasks; return only once nothing of them is left running."""

    def hurry(self) -> None:  # noqa: B027 (optional hook)
        """A second Ctrl-C or SIGTERM: end everything now, no checkpoint."""

    @abc.abstractmethod
    def read_file(self, path: str) -> str | None:
        """A small file of the run (relative to the working directory) where the chief wrote it."""

    spec: ClusterSpec


def resume_hint(step: int | None) -> str:
    """What a new `launch up` of a run that stopped here would do."""
    if step is None:
        return 'no checkpoint was written: a new `launch up` starts from step 0'
    return f'a new `launch up` resumes from the checkpoint at global step {step}'
