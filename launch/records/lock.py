"""One launcher per train_dir: the lock every launcher takes, and that `launch list` and `launch
status` probe to tell a running run from an ended one."""
from __future__ import annotations

import fcntl
import os
import time

from cluster.runtime.rundir import lock_path
from launch.system import poll_until


class LockBusy(Exception):
    """Another launcher holds the train_dir: the message says which."""


class TrainDirLock:
    """One launcher per train_dir: an exclusive flock on `<train_dir>/launch.lock`, held for the
    launcher's life (the kernel drops it when the process ends, however it ends). The file says
    who holds it, for the launcher that is refused."""

    def __init__(self, train_dir: str, name: str | None = None) -> None:
        """`name`: another lock file of the train_dir (`launch scale` takes scale.lock)."""
        self.path = os.path.join(train_dir, name) if name else lock_path(train_dir)
        self._fd: int | None = None

    def acquire(self, holder: str) -> None:
        """Take the lock or raise LockBusy naming the holder. `holder` says who we are."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if not self._take(fd):
                text = self._holder(fd)
                os.close(fd)
                raise LockBusy(text) from None
            try:    # the file we locked must still be the one at the path (a cleanup may unlink it)
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f'{holder}\n'.encode(), 0)
        self._fd = fd

    @staticmethod
    def held(train_dir: str) -> str | None:
        """Who holds the train_dir's lock (the holder's text, or 'another launcher'), or None when
        no live launcher does. The lock, not a state file or run.json, tells a running run from a
        dead one: the kernel drops it with its process, however that ends. A shared lock, taken
        and dropped at once, only probes; the file is never created (a read-only directory of an
        old run stays untouched), and one that cannot be opened counts as not held."""
        try:
            fd = os.open(lock_path(train_dir), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return TrainDirLock._holder(fd, wait=0.2)
            except OSError:
                return None
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    @staticmethod
    def _take(fd: int, wait: float = 0.1) -> bool:
        """The exclusive lock, retried briefly: `launch list` and `launch status` probe it with a
        shared lock for a moment (`held`), which must not refuse a launcher."""
        def locked() -> bool:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
        return poll_until(locked, time.monotonic() + wait, poll=0.005)

    @staticmethod
    def _holder(fd: int, wait: float = 2.0) -> str:
        """Who holds the lock, as the holder wrote it. The holder writes its name just after it
        takes the lock, so a launcher refused in between finds the file still empty: it waits
        for the name (briefly) rather than report 'another launcher'."""
        text = ''

        def named() -> bool:
            nonlocal text
            text = os.pread(fd, 4096, 0).decode('utf-8', 'replace').strip()
            return bool(text)
        poll_until(named, time.monotonic() + wait, poll=0.01)
        return text or 'another launcher'

    def release(self, remove: bool = False) -> None:
        if self._fd is None:
            return
        if remove:      # only while holding it, so no one can have it
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        else:
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None


def in_use(spec_path: str, train_dir: str, holder: str) -> str:
    """The line `launch up` and `launch check` refuse a train_dir another live launcher holds with."""
    return (f'{spec_path}: train_dir {train_dir} is in use by {holder}; one launcher per train_dir '
            f'(`launch status {spec_path}` shows that run)')
