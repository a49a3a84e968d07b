"""What happened in a run, read from its records for `launch report`: the events in time order,
the attempts (when, from which step, how far, how each ended), each task's life within an attempt
(a bar of the timeline), the marks on the timeline and the numbered faults.

Built from `events.jsonl`, `run.json` and `spec.yaml` only; drawing is launch/records/plots.py's,
the page launch/records/report.py's.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
from dataclasses import dataclass, field
from collections.abc import Iterable

from cluster.runtime import rundir
from launch.records.event_types import (Checkpoint, DiskFull, Event, Failover, Finished, FirstStep, Interrupted, Moved,
                                        Preempted, Progress, Restart, RunStarted, Scale, Serving, Stall, TaskLost, TaskStarted, Tolerated)
from launch.records.events import typed_events, typed_run_record
from launch.records.result import RunRecord, RunState

log = logging.getLogger(__name__)

RUN_ROW = 'run'


# -- reading the run ---------------------------------------------------------------------------------
@dataclass
class Run:
    """Everything the page shows, read once; events sorted by time, each with a readable time."""
    train_dir: str
    events: list[Event]
    result: RunRecord           # run.json, else the last `finished` event's result, else an empty one
    result_source: str          # where `result` came from, for the page to say
    spec_text: str | None
    tz: datetime.tzinfo


def load(train_dir: str) -> Run:
    events = _timed(typed_events(rundir.events_path(train_dir)), rundir.events_path(train_dir))
    result, source = typed_run_record(rundir.run_path(train_dir)), 'run.json'
    if result.is_empty():
        finished = [e.result for e in events if isinstance(e, Finished) and e.result is not None]
        result, source = (finished[-1], 'the last finished event') if finished else (result, '')
    tz = (datetime.datetime.fromisoformat(events[0].time).tzinfo if events else None) or _local_tz()
    return Run(train_dir, events, result, source, rundir.read_text(rundir.spec_path(train_dir)), tz)


def _timed(events: Iterable[Event], path: str) -> list[Event]:
    """The events with a readable time, in time order: a hand-edited or foreign line without one
    cannot be placed on a time axis, so it is left out (one warning, as for a torn line; a line
    whose attempt is no number is one typed_events skipped already)."""
    out, bad = [], 0
    for event in events:
        try:
            event.epoch         # noqa: B018 (a time that does not parse raises here)
        except ValueError:
            bad += 1
            continue
        out.append(event)
    if bad:
        log.warning('%s: left out %d event(s) without a readable time', path, bad)
    out.sort(key=lambda e: e.epoch)       # stable: events of one instant keep the order they were written in
    return out


def _local_tz() -> datetime.tzinfo:
    tz = datetime.datetime.now().astimezone().tzinfo
    assert tz is not None
    return tz


# -- the attempts ------------------------------------------------------------------------------------
@dataclass
class Attempt:
    number: int
    start: float
    end: float
    ended: str = 'no end recorded'
    step: int | None = None
    resumed_from: int | None = None
    lost: list[str] = field(default_factory=list)


def attempts(run: Run) -> list[Attempt]:
    """One row per attempt: when, from which step, how far, and how it ended."""
    out: dict[int, Attempt] = {}
    resume = None
    for e in run.events:
        a = out.get(e.attempt)
        if a is None:
            a = out[e.attempt] = Attempt(e.attempt, e.epoch, e.epoch, resumed_from=resume)
        a.end = e.epoch
        resume = _account(a, e, resume)
    if out:
        last = out[max(out)]
        if last.ended == 'no end recorded':
            last.ended = 'no end recorded yet (still running, or its launcher was killed)'
    return [out[n] for n in sorted(out)]


def _account(a: Attempt, e: Event, resume: int | None) -> int | None:
    """Fold one event into its attempt; returns the step the next attempt resumes from."""
    if isinstance(e, (FirstStep, Progress, Checkpoint)) and e.step is not None:
        a.step = max(a.step or 0, e.step)
    elif isinstance(e, RunStarted):
        a.resumed_from = e.resumes_from
    elif isinstance(e, TaskLost):
        a.lost.append(e.task or '?')
    elif isinstance(e, Restart) and not e.tasks:
        a.ended = f'restarted: {_or(e.cause)}'
        return e.from_step
    elif isinstance(e, Interrupted):
        a.ended = f'interrupted by {e.signal or "a signal"}'
    elif isinstance(e, Finished):
        if a.step is None and e.result is not None:     # no step seen in lines: how far its result says
            a.step = e.result.global_step
        if not a.ended.startswith('interrupted'):
            a.ended = _how_finished(e.result)
    return resume


def _how_finished(result: RunRecord | None) -> str:
    if result is None:
        return 'finished'
    state, code = result.state if result.has('state') else '?', result.exit_code
    causes = [f.cause for f in result.failures or () if f.cause]
    text = f'finished: {state}' + (f' (exit code {code})' if code not in (0, None) else '')
    return text + (f': {causes[0]}' if causes else '')


def _or(text: str | None, default: str = '?') -> str:
    return default if text is None else text


# -- the timeline's content: task segments, marks and faults ------------------------------------------
@dataclass
class Segment:
    """One task's life within one attempt: a bar on the timeline."""
    task: str
    attempt: int
    start: float
    serving: float | None = None
    end: float | None = None


@dataclass(frozen=True)
class Fault:
    """Something that went wrong, numbered F1.. on the page: when, in which attempt, on which row
    of the timeline (a task, or the run's), what, and the task's last Python error if known."""
    t: float
    attempt: int
    row: str
    text: str
    error: str | None = None


@dataclass
class Story:
    """The timeline's content: rows top to bottom, bars, marks (row, time, kind) and numbered faults."""
    rows: list[str]
    segments: list[Segment]
    marks: list[tuple[str, float, str]]
    faults: list[Fault]
    stalled: set[str] = field(default_factory=set)      # the tasks a stall named


def story(run: Run) -> Story:
    """Walk the events once, opening a task's bar when it starts and closing it when it is lost,
    the cluster restarts or the attempt ends."""
    walk = _Walk({a.number: a.end for a in attempts(run)})
    attempt = None
    for e in run.events:
        if e.attempt != attempt:    # only a change of attempt can end a bar: each look is O(tasks)
            walk.close_older(attempt := e.attempt)
        walk.see(e)
    walk.close_older(None)
    tasks = sorted({s.task for s in walk.segments} | {m[0] for m in walk.marks if m[0] != RUN_ROW}, key=task_order)
    return Story([RUN_ROW] + tasks, walk.segments, walk.marks, walk.faults, walk.stalled)


class _Walk:
    """The walk of story(): the open bars (`live`, by task) and what has been found so far."""

    def __init__(self, attempt_end: dict[int, float]) -> None:
        self.attempt_end = attempt_end
        self.live: dict[str, Segment] = {}
        self.seen: set[str] = set()         # tasks started before: their next start is a restart
        self.segments: list[Segment] = []
        self.marks: list[tuple[str, float, str]] = []
        self.faults: list[Fault] = []
        self.stalled: set[str] = set()

    def close_older(self, attempt: int | None) -> None:
        """End the bars of attempts before `attempt` (None: all) where their attempt ended: the
        attempt ended with no word of the task."""
        for task, seg in list(self.live.items()):
            if attempt is None or seg.attempt < attempt:
                seg.end = self.attempt_end[seg.attempt]
                del self.live[task]

    def see(self, e: Event) -> None:
        t, task, mark = e.epoch, getattr(e, 'task', None) or '', self.marks.append
        if isinstance(e, RunStarted) and self.seen:
            # A new `launch up` of the run (a manual resume): its tasks start, nothing restarts them.
            self.seen.clear()
            mark((RUN_ROW, t, 'resumed'))
        elif isinstance(e, TaskStarted):
            self._start(task, e.attempt, t)
        elif isinstance(e, Serving) and task in self.live and self.live[task].serving is None:
            self.live[task].serving = t
            mark((task, t, 'serving'))
        elif isinstance(e, (FirstStep, Checkpoint)):
            mark((RUN_ROW, t, e.name))
        elif isinstance(e, TaskLost):
            self._end(task, t)
            mark((task, t, 'lost'))
            if not self._joined(e):
                self._fault(e, task, lost_text(e), e.error)
        elif isinstance(e, Tolerated):
            mark((task, t, 'tolerated'))
        elif isinstance(e, Stall):
            mark((RUN_ROW, t, 'stall'))
            self.stalled.update(e.tasks or ())
            tasks = ', '.join(e.tasks or ())
            self._fault(e, RUN_ROW, f'stall{" of " + tasks if tasks else ""}: {_or(e.cause)}')
        elif isinstance(e, Scale):
            mark((RUN_ROW, t, 'scale'))
        elif isinstance(e, Failover):
            mark((task, t, 'failover'))
            self._fault(e, task, f'{task}\'s host could not be reached: {_or(e.to)} started in its place')
        elif isinstance(e, Moved):
            mark((task, t, 'moved'))
        elif isinstance(e, Preempted):     # no fault: the restart that follows shows as its own
            mark((task, t, 'preempted'))
        elif isinstance(e, DiskFull):
            mark((RUN_ROW, t, 'disk full'))
            self._fault(e, RUN_ROW, f'the disk under {_or(e.path)} is full: {_or(e.cause)}')
        elif isinstance(e, Interrupted):      # the user's stop, not a fault: the attempts say how it ended
            mark((RUN_ROW, t, 'interrupted'))
        elif isinstance(e, Restart) and not e.tasks:       # a task's own restart shows as its new start
            mark((RUN_ROW, t, 'restart'))
            self._stop_all(t)
        elif isinstance(e, Finished):
            state = e.result.state if e.result is not None else None
            mark((RUN_ROW, t, str(state) if state in (RunState.DONE, RunState.FAILED) else 'ended'))
            self._stop_all(t)

    def _start(self, task: str, attempt: int, t: float) -> None:
        self._end(task, t)
        self.live[task] = Segment(task, attempt, t)
        self.segments.append(self.live[task])
        self.marks.append((task, t, 'restarted' if task in self.seen else 'started'))
        self.seen.add(task)

    def _end(self, task: str, t: float) -> None:
        if task in self.live:
            self.live.pop(task).end = t

    def _stop_all(self, t: float) -> None:
        for task, seg in list(self.live.items()):
            seg.end = t
            self.marks.append((task, t, 'stopped'))
        self.live.clear()

    def _fault(self, e: Event, row: str, text: str, error: str | None = None) -> None:
        self.faults.append(Fault(e.epoch, e.attempt, row, text, error))

    def _joined(self, e: TaskLost) -> bool:
        """A task lost because of another (`after`: a chief that ended with its ps) joins that
        task's fault of the same attempt: '(then worker:0 exited with code 1)'; its error stands
        in for the cause's when that has none (a ps killed says nothing)."""
        found = next((i for i in range(len(self.faults) - 1, -1, -1) if self.faults[i].row == e.after
                      and self.faults[i].attempt == e.attempt), None) if e.after else None
        if found is None:
            return False
        f = self.faults[found]
        text = f.text[:-1] + f', {lost_text(e)})' if f.text.endswith(')') and ' (then ' in f.text \
            else f'{f.text} (then {lost_text(e)})'
        error = f.error or (f'{e.task}: {e.error}' if e.error else None)
        self.faults[found] = dataclasses.replace(f, text=text, error=error)
        return True


# -- a large run's timeline: the quiet tasks of a job on one row -------------------------------------
COLLAPSE_ABOVE = 40     # task rows: a timeline with more shows each job's quiet tasks as one row
LOUD_MARKS = ('lost', 'tolerated', 'failover')


def collapsed(tale: Story, above: int = COLLAPSE_ABOVE) -> Story:
    """The story as a large run's timeline shows it: above `above` task rows, the tasks with
    nothing to say (no fault, no restart of their own, not named by a stall) of each job on one
    row, 'worker ×978', its bars from their first start to their last end in each attempt; every
    other task keeps its own row. 1,000 rows cannot be read, nor drawn in a second."""
    if len(tale.rows) - 1 <= above:
        return tale
    loud = _loud(tale)
    jobs: dict[str, list[str]] = {}
    for task in tale.rows[1:]:
        jobs.setdefault(task.partition(':')[0], []).append(task)
    rows, segments, marks = [RUN_ROW], [s for s in tale.segments if s.task in loud], \
        [m for m in tale.marks if m[0] == RUN_ROW or m[0] in loud]
    for job, tasks in jobs.items():
        quiet = [t for t in tasks if t not in loud]
        if len(quiet) > 1:
            row = f'{job} \u00d7{len(quiet)}'
            rows.append(row)
            merged = _merged(row, [s for s in tale.segments if s.task in set(quiet)])
            segments += merged
            marks += _group_marks(row, merged, [m[1] for m in tale.marks if m[2] == 'stopped' and m[0] in set(quiet)])
        rows += [t for t in tasks if t in loud or len(quiet) == 1]
    return Story(rows, segments, marks, tale.faults, tale.stalled)


def _loud(tale: Story) -> set[str]:
    """The tasks with something to say: a fault on their row, a loss, named by a stall, or
    started twice in one attempt (their own restart; a cluster's restart is every task's)."""
    starts: dict[tuple[str, int], int] = {}
    for seg in tale.segments:
        starts[seg.task, seg.attempt] = starts.get((seg.task, seg.attempt), 0) + 1
    return ({f.row for f in tale.faults} | {m[0] for m in tale.marks if m[2] in LOUD_MARKS} | tale.stalled
            | {task for (task, _), n in starts.items() if n > 1}) - {RUN_ROW}


def _merged(row: str, segments: list[Segment]) -> list[Segment]:
    """One bar per attempt for a row of tasks: from the first start to the last end, serving
    once the last of them served."""
    by_attempt: dict[int, list[Segment]] = {}
    for seg in segments:
        by_attempt.setdefault(seg.attempt, []).append(seg)
    out = []
    for attempt, segs in sorted(by_attempt.items()):
        ends, serving = [s.end for s in segs], [s.serving for s in segs]
        out.append(Segment(row, attempt, min(s.start for s in segs),
                           None if None in serving else max(t for t in serving if t is not None),
                           None if None in ends else max(t for t in ends if t is not None)))
    return out


def _group_marks(row: str, merged: list[Segment], stopped: list[float]) -> list[tuple[str, float, str]]:
    """A group row's marks: each bar's start (a restart after the first), the last serving, and
    the stop where its tasks were stopped."""
    out = []
    for n, seg in enumerate(merged):
        out.append((row, seg.start, 'restarted' if n else 'started'))
        if seg.serving is not None:
            out.append((row, seg.serving, 'serving'))
        if seg.end is not None and any(seg.start <= t <= seg.end for t in stopped):
            out.append((row, seg.end, 'stopped'))
    return out


def lost_text(e: TaskLost) -> str:
    """The cause as the supervisor said it, with the signal or exit code when it does not say them."""
    cause = e.cause or f'{e.task or "?"} lost'
    if e.signal:
        return cause if e.signal in cause else f'{cause} ({e.signal})'
    code = e.exit_code
    return cause if code is None or f'code {code}' in cause else f'{cause} (exit code {code})'


def task_order(name: str) -> tuple[int, str, int, str]:
    """ps tasks first, then the chief, then workers, each by index: the order of a spec's cluster."""
    try:
        job, index = rundir.parse_task_name(name)
    except ValueError:
        job, index = name.partition(':')[0], 0
    return {'ps': 0, 'chief': 1, 'worker': 2}.get(job, 3), job, index, name.partition(':')[2]
