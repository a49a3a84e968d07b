"""The launcher's console: one line per task log line, prefixed with its task, and the
launcher's own lines, written whole from many threads; TensorFlow's C++ start-up chatter left
out unless -v (the log files keep every line). A run of more than QUIET_ABOVE tasks is told
in fewer lines: while its tasks start, one 'serving 412/1000' line a second stands for their
serving lines, and only the chief's progress lines are shown unless -v (1,000 workers say
100 a second)."""
from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from cluster.runtime import messages

QUIET_ABOVE = 50            # tasks: a larger run's start and progress are told in fewer lines
SERVING_EVERY = 1.0         # seconds between two 'serving N/M' lines while its tasks start


# TensorFlow's C++ start-up chatter, which TF_CPP_MIN_LOG_LEVEL does not reach (it is printed
# before absl logging is initialised). Hidden from the console only: log files keep every line.
_NOISE = re.compile(
    r'^[IW]\d{4} [\d:.]+ +\d+ \S+\] '                      # absl INFO and WARNING lines
    r'|^WARNING: All log messages before absl::InitializeLog'
    r'|^E\d{4} .*(failed call to cuInit|oneDNN supports DT_UINT8 only)')


# Every line a TensorFlow server logs through absl or its C++ logging (INFO to FATAL): start-up
# chatter that explains nothing about why a task ended.
_CHATTER = re.compile(r'^[IWEF]\d{4} [\d:.]+ +\d+ \S+\] |^\d{4}-\d\d-\d\d [\d:.]+: [IWEF] \S+\] '
                      r'|^WARNING: All log messages before absl::InitializeLog')


def is_chatter(line: str) -> bool:
    return bool(_CHATTER.match(line.strip()))


def is_noise(line: str) -> bool:
    """A line the console leaves out unless -v (the log files keep it)."""
    return bool(_NOISE.match(line))


class Console:
    """Serialises output lines from many threads, each with its source as a prefix."""

    def __init__(self, stream: TextIO | None = None, width: int = 10, verbose: bool = False, tasks: int = 0,
                 chief: str = '', clock: Callable[[], float] = time.monotonic) -> None:
        """`tasks`: how many the run starts (above QUIET_ABOVE its start and progress are told
        in fewer lines); `chief`: the task whose progress lines are always shown."""
        self.stream = stream or sys.stdout
        self.width = width
        self.verbose = verbose
        self._lock = threading.Lock()
        self.chief = chief
        self._start = _StartCount(tasks, clock) if tasks > QUIET_ABOVE else None

    def starting(self) -> None:
        """Every task starts again (the cluster's restart): count their serving lines again."""
        if self._start is not None:
            with self._lock:
                self._start.reset()

    def line(self, source: str, text: str) -> None:
        if not self.verbose and is_noise(text):
            return
        if self._start is not None and source != 'launch':
            shown = self._folded(source, text)
            if shown is None:
                return
            source, text = shown
        self._write(source, text)

    def _folded(self, source: str, text: str) -> tuple[str, str] | None:
        """A large run's task line as shown: a serving line while the tasks start counts toward
        the next 'serving N/M' line (None: nothing shown now); a progress line of a task other
        than the chief is not shown unless -v."""
        said = messages.read(text)
        if messages.says_ready(said, source):
            assert self._start is not None
            with self._lock:
                counted = self._start.saw(source)
            if counted is None:
                return source, text
            return ('launch', counted) if counted else None
        if isinstance(said, messages.Progress) and source != self.chief and not self.verbose:
            return None
        return source, text

    def _write(self, source: str, text: str) -> None:
        with self._lock:
            try:
                self.stream.write(f'{"[" + source + "]":<{self.width}} {text}\n')
                self.stream.flush()
            except (OSError, ValueError):   # the reader went away (`| head`, a closed tee or terminal:
                pass                          # EPIPE, EIO): keep running so the tear-down still happens

    def say(self, text: str) -> None:
        self.line('launch', text)


class _StartCount:
    """The tasks seen serving while a large run starts: 'serving 412/1000' at most once every
    SERVING_EVERY seconds, and once all serve. Once all have served, a task's serving line (its
    restart) is shown as it is."""

    def __init__(self, tasks: int, clock: Callable[[], float]) -> None:
        self.tasks, self.clock = tasks, clock
        self.reset()

    def reset(self) -> None:
        self.served: set[str] = set()
        self.said = -SERVING_EVERY        # when the last line was said (clock seconds)
        self.done = False

    def saw(self, task: str) -> str | None:
        """The line to show now ('' for none) for `task`'s serving line; None once the start is
        over (the line itself is shown)."""
        if self.done:
            return None
        self.served.add(task)
        now = self.clock()
        self.done = len(self.served) >= self.tasks
        if not self.done and now - self.said < SERVING_EVERY:
            return ''
        self.said = now
        return f'serving {len(self.served)}/{self.tasks}'
