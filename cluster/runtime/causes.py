"""Why a task failed, in one line, from what it printed: the cause of a TensorFlow error among
its frames, banners and C++ log lines, and the last error of a task's log (what the launcher's
closing line and the fault events name). Both sides use it; nothing here imports TensorFlow."""
from __future__ import annotations

import re

from cluster.runtime.rundir import _LOGGED, _LOGGED_ERROR, _PY_ERROR, OS_CAUSES


_NOT_THE_CAUSE = re.compile(r"Graph execution error:|Detected at node|Node: '|File \"|\[\[\{\{node |"
                            r"From /job:|Additional GRPC error information|\d+ root error|\d+ successful operations|"
                            r"\d+ derived errors|\(\d+\) [A-Z][a-z]+:$|"
                            # several errors at once (tsl's StatusGroup): a banner of '=' around them,
                            # each `CODE: From /job:...:` with its cause on the next line
                            r"={5,}$|[A-Z][A-Z_]+: From /job:\S*:$|"
                            # the C++ log lines TensorFlow appends to a message
                            r"Recent warning and error logs:|[IWEF]\d{4} [\d:.]+ +\d+ \S+\] |"
                            # what TensorFlow appends to every RESOURCE_EXHAUSTED error, a full disk's too
                            r"Hint: If you want to see a list of allocated tensors")
# An error line's exception and its message: `worker:1: UnavailableError: Socket closed`.
_ERROR_MESSAGE = re.compile(r'^(.*?\b[A-Za-z_][\w.]*(?:Error|Exception)):\s*(.*)$')
# A message that only leads in to the cause, which TensorFlow puts on the lines after it.
_LEAD_IN = re.compile(r'(={5,}|Graph execution error:|(?:[A-Z][A-Z_]+: )?From /job:\S*:)?')
_MESSAGE_LINES = 60         # of a traceback's message, after its exception line


def _cause(lines: list[str]) -> str | None:
    """The first line of an error message that says what happened (stripped lines, no blank ones):
    one that names a refusal of the OS (a full disk: TensorFlow calls it RESOURCE_EXHAUSTED, as it
    does memory, and puts the words anywhere among its frames and banners), else the first after
    TensorFlow's preamble."""
    refused = next((line for line in lines if not _NOT_THE_CAUSE.match(line)
                    and any(words in line for words in OS_CAUSES.values())), None)
    if refused:
        return refused
    start = 0
    if lines and lines[0].startswith('Graph execution error'):
        frames = [i for i, line in enumerate(lines) if line.startswith('File "')]
        start = frames[-1] + 2 if frames else 1        # a frame is its File line and its code
    return next((line for line in lines[start:] if not _NOT_THE_CAUSE.match(line)), None)


def cause_line(text: str, default: str = '') -> str:
    """What an OpError says happened, in one line. TensorFlow 2's graph errors start with
    `Graph execution error:` and the Python frames where the op was defined, and put the cause
    after them; errors of several tasks at once come between two banners of '='. The first line
    that is none of those, else the first line that is no banner."""
    lines = [line.strip() for line in (text or '').splitlines() if line.strip()]
    found = _cause(lines)
    if found:
        return found
    return next((line for line in lines if not re.fullmatch(r'={5,}', line)), default)


USAGE_ERROR = 'cluster.task: error: '      # how a task that cannot start prints why (then exits EXIT_USAGE)


def last_error_line(lines: list[str]) -> str | None:
    """The last Python error of a task's output: an exception line of a traceback, an error the
    task logged itself, or the line it refused to start with (USAGE_ERROR: its port taken). TensorFlow's C++ chatter (absl `E1122 ...` lines) is not an explanation,
    nor is a message that is only TensorFlow's preamble or banner (`UnavailableError: ====`):
    then the cause is the rest of the message on the lines after it (a traceback's), else the
    error is named without the empty words."""
    for i in range(len(lines) - 1, -1, -1):
        text = lines[i].strip()
        m = _LOGGED_ERROR.match(text)
        if m:
            return _with_cause(m.group(2), lines[i + 1:])
        if _PY_ERROR.match(text):
            return _with_cause(text, lines[i + 1:])
        if text.startswith(USAGE_ERROR) and len(text) > len(USAGE_ERROR):
            return text[len(USAGE_ERROR):]
    return None


def _with_cause(error: str, after: list[str]) -> str:
    """An error line whose message says nothing (TensorFlow's first line of a longer message)
    with its cause from the message's next lines, those before the task's next log line."""
    m = _ERROR_MESSAGE.match(error)
    if not m or not _LEAD_IN.fullmatch(m.group(2)):
        return error
    rest = []
    for line in after[:_MESSAGE_LINES]:
        if _LOGGED.match(line.strip()):
            break
        if line.strip():
            rest.append(line.strip())
    found = _cause(rest)
    return f'{m.group(1)}: {found}' if found else m.group(1)
