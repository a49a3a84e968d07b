"""A full disk under a run, seen from the launcher: named first, as the cause, with its path, and
never taken for a training that stopped.

A full disk stops the tasks' logs (mid-line), their checkpoints, and the launcher's own events
and state file. The launcher reads the training's progress from the logs, so without more it
sees no new step and declares a stall whose words blame the training (a deadlock) while the
training goes on. Three things keep it honest:

  - the tasks' pulses (cluster/runtime/pulse.py): a small file each trainer overwrites in place,
    which needs no new block, read when the logs have been quiet for a while (Pulses): steps a log
    could not carry are progress all the same, and a task whose log the disk refuses says so;
  - statvfs of the file systems under the tasks' files that the launcher can see (Backend.disk_full)
    and under its own (DiskWatch): one line and one event as soon as one is full, before any
    stall can be declared, and another once it has room again;
  - the policy (launch/run/policy.py) gets the refusal with the progress (Progress.disk): a fault
    while the disk is full is named with it, first, and ends the run rather than restart it;
  - in a coordinator run or a train.command's, the lost task's own last error (Refusals): a
    checkpoint too big for the room left fails with ENOSPC while statvfs still shows room (the
    half-written files go again), and a chief started again would fail at its next checkpoint
    the same way. (The TF1 trainer's own SaveError keeps the repeat rule's one restart.)
"""
from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from cluster.runtime import causes, pulse, rundir
from launch.backends.base import Backend, TaskRecord, tail
from launch.records.event_types import DiskFree, DiskFull, Event
from launch.records.events import EventLog

log = logging.getLogger(__name__)

LOOK_SECS = 1.0         # how often the supervisor looks at the pulses and the disks
QUIET_SECS = 1.0        # the logs quiet this long (no new step) before the pulses are read
TRAINERS = ('worker', 'chief')      # the tasks that beat (a ps has no steps of its own)


def read_pulse(record: TaskRecord, backend: Backend) -> pulse.Beat | None:
    """The task's pulse, beside its log on its host; None if it has none (yet)."""
    return pulse.parse(backend.read_file(record, pulse.beside(record.log)))


def one_per_folder(records: Sequence[TaskRecord]) -> list[TaskRecord]:
    """The first record of each log folder on each host and backend: the disk under a folder is
    looked at once (Backend.disk_full asks the file system of the log's folder), not per task."""
    first: dict[tuple[str, str, str], TaskRecord] = {}
    for r in records:
        first.setdefault((r.backend, r.host, os.path.dirname(r.log)), r)
    return list(first.values())


def seen_full(records: Sequence[TaskRecord], backends: Mapping[str, Backend]) -> str | None:
    """The first full file system under these tasks' logs the launcher sees itself, or None."""
    return next((full for full in (backends[r.backend].disk_full(r) for r in one_per_folder(records)) if full), None)


def refusal(records: Sequence[TaskRecord], backends: Mapping[str, Backend]) -> str | None:
    """Why the disk under these tasks' files refuses them, in one phrase with the path (a full
    file system the launcher sees itself first, else the first trainer whose pulse says its log
    is refused), or None."""
    seen = seen_full(records, backends)
    if seen:
        return seen
    return told([r for r in records if r.job in TRAINERS],
                {r.name: read_pulse(r, backends[r.backend]) for r in records if r.job in TRAINERS})


def told(records: Sequence[TaskRecord], beats: Mapping[str, pulse.Beat | None]) -> str | None:
    """The first of these tasks whose pulse says the disk refuses its log: `worker:0 cannot write
    PATH: No space left on device (ENOSPC)`."""
    for r in records:
        beat = beats.get(r.name)
        if beat is not None and beat.refused:
            return f'{r.name} {beat.refused}'
    return None


class Pulses:
    """The supervisor's reading of its tasks' pulses (from Attempt.observe). The first beat read
    of a task's start is only where it stands (it may be the previous start's, left in the file);
    a later beat with another step is a step the log did not carry."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int, str], int | None] = {}
        self._at = 0.0
        self._told: str | None = None          # the refusal the pulses said at the last reading

    def due(self) -> bool:
        return time.monotonic() - self._at >= LOOK_SECS

    def read(self, records: Sequence[TaskRecord], backends: Mapping[str, Backend],
             quiet: float) -> tuple[int | None, str | None, bool]:
        """(the newest step heard, the disk's refusal or None, whether the launcher saw the disk
        itself); the pulses are read once the logs have been quiet for QUIET_SECS, and while they
        say the disk refuses a log (a step heard in a pulse makes the logs look loud again; the
        refusal holds until a pulse says the log is written again). One trainer's pulse per log
        folder and host (the chief's where it is there): the disk under a folder refuses all its
        logs alike, and each trainer beats the global step (1,000 reads a second at 1,000
        tasks, read each, were a tenth of the launcher's CPU)."""
        self._at = time.monotonic()
        beats: dict[str, pulse.Beat | None] = {}
        newest = None
        if quiet >= QUIET_SECS or self._told is not None:
            trainers = sorted((r for r in records if r.job in TRAINERS), key=lambda r: not (r.job == 'chief' or r.is_chief))
            for r in one_per_folder(trainers):
                beat = beats[r.name] = read_pulse(r, backends[r.backend])
                key = (r.name, r.pid, r.ident)
                step = beat.step if beat is not None else None
                first = key not in self._seen
                if not first and step is not None and step != self._seen[key]:
                    newest = step if newest is None else max(newest, step)
                self._seen[key] = step
        if beats:
            self._told = told(records, beats)
        seen = seen_full(records, backends)
        if seen:
            return newest, seen, True
        return newest, self._told, False


class DiskWatch:
    """The launcher's own files (events, state, run.json; for local and compose tasks also their
    logs and checkpoints, which lie in the same train_dir): one line and one event when the disk
    under them is full or refuses the event log, and one when it has room again."""

    def __init__(self, path: str, say: Callable[[str], None], emit: Callable[[Event], None],
                 events: EventLog | None = None) -> None:
        self.path = os.path.abspath(path)
        self.say, self.emit, self.events = say, emit, events
        self.full: str | None = None        # the cause, while the disk refuses
        self._lock = threading.Lock()       # the watch's thread and the supervisor's may look at once

    def check(self) -> str | None:
        """Look now; the cause while the disk refuses, else None."""
        with self._lock:
            return self._check()

    def _check(self) -> str | None:
        cause, where = rundir.no_room(self.path), self.path
        if cause is None and self.events is not None and self.events.refused:
            cause, where = self.events.refused, self.events.path
        if cause and not self.full:
            self.full = cause
            self.say(f'warning: the disk under {where} is full: {cause}; no log, checkpoint or record of the run '
                     'can be written there, and the next checkpoint fails: free space there')
            self.emit(DiskFull(path=where, cause=cause))
        elif not cause and self.full:
            self.full = None
            self.say(f'the disk under {self.path} has room again')
            self.emit(DiskFree(path=self.path))
        return self.full

    def watch(self, stop: threading.Event) -> None:
        """check() every LOOK_SECS until `stop` (a thread of its own: the lifecycle's)."""
        while True:
            try:
                self.check()
            except Exception:   # a watch is a courtesy: it must never end the run
                log.debug('checking the disk under %s failed', self.path, exc_info=True)
            if stop.wait(LOOK_SECS):
                return


SPACE_CAUSES = (rundir.OS_CAUSES[errno.ENOSPC], rundir.OS_CAUSES[errno.EDQUOT])
_PATH = re.compile(r"/[^\s;:,'\"{}()\[\]]+")
_SAVE_FILE = re.compile(r'_temp|\.tempstate|^part-|^' + re.escape(rundir.CHECKPOINT_PREFIX))


def refused_space(error: str | None, train_dir: str) -> tuple[str, str] | None:
    """(the folder, the cause) when a task's last error says the disk had no room for what it
    wrote: the train_dir if the error names a file under it, else the folder of the first path it
    names (a checkpoint's temporary files left out); None for any other error."""
    cause = rundir.os_cause(error) if error else None
    if error is None or cause is None or not cause.startswith(SPACE_CAUSES):
        return None
    where = os.path.abspath(train_dir)
    paths = _PATH.findall(error)
    if not paths or any(p == where or p.startswith(where + os.sep) for p in paths):
        return where, cause
    path = paths[0]
    while os.path.basename(path) and _SAVE_FILE.search(os.path.basename(path)):
        path = os.path.dirname(path)
    return path or where, cause


class Refusals:
    """A coordinator run's or a train.command's tasks lost with their own error saying the disk
    had no room (read once per start of a task); `full` then says so in Progress.disk's words."""

    def __init__(self) -> None:
        self._read: set[tuple[str, int | None]] = set()
        self.full: str | None = None

    def hear(self, failed: Sequence[TaskRecord], backends: Mapping[str, Backend],
             train_dir: str) -> tuple[str, str, str] | None:
        """(task, folder, cause) the first time one of these failed tasks' last error is a full disk."""
        for r in failed:
            if (r.name, r.pid) in self._read:
                continue
            self._read.add((r.name, r.pid))
            try:
                lines = tail(backends[r.backend].read_log(r, offset=r.log_offset), 200)
            except Exception:   # a log that cannot be read tells nothing here: the fault's own account says so
                continue
            found = refused_space(causes.last_error_line(lines), train_dir)
            if found and self.full is None:
                self.full = f'the disk under {found[0]} is full: {found[1]}'
                return r.name, found[0], found[1]
        return None

    def tell(self, failed: Sequence[TaskRecord], backends: Mapping[str, Backend], train_dir: str,
             say: Callable[[str], None] | None, emit: Callable[[Event], None]) -> None:
        """hear(), and a full disk heard first is one line (`say`: None when the launcher named the
        disk already, from statvfs or a pulse) and one `disk_full` event, as DiskWatch gives."""
        heard = self.hear(failed, backends, train_dir)
        if heard is None or say is None:
            return
        task, path, cause = heard
        say(f'warning: the disk under {path} is full: {cause}, as {task}\'s last error says; no checkpoint fits '
            'there until space is freed')
        emit(DiskFull(path=path, cause=cause))
