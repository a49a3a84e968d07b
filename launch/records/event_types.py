"""The events of `events.jsonl`, typed: `EventKind` names them, one dataclass per kind holds its
fields, each with a docstring that says what the event tells and a `doc` for each field that says
what it holds: the event log's reference page (docs/reference/events.md) is made from them.

Every line is `{"time", "run", "attempt", "event", <the kind's fields>...}`; `parse_event` reads
one, `Event.to_json` writes it back: same keys, same order, same values (see jsonrecord.py for
what a line with missing, unknown or mistyped fields reads as). The field order of each class is
the order the launcher writes them in, which is the order a line built from it is written in.
"""
from __future__ import annotations

import datetime
import enum
import functools
from dataclasses import dataclass
from typing import Any, ClassVar
from collections.abc import Mapping

from cluster.runtime.runjson import short
from launch.records.jsonrecord import (JsonRecord, json_field, read_fields, read_flag, read_real, read_text, read_texts,
                                       read_whole, read_wholes)
from launch.records.result import MendedFault, RunRecord, RunState, read_phases, read_state


class EventKind(str, enum.Enum):
    """What an event tells; written as the value."""
    RUN_STARTED = 'run_started'
    TASK_STARTED = 'task_started'
    SERVING = 'serving'
    FIRST_STEP = 'first_step'
    PROGRESS = 'progress'
    CHECKPOINT = 'checkpoint'
    EVALUATION = 'evaluation'
    TASK_LOST = 'task_lost'
    TOLERATED = 'tolerated'
    STALL = 'stall'
    RESTART = 'restart'
    RECOVERED = 'recovered'
    SCALE = 'scale'
    SCALED = 'scaled'
    FAILOVER = 'failover'
    MOVED = 'moved'
    PREEMPTED = 'preempted'
    DISK_FULL = 'disk_full'
    DISK_FREE = 'disk_free'
    SAMPLE = 'sample'
    STRAGGLER = 'straggler'
    INTERRUPTED = 'interrupted'
    FINISHED = 'finished'

    def __str__(self) -> str:
        return self.value


# The keys every event has, first, and what each holds (docs/reference/events.md is made from these).
HEADER_DOCS = {
    'time': 'When the launcher wrote it: ISO-8601 with the UTC offset, e.g. 2026-11-23T21:08:43.123+00:00.',
    'run': "The run's id, e.g. local2-20261123-210843.",
    'attempt': '1, 2, ...: every `launch up` of the train_dir and every cluster restart inside one begins the next.',
    'event': 'The kind of event: one of those below, which say what other keys it has.',
}
HEADER = tuple(HEADER_DOCS)


def read_attempt(value: Any) -> int:
    """An attempt number; a line without one is of the first attempt. ValueError if it is not one."""
    try:
        number = int(value or 1)
    except (TypeError, ValueError, OverflowError):      # OverflowError: an infinity
        number = None
    if number is None or read_whole(number) is None:
        raise ValueError(f'not an attempt number: {short(repr(value), 40)}')
    return number


@dataclass(frozen=True, kw_only=True)
class Event(JsonRecord):
    """One line of the event log: the header every event has; a subclass adds its kind's fields."""
    time: str = ''              # ISO-8601 with the UTC offset, as written ('' where it is no text)
    run: str = ''               # '' where it is no text
    attempt: int = 1

    kind: ClassVar[EventKind | None] = None
    NOT_JSON = JsonRecord.NOT_JSON | {'time', 'run', 'attempt'}

    @property
    def name(self) -> str:
        """The `event` key's value."""
        assert self.kind is not None
        return self.kind.value

    @functools.cached_property
    def epoch(self) -> float:
        """`time` in epoch seconds (one without an offset is local time); ValueError if it is no time."""
        when = datetime.datetime.fromisoformat(self.time)
        if when.tzinfo is None:
            when = when.astimezone()
        return when.timestamp()

    def payload(self) -> dict[str, Any]:
        """The kind's fields as JSON: the line without its header."""
        return super().to_json()

    def to_json(self) -> dict[str, Any]:
        return {'time': self.time, 'run': self.run, 'attempt': self.attempt, 'event': self.name, **self.payload()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], **given: Any) -> Any:
        """The event of one line (its kind's class: see parse_event). ValueError if its attempt is no number."""
        payload = {k: v for k, v in data.items() if k not in HEADER}
        values, extra = read_fields(cls, payload)
        return cls(**values, **given, time=read_text(data.get('time')) or '', run=read_text(data.get('run')) or '',
                   attempt=read_attempt(data.get('attempt')), keys=tuple(payload), extra=extra)


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event):
    """A launcher began an attempt of the run (`launch up`; a cluster restart inside one begins the
    next attempt with `restart`, not with this): what it runs, from where, and from which step."""
    kind = EventKind.RUN_STARTED
    spec: str | None = json_field(read_text, doc="The spec file's absolute path.")
    backend: str | None = json_field(read_text, doc='The backend that runs the tasks (local, ssh, compose or slurm), '
                                                    'or null where each host chose its own.')
    spec_hash: str | None = json_field(read_text, doc='The sha256 of the effective spec (the file with the --set '
                                                      'options applied).')
    overrides: list[str] | None = json_field(read_texts, doc='The --set options, in order (a secret-looking env '
                                                             'value as a reference to its variable).')
    cwd: str | None = json_field(read_text, doc="The launcher's working directory.")
    train_dir: str | None = json_field(read_text, doc="The run's directory, absolute.")
    launcher_pid: int | None = json_field(read_whole, doc="The launcher's process id.")
    resumes_from: int | None = json_field(read_whole, doc='The step of the checkpoint the training resumes from; '
                                                          'null for a fresh start.')


@dataclass(frozen=True, kw_only=True)
class TaskStarted(Event):
    """A task was started. Where it runs: a process (`pid`), a container (compose), a scheduler's
    job (Slurm) or a Ray node and the actor that keeps it there."""
    kind = EventKind.TASK_STARTED
    OPTIONAL = frozenset({'pid', 'container', 'job', 'node', 'actor', 'warm'})
    task: str | None = json_field(read_text, doc='The task, job:index (e.g. worker:1).')
    host: str | None = json_field(read_text, doc='The host it runs on, as the spec names it.')
    pid: int | None = json_field(read_whole, doc='Its process id on that host (local and SSH tasks).')
    container: str | None = json_field(read_text, doc='Its container (compose).')
    job: str | None = json_field(read_text, doc="The scheduler's job id (Slurm).")
    node: str | None = json_field(read_text, doc='The Ray node it runs on, by address (Ray).')
    actor: str | None = json_field(read_text, doc='The Ray actor that keeps it, by name (Ray).')
    warm: bool | None = json_field(read_flag, doc='true: a warm standby became the task (supervise.standby; '
                                                  'only then written).')


@dataclass(frozen=True, kw_only=True)
class Serving(Event):
    """A task is up (once per task and attempt): its server accepts connections, or, for a
    coordinator run's chief and evaluator, which serve nothing, its program or command has started."""
    kind = EventKind.SERVING
    task: str | None = json_field(read_text, doc='The task, job:index.')


@dataclass(frozen=True, kw_only=True)
class FirstStep(Event):
    """The attempt's first global step: the cluster trains."""
    kind = EventKind.FIRST_STEP
    step: int | None = json_field(read_whole, doc='The global step.')


@dataclass(frozen=True, kw_only=True)
class Progress(Event):
    """The chief's progress line, at its cadence (train.log_every_secs); `workers` only while part of
    the pool runs."""
    kind = EventKind.PROGRESS
    OPTIONAL = frozenset({'workers'})
    step: int | None = json_field(read_whole, doc='The global step.')
    total: int | None = json_field(read_whole, doc='The global step the run trains to (train.steps).')
    loss: float | None = json_field(read_real, doc='The loss, or null if not known.')
    images_per_sec: float | None = json_field(read_real, doc='Images per second, all workers together, or null '
                                                             'if not known.')
    workers: int | None = json_field(read_whole, doc='The workers that run now, when fewer than the pool.')


@dataclass(frozen=True, kw_only=True)
class Checkpoint(Event):
    """The chief saved a checkpoint."""
    kind = EventKind.CHECKPOINT
    step: int | None = json_field(read_whole, doc='Its global step.')


def read_metrics(value: Any) -> dict[str, float] | None:
    """An evaluation's figures: name -> number (anything else is dropped)."""
    if not isinstance(value, dict):
        return None
    return {str(k): float(number) for k, number in ((k, read_real(v)) for k, v in value.items()) if number is not None}


@dataclass(frozen=True, kw_only=True)
class Evaluation(Event):
    """An evaluator's figures for the checkpoint at `step` (a coordinator run's evaluator task)."""
    kind = EventKind.EVALUATION
    task: str | None = json_field(read_text, doc='The evaluator task.')
    step: int | None = json_field(read_whole, doc="The evaluated checkpoint's global step.")
    metrics: dict[str, float] | None = json_field(read_metrics, doc='Name -> number, as the evaluator reported them.')


@dataclass(frozen=True, kw_only=True)
class TaskLost(Event):
    """A lost task; `after` names the task lost with it that caused it (a chief that ended
    because its ps was killed): part of that fault, not one of its own."""
    kind = EventKind.TASK_LOST
    OPTIONAL = frozenset({'after'})
    task: str | None = json_field(read_text, doc='The task, job:index.')
    cause: str | None = json_field(read_text, doc='Why it counts as lost, in one line.')
    exit_code: int | None = json_field(read_whole, doc='Its exit code, or null if unknown.')
    signal: str | None = json_field(read_text, doc="The signal's name (e.g. SIGKILL) if a signal ended it, else "
                                                   'null.')
    error: str | None = json_field(read_text, doc="The task's last Python error line, or null.")
    after: str | None = json_field(read_text, doc='The task whose loss caused this one, if any.')


@dataclass(frozen=True, kw_only=True)
class Tolerated(Event):
    """A lost task the training does without (an async worker, a sync backup worker): it goes on."""
    kind = EventKind.TOLERATED
    task: str | None = json_field(read_text, doc='The task, job:index.')
    cause: str | None = json_field(read_text, doc='Why it counts as lost, in one line.')


@dataclass(frozen=True, kw_only=True)
class Stall(Event):
    """No new global step for supervise.stall_secs: the tasks that answered dumped their Python
    stacks before anything was stopped."""
    kind = EventKind.STALL
    OPTIONAL = frozenset({'stacks', 'no_stacks'})
    tasks: list[str] | None = json_field(read_texts, doc='The tasks that hold the training up.')
    cause: str | None = json_field(read_text, doc='What each task was doing, in one line.')
    stacks: str | None = json_field(read_text, doc="Where the tasks' stack dumps are, relative to the train_dir "
                                                   '(stacks/attempt-N).')
    no_stacks: list[str] | None = json_field(read_texts, doc='The tasks that wrote none (stopped, ended, or silent).')


@dataclass(frozen=True, kw_only=True)
class Restart(Event):
    """A cluster restart (ends the attempt; the next attempt's events follow), or of the tasks named
    in `tasks` (the attempt goes on)."""
    kind = EventKind.RESTART
    OPTIONAL = frozenset({'tasks'})
    cause: str | None = json_field(read_text, doc='The fault, in one line.')
    from_step: int | None = json_field(read_whole, doc='The step of the checkpoint the training resumes from, or '
                                                       'null.')
    tasks: list[str] | None = json_field(read_texts, doc='The tasks restarted alone, when not the whole cluster.')


@dataclass(frozen=True, kw_only=True)
class Recovered(Event):
    """The training is back after a fault: the tasks restarted for it, the seconds from the
    supervisor seeing it to the next global step, the steps trained again, each phase's seconds."""
    kind = EventKind.RECOVERED
    OPTIONAL = frozenset({'preempted', 'standby', 'cold'})
    tasks: list[str] | None = json_field(read_texts, doc='The tasks restarted for the fault.')
    seconds: float | None = json_field(read_real, doc='Seconds from the fault seen to the next global step.')
    steps_redone: int | None = json_field(read_whole, doc='Steps trained again from an older checkpoint.')
    phases: dict[str, float] | None = json_field(read_phases, doc='Seconds of each phase the restart went through: '
                                                                  'save (a preemption\'s, from the notice), stop, '
                                                                  'backoff, start, step.')
    preempted: bool | None = json_field(read_flag, doc='true: a preemption, timed from its notice (only then written).')
    standby: int | None = json_field(read_whole, doc='Tasks the restart started from a warm standby (only '
                                                     'written when one was).')
    cold: int | None = json_field(read_whole, doc='Tasks it started cold, beside those (only written with standby).')

    @classmethod
    def of(cls, mended: MendedFault) -> Recovered:
        return cls(tasks=mended.tasks, seconds=mended.seconds, steps_redone=mended.steps_redone,
                   phases=mended.phases, preempted=mended.preempted, standby=mended.standby, cold=mended.cold)


@dataclass(frozen=True, kw_only=True)
class Scale(Event):
    """`launch scale` asked for another number of workers, and the launcher starts or stops them."""
    kind = EventKind.SCALE
    to: int | None = json_field(read_whole, doc='The worker count asked for.')
    add: list[str] | None = json_field(read_texts, doc='The workers started.')
    remove: list[str] | None = json_field(read_texts, doc='The workers stopped.')
    pid: int | None = json_field(read_whole, doc='The process id of the `launch scale` that asked.')


@dataclass(frozen=True, kw_only=True)
class Scaled(Event):
    """How a change of the worker count ended."""
    kind = EventKind.SCALED
    state: RunState | str | None = json_field(read_state, doc='done or failed.')
    workers: list[int] | None = json_field(read_wholes, doc='The indices of the workers that run now.')
    cause: str | None = json_field(read_text, doc='What happened, in one line.')


@dataclass(frozen=True, kw_only=True)
class Failover(Event):
    """A task whose host could not be reached was replaced by a spare worker of the pool."""
    kind = EventKind.FAILOVER
    task: str | None = json_field(read_text, doc='The lost task: its host could not be reached.')
    to: str | None = json_field(read_text, doc='The spare started in its place.')
    host: str | None = json_field(read_text, doc="The spare's host.")
    cause: str | None = json_field(read_text, doc='Why the task counts as lost, in one line.')


@dataclass(frozen=True, kw_only=True)
class Moved(Event):
    """A task placed on another node as the cluster started again, since it could not start where
    it ran (a backend that places its tasks: Ray); every task was told the new address."""
    kind = EventKind.MOVED
    task: str | None = json_field(read_text, doc='The task that moved.')
    before: str | None = json_field(read_text, doc='Its address before (host:port).')
    address: str | None = json_field(read_text, doc='Its address now (host:port).')
    cause: str | None = json_field(read_text, doc='Why it could not start where it ran, in one line.')


@dataclass(frozen=True, kw_only=True)
class Preempted(Event):
    """A task got a preemption notice (a SIGTERM from outside the launcher): no fault, not counted
    against supervise.max_restarts; the restart that follows (if any) is in its own event."""
    kind = EventKind.PREEMPTED
    task: str | None = json_field(read_text, doc='The task that got the notice.')
    cause: str | None = json_field(read_text, doc='Where the notice came from, in words.')
    grace: float | None = json_field(read_real, doc='Its seconds to have the checkpoint saved and go.')
    step: int | None = json_field(read_whole, doc='The global step it had reached (null: not known to it).')
    checkpoint: int | None = json_field(read_whole, doc='The newest checkpoint at the notice (null: none yet).')


@dataclass(frozen=True, kw_only=True)
class DiskFull(Event):
    """The disk under the run's files (`path`) is full, or refuses the event log: `cause`. The
    event is written into the log's reserve."""
    kind = EventKind.DISK_FULL
    path: str | None = json_field(read_text, doc='The path that could not be written.')
    cause: str | None = json_field(read_text, doc="The system's reason, e.g. No space left on device (ENOSPC).")


@dataclass(frozen=True, kw_only=True)
class DiskFree(Event):
    """The disk under `path` has room again."""
    kind = EventKind.DISK_FREE
    path: str | None = json_field(read_text, doc='The path written again.')


def read_samples(value: Any) -> dict[str, dict[str, float | None]] | None:
    """A sample event's figures: task -> figure name -> number or null (anything else dropped)."""
    if not isinstance(value, dict):
        return None
    return {str(task): {str(k): read_real(v) for k, v in figures.items()}
            for task, figures in value.items() if isinstance(figures, dict)}


@dataclass(frozen=True, kw_only=True)
class Sample(Event):
    """What each running task measured of itself over its last few seconds (cluster/runtime/telemetry.py),
    every 30 s while the run trains."""
    kind = EventKind.SAMPLE
    tasks: dict[str, dict[str, float | None]] | None = json_field(
        read_samples, doc='Task -> its figures: `steps`, `steps_per_sec` and `images_per_sec` (a worker of the '
                          'built-in trainer), `cpu` (share of one core), `rss` (bytes), `in_per_sec` and '
                          '`out_per_sec` (bytes its TCP connections received and sent per second); null where not '
                          'measured.')


@dataclass(frozen=True, kw_only=True)
class Straggler(Event):
    """A worker whose steps per second stayed below supervise's straggler fraction of the other
    workers' median: who, how slow, and the likely cause."""
    kind = EventKind.STRAGGLER
    task: str | None = json_field(read_text, doc='The worker, job:index.')
    steps_per_sec: float | None = json_field(read_real, doc='Its steps per second.')
    median: float | None = json_field(read_real, doc="The other workers' median steps per second.")
    cause: str | None = json_field(read_text, doc='The likely cause, in words, from its CPU against the others\'.')


@dataclass(frozen=True, kw_only=True)
class Interrupted(Event):
    """The launcher was told to stop (Ctrl-C, SIGTERM, SIGHUP): it stops the tasks and ends the run."""
    kind = EventKind.INTERRUPTED
    signal: str | None = json_field(read_text, doc="The signal's name.")


def read_record(value: Any) -> RunRecord | None:
    return RunRecord.from_json(value) if isinstance(value, dict) else None


@dataclass(frozen=True, kw_only=True)
class Finished(Event):
    """The launcher is done: how its last attempt ended."""
    kind = EventKind.FINISHED
    result: RunRecord | None = json_field(read_record, doc='The result, as run.json holds it.')


@dataclass(frozen=True, kw_only=True)
class OtherEvent(Event):
    """A line of a kind this version does not know (a newer launcher's): its fields all in `extra`."""
    event: str = ''
    NOT_JSON = Event.NOT_JSON | {'event'}

    @property
    def name(self) -> str:
        return self.event


EVENT_TYPES: dict[str, type[Event]] = {cls.kind.value: cls for cls in (
    RunStarted, TaskStarted, Serving, FirstStep, Progress, Checkpoint, Evaluation, TaskLost, Tolerated, Stall, Restart,
    Recovered, Scale, Scaled, Failover, Moved, Preempted, DiskFull, DiskFree, Sample, Straggler, Interrupted, Finished)
    if cls.kind is not None}
assert set(EVENT_TYPES) == {k.value for k in EventKind}


def parse_event(data: Mapping[str, Any]) -> Event:
    """The typed event of one line (a dict with an `event` key, as events.read_events gives);
    ValueError if its attempt is no number."""
    name = data.get('event')
    cls = EVENT_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        return OtherEvent.from_json(data, event=str(name))
    return cls.from_json(data)
