"""The launcher's user errors: one line on stderr (`launch: error: ...`) and the exit code the
error's class carries, nothing started. Raised by the command bodies, the pre-flight and the
renderers alike, so they live below all of them; launch/cli.py catches the root class only."""
from __future__ import annotations

from typing import ClassVar

from cluster.runtime.rundir import EXIT_FAILED, EXIT_USAGE

EXIT_NO_RUN = 3         # `launch status` of a run that does not exist (like `systemctl status`)


class LaunchError(Exception):
    """A user error or a command that could not do its job: one line, exit code `exit_code`."""
    exit_code: ClassVar[int] = EXIT_USAGE


class UsageError(LaunchError):
    """A user error found before anything starts: one line, exit code 2."""
    exit_code: ClassVar[int] = EXIT_USAGE


class NoSuchRun(LaunchError):
    """`launch status` of a run that does not exist: exit code 3, so scripts can tell it apart."""
    exit_code: ClassVar[int] = EXIT_NO_RUN


class CommandFailed(LaunchError):
    """The command was well formed but could not do its job (a task that would not stop, a
    launcher gone before it carried out a change): one line, exit code 1."""
    exit_code: ClassVar[int] = EXIT_FAILED
