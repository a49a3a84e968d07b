"""The user's index of runs: one small record per run `launch up` started, whatever its train_dir,
so that a run id works from any directory and `launch list` shows the user's runs, as `ray job
list` or `sacct` know a user's jobs.

A run's files stay in its train_dir (launch/records/runs.py reads them); the index only says where
each run is: `<state dir>/runs/<id>.<hash of train_dir>.json`, holding the id, the train_dir, the
spec file and when the run was recorded. The state directory is $TFCLUSTER_STATE_DIR, else
$XDG_STATE_HOME/tfcluster, else ~/.local/state/tfcluster. Records are written atomically and once
per (id, train_dir): a resumed run keeps its record. They are read, never trusted: a train_dir
that is gone, or that holds another run now, makes a record stale, and the readers say so
instead of failing. An index that cannot be written costs a warning, never the run.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass

from cluster.runtime import runjson
from cluster.runtime.rundir import write_atomically

log = logging.getLogger(__name__)

STATE_ENV = 'TFCLUSTER_STATE_DIR'       # where the index lies (tests point it at a temporary directory)
RUNS_DIR = 'runs'
RECORD_BYTES = 64 * 1024                # a record longer than this is not one of ours: skipped
_UNSAFE = re.compile(r'[^A-Za-z0-9._-]')


def state_dir() -> str:
    """The user's state directory of tfcluster (XDG Base Directory: state that outlives a run)."""
    given = os.environ.get(STATE_ENV)
    if given:
        return os.path.abspath(os.path.expanduser(given))
    xdg = os.environ.get('XDG_STATE_HOME', '')
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser('~'), '.local', 'state')
    return os.path.join(base, 'tfcluster')


def runs_dir() -> str:
    return os.path.join(state_dir(), RUNS_DIR)


@dataclass(frozen=True)
class Entry:
    """One run in the index: its id, and where it was started from and into (absolute paths)."""
    id: str
    train_dir: str
    spec: str = ''
    recorded: str = ''      # when `launch up` recorded it: ISO-8601 with the UTC offset

    def to_json(self) -> dict[str, str]:
        return {'id': self.id, 'train_dir': self.train_dir, 'spec': self.spec, 'recorded': self.recorded}

    @staticmethod
    def from_json(data: object) -> Entry | None:
        """The entry of a record's JSON, or None when it is not one (a damaged or foreign file)."""
        if not isinstance(data, dict):
            return None
        run_id, train_dir = data.get('id'), data.get('train_dir')
        if not (isinstance(run_id, str) and run_id and isinstance(train_dir, str) and os.path.isabs(train_dir)):
            return None
        spec, recorded = data.get('spec'), data.get('recorded')
        return Entry(run_id, train_dir, spec if isinstance(spec, str) else '',
                     recorded if isinstance(recorded, str) else '')


def _file_name(run_id: str, train_dir: str) -> str:
    """`<id>.<hash>.json`: the id readable (characters a file name cannot hold replaced), the hash
    of the train_dir telling apart two runs of one id (a copied train_dir resumed elsewhere)."""
    digest = hashlib.sha256(train_dir.encode('utf-8', 'surrogateescape')).hexdigest()[:16]
    return f'{_UNSAFE.sub("_", run_id)[:100]}.{digest}.json'


def remember(run_id: str, train_dir: str, spec: str) -> str | None:
    """Record the run (once: a record of the same id and train_dir is kept as it is); the
    record's path, or None when the index cannot be written (a warning says why)."""
    train_dir = os.path.abspath(train_dir)
    directory = runs_dir()
    path = os.path.join(directory, _file_name(run_id, train_dir))
    if os.path.isfile(path):
        return path
    now = datetime.datetime.now().astimezone().isoformat(timespec='seconds')
    entry = Entry(run_id, train_dir, os.path.abspath(spec) if spec else '', now)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        write_atomically(path, runjson.dumps(entry.to_json(), indent=1) + '\n')
    except OSError as e:
        log.warning('cannot record run %s in %s (%s): `launch list` and its id from other directories will '
                    'not know it; set %s to a writable directory', run_id, directory, e.strerror or e, STATE_ENV)
        return None
    return path


def entries(run_id: str | None = None) -> list[Entry]:
    """The index's entries (only those of `run_id` when given), oldest record first; an
    unreadable index is empty, a damaged record is skipped."""
    directory = runs_dir()
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    prefix = None if run_id is None else _UNSAFE.sub('_', run_id)[:100] + '.'
    found = []
    for name in names:
        if not name.endswith('.json') or (prefix is not None and not name.startswith(prefix)):
            continue
        entry = _read(os.path.join(directory, name))
        if entry is not None and (run_id is None or entry.id == run_id):
            found.append(entry)
    return sorted(found, key=lambda e: (e.recorded, e.id, e.train_dir))


def _read(path: str) -> Entry | None:
    try:
        with open(path, 'rb') as f:
            data = f.read(RECORD_BYTES + 1)
    except OSError as e:
        log.debug('%s: not read (%s)', path, e.strerror or e)
        return None
    if len(data) > RECORD_BYTES:
        return None
    try:
        return Entry.from_json(json.loads(data))
    except (ValueError, RecursionError):
        return None
