"""Whose a train_dir is: `launch up` writes into a directory only when it is tfcluster's.

A launcher overwrites run.json, spec.yaml and report.html, removes an earlier run's worker-N.json,
appends to events.jsonl, and its chief resumes from whatever `checkpoint` names: in a directory
of someone else's files (another program's checkpoints and summaries, a project folder) that is
lost work, or a run that trains on from a stranger's model. So a train_dir is tfcluster's, or it
is refused before anything is touched:

  - it does not exist, or is empty;
  - it holds a run tfcluster started: events.jsonl with an event of tfcluster's (the launcher
    writes `run_started` first, at every `launch up`), or run.json with tfcluster's record of an
    attempt, or launch-state.json naming a launcher. Everything else in such a directory is the
    run's (checkpoints, task logs, summaries, the synthetic data set, what a user's program
    wrote), since only that run's tasks write there;
  - it holds only what a launcher writes before its first event (its lock file, the synthetic
    data set): a `launch up` that ended before it began; and a rehearsal's run (`launch up
    --rehearse`, in `rehearsal/`), itself marked as tfcluster's: the real run is started after it.

The markers are read, not trusted: a line or file that is not tfcluster's format (or too big to
be) marks nothing, and reading never fails with more than a directory that is not marked.
"""
from __future__ import annotations

import json
import os

from cluster.runtime import contract, rundir
from cluster.spec import ClusterSpec
from launch.records.event_types import EventKind
from launch.records.result import RESULT_STATES

BEFORE_FIRST_EVENT = frozenset({rundir.LOCK_FILE, rundir.SYNTHETIC_DATA_DIR})
MARKER_LINES = 64                       # events.jsonl lines read for a marker (the first is `run_started`)
MARKER_BYTES = 1 << 20                  # a line, or run.json or the state file, longer than this marks nothing

_EVENTS = frozenset(kind.value for kind in EventKind)
_STATES = frozenset(state.value for state in RESULT_STATES)


def foreign_files(train_dir: str) -> list[str]:
    """The names of train_dir's entries that show it is not tfcluster's (sorted), or [] when it
    is: missing, empty, marked as a tfcluster run, or holding only what a launcher writes before
    its first event."""
    try:
        names = os.listdir(train_dir)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        return [os.path.basename(train_dir)]
    if is_marked(train_dir):
        return []
    return sorted(n for n in names if n not in BEFORE_FIRST_EVENT and not _empty_events(train_dir, n)
                  and not _rehearsal(train_dir, n))


def _rehearsal(train_dir: str, name: str) -> bool:
    """`name` is the rehearsal's run of this train_dir (a folder marked as a tfcluster run)."""
    path = os.path.join(train_dir, name)
    return name == rundir.REHEARSAL_DIR and os.path.isdir(path) and is_marked(path)


def check_train_dir(spec: ClusterSpec) -> None:
    """The spec's train_dir can be a run's: a directory (or none yet, under a directory) that is
    tfcluster's; else the SpecError `launch up` and `launch check` end with. Reads only."""
    path = spec.train.train_dir
    if os.path.exists(path) and not os.path.isdir(path):
        raise spec.error('train.train_dir', f'{path} exists and is not a directory')
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise spec.error('train.train_dir', f'{path}: {parent} is not a directory')
    try:
        foreign = foreign_files(path)
    except OSError as e:
        raise spec.error('train.train_dir', f'cannot read {path}: {e.strerror}') from None
    if foreign:
        raise spec.error('train.train_dir', refusal(path, foreign))


def is_marked(train_dir: str) -> bool:
    """Whether train_dir holds a run tfcluster started (see the module's docstring)."""
    return (_has_event(rundir.events_path(train_dir)) or _is_run_record(_read_json(rundir.run_path(train_dir)))
            or _is_state(_read_json(rundir.state_path(train_dir))))


def refusal(train_dir: str, names: list[str]) -> str:
    """The one line `launch up` ends with on a train_dir of someone else's files."""
    shown = ', '.join(names[:3]) + (f' and {len(names) - 3} more' if len(names) > 3 else '')
    return (f'{train_dir} holds files tfcluster did not write ({shown}), so it is not a run of tfcluster; '
            'nothing there was touched: name a new or empty directory (--set train.train_dir=DIR), '
            'or move those files out of it')


def written_by_task(path: str) -> bool:
    """Whether `path` holds closing figures a task of tfcluster wrote (worker-N.json,
    chief.json: a JSON object naming its task): the only kind of earlier file a launcher removes
    (Lifecycle.up), so it cannot pass for the new run's."""
    record = _read_json(path)
    if not isinstance(record, dict) or not isinstance(record.get('task'), str):
        return False
    try:
        contract.TaskName.parse(record['task'])
    except ValueError:
        return False
    return True


def _empty_events(train_dir: str, name: str) -> bool:
    """An empty events.jsonl: a launcher killed as it wrote its first event."""
    path = os.path.join(train_dir, name)
    return name == rundir.EVENTS_FILE and os.path.isfile(path) and os.path.getsize(path) == 0


def _has_event(path: str) -> bool:
    """Whether one of the first lines of `path` is an event of tfcluster's event log."""
    try:
        f = open(path, 'rb')
    except OSError:
        return False
    with f:
        for _ in range(MARKER_LINES):
            line = f.readline(MARKER_BYTES + 1)
            if not line:
                return False
            if len(line) > MARKER_BYTES:        # it marks nothing: skip the rest of it, a piece at a time
                while line and not line.endswith(b'\n'):
                    line = f.readline(MARKER_BYTES)
                continue
            if _is_event(_loads(line)):
                return True
    return False


def _is_event(event: object) -> bool:
    return (isinstance(event, dict) and event.get('event') in _EVENTS and isinstance(event.get('run'), str)
            and bool(event['run']) and isinstance(event.get('attempt'), int) and isinstance(event.get('time'), str))


def _is_run_record(record: object) -> bool:
    return (isinstance(record, dict) and isinstance(record.get('id'), str) and bool(record['id'])
            and isinstance(record.get('attempt'), int) and record.get('state') in _STATES)


def _is_state(state: object) -> bool:
    """A state file of any version (an older one is refused later, with what to do about its tasks)."""
    return isinstance(state, dict) and isinstance(state.get('launcher_pid'), int) and isinstance(state.get('tasks'), list)


def _read_json(path: str) -> object:
    try:
        with open(path, 'rb') as f:
            return _loads(f.read(MARKER_BYTES + 1))
    except OSError:
        return None


def _loads(data: bytes) -> object:
    if len(data) > MARKER_BYTES:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None
