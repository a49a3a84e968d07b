"""How an attempt of a run ended: the launcher's `RunResult`, and `run.json` (which the `finished`
event repeats) as a typed `RunRecord`.

`run.json` is a user-facing file (docs/runs.md): its keys, their order and their values are
fixed; `RunResult.to_json` writes it, `RunRecord.from_json(...).to_json()` gives it back unchanged.
"""
from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping

from cluster.runtime import rundir
from launch.records.jsonrecord import JsonRecord, finite, json_field, read_flag, read_real, read_text, read_texts, read_whole
from launch.records.rehearsal import Rehearsal, read_rehearsal


class RunState(str, enum.Enum):
    """A run's state: how its latest attempt ended (run.json's `state`), or, for `launch list`,
    that it is still running or that the way it ended is unknown. Written as the value."""
    DONE = 'done'
    FAILED = 'failed'
    INTERRUPTED = 'interrupted'
    SCALED = 'scaled'               # the attempt a sync `launch scale` ended: the run goes on
    RUNNING = 'running'             # a live launcher holds the train_dir
    UNKNOWN = 'unknown'             # the latest attempt left no result (its launcher was killed)

    def __str__(self) -> str:
        return self.value

    def is_terminal(self) -> bool:
        """Whether the run stopped there: nothing runs until someone starts it again. A scaled
        attempt is followed by the next one; of an unknown state nothing is known."""
        return self in (RunState.DONE, RunState.FAILED, RunState.INTERRUPTED)


# The states an attempt's result can have (run.json's `state`).
RESULT_STATES = (RunState.DONE, RunState.FAILED, RunState.INTERRUPTED, RunState.SCALED)


def read_state(value: Any) -> RunState | str | None:
    """A state as written: a RunState, or the text of one this version does not know."""
    if not isinstance(value, str):
        return None
    try:
        return RunState(value)
    except ValueError:
        return value


def read_epoch(text: Any) -> float | None:
    """Epoch seconds of an ISO-8601 time; one without an offset is local time; None if not one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace('Z', '+00:00'))
    except ValueError:
        return None
    return moment.timestamp()


def _name(value: Any) -> str:
    return value if isinstance(value, str) else ''


@dataclass(frozen=True)
class Failure(JsonRecord):
    """One task lost on the way: which, where, and how."""
    task: str = json_field(_name, '')
    cause: str = json_field(_name, '')
    host: str = json_field(_name, '')
    pid: int | None = json_field(read_whole)


def read_failures(value: Any) -> list[Failure] | None:
    if not isinstance(value, list):
        return None
    return [Failure.from_json(f) for f in value if isinstance(f, dict)]


def read_phases(value: Any) -> dict[str, float] | None:
    """A restart's phases: name -> seconds (anything else dropped)."""
    if not isinstance(value, dict):
        return None
    return {k: v for k, v in ((k, finite(v)) for k, v in value.items() if isinstance(k, str)) if v is not None}


# A restart's phases, in the order a cluster restart goes through them; 'save' only after a
# preemption (from the notice to the chief's checkpoint seen, or the grace up: mending.py).
PHASES = ('save', 'stop', 'backoff', 'start', 'step')


@dataclass(frozen=True)
class MendedFault(JsonRecord):
    """One fault mended: the tasks restarted for it, the seconds from the supervisor seeing it to
    the next global step trained, the steps trained again, and how long each phase of the restart
    took (launch/run/supervised/mending.py); `preempted` (only then written): it was a preemption,
    timed from the notice; `standby` and `cold` (only when a standby was used): the tasks started
    each way."""
    OPTIONAL = frozenset({'preempted', 'standby', 'cold'})
    tasks: list[str] | None = json_field(read_texts)
    seconds: float | None = json_field(read_real)
    steps_redone: int | None = json_field(read_whole)
    phases: dict[str, float] | None = json_field(read_phases)
    preempted: bool | None = json_field(read_flag)
    standby: int | None = json_field(read_whole)     # tasks started from a warm standby (only when some were)
    cold: int | None = json_field(read_whole)        # and cold, beside them


def read_mended(value: Any) -> list[MendedFault] | None:
    if not isinstance(value, list):
        return None
    return [MendedFault.from_json(f) for f in value if isinstance(f, dict)]


@dataclass(frozen=True)
class RunRecord(JsonRecord):
    """run.json as read (or a `finished` event's result): every field may be missing (`has` says
    which were written) or null; the field order is the order the launcher writes them in."""
    # once a fault was mended; a rehearsal; once preempted; with backup workers
    OPTIONAL = frozenset({'recoveries', 'rehearsal', 'preemptions', 'dropped_gradients'})
    state: RunState | str | None = json_field(read_state)
    exit_code: int | None = json_field(read_whole)
    seconds: float | None = json_field(read_real)
    global_step: int | None = json_field(read_whole)
    images_per_sec: float | None = json_field(read_real)
    loss: float | None = json_field(read_real)
    restarts: int | None = json_field(read_whole)
    failures: list[Failure] | None = json_field(read_failures)
    recoveries: list[MendedFault] | None = json_field(read_mended)
    started: str | None = json_field(read_text)      # ISO-8601
    ended: str | None = json_field(read_text)
    id: str | None = json_field(read_text)
    attempt: int | None = json_field(read_whole)
    spec: str | None = json_field(read_text)
    backend: str | None = json_field(read_text)
    train_dir: str | None = json_field(read_text)
    rehearsal: Rehearsal | None = json_field(read_rehearsal)     # `launch up --rehearse`: the links tried
    preemptions: int | None = json_field(read_whole)     # preemption notices, none counted among the restarts
    dropped_gradients: int | None = json_field(read_whole)     # sync with backup workers: gradients dropped as stale

    def is_empty(self) -> bool:
        return not self.written_keys()

    def result(self) -> RunResult:
        """The launcher's view of it (times as epoch seconds; what is missing, zero)."""
        state = self.state if isinstance(self.state, RunState) else RunState.UNKNOWN
        return RunResult(state=state, exit_code=self.exit_code or 0, seconds=self.seconds or 0.0,
                         global_step=self.global_step, images_per_sec=self.images_per_sec, loss=self.loss,
                         restarts=self.restarts or 0, failures=list(self.failures or ()),
                         recoveries=list(self.recoveries or ()), started=read_epoch(self.started) or 0.0, ended=read_epoch(self.ended) or 0.0,
                         rehearsal=self.rehearsal, preemptions=self.preemptions or 0,
                         dropped_gradients=self.dropped_gradients)


@dataclass
class RunResult:
    """How an attempt ended: what `launch up` returns and the closing line is made of."""
    state: RunState
    exit_code: int
    seconds: float = 0.0
    global_step: int | None = None
    images_per_sec: float | None = None
    loss: float | None = None
    restarts: int = 0
    failures: list[Failure] = field(default_factory=list)
    recoveries: list[MendedFault] = field(default_factory=list)     # every fault mended in this `launch up`
    started: float = 0.0                # epoch seconds
    ended: float = 0.0
    rehearsal: Rehearsal | None = None      # a rehearsal's findings (launch up --rehearse)
    preemptions: int = 0                # preemption notices in this `launch up` (not among the restarts)
    dropped_gradients: int | None = None    # sync with backup workers: the gradients computed and not aggregated

    def __post_init__(self) -> None:
        self.state = RunState(self.state)       # a caller's 'done' is the state DONE

    def record(self, run: str, attempt: int, spec: str, backend: str, train_dir: str) -> RunRecord:
        """run.json's record of this result: the attempt's identity added, times as ISO-8601."""
        return RunRecord(state=self.state, exit_code=self.exit_code, seconds=round(self.seconds, 3),
                         global_step=self.global_step, images_per_sec=self.images_per_sec, loss=self.loss,
                         restarts=self.restarts, failures=list(self.failures), recoveries=list(self.recoveries) or None,
                         started=rundir.iso_time(self.started),
                         ended=rundir.iso_time(self.ended), id=run, attempt=attempt, spec=spec, backend=backend,
                         train_dir=train_dir, rehearsal=self.rehearsal, preemptions=self.preemptions or None,
                         dropped_gradients=self.dropped_gradients)

    def to_json(self, run: str, attempt: int, spec: str, backend: str, train_dir: str) -> dict[str, Any]:
        """run.json: the fields `launch status --json` and `launch list --json` agree with."""
        return self.record(run, attempt, spec, backend, train_dir).to_json()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunResult:
        """The result a run.json holds (its run's identity is RunRecord's to read)."""
        return RunRecord.from_json(data).result()


def steps_note(reached: int, asked: int | None, saved: int | None) -> str:
    """' (100 asked; last checkpoint at step 108)' where the step `reached` differs from what was
    asked or saved; '' where all agree (a sync run) or nothing is known to compare (no checkpoint
    in the train_dir: a user's program may keep its own elsewhere)."""
    parts = []
    if asked is not None and asked != reached:
        parts.append(f'{asked} asked')
    if saved is not None and saved != reached:
        parts.append(f'last checkpoint at step {saved}')
    return f' ({"; ".join(parts)})' if parts else ''
