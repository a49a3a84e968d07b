"""Reading a remote log over SFTP: its complete lines from an offset, once or followed.

A followed log keeps its file open, so each poll is one SFTP read (a stat, an open and a close
each poll cost three more round trips on the host's one SFTP client, which every log of the host
shares). It is polled every LOG_FAST_SECS for the first LOG_FAST_FOR seconds, then every
LOG_POLL_SECS: a log followed anew is a task that just started, and the launcher waits for its
first lines (it serves, then its first step) to call a restart done and admit the next task. At
most LOG_FAST_AT_ONCE logs of a host are read fast at a time (pace), so that a start-up of a
hundred tasks on a host does not swamp its one SFTP client: the others start at the usual pace.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import paramiko

from launch.backends.ssh.connections import SSHError

log = logging.getLogger(__name__)

LOG_FAST_SECS = 0.05          # how often a log followed anew is read
LOG_FAST_FOR = 10.0           # ... for this long after its follow began
LOG_POLL_SECS = 0.25          # how often a followed log is read after that
LOG_FAST_AT_ONCE = 8          # logs of one host read fast at a time
LOG_CHUNK = 1 << 20

R = TypeVar('R')
SFTPCall = Callable[[Callable[[paramiko.SFTPClient], R]], R]


def pace() -> threading.BoundedSemaphore:
    """How many more logs of one host may be read fast now (acquire without blocking; release when
    one slows)."""
    return threading.BoundedSemaphore(LOG_FAST_AT_ONCE)


class _Open:
    """A remote file kept open on one SFTP client; opened again on a new client (after an error)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.file: paramiko.SFTPFile | None = None

    def read(self, sftp: paramiko.SFTPClient, offset: int) -> bytes:
        if self.file is None or self.file.sftp is not sftp:
            try:
                self.file = sftp.open(self.path, 'rb')
            except FileNotFoundError:
                return b''       # not written yet: counts as empty
        self.file.seek(offset)
        return self.file.read(LOG_CHUNK)

    def close(self, sftp: paramiko.SFTPClient) -> None:
        if self.file is not None and self.file.sftp is sftp:
            self.file.close()
        self.file = None


def read_lines(call: SFTPCall, path: str, stop: threading.Event | None, offset: int = 0,
               pace: threading.BoundedSemaphore | None = None) -> Iterator[str]:
    """Complete lines of the remote file at `path` from `offset`, read through `call` (the host's
    serialised SFTP client); with `stop`, keep polling until it is set and the file has no more,
    fast at first where the host's `pace` allows."""
    pending = b''
    opened = _Open(path)
    fast = pace if stop is not None and pace is not None and pace.acquire(blocking=False) else None    # while read fast
    fast_until = time.monotonic() + LOG_FAST_FOR
    failing_since = None
    try:
        while True:
            try:
                data = call(functools.partial(opened.read, offset=offset))
                failing_since = None
            except SSHError as e:
                opened.file = None
                # Following: a dropped connection is retried (the poll decides whether the host is
                # lost); reading once: report it.
                if stop is None or stop.is_set():
                    log.error('cannot read %s: %s', path, e)
                    return
                if failing_since is None:
                    failing_since = time.monotonic()
                    log.warning('cannot read %s: %s; retrying', path, e)
                stop.wait(1.0)
                continue
            if data:
                offset += len(data)
                pending += data
                *lines, pending = pending.split(b'\n')
                for line in lines:
                    yield line.decode('utf-8', errors='replace')
                continue
            if stop is None or stop.is_set():
                if pending:
                    yield pending.decode('utf-8', errors='replace')
                return
            if fast is not None and time.monotonic() >= fast_until:
                fast.release()
                fast = None
            stop.wait(LOG_POLL_SECS if fast is None else LOG_FAST_SECS)
    finally:
        if fast is not None:
            fast.release()
        if opened.file is not None:
            try:
                call(opened.close)
            except SSHError:
                pass         # the connection is gone, and the file's handle with it
