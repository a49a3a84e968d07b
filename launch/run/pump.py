"""One thread that follows many logs: it polls every followed task's LogTail
(launch/backends/tail.py) every POLL_SECS, or at once when a tail wakes it, and hands each line to
that task's callback in the log's order. Order across tasks was never promised.

Why one thread: a thread per task polling its file 10 times a second was 1,000 threads, 1,000 open
files and about 10,000 wake-ups a second at 1,000 tasks. Here the cost is a stat per local log per
poll; the lines' callbacks (the parsers, the console, a task's channel read at a message line) run
in this thread, as they ran in each task's own before.

The thread exists while something is followed: it ends once the last log is drained."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from launch.backends.tail import LogTail

log = logging.getLogger(__name__)

POLL_SECS = 0.1           # the longest a line waits to be seen (a tail that wakes the pump waits less)
DRAIN_SECS = 5.0          # how long `drain` waits for logs that will not end (a host that hangs)


@dataclass(eq=False)
class _Followed:
    """One followed log: its tail, what to do with each line, and set once drained."""
    name: str
    tail: LogTail
    on_line: Callable[[str], None]
    drained: threading.Event = field(default_factory=threading.Event)


class Pump:
    """Follows logs from one thread; see the module's docstring."""

    def __init__(self, name: str = 'follow') -> None:
        self.name = name
        self._lock = threading.Lock()
        self._followed: dict[str, _Followed] = {}
        self._woken = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Poll now, not at the next tick (a tail has lines, or ended)."""
        self._woken.set()

    def add(self, name: str, tail: LogTail, on_line: Callable[[str], None]) -> None:
        """Follow `tail`, each of its lines to `on_line` (which must not raise: a raise is logged
        and the line dropped), until drain([name]). A name followed already is an error: drain it
        first."""
        tail.wake = self.wake
        with self._lock:
            if name in self._followed:
                raise ValueError(f'{name}: followed already')
            self._followed[name] = _Followed(name, tail, on_line)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f'{self.name}-pump', daemon=True)
                self._thread.start()
        self.wake()

    def following(self) -> list[str]:
        with self._lock:
            return list(self._followed)

    def drain(self, names: Iterable[str], timeout: float = DRAIN_SECS) -> None:
        """Stop following these logs once each is read to its end and its lines handed on (all
        of them closed at once, then waited for together, at most `timeout` seconds in all)."""
        with self._lock:
            entries = [self._followed[n] for n in names if n in self._followed]
        for entry in entries:
            entry.tail.close()
        self.wake()
        deadline = time.monotonic() + timeout
        for entry in entries:
            if not entry.drained.wait(max(0.0, deadline - time.monotonic())):
                log.warning('the log of %s was not read to its end in %.0fs', entry.name, timeout)
        with self._lock:
            for entry in entries:
                if self._followed.get(entry.name) is entry:
                    del self._followed[entry.name]

    def _run(self) -> None:
        while True:
            self._woken.clear()       # before the pass: a wake during it means one more pass
            with self._lock:
                entries = list(self._followed.values())
                if not entries:
                    self._thread = None
                    return
            busy = False
            for entry in entries:
                busy = self._pass(entry) or busy
            if not busy:
                self._woken.wait(POLL_SECS)

    def _pass(self, entry: _Followed) -> bool:
        """Poll one tail and hand its lines on; whether it gave any (more may be waiting)."""
        ended = entry.tail.ended       # before the poll: an end seen then leaves no line behind
        try:
            lines = entry.tail.poll()
        except Exception:       # a tail that cannot be polled: it is done (what it gave was shown)
            log.warning('stopped following the log of %s', entry.name, exc_info=True)
            lines, ended = [], True
        for line in lines:
            try:
                entry.on_line(line)
            except Exception:       # never the end of the pump, nor of the task's other lines
                log.debug('a line of %s was dropped', entry.name, exc_info=True)
        if ended or entry.tail.ended:
            self._finish(entry)
        return bool(lines)

    def _finish(self, entry: _Followed) -> None:
        with self._lock:
            if self._followed.get(entry.name) is entry:
                del self._followed[entry.name]
        entry.drained.set()
