"""A task's stack dump on request: every Python thread's stack, appended to the task's stacks file
of the run (rundir.stacks_path) when the task gets rundir.DUMP_SIGNAL (SIGUSR1). The launcher sends
it when the stall watchdog fires and on `launch debug`; anyone can `kill -USR1 PID`.

The standard faulthandler module writes the dump from its C signal handler: it needs neither the
GIL nor the main thread, so a task whose main thread is blocked in TensorFlow's C++ (a sync step
waiting for a lost gradient, a save to a ps that does not answer) still answers. A Python signal
handler would run only once that call returned, perhaps never. For the same reason the file is
opened when the task starts: nothing can be opened safely inside a signal handler. And the signal
gets no Python-level handler: Python's own would write the signal's number to the wakeup fd, which
the chief's GracefulStop reads as "save and stop" (cluster/runtime/session.py).

What this shows of TensorFlow: each thread's Python frames, TensorFlow's Python API included, so a
stuck task reads as `Session.run` -> `_call_tf_sessionrun` under the line of tfcluster (or of the
user's program) that called it. TensorFlow's own C++ threads and the ops of a step in progress are
out of Python's reach (TF1 sessions offer no view of a running step), so nothing more is claimed.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import sys
from typing import TextIO

from cluster.runtime import rundir

log = logging.getLogger(__name__)

_OPEN: list[TextIO] = []     # the file faulthandler writes to: it must stay open while registered


def header(name: str, pid: int, attempt: int | None, when: float) -> str:
    """The line a task starts its stacks file with at each start: what the file is, how to fill it."""
    of = f', attempt {attempt}' if attempt is not None else ''
    return (f'# {name} (pid {pid}{of}) started {rundir.iso_time(when)}: its Python stacks, every thread, '
            f'are appended below on SIG{rundir.DUMP_SIGNAL.name[3:]} (the stall watchdog, `launch debug RUN`, '
            f'or `kill -{rundir.DUMP_SIGNAL.name[3:]} {pid}`)\n')


def install(train_dir: str, job: str, index: int, when: float) -> str | None:
    """Make DUMP_SIGNAL append this process's stacks to its file of the run: under the attempt its
    log belongs to (rundir.log_attempt), else (started without a launcher) straight under stacks/.
    Returns the file's path; None where it cannot be written (a full disk, a read-only train_dir):
    the dumps then go to standard error, the task's log, and one warning says so."""
    attempt = rundir.log_attempt(train_dir, job, index)
    path = rundir.stacks_path(train_dir, attempt, job, index)
    name = rundir.task_name(job, index)
    out: TextIO | None = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        out = open(path, 'a', encoding='utf-8')     # noqa: SIM115 (open for the life of the process)
        out.write(header(name, os.getpid(), attempt, when))
        out.flush()
    except OSError as e:
        if out is not None:
            out.close()
        log.warning('%s: cannot write %s (%s): stack dumps go to this log', name, path, rundir.os_cause(e))
        faulthandler.register(rundir.DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
        return None
    faulthandler.register(rundir.DUMP_SIGNAL, file=out, all_threads=True, chain=False)
    _OPEN[:] = [out]
    return path


def uninstall() -> None:
    """Back to the signal's default action (tests, which install it in their own process)."""
    faulthandler.unregister(rundir.DUMP_SIGNAL)
    for out in _OPEN:
        if out is not sys.stderr:
            out.close()
    _OPEN.clear()
