"""One thread that follows many logs: it polls every followed task's LogTail
(launch/backends/tail.py) every POLL_SECS, or at once when a tail wakes it, and hands each line to
that task's callback in the log's order. Order across tasks was never promised.

Why one thread: a thread per task polling its file 10 times a second was 1,000 threads, 1,000 open
files and about 10,000 wake-ups a second at 1,000 tasks. Here a local log written on this machine
is read only when inotify said it was written (launch/run/changes.py), and every log is looked at
once per SWEEP_SECS whatever the events said; any other log is stat-ed at each poll. The lines'
callbacks (the parsers, the console, a task's channel read at a message line) run in this thread,
as they ran in each task's own before.

The thread exists while something is followed: it ends once the last log is drained."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from launch.backends.tail import FileTail, LogTail
from launch.run.changes import Changes

log = logging.getLogger(__name__)

POLL_SECS = 0.1           # the longest a line waits to be seen (a tail that wakes the pump waits less)
SWEEP_SECS = 2.0          # every log is polled at least this often, whatever inotify said
DRAIN_SECS = 5.0          # how long `drain` waits for logs that will not end (a host that hangs)


@dataclass(eq=False)
class _Followed:
    """One followed log: its tail, what to do with each line, and set once drained."""
    name: str
    tail: LogTail
    on_line: Callable[[str], None]
    drained: threading.Event = field(default_factory=threading.Event)
    watched: str = ''       # the pump's thread alone: the path of its file where inotify watches it


class _Polls:
    """The pump thread's own book of what to poll: every log at a sweep; else each unwatched or
    closing log, each that gave lines at its last poll (it may have more), and each watched file
    inotify says was written. A tick costs O(those), not O(followed)."""

    def __init__(self) -> None:
        self.changes = Changes()
        self.known: dict[int, _Followed] = {}
        self.every_tick: dict[int, _Followed] = {}
        self.by_path: dict[str, dict[int, _Followed]] = {}

    def take(self, entries: list[_Followed]) -> None:
        """The followed logs are now `entries`: watch the new ones, forget the gone."""
        now = {id(e): e for e in entries}
        for key in [k for k in self.known if k not in now]:
            self.forget(self.known[key])
        for key, entry in now.items():
            if key not in self.known:
                self.known[key] = self.every_tick[key] = entry        # a new log: polled at once
                tail = entry.tail
                if isinstance(tail, FileTail) and tail.written_here and self.changes.watch(tail.path):
                    entry.watched = tail.path
                    self.by_path.setdefault(tail.path, {})[key] = entry

    def forget(self, entry: _Followed) -> None:
        key = id(entry)
        if self.known.pop(key, None) is None:
            return
        self.every_tick.pop(key, None)
        if entry.watched:
            self.by_path.get(entry.watched, {}).pop(key, None)
            if not self.by_path.get(entry.watched):
                self.by_path.pop(entry.watched, None)
            self.changes.unwatch(entry.watched)

    def due(self, sweep: bool) -> list[_Followed]:
        """The logs to poll now (`sweep`: all of them)."""
        changed = self.changes.changed()
        if sweep or changed is None:
            return list(self.known.values())
        due = dict(self.every_tick)
        for path in changed:
            due.update(self.by_path.get(path, {}))
        return list(due.values())

    def closing(self, entries: list[_Followed]) -> None:
        """These logs were closed (drain): polled at every tick until read to their end."""
        self.every_tick.update((id(e), e) for e in entries if id(e) in self.known)

    def polled(self, entry: _Followed, gave: bool) -> None:
        """After a poll: a watched log that gave nothing waits for inotify (a closed one has
        ended: a FileTail's closing poll reads to the end); any other is polled again next tick."""
        key = id(entry)
        if entry.drained.is_set():
            self.forget(entry)
        elif not entry.watched or gave:
            self.every_tick[key] = entry
        else:
            self.every_tick.pop(key, None)


class Pump:
    """Follows logs from one thread; see the module's docstring."""

    def __init__(self, name: str = 'follow') -> None:
        self.name = name
        self._lock = threading.Lock()
        self._followed: dict[str, _Followed] = {}
        self._woken = threading.Event()
        self._thread: threading.Thread | None = None
        self._membership = 0            # bumped as logs are added, closed or dropped: the thread looks again
        self._closing: list[_Followed] = []     # closed by drain: polled at every tick until ended

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
            self._membership += 1
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
            for entry in entries:       # closed before the thread can take them as closing
                entry.tail.close()
            self._closing.extend(entries)
            self._membership += 1
        self.wake()
        deadline = time.monotonic() + timeout
        for entry in entries:
            if not entry.drained.wait(max(0.0, deadline - time.monotonic())):
                log.warning('the log of %s was not read to its end in %.0fs', entry.name, timeout)
        with self._lock:
            for entry in entries:
                if self._followed.get(entry.name) is entry:
                    del self._followed[entry.name]
                    self._membership += 1

    def _run(self) -> None:
        polls, seen = _Polls(), -1
        swept = time.monotonic()
        try:
            while True:
                self._woken.clear()       # before the pass: a wake during it means one more pass
                with self._lock:
                    if not self._followed:
                        self._thread = None
                        return
                    if seen != self._membership:
                        seen, entries, closing = self._membership, list(self._followed.values()), self._closing
                        self._closing = []
                        polls.take(entries)
                        polls.closing(closing)
                sweep = time.monotonic() - swept >= SWEEP_SECS
                if sweep:
                    swept = time.monotonic()
                busy = False
                for entry in polls.due(sweep):
                    gave = self._pass(entry)
                    polls.polled(entry, gave)
                    busy = gave or busy
                if not busy:
                    self._woken.wait(POLL_SECS)
        finally:
            polls.changes.close()

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
