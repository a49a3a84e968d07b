"""Preemption of a supervised run: a task that got a SIGTERM from outside its launcher (a node
shutting down, a pod deleted, Slurm's --signal, `launch preempt`) says so in its log
(cluster/runtime/messages.py Preempted) and has `supervise.preemption_grace` seconds to go.

The task that saves (a TF1 chief, a PSS chief) saves at once and leaves "preempted"
(contract.EXIT_PREEMPTED). Any other task keeps serving while the launcher asks the chief for a
checkpoint through every lease (membership.py Members.save, as a sync scale does); once the
chief saved after the notice, or the grace is up, the task counts as left "preempted" and the
policy's own rules decide what starts again (launch/run/policy.py: the same choices as for a
fault). A preemption is no fault: it spends none of supervise.max_restarts, waits no backoff,
and writes a `preempted` event, not `task_lost`.

`step` is pure: statuses and the attempt's notices in, a Plan and the statuses as the policy is
to see them out. A task may leave "preempted" before its log's notice line is read (the log is
followed in another thread, and a chief saves and goes at once): its exit code is the notice then,
so that no preemption goes uncounted or unlogged.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from cluster.runtime.contract import EXIT_PREEMPTED
from launch.records.event_types import Preempted
from launch.run.policy import TaskState, TaskStatus
from launch.run.supervised.attempt import Notice
from launch.run.supervised import mending
from launch.run.supervised.plan import Plan
from launch.run.supervised.state import SupervisorState

MARGIN_SECS = 2.0       # the task leaves by itself at grace - MARGIN_SECS (cluster/runtime/notice.py)


@dataclass(frozen=True)
class Step:
    """What one round makes of the notices: the plan (told, the chief asked to save) and the
    statuses the policy decides on (a task whose notice is done counts as left preempted)."""
    plan: Plan | None
    statuses: list[TaskStatus]


def saver(state: SupervisorState) -> str:
    """The task that saves the checkpoints: a coordinator run's chief, else worker 0."""
    return 'chief:0' if state.spec.coordinator else 'worker:0'


def told(state: SupervisorState, new: Sequence[Notice]) -> Plan | None:
    """The notices not told yet: a line and a `preempted` event each, and one request to the chief
    for a checkpoint unless the chief itself is preempted (it saves as it goes)."""
    if not new:
        return None
    say, events = [], []
    chief = saver(state)
    for n in new:
        at = f'at step {n.step}' if n.step is not None else 'before its first step'
        first = ('it saves its checkpoint and goes' if n.task == chief else
                 f'{chief} saves a checkpoint first, then {n.task} goes')
        say.append(f'{n.task} got a preemption notice {at} ({n.grace:g}s of grace): {first}; '
                   'a preemption is not counted against supervise.max_restarts')
        events.append(Preempted(task=n.task, cause='a SIGTERM from outside the launcher', grace=n.grace,
                                step=n.step, checkpoint=n.saved))
    members = None
    if any(n.task != chief for n in new):
        members = dataclasses.replace(state.members, save=state.members.save + 1)
    return Plan(members=members, publish=members is not None, say=tuple(say), events=tuple(events),
                preemptions=len(new))


def is_done(notice: Notice, saved: int | None, now: float) -> bool:
    """A non-saving task's notice is done once a checkpoint newer than the one at the notice is
    saved, or once its grace (less the margin it leaves by itself) is up."""
    newer = saved is not None and (notice.saved is None or saved > notice.saved)
    return newer or now >= notice.at + max(0.0, notice.grace - MARGIN_SECS)


def step(state: SupervisorState, statuses: Sequence[TaskStatus], now: float) -> Step:
    """One round of preemptions: the new notices told (a Plan), and the statuses with every task
    whose notice is done, and that still runs, as left preempted (EXIT_PREEMPTED)."""
    attempt = state.attempt
    known = {n.task for n in attempt.notices_now()} | attempt.told
    for t in statuses:      # left preempted before its log's notice line was read: its exit code says it
        if t.state is TaskState.FAILED and t.exit_code == EXIT_PREEMPTED and t.name not in known:
            attempt.saw_notice(t.name, state.spec.supervise.preemption_grace, None)
    notices = attempt.notices_now()
    new = [n for n in notices if n.task not in attempt.told]
    attempt.told.update(n.task for n in new)
    saved = attempt.progress(state.spec.train.steps).saved
    for n in notices:
        if n.task not in attempt.done and is_done(n, saved, now):
            attempt.done.add(n.task)
    out = []
    for t in statuses:
        if t.name in attempt.done and t.state is TaskState.RUNNING:
            t = dataclasses.replace(t, state=TaskState.FAILED, exit_code=EXIT_PREEMPTED, preempted=True, frozen=0.0)
        out.append(t)
    return Step(told(state, new), out)




def clocked(state: SupervisorState, tasks: Sequence[str]) -> mending.Notice | None:
    """The recovery clock's start for a preemption of `tasks`: the first of their notices, and when
    the chief's checkpoint after it was seen (None: no notice was seen, a task that left
    EXIT_PREEMPTED with its line lost: timed as a fault is)."""
    attempt = state.attempt
    notices = [n for n in attempt.notices_now() if n.task in tasks]
    if not notices:
        return None
    first = min(notices, key=lambda n: n.at)
    newer = attempt.saved is not None and (first.saved is None or attempt.saved > first.saved)
    return mending.Notice(first.at, attempt.saved_at if newer else None)
