"""What a task tells its launcher, typed, in one place: each message, its one writer and its one reader.

Both sides import this module (the launcher may import `cluster.runtime`, never the task side's
top layers); who a task is and how it is started and ends (its name, command line, environment's
names, exit codes) is the contract's, cluster/runtime/contract.py.

Every message a task sends its launcher (`Serving`, `Started`, `Progress`, `Checkpoint`,
`Evaluation`) is a small frozen dataclass. Each has one writer, `say`, which logs the message's
human line (the words people read, unchanged) and, where the launcher named the task a channel
(`CHANNEL_ENV`), first appends the message's record there: one line, `RECORD_TAG` and compact
JSON with a `kind` tag (`to_record`/`read` round-trip it). One reader per task, `Reader`, takes
each message once: from its record where the channel has it, else from its human line (a
`train.command` prints its own). The words of a human line are read only here, so no other
module depends on how a line is phrased.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum
from typing import Any, ClassVar, Protocol

from cluster.runtime import runjson

# -- the channel ----------------------------------------------------------------------------------
# Set by a launcher that reads its tasks' channels (the local and the SSH backends): the file
# that the task appends its messages' records to, on its host (`channel_beside` its log:
# logs/attempt-N/worker-0.log -> logs/attempt-N/worker-0.records).
# Tasks started by hand, by Slurm or by compose have none and write none.
CHANNEL_ENV = 'TFCLUSTER_CHANNEL'
CHANNEL_SUFFIX = '.records'


# -- what a task tells its launcher ---------------------------------------------------------------
class Kind(str, Enum):
    SERVING = 'serving'
    STARTED = 'started'
    PROGRESS = 'progress'
    CHECKPOINT = 'checkpoint'
    EVALUATION = 'evaluation'
    PREEMPTED = 'preempted'


class _Logger(Protocol):
    def info(self, msg: str, *args: object) -> None: ...


@dataclass(frozen=True)
class Serving:
    """A server's word that its gRPC port is bound: the launcher's proof that the port it probes
    is this task's, not a stranger's."""
    KIND: ClassVar[Kind] = Kind.SERVING
    task: str
    address: str
    pid: int

    def human(self) -> str:
        return f'{self.task} serving on {self.address} (pid {self.pid})'


@dataclass(frozen=True)
class Started:
    """The word of a task that serves no port of its own that it runs (a coordinator run's chief,
    its program or the command `pid` is, and its evaluator): taken as a server's Serving is."""
    KIND: ClassVar[Kind] = Kind.STARTED
    task: str
    what: str
    pid: int

    def human(self) -> str:
        return f'{self.task} started: {self.what} (pid {self.pid})'


@dataclass(frozen=True)
class Progress:
    """A trainer's progress: global step of total, the loss and images/s as its line shows them
    (None where it shows none), `workers` where part of the pool runs (launch up --workers,
    launch scale), and `rate`, the words after the loss (`  400 images/s`, `  1.5 global steps/s`).
    Made by `progress` on the task's side, so its figures are the ones its line shows."""
    KIND: ClassVar[Kind] = Kind.PROGRESS
    step: int
    total: int
    loss: float | None
    images_per_sec: float | None = None
    workers: int | None = None
    rate: str = ''

    def human(self) -> str:
        loss = '-inf' if self.loss is None else f'{self.loss:.3f}'     # the one loss a line does not read back
        return f'step {self.step}/{self.total}  loss {loss}{self.rate}'

    def facts(self) -> dict:
        """The fields of the launcher's Progress event, as the line said them."""
        out = {'step': self.step, 'total': self.total, 'loss': self.loss, 'images_per_sec': self.images_per_sec}
        if self.workers is not None:
            out['workers'] = self.workers
        return out


def progress(step: int, total: int, loss: float, rate: str = '') -> Progress:
    """The Progress message of a trainer at `step` of `total` with `loss`, `rate` the words after
    the loss: its figures read from its own line, so a record and the line say the same."""
    found = _progress_of(f'step {step}/{total}  loss {loss:.3f}{rate}', rate)
    assert found is not None        # the line has its step
    return found


@dataclass(frozen=True)
class Checkpoint:
    """The chief saved a checkpoint at global step `step`."""
    KIND: ClassVar[Kind] = Kind.CHECKPOINT
    step: int

    def human(self) -> str:
        return f'saved a checkpoint at global step {self.step}'


@dataclass(frozen=True)
class Evaluation:
    """An evaluator's metrics of the checkpoint of global step `step`."""
    KIND: ClassVar[Kind] = Kind.EVALUATION
    step: int
    metrics: dict[str, float]

    def human(self) -> str:
        return f'evaluation at global step {self.step}: ' + ' '.join(
            f'{k}={v:.6g}' for k, v in sorted(self.metrics.items()))


@dataclass(frozen=True)
class Preempted:
    """`task` got a preemption notice (a SIGTERM from outside its launcher) at global step `step`
    (None: not known to it): `grace` seconds to have the checkpoint saved and go."""
    KIND: ClassVar[Kind] = Kind.PREEMPTED
    task: str
    grace: float
    step: int | None = None

    def human(self) -> str:
        at = '' if self.step is None else f' at global step {self.step}'
        return f'{self.task}: preemption notice (SIGTERM from outside the launcher){at}: {self.grace:g}s to save and go'


Message = Serving | Started | Progress | Checkpoint | Evaluation | Preempted
MESSAGES: dict[Kind, type[Message]] = {m.KIND: m for m in (Serving, Started, Progress, Checkpoint, Evaluation,
                                                           Preempted)}


def say(log: _Logger, message: Message, environ: Mapping[str, str] = os.environ) -> None:
    """The one writer: the message's record in the task's channel (where the launcher named one,
    CHANNEL_ENV), then its human line in the task's log, where people read it. The log itself
    carries no record: `launch logs` shows a task's log byte for byte as the file holds it, and
    users read the files (Slurm's, `kubectl logs`) directly. The record goes first, so a launcher
    that reads the line finds its record in the channel already (the Reader's order)."""
    channel = environ.get(CHANNEL_ENV)
    if channel:
        append_record(channel, to_record(as_shown(message)))
    log.info('%s', message.human())


def channel_beside(log_path: str) -> str:
    """The channel of the task whose output goes to `log_path` (a posix path as well: SSH)."""
    stem, ext = os.path.splitext(log_path)
    return (stem if ext == '.log' else log_path) + CHANNEL_SUFFIX


def channel_env(log_path: str) -> dict[str, str]:
    """What a launcher that reads the channel adds to the environment of a task logging to
    `log_path` (absolute, or relative to the task's working directory)."""
    return {CHANNEL_ENV: channel_beside(log_path)}


def append_record(path: str, record: str) -> bool:
    """Append one record line to a channel; whether it could be. One write of an O_APPEND file:
    the records of the task's processes (a `train.command` and its wrapper) never interleave
    within a line. A channel the disk refuses loses the record, never the task: the human line
    still says it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        os.write(fd, (record + '\n').encode('ascii'))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def clear_channel(path: str) -> None:
    """Remove a task's channel as its launcher starts it (again): the channel then holds the
    records of this start alone, and the reader of this start reads it from its beginning, as it
    reads the log from where this start's output begins (a task started again in its attempt
    appends to its log). Robust to a launcher that restarts and resumes the run: its reader too
    begins at byte 0, with no offset to remember. A channel that cannot be removed keeps the
    earlier start's records, which the Reader passes by."""
    try:
        os.unlink(path)
    except OSError:
        pass


def as_shown(message: Message) -> Message:
    """The message with the figures its human line shows (a loss to 3 places, a metric to 6
    figures): the events a launcher writes from a record are the ones it wrote from the line."""
    heard = _from_human(message.human())
    if heard is None or type(heard) is not type(message):
        return message
    return replace(heard, rate=message.rate) if isinstance(message, Progress) and isinstance(heard, Progress) \
        else heard


# -- records: a message as one tagged JSON line ---------------------------------------------------
RECORD_TAG = '@tfcluster '


def to_record(message: Message) -> str:
    """`@tfcluster {"kind": "checkpoint", "step": 40}`: the message as one line of compact JSON."""
    data = {'kind': message.KIND.value, **{k: _finite(v) for k, v in asdict(message).items()}}
    return RECORD_TAG + runjson.dumps(data, separators=(',', ':'), sort_keys=True)


_NOT_FINITE = ('nan', 'inf', '-inf')     # standard JSON has no NaN: a diverged loss goes as its word


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return {k: _finite(v) for k, v in value.items()} if isinstance(value, dict) else value


def _number(value: Any) -> Any:
    if isinstance(value, str) and value in _NOT_FINITE:
        return float(value)
    return {k: _number(v) for k, v in value.items()} if isinstance(value, dict) else value


def _from_record(text: str) -> Message | None:
    try:
        data = {k: _number(v) for k, v in json.loads(text).items()}
        kind = Kind(data.pop('kind'))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    cls = MESSAGES[kind]
    if set(data) != {f.name for f in fields(cls)} or not all(_fits(data[f.name], str(f.type)) for f in fields(cls)):
        return None
    return cls(**data)


def _fits(value: object, annotation: str) -> bool:
    """Whether a record's value is of its field's type (the annotations of the messages above)."""
    if annotation.endswith(' | None'):
        return value is None or _fits(value, annotation[:-len(' | None')])
    if annotation == 'int':
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation == 'float':
        return isinstance(value, (int, float)) and not isinstance(value, bool)    # a word of _NOT_FINITE is read already
    if annotation == 'str':
        return isinstance(value, str)
    if annotation == 'dict[str, float]':
        return isinstance(value, dict) and all(isinstance(k, str) and _fits(v, 'float') for k, v in value.items())
    raise AssertionError(f'a message field of type {annotation} has no check')


# -- the one reader ---------------------------------------------------------------------------------
_SERVING = re.compile(r'(?:^|\s)([A-Za-z_][\w-]*:\d+) serving on (\S+) \(pid (\d+)\)')
_STARTED = re.compile(r'(?:^|\s)([A-Za-z_][\w-]*:\d+) started: (.*) \(pid (\d+)\)\s*$')
_STEP = re.compile(r'\bstep (\d+)/(\d+)\b')
_LOSS = re.compile(r'\bloss (-?[\d.]+|nan|inf)\b')
_RATE = re.compile(r'\b([\d.]+) images/s\b')
_LIVE = re.compile(r'\b(\d+) of \d+ workers\b')
_SAVED = re.compile(r'\bsaved a checkpoint at global step (\d+)\b')
_EVALUATION = re.compile(r'\bevaluation at global step (\d+): (.*)$')
_PREEMPTED = re.compile(r'(?:^|\s)([A-Za-z_][\w-]*:\d+): preemption notice \(SIGTERM from outside the launcher\)'
                        r'(?: at global step (\d+))?: (\d+(?:\.\d+)?(?:e[-+]?\d+)?)s to save and go')
_METRIC = re.compile(r'([A-Za-z_][\w./-]*)=(-?[\d.]+(?:e[-+]?\d+)?|nan|inf|-inf)')


def is_record(line: str) -> bool:
    """Whether a line of a task's log is a message's record: never shown to people (the console,
    `launch logs`, a failure's last lines)."""
    return _record_of(line) is not None


def read(line: str) -> Message | None:
    """The message a line of a task's log carries (a record, or a human line as `say` writes it,
    or as a user's `train.command` prints one itself), else None. Never raises. Reading a whole
    log, use a Reader: it does not take a message twice, from its record and its line."""
    return _record_of(line) or _from_human(line)


Channel = Callable[[], Iterable[str]]      # the record lines a task's channel holds since the last call
PENDING_RECORDS = 256       # records a Reader holds whose lines have not come (yet); older ones go


class Reader:
    """The one reader of a task's messages, fed its log line by line: each line's message, or
    None. A message comes once, at its line, whichever way it came:

    - with a channel (the records a task wrote beside its log): a line that shows a message is
      answered with the first record not yet passed that shows what the line shows (its record:
      written before the line, so read by then), else with the line's own reading (a
      `train.command` prints its own lines, a task of an older tfcluster writes no records). The
      records before the one taken belong to lines that have passed; they go. The channel is
      read only at a line that shows a message, in the thread that reads the log, so the
      messages come in the log's order.
    - a record in the log itself (the logs of runs of the round before): taken, and the human
      lines of its kind are its words from then on and are not read again.

    Reading the same line twice gives the same answer."""

    def __init__(self, channel: Channel | None = None) -> None:
        self._recorded: set[Kind] = set()
        self._channel = channel
        self._pending: deque[Message] = deque(maxlen=PENDING_RECORDS)
        self._last: tuple[str, Message | None] | None = None     # the line read last and its answer

    def read(self, line: str) -> Message | None:
        if self._last is not None and self._last[0] == line:
            return self._last[1]            # asked again (the launcher asks per use): no second look at the channel
        answer = self._answer(line)
        self._last = (line, answer)
        return answer

    def _answer(self, line: str) -> Message | None:
        recorded = _record_of(line)
        if recorded is not None:
            self._recorded.add(recorded.KIND)
            return recorded
        heard = _from_human(line)
        if heard is None or heard.KIND in self._recorded:
            return None
        if self._channel is None:
            return heard
        found = self._take(heard)
        if found is None:
            self._pending.extend(m for m in map(_record_of, self._channel()) if m is not None)
            found = self._take(heard)
        return heard if found is None else found

    def _take(self, heard: Message) -> Message | None:
        """The first pending record that shows what `heard` says; the ones before it go."""
        key = _shown_key(heard)
        for i, record in enumerate(self._pending):
            if _shown_key(record) == key:
                for _ in range(i):
                    self._pending.popleft()
                return record
        return None


def _shown_key(message: Message) -> Message:
    """What a message's line shows of it: a progress line's words after the loss are not read back."""
    return replace(message, rate='') if isinstance(message, Progress) else message


def _record_of(line: str) -> Message | None:
    at = line.find(RECORD_TAG)
    return _from_record(line[at + len(RECORD_TAG):]) if at >= 0 else None


def _from_human(line: str) -> Message | None:
    m = _SERVING.search(line)
    if m:
        return Serving(m.group(1), m.group(2), int(m.group(3)))
    m = _STARTED.search(line)
    if m:
        return Started(m.group(1), m.group(2), int(m.group(3)))
    m = _EVALUATION.search(line)
    if m:
        return Evaluation(int(m.group(1)), {k: float(v) for k, v in _METRIC.findall(m.group(2))})
    m = _SAVED.search(line)
    if m:
        return Checkpoint(int(m.group(1)))
    m = _PREEMPTED.search(line)
    if m:
        return Preempted(m.group(1), float(m.group(3)), None if m.group(2) is None else int(m.group(2)))
    return _progress_of(line)


def _progress_of(line: str, rate: str = '') -> Progress | None:
    """A progress line's figures (a user's `train.command` words its own lines as it likes)."""
    m = _STEP.search(line)
    if m is None:
        return None
    loss, speed, live = _LOSS.search(line), _RATE.search(line), _LIVE.search(line)
    return Progress(int(m.group(1)), int(m.group(2)), float(loss.group(1)) if loss else None,
                    float(speed.group(1)) if speed else None, int(live.group(1)) if live else None, rate)


def says_ready(message: Message | None, task: str) -> bool:
    """Whether a message is `task`'s word that it is up: serving (a server), or started (a chief
    or an evaluator, which serve nothing)."""
    return isinstance(message, (Serving, Started)) and message.task == task
