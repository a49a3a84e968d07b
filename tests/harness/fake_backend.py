"""One fake backend for the fast tests of the supervisor: launch/backends/base.py's Backend in
memory, no processes. Each task's state is scripted (running, ended with a code, its host
unreachable, frozen) and its log is a list of lines; starts and stops are recorded, so a test can
say what the loop did."""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from cluster.spec import ClusterSpec, load_spec
from launch.backends.base import ENDED, RUNNING, UNKNOWN, Backend, Observation, TaskRecord
from launch.planning.plan import TaskPlan, plan_cluster

DOWN = 'down'           # a task whose host cannot be asked
FROZEN = 'frozen'       # a running task stopped by SIGSTOP


class FakeBackend(Backend):
    """Tasks in a dict: name -> None (running), an exit code (ended), DOWN or FROZEN."""
    name = 'fake'

    def __init__(self, script: dict[str, object] | None = None, logs: dict[str, list[str]] | None = None,
                 on_start: dict[str, object] | None = None) -> None:
        self.script: dict[str, object] = dict(script or {})
        self.on_start: dict[str, object] = dict(on_start or {})     # what a start leaves (default: running)
        self.logs: dict[str, list[str]] = {k: list(v) for k, v in (logs or {}).items()}
        self.started: list[str] = []
        self.stopped: list[tuple[str, float]] = []
        self.leases: list[str | None] = []

    def check(self, plans: list[TaskPlan], imports: bool = False) -> list:
        return []

    def start(self, plan: TaskPlan) -> TaskRecord:
        self.started.append(plan.name)
        self.script[plan.name] = self.on_start.get(plan.name)
        return record_of(plan, pid=1000 + len(self.started))

    def status(self, record: TaskRecord) -> Observation:
        value = self.script.get(record.name)
        if value == DOWN:
            return Observation(UNKNOWN, error=f'{record.host}: unreachable: connection refused')
        if value == FROZEN:
            return Observation(RUNNING, stopped='is stopped (SIGSTOP, or a debugger)')
        return Observation(RUNNING) if value is None else Observation(ENDED, int(str(value)))

    def stop(self, records: list[TaskRecord], grace: float = 0) -> None:
        for r in records:
            self.stopped.append((r.name, grace))
            if self.script.get(r.name) is None or self.script.get(r.name) == FROZEN:
                self.script[r.name] = -15

    def renew(self, plans: list[TaskPlan], text: str | None = None) -> None:
        self.leases.append(text)

    def probe(self, record: TaskRecord, timeout: float, handshake: bool = True, channel_ready: object = None) -> bool:
        return self.script.get(record.name) is None

    def log_record(self, plan: TaskPlan) -> TaskRecord:
        return record_of(plan)

    def read_log(self, record: TaskRecord, follow: bool = False, stop: object = None,
                 offset: int = 0) -> Iterator[str]:
        return iter(self.logs.get(record.name, []))

    def read_file(self, record: TaskRecord, path: str) -> str | None:
        return None


def record_of(plan: TaskPlan, pid: int = 100) -> TaskRecord:
    """The record a start of `plan` on the fake backend makes."""
    return TaskRecord(plan.name, plan.task.job, plan.task.index, plan.task.host, plan.task.port, 'fake', pid,
                      f'logs/{plan.name}.log')


def fake_cluster(spec_path: str, overrides: Sequence[str] = ()) -> tuple[ClusterSpec, list[TaskPlan]]:
    """A spec and its tasks' plans, every one on the fake backend."""
    import dataclasses
    spec = load_spec(spec_path, list(overrides))
    return spec, [dataclasses.replace(p, backend='fake') for p in plan_cluster(spec)]
