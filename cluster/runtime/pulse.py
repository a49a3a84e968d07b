"""A task's pulse: its newest global step, and whether the disk refuses its log, in a small file
beside its log that it overwrites in place.

Why: the launcher learns that training goes on from the progress lines in the tasks' logs. A log
only grows, so a full disk stops it (mid-line) while the training itself goes on; a supervisor
reading only the log would take a disk for a deadlock and end a run that still trains. The pulse
file is written once at its full size (PULSE_BYTES) when the task starts and afterwards only
overwritten at offset 0: on ext4, xfs and tmpfs that takes no new block, so the pulse still beats
on a full disk. (Copy-on-write file systems, btrfs and ZFS, allocate on every overwrite; there a
full disk silences the pulse too, and the launcher's own check of the disk still names it.)

The file lies beside the task's log: `logs/attempt-N/worker-0.log` -> `logs/attempt-N/worker-0.pulse`.
The task finds its log as its standard output (/proc/self/fd/1, Linux), the launcher from the
task's record: no backend has to pass a path, and every attempt has its own. Only tasks a
launcher started (rundir.LEASE_ENV set) beat; one started by hand writes nothing beside its output.

One JSON object padded with spaces: {"step": 40, "total": 100, "refused": null, "sample": {...}};
`refused` is `cannot write PATH: No space left on device (ENOSPC)` while the disk refuses the
task's log lines; `sample` is the task's newest telemetry (cluster/runtime/telemetry.py), left
out where it would not fit the block beside a long `refused`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import TextIO

from cluster.runtime import rundir, runjson
from cluster.runtime.telemetry import Sample

PULSE_BYTES = 512           # one block of every file system: the whole pulse, written in one pwrite
SUFFIX = '.pulse'


def beside(log_path: str) -> str:
    """The pulse file of the task whose output goes to `log_path` (a posix path as well: SSH)."""
    stem, ext = os.path.splitext(log_path)
    return (stem if ext == '.log' else log_path) + SUFFIX


@dataclass(frozen=True)
class Beat:
    """What a pulse file says."""
    step: int | None            # the newest global step the task reported; None before its first
    total: int | None
    refused: str | None         # why the disk refuses the task's log, while it does
    sample: Sample | None = None    # its newest telemetry


def parse(text: str | None) -> Beat | None:
    """The beat of a pulse file's text; None when there is none or it is not one (half-written,
    or someone else's file): a pulse is a hint, never an error."""
    try:
        data = runjson.loads((text or '').strip() or 'null')
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    refused = data.get('refused')
    return Beat(_whole(data.get('step')), _whole(data.get('total')),
                refused if isinstance(refused, str) and refused else None, Sample.from_json(data.get('sample')))


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Pulse:
    """The pulse of this task (one per process: PULSE). Does nothing until opened; a file that
    cannot be made (the disk was full already) leaves it off, and the task trains as before."""

    def __init__(self) -> None:
        self.path: str | None = None
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._beat = Beat(None, None, None)

    def open(self, path: str) -> bool:
        """Make the file at full size now, while the disk has room; whether it could be."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return False
        try:
            os.pwrite(fd, self._text(self._beat), 0)
            os.fsync(fd)        # the block is the file's now, not a promise a full disk can break
        except OSError:
            os.close(fd)
            return False
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
            self._fd, self.path = fd, path
        return True

    def beat(self, step: int, total: int) -> None:
        """The task reached global `step` of `total`."""
        with self._lock:
            self._write(dataclasses.replace(self._beat, step=step, total=total))

    def refuse(self, why: str | None) -> None:
        """The disk refuses the task's log (`why`), or takes it again (None)."""
        with self._lock:
            if why != self._beat.refused:
                self._write(dataclasses.replace(self._beat, refused=why))

    def sample(self, sample: Sample) -> None:
        """The task's newest telemetry (the Sampler's)."""
        with self._lock:
            self._write(dataclasses.replace(self._beat, sample=sample))

    @property
    def step(self) -> int | None:
        """The newest global step beaten (None before the first): what a preemption notice names."""
        return self._beat.step

    @property
    def refused(self) -> str | None:
        return self._beat.refused

    def _write(self, beat: Beat) -> None:
        """Overwrite the file with `beat` (the lock held)."""
        self._beat = beat
        if self._fd is None:
            return
        try:
            os.pwrite(self._fd, self._text(beat), 0)
        except OSError:     # a copy-on-write file system on a full disk: the launcher checks the disk
            pass

    @staticmethod
    def _text(beat: Beat) -> bytes:
        """The block: the sample left out where it would not fit (a long `refused`), so the
        step and the refusal always come whole."""
        fields = {'step': beat.step, 'total': beat.total, 'refused': beat.refused}
        text = json.dumps({**fields, 'sample': beat.sample.to_json()} if beat.sample else fields, allow_nan=False)
        if len(text.encode('utf-8')) >= PULSE_BYTES:
            text = json.dumps(fields, allow_nan=False)
        return text.encode('utf-8')[:PULSE_BYTES - 1].ljust(PULSE_BYTES - 1) + b'\n'


PULSE = Pulse()


def output_log(fd: int = 1) -> str | None:
    """The file this process's standard output (or `fd`) goes to, if it is a task log (`*.log`):
    where a launcher put it. None for a terminal, a pipe, or where /proc cannot tell."""
    try:
        path = os.readlink(f'/proc/self/fd/{fd}')
    except OSError:
        return None
    return path if path.endswith('.log') and os.path.isabs(path) else None


def start_beating() -> bool:
    """Open this task's pulse beside its log, when a launcher started it (it reads the pulse)."""
    log = output_log()
    return log is not None and bool(os.environ.get(rundir.LEASE_ENV)) and PULSE.open(beside(log))


class LogHandler(logging.StreamHandler):
    """The task's log handler: a line the disk refuses is noted in the pulse (with the log's path
    and the cause), and the note goes once a line is written again. logging's own report of a
    failed line goes to the same refused file, so it says nothing; the pulse is how it is heard."""

    def __init__(self, stream: TextIO | None = None, pulse: Pulse = PULSE) -> None:
        super().__init__(stream if stream is not None else sys.stdout)
        self.pulse = pulse
        self._failed = False

    def emit(self, record: logging.LogRecord) -> None:
        self._failed = False
        super().emit(record)
        if not self._failed and self.pulse.refused:
            self.pulse.refuse(None)

    def handleError(self, record: logging.LogRecord) -> None:
        self._failed = True
        error = sys.exc_info()[1]
        if not (isinstance(error, OSError) and error.errno in rundir.OS_CAUSES):
            super().handleError(record)
            return
        try:
            where = output_log(self.stream.fileno())
        except (AttributeError, OSError, ValueError):       # a stream with no file under it
            where = None
        self.pulse.refuse(f'cannot write {where or "its log"}: {rundir.os_cause(error)}')
