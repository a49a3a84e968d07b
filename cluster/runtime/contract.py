"""The contract between a task and its launcher: what one says and the other reads, typed, in one place.

Both sides import this module (the launcher may import `cluster.runtime`, never the task side's
top layers), so a change to a name, a flag or a message is made here and both follow:

- `TaskName(job, index)`: a task's name in logs, events and messages (`worker:3`), parsed once;
- the task's command line: `task_argv` builds what the launcher runs, `parse_task_argv` is the
  parser `python -m cluster.task` runs; `--place NAME` picks where the task learns its place
  (cluster/env/: `tf_config`, `slurm`, `jobset`), `--slurm`/`--jobset` still mean what they meant;
- the environment's names and the exit codes both sides use;
- every message a task sends its launcher (`Serving`, `Started`, `Progress`, `Checkpoint`,
  `Evaluation`) as a small frozen dataclass. Each has one writer, `say`, which logs the message's
  human line (the words people read, unchanged) and, where the launcher named the task a channel
  (`CHANNEL_ENV`), first appends the message's record there: one line, `RECORD_TAG` and compact
  JSON with a `kind` tag (`to_record`/`read` round-trip it). One reader per task, `Reader`, takes
  each message once: from its record where the channel has it, else from its human line (a
  `train.command` prints its own). The words of a human line are read only here, so no other
  module depends on how a line is phrased.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum
from typing import Any, ClassVar, Protocol

from cluster.env import places
from cluster.env.slurm import DEFAULT_PORT_BASE
from cluster.runtime import runjson
from cluster.spec import DEFAULT_SPEC, JOBS, TF_CONFIG_ENV
from cluster.spec.load import take_overrides

# -- names ----------------------------------------------------------------------------------------
_TASK_NAME = re.compile(r'([A-Za-z_][\w-]*):([0-9]+)')


@dataclass(frozen=True, order=True)
class TaskName:
    """A task's name: its job and its index in that job (`worker:3`)."""
    job: str
    index: int

    def __str__(self) -> str:
        return f'{self.job}:{self.index}'

    @classmethod
    def parse(cls, name: str) -> TaskName:
        """`worker:3` -> TaskName('worker', 3); ValueError for anything else."""
        m = _TASK_NAME.fullmatch(name)
        if m is None:
            raise ValueError(f'not a task name (JOB:INDEX): {name!r}')
        return cls(m.group(1), int(m.group(2)))


def job_of(name: str) -> str | None:
    """The job of a task's name (`ps:1` -> 'ps'), None where `name` is not one: the test a
    caller makes of a name it did not make itself (an event's, a decision's)."""
    try:
        return TaskName.parse(name).job
    except ValueError:
        return None


# -- the environment and the exit codes -----------------------------------------------------------
# Set by the launcher in each task's environment: a file it touches every second or so. A task
# whose lease is older than LEASE_SECS_ENV seconds has lost its launcher (killed, or cut off from
# its host) and stops itself. Tasks started by hand, by Slurm or by a TFJob have none.
LEASE_ENV, LEASE_SECS_ENV = 'TFCLUSTER_LEASE', 'TFCLUSTER_LEASE_SECS'

# Set by the launcher on the tasks it starts again after a fault: one line saying why, e.g.
# `restart 1/3: ps:0 was killed by SIGKILL`. The chief records it in TensorBoard (a text summary).
RESTART_ENV = 'TFCLUSTER_RESTART'

# Set by a launcher that reads its tasks' channels (the local and the SSH backends): the file
# that the task appends its messages' records to, on its host (`channel_beside` its log:
# logs/attempt-N/worker-0.log -> logs/attempt-N/worker-0.records).
# Tasks started by hand, by Slurm or by compose have none and write none.
CHANNEL_ENV = 'TFCLUSTER_CHANNEL'
CHANNEL_SUFFIX = '.records'

# Exit codes, of a task and of the launcher alike.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_NO_RESTART = 3     # a task failed in a way a restart cannot mend (no checkpoint restores)


# -- the task's command line ----------------------------------------------------------------------
TASK_MODULE = 'cluster.task'


def task_argv(python: str, spec_file: str, task: TaskName) -> tuple[str, ...]:
    """The command line that runs `task` of the spec in `spec_file` (what `launch up` starts)."""
    return (python, '-m', TASK_MODULE, '--spec', spec_file, '--job', task.job, '--index', str(task.index))


@dataclass(frozen=True)
class TaskArgs:
    """What a task's command line says: the spec, the overrides, and where the task's place comes
    from: `task` (--job/--index: the spec's cluster), else `place` (a source of cluster/env/places)."""
    spec: str | None
    overrides: tuple[str, ...]
    task: TaskName | None
    place: str | None
    port_base: int = DEFAULT_PORT_BASE


def _parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f'python -m {TASK_MODULE}', description=doc)
    p.add_argument('--spec', help=f'cluster spec (default: $CLUSTER_SPEC, else {DEFAULT_SPEC})')
    p.add_argument('--job', choices=list(JOBS), help='the task\'s job (default: from $TF_CONFIG)')
    p.add_argument('--index', type=int, help="the task's position in its job's list (default: from $TF_CONFIG)")
    p.add_argument('--set', dest='overrides', action='append', default=[], metavar='KEY=VALUE',
                   help='override a spec key, e.g. --set train.steps=50')
    p.add_argument('--slurm', action='store_true',
                   help="inside an srun step: every task's job, index, host and port from Slurm's environment "
                        '(ranks in node order, the spec\'s ps tasks first)')
    p.add_argument('--port-base', type=int, default=DEFAULT_PORT_BASE, metavar='PORT',
                   help=f'with --slurm: the first port on each node (default {DEFAULT_PORT_BASE})')
    p.add_argument('--jobset', action='store_true',
                   help="in a pod of a JobSet (launch render --format jobset|trainjob): every task's job, index "
                        "and DNS name from the pod's labels and the rendered TFCLUSTER_JOBSET_* variables")
    # Hidden from --help and the usage line, which stay as they were (round 3 changes no CLI text):
    # the sources are cluster/env/places.SOURCES, `--slurm`/`--jobset` the spellings users know.
    p.add_argument('--place', choices=list(places.SOURCES), default=None, help=argparse.SUPPRESS)
    return p


def parse_task_argv(argv: Sequence[str] | None = None, doc: str = '',
                    environ: Mapping[str, str] = os.environ) -> TaskArgs:
    """A task's command line (sys.argv[1:] by default) as TaskArgs; a bad one exits with argparse's
    usage line and code 2, before anything is imported or started."""
    p = _parser(doc)
    rest, overrides = take_overrides(sys.argv[1:] if argv is None else list(argv))
    args = p.parse_args(rest)       # without the --set options: argparse is quadratic in them
    if args.slurm and args.jobset:
        p.error('give --slurm or --jobset, not both')
    flagged = [name for name in (places.SLURM, places.JOBSET) if getattr(args, name)]
    if args.place is not None and flagged and flagged != [args.place]:
        p.error(f'give --place {args.place} or --{flagged[0]}, not both')
    place = args.place or (flagged[0] if flagged else None)
    if place is not None and place != places.TF_CONFIG and (args.job is not None or args.index is not None):
        flag = f'--{place}' if place in flagged else f'--place {place}'
        p.error(f'{flag} takes the task from {places.SOURCES[place].where}: drop --job and --index')
    if (args.job is None) != (args.index is None):
        p.error('give --job and --index together (or neither, to take both from $TF_CONFIG)')
    if args.job is None and place in (None, places.TF_CONFIG) and not environ.get(TF_CONFIG_ENV):
        p.error(f'--job and --index are required unless ${TF_CONFIG_ENV} names the task')
    task = TaskName(args.job, args.index) if args.job is not None else None
    return TaskArgs(spec=args.spec, overrides=tuple(overrides + args.overrides), task=task,
                    place=place if task is None else None, port_base=args.port_base)


# -- what a task tells its launcher ---------------------------------------------------------------
class Kind(str, Enum):
    SERVING = 'serving'
    STARTED = 'started'
    PROGRESS = 'progress'
    CHECKPOINT = 'checkpoint'
    EVALUATION = 'evaluation'


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


Message = Serving | Started | Progress | Checkpoint | Evaluation
MESSAGES: dict[Kind, type[Message]] = {m.KIND: m for m in (Serving, Started, Progress, Checkpoint, Evaluation)}


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
