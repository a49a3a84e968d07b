"""A task's SIGTERM: its launcher's stop, or a preemption notice (issue #41).

The rule: a SIGTERM is the launcher's stop when the launcher marked the task first (a file,
rundir.stop_mark_path, or the run-wide rundir.stop_all_path, written before it signals), when the
task stops itself (its lease went stale: STOPPING), when the process that started it is gone (a
Ray actor's death signal, PR_SET_PDEATHSIG: its keeper went, as it does with its launcher), or
when supervise.preemption_grace is 0. Any
other SIGTERM (a node shutting down, a pod deleted, Slurm's --signal, `launch preempt`) is a
preemption notice: the task says so at once (messages.Preempted), its role does what it owes (a
chief saves its checkpoint), and it exits EXIT_PREEMPTED, at the grace's deadline at the latest.

A stop keeps each role's behaviour as it was before notices existed: the role's `on_stop` (the
TF1 chief saves and exits 128+sig; a PSS chief's or evaluator's StopSignal is set; a train.command
gets the signal passed on) or, for a role with none, death by the SIGTERM itself (-15), so the
launcher's words about it stay. SIGINT is always a stop; it goes through here only for a role that
takes it (the TF1 chief); elsewhere it stays Python's KeyboardInterrupt.

Why a thread: the main thread may be blocked in TensorFlow's C++ (a sync step waiting for a lost
worker, a server's join), and Python runs signal handlers only between the main thread's
bytecodes. So the handler does nothing; the signal's number arrives through signal.set_wakeup_fd
at a thread of its own, which decides and acts. A task that inherited SIGTERM ignored (Slurm's ps
ranks, `trap "" TERM`, so that they hold the variables while the chief saves) keeps ignoring it.
A user's program that sets its own SIGTERM handler later replaces only the Python-level one: the
wakeup fd still tells this thread, and the user's handler runs too; one found at install is
chained (called by ours). SIG_DFL or SIG_IGN set by a program, or a wakeup fd of its own, take the
signal from this thread: docs/preemption.md says so.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import NoReturn

from cluster.runtime import messages, rundir
from cluster.runtime.contract import EXIT_PREEMPTED
from cluster.runtime.pulse import PULSE

log = logging.getLogger('cluster.task')

PREEMPT_MARGIN_SECS = 2.0   # a preempted task is gone this long before its grace ends (its exit is seen)

# Set by the task itself before it SIGTERMs itself (cluster/runtime/lease.py: the lease went
# stale): that SIGTERM is a stop, whatever the marks say.
STOPPING = threading.Event()


class Kind(str, Enum):
    """What a signal to the task means."""
    STOP = 'stop'               # the launcher's (or a user's Ctrl-C): as before notices existed
    PREEMPTED = 'preempted'     # a notice from outside the launcher: save, then go


def classify(signum: int, marked: bool, stopping: bool, grace: float) -> Kind:
    """The rule (see the module's docstring), on what the task sees when the signal comes."""
    if signum != signal.SIGTERM or marked or stopping or grace <= 0:
        return Kind.STOP
    return Kind.PREEMPTED


def deadline_secs(grace: float) -> float:
    """How long after a notice the task exits whatever its role is doing: the grace less a margin,
    so the launcher (or the kubelet) sees it go before the grace ends; half a short grace."""
    return grace - PREEMPT_MARGIN_SECS if grace > 2 * PREEMPT_MARGIN_SECS else grace / 2


@dataclass(frozen=True)
class Role:
    """What a role does on a stop (`on_stop(signum)`, None: die of the signal, as before) and on a
    notice (`on_preempted()`, None: keep serving or training until the launcher's marked stop or
    the deadline). `interrupt`: the role takes SIGINT here too (else it stays KeyboardInterrupt)."""
    on_stop: Callable[[int], None] | None = None
    on_preempted: Callable[[], None] | None = None
    interrupt: bool = False


def exit_now(code: int, level: int, message: str) -> NoReturn:
    """Log `message` and end the process with `code`, whatever its threads are doing."""
    log.log(level, message)
    logging.shutdown()
    os._exit(code)


def die_of(signum: int) -> NoReturn:
    """End the process by `signum` itself (its default action), as a task with no handler died
    before notices existed: the launcher reads -15, not an exit code. signal.signal can be called
    from the main thread only, so the default is put back through the C library."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal.restype = ctypes.c_void_p
    libc.signal(signum, None)       # SIG_DFL
    os.kill(os.getpid(), signum)
    threading.Event().wait(5.0)     # the signal ends the process before this returns
    os._exit(128 + signum)


Handler = Callable[[int, types.FrameType | None], object]


def _ignore(signum: int, frame: types.FrameType | None) -> None:
    """The Python-level handler: the work is the notice thread's (the wakeup fd wakes it). A
    handler that was there before `install` (a sitecustomize's, a library's) is called as before."""
    previous = NOTICES.previous.get(signum)
    if previous is not None:
        previous(signum, frame)


class Notices:
    """This process's signal handling (one per process: NOTICES). `install` once, early in the
    task's main; each role then `take`s it with what it does."""

    def __init__(self) -> None:
        self.task, self.grace = '', 0.0
        self.marks: tuple[str, ...] = ()
        self.step: Callable[[], int | None] = lambda: PULSE.step
        self.role = Role()
        self.preempted = threading.Event()
        self.installed = False
        self.parent = os.getppid()
        self.previous: dict[int, Handler] = {}     # Python-level handlers found at install (chained)
        self._lock = threading.Lock()

    def install(self, task: str, train_dir: str, job: str, index: int, grace: float,
                step: Callable[[], int | None] | None = None) -> None:
        """Own SIGTERM (and the wakeup fd) from now on; from the main thread. `grace`: the spec's
        supervise.preemption_grace; the marks are this task's and the run's, under `train_dir`."""
        self.task, self.grace = task, grace
        self.marks = (os.path.abspath(rundir.stop_mark_path(train_dir, job, index)),
                      os.path.abspath(rundir.stop_all_path(train_dir)))
        if step is not None:
            self.step = step
        self.parent = os.getppid()
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        self._own(signal.SIGTERM)
        self.installed = True
        threading.Thread(target=self._wait, args=(read,), name='notice', daemon=True).start()

    def take(self, role: Role) -> None:
        """Make `role` this task's (from the main thread). A notice that came before (during the
        import, the restore) is acted on now. Outside a task (a test, a program run by hand)
        with nothing installed: installed with no grace, so every SIGTERM is a stop, as before."""
        if not self.installed:
            self.install(self.task or 'task', '.', 'task', 0, 0.0)
        if role.interrupt:
            signal.signal(signal.SIGINT, _ignore)
        with self._lock:
            self.role = role
            pending = self.preempted.is_set()
        if pending and role.on_preempted is not None:
            role.on_preempted()

    def _own(self, signum: int) -> None:
        """Take `signum` at the Python level (the wakeup fd does the rest), keeping a callable
        handler found there to call on; an ignored SIGTERM stays ignored (a Slurm ps rank's)."""
        found = signal.getsignal(signum)
        if found == signal.SIG_IGN:
            return
        if callable(found) and found is not _ignore:
            self.previous[signum] = found
        signal.signal(signum, _ignore)

    def marked(self) -> bool:
        """Whether the launcher marked this task (or the whole run) for its stop."""
        return any(os.path.exists(m) for m in self.marks)

    def stopping(self) -> bool:
        """Whether the task stops itself (STOPPING), or the process that started it is gone: a
        death signal (PR_SET_PDEATHSIG, the Ray actor's) comes once the task has a new parent."""
        return STOPPING.is_set() or os.getppid() != self.parent

    def _wait(self, read: int) -> None:
        while True:
            for signum in os.read(read, 64):
                self.handle(signum)

    def handle(self, signum: int) -> None:
        """One signal, in the notice thread (a test calls it directly)."""
        if signum not in (signal.SIGTERM, signal.SIGINT):
            return
        with self._lock:
            role = self.role
        if signum == signal.SIGINT and not role.interrupt:
            return      # Python's KeyboardInterrupt in the main thread, as before
        if self.preempted.is_set():
            if signum == signal.SIGTERM and not (self.marked() or self.stopping()):
                log.info('%s: another preemption notice; already on the way out', self.task)
                return
            exit_now(EXIT_PREEMPTED, logging.INFO, f'{self.task}: stopped after the preemption notice')
        if classify(signum, self.marked(), self.stopping(), self.grace) is Kind.STOP:
            if role.on_stop is None:
                die_of(signum)
            role.on_stop(signum)
            return
        self.preempted.set()
        messages.say(log, messages.Preempted(self.task, self.grace, self.step()))
        deadline = threading.Timer(deadline_secs(self.grace), exit_now, (
            EXIT_PREEMPTED, logging.WARNING, f'{self.task}: the preemption grace is ending; exiting'))
        deadline.daemon = True
        deadline.start()
        if role.on_preempted is not None:       # its own thread: a marked stop must still be heard
            threading.Thread(target=role.on_preempted, name='preempted', daemon=True).start()


NOTICES = Notices()


def install(task: str, train_dir: str, job: str, index: int, grace: float,
            step: Callable[[], int | None] | None = None) -> None:
    """NOTICES.install: what a task's main calls once, early (before the TensorFlow import)."""
    NOTICES.install(task, train_dir, job, index, grace, step)
