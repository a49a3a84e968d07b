"""Failover of a supervised run: a lost worker whose host cannot be reached starts on a spare
address of the pool instead (the spec's workers not live now), on a host that can be.

A new start on the lost host would fail too, so `policy.decide` only tolerates such a worker;
with `supervise.restart: on-failure` and restarts left, a spare takes its place. The lost one
is retired: it is never started again, and `launch scale` does not pick it (its host was lost).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from cluster.runtime.membership import Members
from cluster.runtime.contract import TaskName
from launch.planning.plan import TaskPlan
from launch.records.event_types import Failover
from launch.run import policy
from launch.run.policy import Decision, TaskState, TaskStatus
from launch.run.supervised.plan import Backoff, Plan
from launch.run.supervised.state import SupervisorState


def spare_moves(decision: Decision, statuses: Sequence[TaskStatus], plans: Sequence[TaskPlan],
                members: Members, retired: set[str], pool: int) -> dict[str, str]:
    """Lost worker -> the spare that takes its place, for each lost worker whose host cannot be
    reached and that has a spare on a host that can be."""
    host_of = {p.name: p.task.host for p in plans}
    unreachable = {host_of[t.name] for t in statuses if t.state is TaskState.UNKNOWN}
    spares = [f'worker:{i}' for i in range(pool) if i not in members.workers and f'worker:{i}' not in retired]
    return policy.pick_spares(list(decision.tasks), host_of, unreachable, spares)


def members_after(members: Members, moves: Mapping[str, str]) -> Members:
    """The live set with each lost worker replaced by its spare, in a new epoch."""
    epoch = members.epoch + 1
    workers = dict(members.workers)
    for lost, spare in moves.items():
        workers.pop(TaskName.parse(lost).index, None)
        workers[TaskName.parse(spare).index] = epoch
    return Members(epoch, workers)


def fail_over(state: SupervisorState, decision: Decision, statuses: Sequence[TaskStatus],
              backoff: Backoff) -> Plan | None:
    """Spares started in place of the lost workers of `decision` that cannot be reached (a
    restart of supervise.max_restarts, after its backoff); None when none can be. The lost ones
    are retired and let go, and stopped in the background (their host may not answer)."""
    rules = state.policy
    if rules.restart != 'on-failure' or state.restarts >= rules.max_restarts or state.spec.train.command:
        return None
    moves = spare_moves(decision, statuses, state.plans, state.members, state.retired, state.spec.num_workers)
    if not moves:
        return None
    say, events = [], []
    for lost, spare in moves.items():
        plan = state.plan_of(spare)
        say.append(f'restart {state.restarts + 1}/{rules.max_restarts}: {decision.reason}; starting {spare} on '
                   f'{plan.task.address} in its place (a spare of the pool)')
        events.append(Failover(task=lost, to=spare, host=plan.task.host, cause=decision.reason))
    return Plan(restart=backoff, retire=frozenset(moves), tolerate=frozenset(moves),
                members=members_after(state.members, moves), publish=True, say=tuple(say), events=tuple(events),
                drop=tuple(r.name for r in state.records if r.name in moves),
                due={spare: backoff.at + backoff.delay for spare in moves.values()}, start=True)
