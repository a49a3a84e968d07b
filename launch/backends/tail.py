"""A task's log read a little at a time: what the launcher's one follower thread
(launch/run/pump.py) polls for every task at once, so following N logs costs O(1) threads and
file descriptors, not one thread and one open file per task.

A LogTail gives the complete lines added since its last poll. Once closed, it reads to the end of
what is there (a last line without its newline too) and then says it has ended: what `unfollow`
waits for, so a start's lines are all read before the next start of the task writes.

Two kinds: FileTail, a file on the launcher's machine, stat-ed at each poll and opened only to read
what was added (no fd held between polls); ThreadTail, any generator of lines (a backend's
`read_log(follow=True, stop=...)`) read in a thread of its own, the default of every backend that
has no cheaper way (Backend.log_tail). And follow_file, the generator of a growing file's lines that
a backend's read_log (and `launch logs -f`) reads through."""
from __future__ import annotations

import abc
import codecs
import io
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator

log = logging.getLogger(__name__)

READ_CHUNK = 4 << 20     # bytes one poll reads at most: one chatty log cannot hold the others up
HANDLED_SECS = 5.0       # the longest a ThreadTail waits for its follower to take a line in hand


def _nothing() -> None:
    """No one to wake (a tail not yet handed to a follower)."""


class LogTail(abc.ABC):
    """The lines of one log as they are written, taken by poll(); see the module's docstring."""

    def __init__(self) -> None:
        self.wake: Callable[[], None] = _nothing     # the follower sets it: called when lines are there

    @abc.abstractmethod
    def poll(self) -> list[str]:
        """The complete lines added since the last poll (never blocks for long)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Read no more than what is there: the next polls give the rest, then `ended` is True.
        Returns at once."""

    @property
    @abc.abstractmethod
    def ended(self) -> bool:
        """Closed, and every line given."""


class Lines:
    """Bytes in, complete lines out, as follow_file reads a file: UTF-8 with a bad byte replaced,
    any line ending a newline, a line cut between two chunks kept for the next. `final`: there is
    no more, so the last line without its newline is given too."""

    def __init__(self) -> None:
        self._decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder('utf-8')('replace'), True)
        self._pending = ''

    def feed(self, data: bytes, final: bool = False) -> list[str]:
        text = self._pending + self._decoder.decode(data, final=final)
        *lines, self._pending = text.split('\n')
        if final and self._pending:
            lines.append(self._pending)
            self._pending = ''
        return lines


class FileTail(LogTail):
    """A local file from byte `offset`, as follow_file reads it (UTF-8, a bad byte replaced, any
    line ending a newline) but without holding it open: each poll stats the file and opens it only
    when it grew. A file not there yet counts as empty. `written_here`: its writer runs on this
    machine, so that a write is an inotify event here (the pump then polls it only when one came,
    launch/run/changes.py); not so for a file a host writes on a network file system."""

    def __init__(self, path: str, offset: int = 0, written_here: bool = False) -> None:
        super().__init__()
        self.path, self.offset, self.written_here = path, offset, written_here
        self._lines = Lines()
        self._closing = self._ended = False

    def poll(self) -> list[str]:
        if self._ended:
            return []
        closing = self._closing       # read before the file: a close during this poll waits for the next
        chunks = [self._read()]
        while closing and chunks[-1]:       # closed: all of it, to the end
            chunks.append(self._read())
        lines = self._lines.feed(b''.join(chunks), final=closing)
        self._ended = closing
        return lines

    def _read(self) -> bytes:
        """What was added since the offset (at most READ_CHUNK bytes); b'' where nothing was, or
        the file is not there or cannot be read now (its task may yet write it)."""
        try:
            if os.stat(self.path).st_size <= self.offset:
                return b''
            with open(self.path, 'rb') as f:
                f.seek(self.offset)
                data = f.read(READ_CHUNK)
        except OSError as e:
            if not isinstance(e, FileNotFoundError):
                log.debug('cannot read %s: %s', self.path, e)
            return b''
        self.offset += len(data)
        return data

    def close(self) -> None:
        self._closing = True

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def ended(self) -> bool:
        return self._ended


class ThreadTail(LogTail):
    """`lines(stop)` (a generator that ends once `stop` is set and all is read) read in a thread of
    its own: a backend whose logs are read some other way (over SFTP, from a container) follows
    them as it always did. In step with the follower, as when the follower's own thread drove the
    generator: it is asked for the next line only once the follower has handled this one (polled
    again), so a generator that acts once its line was read (a test's scripted task) still may."""

    def __init__(self, lines: Callable[[threading.Event], Iterable[str]], name: str) -> None:
        super().__init__()
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._lines: list[str] = []
        self._unhandled = 0       # lines read from the generator that no poll after their own has passed
        self._done = False
        self._thread = threading.Thread(target=self._read, args=(lines, name), name=f'follow-{name}', daemon=True)
        self._thread.start()

    def _read(self, lines: Callable[[threading.Event], Iterable[str]], name: str) -> None:
        try:
            for line in lines(self._stop):
                with self._changed:
                    self._lines.append(line)
                    self._unhandled += 1
                self.wake()
                with self._changed:     # a follower that polls no more (given up on) holds it up no longer
                    self._changed.wait_for(lambda: not self._unhandled, timeout=HANDLED_SECS)
        except Exception:       # a log that cannot be read any more: what was read is still shown
            log.warning('stopped following the log of %s', name, exc_info=True)
        finally:
            with self._changed:
                self._done = True
            self.wake()

    def poll(self) -> list[str]:
        with self._changed:
            lines, self._lines = self._lines, []
            self._unhandled = len(lines)        # the ones the last poll gave are handled by now
            self._changed.notify_all()
        return lines

    def close(self) -> None:
        self._stop.set()

    @property
    def ended(self) -> bool:
        with self._changed:
            return self._done and not self._lines


def follow_file(path: str, stop: threading.Event | None, poll: float = 0.1, offset: int = 0) -> Iterator[str]:
    """Yield complete lines of a growing file from byte `offset`; end at EOF once `stop` is set
    (or at once if stop is None). A missing file counts as empty until it appears."""
    pending = ''
    f = None
    try:
        while True:
            if f is None:
                try:
                    f = open(path, encoding='utf-8', errors='replace')
                    if offset:
                        # open()'s buffer seeks; typeshed's _WrappedBuffer does not declare it
                        f.buffer.seek(offset)    # type: ignore[attr-defined]
                except FileNotFoundError:
                    if stop is None or stop.is_set():
                        return
                    time.sleep(poll)
                    continue
            chunk = f.read(65536)
            if chunk:
                pending += chunk
                *lines, pending = pending.split('\n')
                yield from lines
                continue
            if stop is None or stop.is_set():
                if pending:
                    yield pending
                return
            time.sleep(poll)
    finally:
        if f is not None:
            f.close()
