"""The launcher's state file (`<train_dir>/launch-state.json`): which processes a `launch up` of a
spec started, so `launch status`, `launch logs` and `launch down` can find them from another shell."""
from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass, field

from cluster.runtime.rundir import lock_path, write_atomically
from launch.backends.base import TaskRecord
from launch.errors import LaunchError


FORMAT = 2      # of the state file; one without it (or another) is refused, never half-read


class StateError(LaunchError):
    """A state file this version cannot read: one line naming it and what to do (exit code 2)."""


class LockBusy(Exception):
    """Another launcher holds the train_dir: the message says which."""


@dataclass
class LaunchState:
    spec: str
    launcher_pid: int
    launcher_ident: str
    started: float
    tasks: list[TaskRecord] = field(default_factory=list)
    progress: dict | None = None     # {'global_step', 'steps', 'at' (epoch seconds)}: the newest step seen
    restarts: int = 0
    workers: dict | None = None      # {'pool', 'live' (indices), 'scaling' (the count asked for, or null)}

    def save(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
        data = {'format': FORMAT, 'spec': self.spec, 'launcher_pid': self.launcher_pid, 'launcher_ident': self.launcher_ident,
                'started': self.started, 'tasks': [t.to_dict() for t in self.tasks],
                'progress': self.progress, 'restarts': self.restarts, 'workers': self.workers}
        write_atomically(path, json.dumps(data, indent=1))

    @classmethod
    def load(cls, path: str) -> 'LaunchState | None':
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError) as e:
            raise StateError(f'{path}: not a state file tfcluster can read ({e}); if tasks of that run still '
                             'live, stop them by hand, then remove the file') from None
        except OSError as e:
            raise StateError(f'{path}: cannot read the state file: {e.strerror}') from None
        if not isinstance(data, dict) or data.get('format') != FORMAT:
            found = data.get('format', 'none') if isinstance(data, dict) else 'none'
            pids = sorted({t.get('pid') for t in (data.get('tasks') or []) if isinstance(t, dict) and t.get('pid')}
                          if isinstance(data, dict) and isinstance(data.get('tasks'), list) else [])
            hint = f' (it names pids {", ".join(map(str, pids))})' if pids else ''
            raise StateError(f'{path}: state file of another tfcluster version (format {found}, this one reads '
                             f'{FORMAT}); if tasks of that run still live{hint}, stop them with the version that '
                             'started them or by hand, then remove the file')
        try:
            tasks = [TaskRecord.from_dict(t) for t in data.pop('tasks', [])]
            known = set(cls.__dataclass_fields__)
            return cls(tasks=tasks, **{k: v for k, v in data.items() if k in known})
        except (TypeError, KeyError, AttributeError) as e:
            raise StateError(f'{path}: damaged state file ({type(e).__name__}: {e}); if tasks of that run '
                             'still live, stop them by hand, then remove the file') from None

    @staticmethod
    def new(spec_path: str, launcher_ident: str) -> 'LaunchState':
        return LaunchState(spec=spec_path, launcher_pid=os.getpid(), launcher_ident=launcher_ident,
                           started=time.time())


class TrainDirLock:
    """One launcher per train_dir: an exclusive flock on `<train_dir>/launch.lock`, held for the
    launcher's life (the kernel drops it when the process ends, however it ends). The file says
    who holds it, for the launcher that is refused."""

    def __init__(self, train_dir: str, name: str | None = None):
        """`name`: another lock file of the train_dir (`launch scale` takes scale.lock)."""
        self.path = os.path.join(train_dir, name) if name else lock_path(train_dir)
        self._fd: int | None = None

    def acquire(self, holder: str) -> None:
        """Take the lock or raise LockBusy naming the holder. `holder` says who we are."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if not self._take(fd):
                text = self._holder(fd)
                os.close(fd)
                raise LockBusy(text) from None
            try:    # the file we locked must still be the one at the path (a cleanup may unlink it)
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f'{holder}\n'.encode(), 0)
        self._fd = fd

    @staticmethod
    def held(train_dir: str) -> str | None:
        """Who holds the train_dir's lock (the holder's text, or 'another launcher'), or None when
        no live launcher does. The lock, not a state file or run.json, tells a running run from a
        dead one: the kernel drops it with its process, however that ends. A shared lock, taken
        and dropped at once, only probes; the file is never created (a read-only directory of an
        old run stays untouched), and one that cannot be opened counts as not held."""
        try:
            fd = os.open(lock_path(train_dir), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return TrainDirLock._holder(fd, wait=0.2)
            except OSError:
                return None
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    @staticmethod
    def _take(fd: int, wait: float = 0.1) -> bool:
        """The exclusive lock, retried briefly: `launch list` and `launch status` probe it with a
        shared lock for a moment (`held`), which must not refuse a launcher."""
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)

    @staticmethod
    def _holder(fd: int, wait: float = 2.0) -> str:
        """Who holds the lock, as the holder wrote it. The holder writes its name just after it
        takes the lock, so a launcher refused in between finds the file still empty: it waits
        for the name (briefly) rather than report 'another launcher'."""
        deadline = time.monotonic() + wait
        while True:
            text = os.pread(fd, 4096, 0).decode('utf-8', 'replace').strip()
            if text or time.monotonic() > deadline:
                return text or 'another launcher'
            time.sleep(0.01)

    def release(self, remove: bool = False) -> None:
        if self._fd is None:
            return
        if remove:      # only while holding it, so no one can have it
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        else:
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None
