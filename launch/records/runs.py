"""Finding runs and describing them: what `launch list` shows, and how `launch status|logs|down|
eval|report|debug` turn a run id or a train_dir into the run's directory: a run id is looked for
under the current directory first, then in the user's index of the runs `launch up` started
(launch/records/index.py), so it works from anywhere.

A run is a train_dir that holds `events.jsonl` (the launcher's event log, launch/records/events.py) or
`run.json` (the result of its latest attempt). Both are read, never trusted for "running": only
a live launcher's lock on the train_dir says that (TrainDirLock.held), since a launcher killed
with SIGKILL leaves every file as it was. Damaged files cost a warning, never a traceback.
"""
from __future__ import annotations

import datetime
import logging
import os
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterator

from cluster.runtime import rundir
from launch.errors import UsageError
from launch.records import index
from launch.records.event_types import Event, Finished, FirstStep, Progress, RunStarted
from launch.records.events import iter_typed_events, typed_events, typed_run_record
from launch.records.result import RESULT_STATES, RunRecord, RunState, read_epoch   # noqa: F401 (re-exported)
from launch.records.lock import TrainDirLock

log = logging.getLogger(__name__)

# Never searched for runs: a run's own output (task logs, checkpoints) and the usual big trees.
# Hidden directories (.git, .venv, ...) are skipped as well, except the root a user names.
SKIP_DIRS = frozenset({'node_modules', '__pycache__', 'site-packages'})
RUN_SKIP_DIRS = frozenset({rundir.LOGS_DIR, 'checkpoints', 'checkpoint', 'ckpt', 'eval', 'telemetry'})


class RunNotFound(UsageError):
    """No run answers to the id or path given: one line, naming where it looked."""


class AmbiguousRun(UsageError):
    """Several runs under the root have the id given (a copied train_dir): name the directory instead."""


@dataclass(frozen=True)
class RunInfo:
    """One run, as `launch list` shows it. Its `to_json()` is one element of `launch list --json`,
    which users' scripts rely on: its keys are fixed (add, never rename):

        id             the run's id, e.g. "local2-20261123-210843" (spec file's stem, first `up`'s local time)
        train_dir      the run's directory, absolute
        spec           the spec file the run was started from (absolute path, as the launcher saw it), or ""
        backend        "local", "ssh", "compose", "slurm", ... or "" if not recorded
        state          "running" (a live launcher holds the train_dir's lock), "done", "failed",
                       "interrupted", "scaled" (the latest attempt's result), or "unknown" (the latest
                       attempt left no result: its launcher was killed, or the files are damaged)
        global_step    the newest global step known (run.json, else the newest progress event), or null
        attempts       the highest attempt number seen (1, 2, ...; 0 if none is recorded)
        started        when the run's first attempt started: ISO-8601 with the UTC offset, or ""
        duration_secs  seconds from `started` to the latest attempt's end (to now while running), or null
        exit_code      the latest attempt's exit code (null while running or when unknown)
    """
    id: str
    train_dir: str
    spec: str
    backend: str
    state: RunState
    global_step: int | None
    attempts: int
    started: str
    duration_secs: float | None
    exit_code: int | None

    def to_json(self) -> dict[str, Any]:
        return {'id': self.id, 'train_dir': self.train_dir, 'spec': self.spec, 'backend': self.backend,
                'state': str(self.state), 'global_step': self.global_step, 'attempts': self.attempts,
                'started': self.started, 'duration_secs': self.duration_secs, 'exit_code': self.exit_code}


# -- one run ------------------------------------------------------------------------------------
def holds_run(directory: str) -> bool:
    return os.path.isfile(rundir.events_path(directory)) or os.path.isfile(rundir.run_path(directory))


def describe(train_dir: str) -> RunInfo | None:
    """The run in `train_dir`, or None if it holds none (neither events.jsonl nor run.json).

    Where run.json and the events disagree, run.json wins for the result (state, step, exit code,
    end) and the events for attempts and the start: run.json is rewritten at every attempt's end
    and so knows only the latest, the events keep the whole story. A run.json older than the
    newest attempt in the events (a launcher killed before it could write one) no longer says how
    the run stands: the state is then "unknown" unless a live launcher holds the lock."""
    train_dir = os.path.abspath(train_dir)
    if not holds_run(train_dir):
        return None
    events = _events(train_dir)
    record = typed_run_record(rundir.run_path(train_dir))
    started_event = next((e for e in events if isinstance(e, RunStarted)), RunStarted())
    attempts = max([e.attempt for e in events] + [record.attempt or 0])
    run_id = started_event.run or next((e.run for e in events if e.run), '') or record.id or os.path.basename(train_dir)
    started = (events[0].time if events else '') or record.started or ''

    result, result_attempt = _latest_result(record, events, attempts)
    holder = TrainDirLock.held(train_dir)
    step = _newest_step(events)
    if holder is not None:
        state, exit_code, ended = RunState.RUNNING, None, None
        step = step if step is not None else result.global_step
    elif not result.is_empty() and result_attempt >= attempts and result.state in RESULT_STATES:
        state, exit_code, ended = RunState(result.state), result.exit_code, _epoch(result.ended)
        step = result.global_step if result.global_step is not None else step
    else:       # the latest attempt left no result
        state, exit_code = RunState.UNKNOWN, None
        ended = _epoch(events[-1].time) if events else None
        step = step if step is not None else result.global_step

    start = _epoch(started)
    if start is None:
        duration = None
    elif state == RunState.RUNNING:
        duration = max(0.0, time.time() - start)
    else:
        duration = max(0.0, ended - start) if ended is not None else None
    return RunInfo(id=run_id, train_dir=train_dir, spec=started_event.spec or record.spec or '',
                   backend=started_event.backend or record.backend or '',
                   state=state, global_step=step, attempts=attempts, started=started,
                   duration_secs=None if duration is None else round(duration, 3), exit_code=exit_code)


def _latest_result(record: RunRecord, events: list[Event], attempts: int) -> tuple[RunRecord, int]:
    """The newest attempt's result and that attempt: run.json's, unless a `finished` event is of a
    newer attempt (run.json could not be written). A run.json without an attempt is taken for the
    latest attempt's."""
    result, result_attempt = record, ((record.attempt or attempts) if not record.is_empty() else 0)
    for e in events:
        if isinstance(e, Finished) and e.result is not None:
            if result.is_empty() or e.attempt > result_attempt:
                result, result_attempt = e.result, e.attempt
    return result, result_attempt


def _events(train_dir: str) -> list[Event]:
    path = rundir.events_path(train_dir)
    try:
        return typed_events(path)
    except OSError as e:
        log.warning('%s: cannot read it (%s); skipped', path, e.strerror or e)
        return []


def _newest_step(events: list[Event]) -> int | None:
    """The global step of the newest event that tells one (a resumed attempt may go back a little
    behind the previous attempt's last progress: its checkpoint's step is the truth then)."""
    for e in reversed(events):
        if isinstance(e, (Progress, FirstStep)) and e.step is not None:
            return e.step
        if isinstance(e, Finished) and e.result is not None and e.result.global_step is not None:
            return e.result.global_step
    return None


_epoch = read_epoch    # an ISO-8601 time's epoch seconds, else None


# -- many runs ----------------------------------------------------------------------------------
def run_dirs(root: str = '.', depth: int = 3) -> Iterator[str]:
    """Every directory under root (root itself at depth 0) down to `depth` levels that holds a run,
    absolute, in no useful order. Symbolic links to directories are never followed (no loops, no
    run counted twice); unreadable directories, hidden ones, the usual big trees and a run's own
    logs and checkpoints are not entered."""
    root = os.path.abspath(root)
    todo = [(root, 0)]
    while todo:
        directory, level = todo.pop()
        is_run = holds_run(directory)
        if is_run:
            yield directory
        if level >= depth:
            continue
        try:
            with os.scandir(directory) as entries:
                children = []
                for entry in entries:
                    name = entry.name
                    if name.startswith('.') or name in SKIP_DIRS or (is_run and _run_output(name)):
                        continue
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            children.append(entry.path)
                    except OSError:
                        continue
        except OSError as e:
            log.debug('%s: not searched (%s)', directory, e.strerror or e)
            continue
        todo.extend((child, level + 1) for child in sorted(children, reverse=True))


def _run_output(name: str) -> bool:
    return name in RUN_SKIP_DIRS or name.startswith(rundir.CHECKPOINT_PREFIX) or name.startswith(rundir.attempt_dirname(0)[:-1])


def find_runs(root: str = '.', depth: int = 3) -> list[RunInfo]:
    """The runs under root (see run_dirs), oldest first (a run whose start is unknown, first)."""
    runs = [info for info in map(describe, run_dirs(root, depth)) if info is not None]
    return sorted(runs, key=lambda r: (_epoch(r.started) or 0.0, r.train_dir))


def _quick_id(train_dir: str) -> str:
    """The run's id, reading no further than the first event that names it (events.jsonl of a long
    run is big); run.json's, else the directory's name, as describe() would."""
    try:
        for event in iter_typed_events(rundir.events_path(train_dir)):
            if event.run:
                return event.run
    except OSError:
        pass
    info = describe(train_dir)
    return info.id if info is not None else ''


def resolve(ref: str, root: str = '.', depth: int = 3) -> str:
    """The train_dir (absolute) that `ref` names: a directory holding a run, or the id of the one
    run with that id under root (searched as find_runs does). Raises RunNotFound (one line) when
    there is none, AmbiguousRun when several runs share the id. A spec file is the caller's to try
    first."""
    path = os.path.abspath(ref)
    if os.path.isdir(ref) and holds_run(path):
        return path
    pathlike = os.sep in ref or bool(os.altsep and os.altsep in ref) or ref in ('.', '..')
    if not ref or (pathlike and not os.path.isdir(ref)):
        raise RunNotFound(f'no directory {path} (and no run id has a "/")' if ref else 'no run named (an empty id)')
    where = os.path.abspath(root)
    found = [] if pathlike else [d for d in run_dirs(where, depth) if _quick_id(d) == ref]
    stale: list[index.Entry] = []
    if not found and not pathlike:      # a run started from elsewhere: the user's index knows where
        found, stale = indexed(ref)
    if not found:       # a directory of that name that holds no run is the likelier mistake
        if os.path.isdir(ref):
            raise RunNotFound(f'{path} holds no run (no {rundir.EVENTS_FILE} or {rundir.RUN_FILE})')
        if os.path.lexists(ref):
            raise RunNotFound(f'{path} is neither a run directory nor a run id')
        if stale:
            raise RunNotFound(gone_line(stale[-1]))
        raise RunNotFound(f'no run {ref} under {where}, nor among the runs you started (`launch list` shows them)')
    if len(found) > 1:
        raise AmbiguousRun(f'{len(found)} runs have the id {ref} ({", ".join(sorted(found))}); '
                           'name its train_dir instead')
    return found[0]


def indexed(run_id: str | None = None) -> tuple[list[str], list[index.Entry]]:
    """The train_dirs of the runs in the user's index (of `run_id` only, when given) that are
    still where it says, each once; and the stale entries: their train_dir is gone, or holds
    another run (or none) now."""
    live: list[str] = []
    stale: list[index.Entry] = []
    for entry in index.entries(run_id):
        there = entry.train_dir
        if there not in live and holds_run(there) and _quick_id(there) == entry.id:
            live.append(there)
        elif there not in live:
            stale.append(entry)
    return live, stale


def gone_line(entry: index.Entry) -> str:
    """One line for a run the index knows but whose train_dir no longer holds it."""
    what = 'is gone' if not os.path.lexists(entry.train_dir) else 'no longer holds it'
    return (f'run {entry.id} was started in {entry.train_dir}, which {what} (moved or removed): name its '
            'train_dir where it is now')


def recorded_runs() -> tuple[list[RunInfo], list[index.Entry]]:
    """`launch list` with no DIR: the runs of the user's index that are still where it says,
    oldest first; and the stale entries."""
    live, stale = indexed()
    runs = [info for info in map(describe, live) if info is not None]
    return sorted(runs, key=lambda r: (_epoch(r.started) or 0.0, r.train_dir)), stale


# -- the human listing --------------------------------------------------------------------------
HEADER = ('ID', 'SPEC', 'BACKEND', 'STATE', 'STEP', 'ATTEMPTS', 'STARTED', 'DURATION', 'TRAIN_DIR')


def table(runs: list[RunInfo], root: str = '.', empty: str = '') -> str:
    """`launch list`: a header and one line per run, columns aligned; paths relative to the current
    directory where that is shorter. With no runs, `empty`, else 'no runs under ROOT'."""
    if not runs:
        return empty or f'no runs under {os.path.abspath(root)}'
    rows = [HEADER] + [(r.id, _short(r.spec) or '-', r.backend or '-', r.state,
                        '-' if r.global_step is None else str(r.global_step), str(r.attempts),
                        local_minutes(r.started), duration_text(r.duration_secs), _short(r.train_dir))
                       for r in runs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER) - 1)]
    return '\n'.join('  '.join(cell.ljust(w) for cell, w in zip(row, widths)) + '  ' + row[-1] for row in rows)


def _short(path: str) -> str:
    """The path relative to the current directory if that is shorter."""
    if not path:
        return ''
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return relative if len(relative) < len(path) else path


def local_minutes(started: str) -> str:
    """An ISO time as local time to the minute, e.g. 2026-11-23 21:08; '-' if unknown."""
    moment = _epoch(started)
    if moment is None:
        return started or '-'
    return datetime.datetime.fromtimestamp(moment).strftime('%Y-%m-%d %H:%M')


def duration_text(seconds: float | None) -> str:
    """42s, 1m05s, 2h03m, 3d04h; '-' if unknown."""
    if seconds is None:
        return '-'
    s = int(round(seconds))
    if s < 60:
        return f'{s}s'
    if s < 3600:
        return f'{s // 60}m{s % 60:02d}s'
    if s < 86400:
        return f'{s // 3600}h{s % 3600 // 60:02d}m'
    return f'{s // 86400}d{s % 86400 // 3600:02d}h'
