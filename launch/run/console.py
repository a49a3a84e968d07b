"""The launcher's console: one line per task log line, prefixed with its task, and the
launcher's own lines, written whole from many threads; TensorFlow's C++ start-up chatter left
out unless -v (the log files keep every line)."""
from __future__ import annotations

import re
import sys
import threading
from typing import TextIO


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

    def __init__(self, stream: TextIO | None = None, width: int = 10, verbose: bool = False) -> None:
        self.stream = stream or sys.stdout
        self.width = width
        self.verbose = verbose
        self._lock = threading.Lock()

    def line(self, source: str, text: str) -> None:
        if not self.verbose and is_noise(text):
            return
        with self._lock:
            try:
                self.stream.write(f'{"[" + source + "]":<{self.width}} {text}\n')
                self.stream.flush()
            except (OSError, ValueError):   # the reader went away (`| head`, a closed tee or terminal:
                pass                          # EPIPE, EIO): keep running so the tear-down still happens

    def say(self, text: str) -> None:
        self.line('launch', text)
