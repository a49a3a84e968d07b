"""The two ways the launcher deals with the operating system's time: running a short command
(`run`) and waiting for a condition with a deadline (`poll_until`). Every backend and the run
layer go through these, so a command always has a timeout, no terminal input and a session of its
own (a Ctrl-C at the terminal is the launcher's to handle, not its helpers'), and no wait sleeps a
fixed time instead of asking again."""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence


class CommandError(Exception):
    """A command that could not be started (`missing`: no such program) or did not end in time."""

    def __init__(self, argv: Sequence[str], cause: str, *, missing: bool = False, timeout: float | None = None) -> None:
        super().__init__(f'{argv[0]}: {cause}')
        self.argv, self.cause, self.missing, self.timeout = list(argv), cause, missing, timeout


def run(argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
        capture: bool = True, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run a command to its end with no input, in a session of its own; its output as text."""
    try:
        return subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=capture, text=True,
                              timeout=timeout, env=dict(env) if env is not None else None, cwd=cwd,
                              start_new_session=True)
    except subprocess.TimeoutExpired as e:
        raise CommandError(argv, str(e), timeout=timeout) from None
    except FileNotFoundError as e:
        raise CommandError(argv, e.strerror or str(e), missing=True) from None
    except OSError as e:
        raise CommandError(argv, e.strerror or str(e)) from None


def poll_until(predicate: Callable[[], object], deadline: float, poll: float = 0.05) -> bool:
    """Ask `predicate` every `poll` seconds until it is true or the monotonic `deadline` passes;
    whether it was true at the last asking."""
    while not predicate():
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(poll)
    return True
