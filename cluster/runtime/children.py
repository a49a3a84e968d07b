"""The processes a task starts of the user's (`train.command`): they live and die with the task.

A task killed hard (SIGKILL, the OOM killer) runs no handler, so it cannot stop its command: left
alone, the command would train on, holding the task's port, and every restart of the task would
find its port taken. Two guarantees close that, one on each side:

- here, on Linux, the command is started with the parent-death signal set (prctl
  PR_SET_PDEATHSIG): the kernel sends it SIGKILL the moment the task's process ends, however it
  ends (a program that starts processes of its own passes them nothing: see the next point);
- the launcher's side stops the whole process group and session of a task it sees ended (local:
  launch/backends/local/backend.py; SSH: the wrapper in launch/backends/ssh/scripts.py; compose: a
  container's processes all end with its main one).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1    # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up before any fork (the child may only call it), or None off Linux."""
    if not sys.platform.startswith('linux'):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6', use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


def adopt_orphans(on: bool) -> bool:
    """Make this process (or no longer) adopt its descendants' orphans, a child subreaper (Linux):
    the launcher, for the tasks a start-up zygote forks (launch/backends/local/zygote.py). Whether
    that worked."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0


def die_with(parent: int, signum: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A preexec_fn that makes the child get `signum` (SIGKILL) when `parent` (this process) ends, and
    that ends it at once if `parent` ended before the call (the signal would never come). Only
    async-signal-safe work runs in the child: prctl, getppid, _exit."""
    prctl = _prctl()
    if prctl is None:
        return None

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + signum)
    return arm


def start(argv: Sequence[str], env: Mapping[str, str], stdout: int | None = None,
          stderr: int | None = None) -> subprocess.Popen:
    """Start the user's command as a child that cannot outlive this task (in this task's
    process group and session, where the launcher finds it too); its stdout and stderr are this
    task's unless given (cluster/runtime/masking.py pipes them where the spec hides values)."""
    return subprocess.Popen(list(argv), env=dict(env), preexec_fn=die_with(os.getpid()), stdout=stdout, stderr=stderr)
