"""The launcher's state file (`<train_dir>/launch-state.json`): which processes a `launch up` of a
spec started, so `launch status`, `launch logs` and `launch down` can find them from another shell."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from launch.backend import TaskRecord


@dataclass
class LaunchState:
    spec: str
    launcher_pid: int
    launcher_ident: str
    started: float
    tasks: list[TaskRecord] = field(default_factory=list)
    progress: dict | None = None     # {'global_step', 'steps', 'at' (epoch seconds)}: the newest step seen
    restarts: int = 0

    def save(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
        data = {'spec': self.spec, 'launcher_pid': self.launcher_pid, 'launcher_ident': self.launcher_ident,
                'started': self.started, 'tasks': [t.to_dict() for t in self.tasks],
                'progress': self.progress, 'restarts': self.restarts}
        with open(path + '.tmp', 'w') as f:
            json.dump(data, f, indent=1)
        os.replace(path + '.tmp', path)

    @classmethod
    def load(cls, path: str) -> 'LaunchState | None':
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        tasks = [TaskRecord.from_dict(t) for t in data.pop('tasks', [])]
        known = set(cls.__dataclass_fields__)
        return cls(tasks=tasks, **{k: v for k, v in data.items() if k in known})

    @staticmethod
    def new(spec_path: str, launcher_ident: str) -> 'LaunchState':
        return LaunchState(spec=spec_path, launcher_pid=os.getpid(), launcher_ident=launcher_ident,
                           started=time.time())
