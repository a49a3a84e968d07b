"""A run's event log, `<train_dir>/events.jsonl`: one JSON object per line, appended by the
launcher (for every backend; under Slurm from what the job's logs say), read by `launch list`,
`launch status`, `launch report` and anyone's scripts.

Every event has `time`, `run`, `attempt` and `event` (its kind), then its kind's fields:
launch/records/event_types.py types them (`EventKind`, one dataclass per kind, `parse_event` for a
line read) and says what each holds; the site's event log reference is made from it.
A reader skips a torn or damaged line (a launcher killed mid-write) with one warning, never a
traceback. Every command reads the log through `typed_events` and run.json through
`typed_run_record`: one reading of a record, whoever reads it (`read_events` gives the raw
objects, for checking the file itself).
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import sys
import threading
import time
from typing import Any, TypeVar
from collections.abc import Callable, Iterator

from cluster.runtime import rundir, runjson
from launch.records.event_types import Event, EventKind, parse_event  # noqa: F401 (re-exported)
from launch.records.result import RunRecord

log = logging.getLogger(__name__)

EVENTS = tuple(kind.value for kind in EventKind)


class EventLog:
    """Appends events of one run; thread-safe (log followers and the supervisor write at once)."""

    def __init__(self, path: str, run: str, attempt: int) -> None:
        self.path, self.run, self.attempt = path, run, attempt
        self._lock = threading.Lock()
        self._lost = 0      # events the disk refused since the last one written
        self.refused: str | None = None     # why the disk refuses the log, while it does (os_cause)

    def emit(self, event: Event) -> dict[str, Any]:
        """Append one event (its time, run and attempt are the log's; its keys in its own order). The log is a record of the run, not the run: a disk that
        refuses it (full, read-only) costs one warning naming the file and the cause, and one more
        saying how many events were lost once it takes them again; never a crash, never half a line."""
        name, fields = event.name, event.payload()
        assert name in EVENTS, name
        record = {'time': rundir.iso_time(time.time()), 'run': self.run, 'attempt': self.attempt, 'event': name,
                  **fields}
        line = runjson.dumps(record, runjson.MAX_TEXT, default=str) + '\n'
        with self._lock:
            try:
                os.makedirs(os.path.dirname(self.path) or '.', exist_ok=True)
                _append_whole(self.path, line.encode('utf-8'))
            except OSError as e:
                if not self._lost:
                    log.warning('cannot write %s: %s; the events of the run are lost until it can',
                                self.path, rundir.os_cause(e))
                self._lost += 1
                self.refused = rundir.os_cause(e)
                return record
            self.refused = None
            if self._lost:
                log.warning('%s: written again; %d event(s) were lost', self.path, self._lost)
                self._lost = 0
        return record


# Room the event log keeps past its end (allocated, the file's size unchanged): the events that
# tell of a full disk, and the run's end, still fit once the disk is full.
RESERVE_BYTES = 64 * 1024
FALLOC_FL_KEEP_SIZE = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith('linux') else None


def _reserve(fd: int, end: int) -> None:
    """Allocate RESERVE_BYTES past `end` without growing the file (Linux fallocate, KEEP_SIZE):
    appends then land in blocks the file holds already. Where it cannot (another OS, a file
    system without it, a disk already full) the log goes on without a reserve."""
    fallocate = getattr(_libc, 'fallocate', None)
    if fallocate is not None:
        fallocate(fd, FALLOC_FL_KEEP_SIZE, ctypes.c_long(end), ctypes.c_long(RESERVE_BYTES))


def _append_whole(path: str, data: bytes) -> None:
    """Append `data` in one write; if the disk takes only part of it, cut the file back, so that
    the log never holds half a line (the next event would be glued to it). The reserve past the
    end is topped up after every write that the disk took."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:         # a short write is the disk filling up: the next one says why
                written = os.write(fd, view)
                if not written:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
                view = view[written:]
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            raise
        _reserve(fd, start + len(data))
    finally:
        os.close(fd)


def read_events(path: str) -> list[dict]:
    """Every event of the file that parses, as the JSON object written (tests and users' scripts
    that check the file itself); a torn, damaged or hostile line is skipped, all of them in one
    warning. The launcher's commands read typed_events instead."""
    return list(iter_events(path))


def iter_events(path: str) -> Iterator[dict]:
    """read_events, one event at a time (the warning comes once the file is read)."""
    return _iter_lines(path, _as_read)


def typed_events(path: str) -> list[Event]:
    """Every event of the file, typed (parse_event): the one reading of the log that every command
    shares, so that `launch list`, `status`, `debug`, `report` and the next `launch up` agree on
    what a hand-edited line says. A line skipped by read_events, or whose attempt is no number,
    is skipped, all of them in one warning."""
    return list(iter_typed_events(path))


def iter_typed_events(path: str) -> Iterator[Event]:
    """typed_events, one event at a time (a run's id is in its first line: no need to read on)."""
    return _iter_lines(path, parse_event)


def typed_run_record(path: str) -> RunRecord:
    """run.json, typed: an empty record where read_run_record gives {}."""
    return RunRecord.from_json(read_run_record(path))


T = TypeVar('T')


def _as_read(event: dict) -> dict:
    return event


def _iter_lines(path: str, parse: Callable[[dict], T]) -> Iterator[T]:
    """`parse` of each line's JSON object with an `event` key. A line longer than
    runjson.MAX_BYTES is read past, never held; one nested deeper than runjson.MAX_DEPTH, or one
    `parse` refuses (ValueError), is damaged: neither takes the reader's memory or stack."""
    try:
        f = open(path, 'rb')
    except FileNotFoundError:
        return
    damaged: list[int] = []
    long: list[int] = []
    with f:
        for number, line in runjson.lines(f):
            if line is None:
                long.append(number)
                continue
            if not line.strip():
                continue
            try:
                event = runjson.loads(line.decode('utf-8', 'replace'))
                parsed = parse(event) if isinstance(event, dict) and 'event' in event else None
            except ValueError:
                parsed = None
            if parsed is None:
                damaged.append(number)
                continue
            yield parsed
    if damaged or long:
        parts = [_lines(damaged, 'damaged'), _lines(long, runjson.OVER)]
        runjson.warn_once(log, f'{path}: skipped {" and ".join(p for p in parts if p)}')


def _lines(numbers: list[int], what: str) -> str:
    """'2 line(s) damaged (line 4, 9)'; '' for none."""
    if not numbers:
        return ''
    shown = ', '.join(map(str, numbers[:5])) + (', ...' if len(numbers) > 5 else '')
    return f'{len(numbers)} line(s) {what} (line {shown})'


def read_run_record(path: str) -> dict:
    """run.json as a dict: {} when it is missing (a run in its first attempt), and when it is
    damaged, too big or nested too deep, after one warning naming it."""
    try:
        with open(path, 'rb') as f:
            data = runjson.read_bytes(f)
    except FileNotFoundError:
        return {}
    except OSError as e:
        runjson.warn_once(log, f'{path}: cannot read it ({e.strerror or e}); skipped')
        return {}
    if data is None:
        runjson.warn_once(log, f'{path}: damaged ({runjson.OVER}); skipped')
        return {}
    try:
        record = runjson.loads(data.decode('utf-8', 'replace'))
    except ValueError as e:
        runjson.warn_once(log, f'{path}: damaged ({e}); skipped')
        return {}
    if not isinstance(record, dict):
        runjson.warn_once(log, f'{path}: damaged (not a JSON object); skipped')
        return {}
    return record
