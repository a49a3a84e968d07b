"""The events of `events.jsonl`, typed: `EventKind` names them, one dataclass per kind holds its
fields (launch/records/events.py lists them; docs/runs.md documents them).

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
from launch.records.jsonrecord import (JsonRecord, json_field, read_fields, read_real, read_text, read_texts,
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
    DISK_FULL = 'disk_full'
    DISK_FREE = 'disk_free'
    INTERRUPTED = 'interrupted'
    FINISHED = 'finished'

    def __str__(self) -> str:
        return self.value


HEADER = ('time', 'run', 'attempt', 'event')


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
    time: str = ''              # ISO-8601 with the UTC offset, as written
    run: str = ''
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
        return cls(**values, **given, time=str(data['time']) if 'time' in data else '',
                   run=str(data['run']) if data.get('run') else '', attempt=read_attempt(data.get('attempt')),
                   keys=tuple(payload), extra=extra)


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event):
    kind = EventKind.RUN_STARTED
    spec: str | None = json_field(read_text)                # absolute path
    backend: str | None = json_field(read_text)
    spec_hash: str | None = json_field(read_text)           # sha256 of the effective spec
    overrides: list[str] | None = json_field(read_texts)    # the --set options
    cwd: str | None = json_field(read_text)
    train_dir: str | None = json_field(read_text)
    launcher_pid: int | None = json_field(read_whole)
    resumes_from: int | None = json_field(read_whole)       # the checkpoint's step


@dataclass(frozen=True, kw_only=True)
class TaskStarted(Event):
    """Where the task runs: a process (`pid`), a container (compose) or a scheduler's job (Slurm)."""
    kind = EventKind.TASK_STARTED
    OPTIONAL = frozenset({'pid', 'container', 'job'})
    task: str | None = json_field(read_text)
    host: str | None = json_field(read_text)
    pid: int | None = json_field(read_whole)
    container: str | None = json_field(read_text)
    job: str | None = json_field(read_text)


@dataclass(frozen=True, kw_only=True)
class Serving(Event):
    kind = EventKind.SERVING
    task: str | None = json_field(read_text)


@dataclass(frozen=True, kw_only=True)
class FirstStep(Event):
    kind = EventKind.FIRST_STEP
    step: int | None = json_field(read_whole)


@dataclass(frozen=True, kw_only=True)
class Progress(Event):
    """The chief's progress line; `workers` only while part of the pool runs."""
    kind = EventKind.PROGRESS
    OPTIONAL = frozenset({'workers'})
    step: int | None = json_field(read_whole)
    total: int | None = json_field(read_whole)
    loss: float | None = json_field(read_real)
    images_per_sec: float | None = json_field(read_real)
    workers: int | None = json_field(read_whole)


@dataclass(frozen=True, kw_only=True)
class Checkpoint(Event):
    kind = EventKind.CHECKPOINT
    step: int | None = json_field(read_whole)


def read_metrics(value: Any) -> dict[str, float] | None:
    """An evaluation's figures: name -> number (anything else is dropped)."""
    if not isinstance(value, dict):
        return None
    return {str(k): float(number) for k, number in ((k, read_real(v)) for k, v in value.items()) if number is not None}


@dataclass(frozen=True, kw_only=True)
class Evaluation(Event):
    """An evaluator's figures for the checkpoint at `step` (a coordinator run's evaluator task)."""
    kind = EventKind.EVALUATION
    task: str | None = json_field(read_text)
    step: int | None = json_field(read_whole)
    metrics: dict[str, float] | None = json_field(read_metrics)


@dataclass(frozen=True, kw_only=True)
class TaskLost(Event):
    """A lost task; `after` names the task lost with it that caused it (a chief that ended
    because its ps was killed): part of that fault, not one of its own."""
    kind = EventKind.TASK_LOST
    OPTIONAL = frozenset({'after'})
    task: str | None = json_field(read_text)
    cause: str | None = json_field(read_text)
    exit_code: int | None = json_field(read_whole)
    signal: str | None = json_field(read_text)              # its name
    error: str | None = json_field(read_text)               # the task's last Python error
    after: str | None = json_field(read_text)


@dataclass(frozen=True, kw_only=True)
class Tolerated(Event):
    kind = EventKind.TOLERATED
    task: str | None = json_field(read_text)
    cause: str | None = json_field(read_text)


@dataclass(frozen=True, kw_only=True)
class Stall(Event):
    """`stacks`: where the tasks' stack dumps of the stall are, relative to the train_dir (stacks/attempt-N);
    `no_stacks`: the tasks that wrote none (stopped, ended, or silent)."""
    kind = EventKind.STALL
    OPTIONAL = frozenset({'stacks', 'no_stacks'})
    tasks: list[str] | None = json_field(read_texts)
    cause: str | None = json_field(read_text)
    stacks: str | None = json_field(read_text)
    no_stacks: list[str] | None = json_field(read_texts)


@dataclass(frozen=True, kw_only=True)
class Restart(Event):
    """A cluster restart (ends the attempt), or of the tasks named in `tasks` (the attempt goes on)."""
    kind = EventKind.RESTART
    OPTIONAL = frozenset({'tasks'})
    cause: str | None = json_field(read_text)
    from_step: int | None = json_field(read_whole)
    tasks: list[str] | None = json_field(read_texts)


@dataclass(frozen=True, kw_only=True)
class Recovered(Event):
    """The training is back after a fault: the tasks restarted for it, the seconds from the
    supervisor seeing it to the next global step, the steps trained again, each phase's seconds."""
    kind = EventKind.RECOVERED
    tasks: list[str] | None = json_field(read_texts)
    seconds: float | None = json_field(read_real)
    steps_redone: int | None = json_field(read_whole)
    phases: dict[str, float] | None = json_field(read_phases)

    @classmethod
    def of(cls, mended: MendedFault) -> Recovered:
        return cls(tasks=mended.tasks, seconds=mended.seconds, steps_redone=mended.steps_redone,
                   phases=mended.phases)


@dataclass(frozen=True, kw_only=True)
class Scale(Event):
    kind = EventKind.SCALE
    to: int | None = json_field(read_whole)                 # the worker count asked for
    add: list[str] | None = json_field(read_texts)
    remove: list[str] | None = json_field(read_texts)
    pid: int | None = json_field(read_whole)                # of `launch scale`


@dataclass(frozen=True, kw_only=True)
class Scaled(Event):
    kind = EventKind.SCALED
    state: RunState | str | None = json_field(read_state)   # done | failed
    workers: list[int] | None = json_field(read_wholes)     # the live worker indices
    cause: str | None = json_field(read_text)


@dataclass(frozen=True, kw_only=True)
class Failover(Event):
    kind = EventKind.FAILOVER
    task: str | None = json_field(read_text)                # lost: its host could not be reached
    to: str | None = json_field(read_text)                  # the spare started in its place
    host: str | None = json_field(read_text)
    cause: str | None = json_field(read_text)


@dataclass(frozen=True, kw_only=True)
class DiskFull(Event):
    """The disk under the run's files (`path`) is full, or refuses the event log: `cause`."""
    kind = EventKind.DISK_FULL
    path: str | None = json_field(read_text)
    cause: str | None = json_field(read_text)


@dataclass(frozen=True, kw_only=True)
class DiskFree(Event):
    """The disk under `path` has room again."""
    kind = EventKind.DISK_FREE
    path: str | None = json_field(read_text)


@dataclass(frozen=True, kw_only=True)
class Interrupted(Event):
    kind = EventKind.INTERRUPTED
    signal: str | None = json_field(read_text)


def read_record(value: Any) -> RunRecord | None:
    return RunRecord.from_json(value) if isinstance(value, dict) else None


@dataclass(frozen=True, kw_only=True)
class Finished(Event):
    kind = EventKind.FINISHED
    result: RunRecord | None = json_field(read_record)


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
    Recovered, Scale, Scaled, Failover, DiskFull, DiskFree, Interrupted, Finished) if cls.kind is not None}
assert set(EVENT_TYPES) == {k.value for k in EventKind}


def parse_event(data: Mapping[str, Any]) -> Event:
    """The typed event of one line (a dict with an `event` key, as events.read_events gives);
    ValueError if its attempt is no number."""
    name = data.get('event')
    cls = EVENT_TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        return OtherEvent.from_json(data, event=str(name))
    return cls.from_json(data)
