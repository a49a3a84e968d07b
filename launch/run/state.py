"""The launcher's state file (`<train_dir>/launch-state.json`): which processes a `launch up` of a
spec started, so `launch status`, `launch logs` and `launch down` can find them from another shell."""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar
from collections.abc import Mapping

from cluster.runtime import runjson
from cluster.runtime.rundir import write_atomically
from launch.backends.base import TaskRecord
from launch.errors import LaunchError


FORMAT = 2      # of the state file; one without it (or another) is refused, never half-read


class StateError(LaunchError):
    """A state file this version cannot read: one line naming it and what to do (exit code 2)."""


@dataclass(frozen=True)
class StepSeen:
    """The newest global step the launcher saw, for `launch status`."""
    global_step: int | None
    steps: int | None               # train.steps: the step the training ends at
    at: float | None                # epoch seconds: when the step was seen

    def to_json(self) -> dict[str, Any]:
        return {'global_step': self.global_step, 'steps': self.steps, 'at': self.at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepSeen:
        return cls(global_step=data.get('global_step'), steps=data.get('steps'), at=data.get('at'))


@dataclass(frozen=True)
class WorkerPool:
    """The workers of the run: the pool the spec names, those running, and a `launch scale` under way."""
    pool: int | None                # the spec's worker count
    live: list[int]                 # the indices of the workers that run
    scaling: int | None = None      # the worker count a `launch scale` asked for, while it is carried out

    def to_json(self) -> dict[str, Any]:
        return {'pool': self.pool, 'live': list(self.live), 'scaling': self.scaling}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerPool:
        return cls(pool=data.get('pool'), live=list(data.get('live') or []), scaling=data.get('scaling'))


Entry = TypeVar('Entry', StepSeen, WorkerPool)


def _entry(cls: type[Entry], value: Any) -> Entry | None:
    """An entry of the state file as its dataclass (null stays None); TypeError if it is not an object."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f'{cls.__name__}: not an object: {runjson.short(repr(value), 40)}')
    return _checked(cls.from_json(value))


# The plain types a field of the state file is declared with, as written (annotations are text here).
_PLAIN = {'str': (str,), 'int': (int,), 'float': (int, float)}


def _checked(record: Any) -> Any:
    """`record` if each of its fields declared `str`, `int` or `float` (or one of them `| None`)
    holds one; TypeError naming the field if not: a later `time.time() - at` must not be the
    place a damaged file is found."""
    for f in dataclasses.fields(record):
        declared = str(f.type)
        plain = _PLAIN.get(declared.removesuffix(' | None'))
        value = getattr(record, f.name)
        if plain is None or value is None and declared.endswith(' | None'):
            continue
        if not isinstance(value, plain) or isinstance(value, bool):
            raise TypeError(f'{type(record).__name__}.{f.name}: not {declared}: {runjson.short(repr(value), 40)}')
    return record


@dataclass
class LaunchState:
    spec: str
    launcher_pid: int
    launcher_ident: str
    started: float
    tasks: list[TaskRecord] = field(default_factory=list)
    progress: StepSeen | None = None
    restarts: int = 0
    workers: WorkerPool | None = None
    preemptions: int = 0        # preemption notices so far (none among the restarts)
    standbys: list[dict[str, Any]] = field(default_factory=list)   # warm standbys: {host, pid, state}

    def fingerprint(self) -> tuple:
        """What save() writes, cheap to compare: equal while the file would say the same (a step's
        time goes with its step)."""
        return (tuple((t.name, t.pid, t.ident, t.host, t.port, t.log, t.log_offset, t.address) for t in self.tasks),
                None if self.progress is None else (self.progress.global_step, self.progress.steps),
                self.restarts, self.workers, self.preemptions,
                tuple((s.get('host'), s.get('pid'), s.get('state')) for s in self.standbys))

    def save(self, path: str) -> None:
        """Write the state file (whole: a reader never sees half of it)."""
        os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
        data = {'format': FORMAT, 'spec': self.spec, 'launcher_pid': self.launcher_pid, 'launcher_ident': self.launcher_ident,
                'started': self.started, 'tasks': [t.to_dict() for t in self.tasks],
                'progress': None if self.progress is None else self.progress.to_json(), 'restarts': self.restarts,
                'workers': None if self.workers is None else self.workers.to_json(), 'preemptions': self.preemptions,
                'standbys': self.standbys}
        write_atomically(path, runjson.dumps(data, indent=1))

    @classmethod
    def load(cls, path: str) -> LaunchState | None:
        try:
            with open(path, 'rb') as f:
                text = runjson.read_bytes(f)
            if text is None:
                raise ValueError(runjson.OVER)
            data = runjson.loads(text.decode('utf-8'))      # bounded: a hostile file is damaged, not a traceback
        except FileNotFoundError:
            return None
        except ValueError as e:     # UnicodeDecodeError included
            raise StateError(f'{path}: not a state file tfcluster can read ({e}); if tasks of that run still '
                             'live, stop them by hand, then remove the file') from None
        except OSError as e:
            raise StateError(f'{path}: cannot read the state file: {e.strerror}') from None
        if not isinstance(data, dict) or data.get('format') != FORMAT:
            found = runjson.short(str(data.get('format', 'none')), 40) if isinstance(data, dict) else 'none'
            listed: list[Any] = data['tasks'] if isinstance(data, dict) and isinstance(data.get('tasks'), list) else []
            pids = sorted({t['pid'] for t in listed if isinstance(t, dict) and isinstance(t.get('pid'), int)
                           and t['pid']})
            hint = f' (it names pids {", ".join(map(str, pids))})' if pids else ''
            raise StateError(f'{path}: state file of another tfcluster version (format {found}, this one reads '
                             f'{FORMAT}); if tasks of that run still live{hint}, stop them with the version that '
                             'started them or by hand, then remove the file')
        try:
            tasks = [_checked(TaskRecord.from_dict(t)) for t in data.pop('tasks', [])]
            progress = _entry(StepSeen, data.pop('progress', None))
            workers = _entry(WorkerPool, data.pop('workers', None))
            standbys = [s for s in data.pop('standbys', None) or [] if isinstance(s, dict)]
            known = set(cls.__dataclass_fields__)
            return _checked(cls(tasks=tasks, progress=progress, workers=workers, standbys=standbys,
                                **{k: v for k, v in data.items() if k in known}))
        except (TypeError, KeyError, AttributeError) as e:
            raise StateError(f'{path}: damaged state file ({type(e).__name__}: {e}); if tasks of that run '
                             'still live, stop them by hand, then remove the file') from None

    @staticmethod
    def new(spec_path: str, launcher_ident: str) -> LaunchState:
        return LaunchState(spec=spec_path, launcher_pid=os.getpid(), launcher_ident=launcher_ident,
                           started=time.time())
