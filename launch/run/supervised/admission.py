"""How many of a start's tasks are in flight at once: spawned, and not yet heard serving.

A backend whose tasks share the launcher's CPUs (local: this machine) names a window
(Backend.start_window); a start of more tasks than that spawns the next one only once fewer than
the window are still starting. Why: 1,000 processes spawned at once all wait in one run queue, so
each one's start (spawn to serving) takes as long as the whole start, and a task's start-up
time says nothing about the task (p99 23.9 s at 1,000 rehearsal tasks on 2 cores). With a window
the cores stay busy just the same, the whole start takes what spawning takes, and each task's
start is its own (docs/scale.md).

A task that ends, hangs or never says it serves does not hold the start up: once none of those
in flight has been heard for PATIENCE_SECS, the next is admitted all the same (the start-up's wait,
startup.py, names what did not come up)."""
from __future__ import annotations

import threading
import time

PATIENCE_SECS = 2.0      # no task heard serving this long: the next is admitted anyway
TICK_SECS = 0.02


class Gate:
    """The start of one backend's tasks: `admit` each task's serving flag as it is spawned."""

    def __init__(self, window: int | None, stop: threading.Event, patience: float = PATIENCE_SECS) -> None:
        self.window, self.stop, self.patience = window, stop, patience
        self._starting: list[threading.Event] = []
        self.waited = 0.0       # seconds spent waiting for room (for the start-up's figures)

    def admit(self, serving: threading.Event) -> None:
        """Count this task in flight; return once there is room for the next one (at once with
        no window)."""
        if self.window is None:
            return
        self._starting.append(serving)
        heard = t0 = time.monotonic()
        while not self.stop.is_set():
            still = [flag for flag in self._starting if not flag.is_set()]
            if len(still) < len(self._starting):
                heard = time.monotonic()
            self._starting = still
            if len(still) < self.window or time.monotonic() - heard >= self.patience:
                break
            still[0].wait(TICK_SECS)
        self.waited += time.monotonic() - t0


def window_for(backend_window: int | None, tasks: int) -> int | None:
    """The window of a start of `tasks` on a backend with `backend_window`: none where they all fit in it."""
    return backend_window if backend_window is not None and tasks > backend_window else None
