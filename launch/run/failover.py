"""Failover of a supervised run: a lost worker whose host cannot be reached starts on a spare
address of the pool instead (the spec's workers not live now), on a host that can be.

A new start on the lost host would fail too, so `policy.decide` only tolerates such a worker;
with `supervise.restart: on-failure` and restarts left, a spare takes its place. The lost one
is retired: it is never started again, and `launch scale` does not pick it (its host was lost).
"""
from __future__ import annotations

import threading
import time
from typing import Protocol
from collections.abc import Callable, Mapping, Sequence

from cluster.runtime.membership import Members
from cluster.runtime.contract import TaskName
from cluster.spec import ClusterSpec
from launch.backends.base import Backend, TaskRecord, stop_all
from launch.planning.plan import TaskPlan
from launch.run import policy as supervise
from launch.run.attempt import Attempt
from launch.run.lifecycle import Lifecycle
from launch.run.policy import Decision, Policy, TaskState, TaskStatus


class FailedOverRun(Protocol):
    """What failover asks of the run it changes (launch/run/supervised.py SupervisedRun)."""
    spec: ClusterSpec
    plans: list[TaskPlan]
    backends: Mapping[str, Backend]
    records: list[TaskRecord]
    life: Lifecycle
    policy: Policy
    members: Members
    attempt: Attempt
    restarts: int
    retired: set[str]

    @property
    def say(self) -> Callable[[str], None]: ...

    def count_restart(self) -> float: ...

    def publish(self) -> None: ...

    def start_due(self) -> None: ...


def spare_moves(decision: Decision, statuses: Sequence[TaskStatus], plans: Sequence[TaskPlan],
                members: Members, retired: set[str], pool: int) -> dict[str, str]:
    """Lost worker -> the spare that takes its place, for each lost worker whose host cannot be
    reached and that has a spare on a host that can be."""
    host_of = {p.name: p.task.host for p in plans}
    unreachable = {host_of[t.name] for t in statuses if t.state is TaskState.UNKNOWN}
    spares = [f'worker:{i}' for i in range(pool) if i not in members.workers and f'worker:{i}' not in retired]
    return supervise.pick_spares(list(decision.tasks), host_of, unreachable, spares)


def members_after(members: Members, moves: Mapping[str, str]) -> Members:
    """The live set with each lost worker replaced by its spare, in a new epoch."""
    epoch = members.epoch + 1
    workers = dict(members.workers)
    for lost, spare in moves.items():
        workers.pop(TaskName.parse(lost).index, None)
        workers[TaskName.parse(spare).index] = epoch
    return Members(epoch, workers)


def fail_over(run: FailedOverRun, decision: Decision, statuses: Sequence[TaskStatus]) -> bool:
    """Start spares in place of the lost workers of `decision` that cannot be reached (a restart
    of supervise.max_restarts, after its backoff); False when none can."""
    policy = run.policy
    if policy.restart != 'on-failure' or run.restarts >= policy.max_restarts or run.spec.train.command:
        return False
    moves = spare_moves(decision, statuses, run.plans, run.members, run.retired, run.spec.num_workers)
    if not moves:
        return False
    delay = run.count_restart()
    run.retired.update(moves)
    run.attempt.tolerated.update(moves)
    run.members = members_after(run.members, moves)
    run.publish()
    for lost, spare in moves.items():
        plan = next(p for p in run.plans if p.name == spare)
        run.say(f'restart {run.restarts}/{policy.max_restarts}: {decision.reason}; starting {spare} on '
                f'{plan.task.address} in its place (a spare of the pool)')
        run.life.emit('failover', task=lost, to=spare, host=plan.task.host, cause=decision.reason)
        run.attempt.due[spare] = time.monotonic() + delay
    gone = [r for r in run.records if r.name in moves]
    backends = run.backends
    threading.Thread(target=lambda: stop_all(gone, backends, grace=1), name='failover-stop', daemon=True).start()
    run.start_due()
    return True
