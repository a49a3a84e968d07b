"""Which of the followed local logs were written since the pump last looked: one inotify watch
per file (Linux), so that following 1,000 logs costs one read of the kernel's queue per poll
instead of 1,000 stats (a third of the launcher's CPU at 1,000 rehearsal tasks, docs/scale.md).

Only files written by processes on this machine are watched (FileTail.written_here): a file
written on another host of a network file system changes without an event here, and is stat-ed
at every poll as before. Where inotify cannot be had (another OS, the kernel's limit of
instances or watches reached), a file is stat-ed at every poll as before, too. The pump also
looks at every file now and then (SWEEP_SECS in pump.py), whatever the events said.

The three calls go to libc through ctypes: the `inotify_simple` package does the same, but
finds libc with ctypes.util.find_library, which runs `ldconfig -p` in a subprocess at its first
use; the C library the interpreter already has loaded (CDLL(None)) needs no search."""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import struct
import sys
from collections import Counter

log = logging.getLogger(__name__)

IN_MODIFY, IN_CLOSE_WRITE, IN_Q_OVERFLOW = 0x2, 0x8, 0x4000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
EVENT = struct.Struct('iIII')       # wd, mask, cookie, len (then len bytes of name)
READ_BYTES = 64 << 10


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith('linux'):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1, libc.inotify_add_watch, libc.inotify_rm_watch     # noqa: B018 (they exist)
    except (OSError, AttributeError):
        return None
    return libc


class Changes:
    """The watched files and the events since the last `changed()`; not thread-safe (the pump's
    thread alone uses it)."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._fd = -1
        if self._libc is not None:
            self._fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if self._fd < 0:        # out of inotify instances: poll
                log.debug('no inotify: %s', os.strerror(ctypes.get_errno()))
        self._wd: dict[str, int] = {}
        self._path: dict[int, str] = {}
        self._users: Counter[int] = Counter()

    @property
    def works(self) -> bool:
        return self._fd >= 0

    def watch(self, path: str) -> bool:
        """Watch `path` for writes; False where it cannot be (no inotify, no such file yet, no
        watch left): then it must be polled."""
        if self._fd < 0 or self._libc is None:
            return False
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), IN_MODIFY | IN_CLOSE_WRITE)
        if wd < 0:
            return False
        self._wd[path], self._path[wd] = wd, path     # a path watched again (a restart's log) has the same wd
        self._users[wd] += 1
        return True

    def unwatch(self, path: str) -> None:
        """One follower of `path` less; its watch goes with the last."""
        wd = self._wd.get(path)
        if wd is None or self._libc is None:
            return
        self._users[wd] -= 1
        if self._users[wd] <= 0:
            del self._users[wd], self._wd[path]
            self._path.pop(wd, None)
            self._libc.inotify_rm_watch(self._fd, wd)      # fails only where the file went (its watch with it)

    def changed(self) -> set[str] | None:
        """The watched paths written since the last call; None when the kernel's queue overflowed
        (then any file may have changed)."""
        out: set[str] = set()
        while self._fd >= 0:
            try:
                data = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise
            at = 0
            while at + EVENT.size <= len(data):
                wd, mask, _, size = EVENT.unpack_from(data, at)
                at += EVENT.size + size
                if mask & IN_Q_OVERFLOW:        # the rest of the queue was lost: read it all anyway
                    self._drain()
                    return None
                path = self._path.get(wd)
                if path is not None:
                    out.add(path)
        return out

    def _drain(self) -> None:
        try:
            while os.read(self._fd, READ_BYTES):
                pass
        except OSError:
            pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
