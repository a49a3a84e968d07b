"""Hidden values kept out of every line a task writes and every line the launcher shows.

The spec hides a value (ClusterSpec.hides: a secret-looking name, or a value taken from the
launcher's environment), and both sides know it: the task from its environment, the launcher
from the spec. A user's own code may still print it. So the task passes its Python output
(sys.stdout, sys.stderr: its log lines, a program's print) and a `train.command`'s output through
a Masker before they reach the log file, and the launcher passes every log line it shows or keeps
(console, `launch logs`, a failure's cause) through one too: a line holds `***` where the value was.

Only values of MIN_CHARS characters or more are masked in lines: a shorter one would turn every
`1` or `true` of a log into `***` and is no secret worth the name (it is still never shown where
a value is listed: `launch plan`, the task's environment line). A value that spans lines (a PEM
key) is also masked line by line. Masking works on whole lines; a partial line is held back until
its end comes, or until a pause (HOLD_SECS) or a flush writes it out.
"""
from __future__ import annotations

import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from typing import IO, Any, TextIO

from cluster.runtime import pulse, rundir
from cluster.spec.environ import MASK
from cluster.spec.model import JOBS, ClusterSpec

MIN_CHARS = 4               # a hidden value shorter than this is not masked inside lines
HOLD_SECS = 1.0             # a partial line of a command's output waits at most this long for its end
DRAIN_SECS = 5.0            # at the task's end, how long a command's last output may take to reach the log
_CHUNK = 1 << 16


class Masker:
    """Replaces every occurrence of the hidden values in a line with MASK (longest value first,
    so a value that holds another is masked whole). An empty masker changes nothing."""

    def __init__(self, values: Iterable[str]) -> None:
        pieces = set()
        for value in values:
            pieces.add(value)
            pieces.update(value.splitlines())       # a value over several lines, line by line
        kept = sorted((p for p in pieces if len(p.strip()) >= MIN_CHARS), key=len, reverse=True)
        self._text = re.compile('|'.join(map(re.escape, kept))) if kept else None
        encoded = [p.encode('utf-8', 'surrogateescape') for p in kept]
        self._bytes = re.compile(b'|'.join(map(re.escape, encoded))) if kept else None

    def __bool__(self) -> bool:
        return self._text is not None

    def text(self, line: str) -> str:
        return self._text.sub(MASK, line) if self._text is not None else line

    def data(self, chunk: bytes) -> bytes:
        return self._bytes.sub(MASK.encode(), chunk) if self._bytes is not None else chunk


NO_MASK = Masker(())


def spec_masker(spec: ClusterSpec) -> Masker:
    """The launcher's masker: every value the spec hides, of every job (a value taken from the
    environment is known only where that variable is set: `launch logs` may lack it, and the
    task masked it already)."""
    return Masker(value for job in JOBS for name, value in spec.task_env(job).items() if spec.hides(job, name))


def task_masker(spec: ClusterSpec, job: str, environ: Mapping[str, str]) -> Masker:
    """A task's masker: the values of the names its spec hides, as its environment has them."""
    names = {*spec.task_env(job), *spec.env_from, *spec.job_env_from.get(job, {})}
    return Masker(environ[name] for name in names if spec.hides(job, name) and environ.get(name))


class MaskedStream:
    """A text stream that writes whole lines, each masked, to the stream under it. A write that
    completes a line writes it at once, so the stream's errors (a full disk) reach the writer as
    before; a partial line waits for its end or a flush. Everything else is the stream's own."""

    def __init__(self, stream: TextIO, masker: Masker) -> None:
        self._stream = stream
        self.masker = masker
        self._pending = ''
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            head, newline, tail = (self._pending + text).rpartition('\n')
            if not newline:
                self._pending = tail
                if len(tail) > _CHUNK:      # no line end for a long while: a progress bar, binary noise
                    self._pending = ''
                    self._stream.write(self.masker.text(tail))
                return len(text)
            self._pending = tail
            self._stream.write(self.masker.text(head + newline))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, ''
            if pending:
                self._stream.write(self.masker.text(pending))
        self._stream.flush()

    def write_bytes(self, data: bytes) -> None:
        """Bytes as they are (a command's output, already masked), after what was written as text."""
        self.flush()
        buffer = self._stream.buffer
        buffer.write(data)
        buffer.flush()

    def __getattr__(self, name: str) -> Any:       # fileno, isatty, encoding, buffer, ...
        return getattr(self._stream, name)


def install(masker: Masker) -> bool:
    """Pass this process's sys.stdout and sys.stderr through `masker` (nothing to mask: leave
    them as they are); whether it did."""
    if not masker or isinstance(sys.stdout, MaskedStream):
        return False
    sys.stdout = MaskedStream(sys.stdout, masker)
    sys.stderr = MaskedStream(sys.stderr, masker)
    return True


def active() -> Masker | None:
    """The masker install() put on sys.stdout, or None."""
    stream = sys.stdout
    return stream.masker if isinstance(stream, MaskedStream) else None


_COPIERS: list[OutputCopier] = []


def command_streams() -> dict[str, int]:
    """Popen's stdout and stderr for the user's command: one pipe for both while this task masks
    its output (copy_output then copies it to the log), else none (it writes to the log itself)."""
    return {'stdout': subprocess.PIPE, 'stderr': subprocess.STDOUT} if active() else {}


def copy_output(child: subprocess.Popen) -> None:
    """Copy a child's piped output to this task's masked stdout until it ends (drain waits)."""
    if child.stdout is not None and isinstance(sys.stdout, MaskedStream):
        _COPIERS.append(OutputCopier(child.stdout, sys.stdout))


def drain(timeout: float = DRAIN_SECS) -> None:
    """Wait, at most `timeout` seconds in all, for the copied output of the commands that ended
    (their last lines); a grandchild that holds a pipe open is not waited for longer."""
    deadline = time.monotonic() + timeout
    for copier in _COPIERS:
        copier.join(max(0.0, deadline - time.monotonic()))


class OutputCopier:
    """Copies a child's output (a pipe) to this task's masked stdout, line by line and masked, on
    a thread of its own; a line the disk refuses is noted in the pulse as the task's own would
    be, and dropped, so the child is never blocked by a full disk."""

    def __init__(self, source: IO[bytes], out: MaskedStream) -> None:
        self.source, self.out, self.masker = source, out, out.masker
        self.thread = threading.Thread(target=self._copy, name='output', daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> None:
        """Wait for the child's last line (its end closes the pipe), at most `timeout` seconds: a
        grandchild may hold the pipe open."""
        self.thread.join(timeout)

    def _copy(self) -> None:
        fd = self.source.fileno()
        pending, since = b'', time.monotonic()
        while True:
            ready, _, _ = select.select([fd], [], [], HOLD_SECS)
            if not ready:
                if pending and time.monotonic() - since >= HOLD_SECS:
                    self._write(pending)
                    pending = b''
                continue
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            if not pending:
                since = time.monotonic()
            head, newline, pending = (pending + chunk).rpartition(b'\n')
            if newline:
                self._write(head + newline)
                since = time.monotonic()
            if len(pending) > _CHUNK:
                self._write(pending)
                pending = b''
        if pending:
            self._write(pending)
        self.source.close()

    def _write(self, data: bytes) -> None:
        try:
            self.out.write_bytes(self.masker.data(data))
        except OSError as e:
            if e.errno in rundir.OS_CAUSES:
                pulse.PULSE.refuse(f'cannot write {pulse.output_log() or "its log"}: {rundir.os_cause(e)}')
            else:
                logging.getLogger(__name__).warning('cannot copy the command\'s output: %s', e)
            return
        if pulse.PULSE.refused:
            pulse.PULSE.refuse(None)
