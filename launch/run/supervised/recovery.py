"""Recovery of a supervised run: what is done about what `launch/run/policy.py` decided of lost
or stuck tasks. A lost worker is tolerated, replaced by a spare (failover.py) or started again
while the rest train on: each a plan (plan.py), from the run's state and the decision, that the
loop applies. A fatal fault stops the cluster and starts it again from its checkpoint (a plan
too, in two halves: the stop, then what the stop left decides the rest); a task lost while the
cluster starts again is one more fault; a run that cannot recover is given up with one line
that says why.

Every fault is told to the event log before anything is done about it, and a restart that would
repeat the last one's failure exactly is no restart (faults.py FaultHistory).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Protocol
from collections.abc import Callable, Mapping, Sequence

from cluster.runtime.contract import RESTART_ENV, TaskName, job_of
from cluster.runtime.contract import EXIT_FAILED
from cluster.spec import ClusterSpec
from launch.backends.base import Backend
from launch.records.event_types import Tolerated
from launch.records.result import MendedFault
from launch.run import policy
from launch.run.lifecycle import Lifecycle, RunResult, RunState
from launch.run.policy import Action, Decision, TaskState, TaskStatus, describe_exit
from launch.run.supervised import faults, preemption
from launch.run.supervised.failover import fail_over
from launch.run.supervised.mending import RecoveryClock
from launch.run.supervised.plan import Backoff, NewAttempt, Plan, Relaunch, StartAll
from launch.run.supervised.state import StartLoss, SupervisorState


class RecoveringRun(Protocol):
    """What recovery asks of the loop (loop.py SupervisedRun): its state and parts to account
    for a fault with, and the plans applied. It calls nothing else of the loop back."""
    spec: ClusterSpec
    backends: Mapping[str, Backend]
    life: Lifecycle
    state: SupervisorState
    clock: RecoveryClock

    @property
    def say(self) -> Callable[[str], None]: ...

    def apply(self, plan: Plan) -> None: ...


def tolerate(state: SupervisorState, decision: Decision) -> Plan:
    """Let the lost tasks go: the workers among them leave the live set (the lease tells the
    others within a second), so the count said here, the state file, `launch scale` and the
    closing line all count the workers that train (a coordinator run's workers stay: PSS takes
    one back when it returns)."""
    events = tuple(Tolerated(task=name, cause=decision.reason) for name in decision.tasks)
    if policy.evaluator_only(decision):
        return Plan(tolerate=frozenset(decision.tasks), events=events,
                    say=(f'{decision.reason}{"; " + decision.note if decision.note else ""}; '
                         'training goes on without evaluation',))
    members = state.members
    if not state.spec.coordinator:  # ParameterServerStrategy fixed its workers when the chief built it
        members = members.without(TaskName.parse(name).index for name in decision.tasks
                                  if job_of(name) == 'worker')
    tolerated = state.attempt.tolerated | set(decision.tasks)
    left = sum(f'worker:{i}' not in tolerated for i in members.indices)
    return Plan(tolerate=frozenset(decision.tasks), events=events,
                members=members if members != state.members else None,
                say=(f'{decision.reason}; training goes on with {left} worker(s)',))


def restart_tasks(state: SupervisorState, decision: Decision, backoff: Backoff) -> Plan:
    """Start the lost tasks again once their backoff has passed; the rest keep training. After a
    preemption (no fault) at once, and none of the run's restarts is spent."""
    if decision.preempted:
        backoff = dataclasses.replace(backoff, delay=0.0)
    wait = f' in {backoff.delay:g}s (supervise.backoff_secs)' if backoff.delay else ''
    count = 'after a preemption' if decision.preempted else f'restart {state.restarts + 1}/{state.policy.max_restarts}'
    line = (f'{count}: {decision.reason}; '
            f'starting {", ".join(decision.tasks)} again{wait}, it rejoins the training')
    # A coordinator without its ps cannot save: end it now rather than after a grace.
    kill = tuple(r.name for r in state.records if r.job == 'chief' and r.name in decision.tasks) \
        if any(job_of(name) == 'ps' for name in decision.tasks) else ()
    return Plan(restart=None if decision.preempted else backoff, say=(line,), restart_tasks=decision.tasks,
                restart_reason=decision.reason,
                kill=kill, restarted_chief=any(job_of(name) == 'chief' for name in decision.tasks),
                due={name: backoff.at + backoff.delay for name in decision.tasks}, start=True)


def restart_evaluator(state: SupervisorState, decision: Decision, now: float) -> Plan:
    """Start the lost evaluator again once its backoff has passed, on its own restarts: the
    training never stopped for it, so none of the run's is spent and no "training again" follows."""
    restarts = state.evaluator_restarts + (not decision.preempted)
    delay = 0.0 if decision.preempted else policy.backoff_delay(state.policy, restarts)
    wait = f' in {delay:g}s (supervise.backoff_secs)' if delay else ''
    line = (f'evaluator restart {restarts}/{state.policy.max_restarts} (its own, not the run\'s): '
            f'{decision.reason}; starting {", ".join(decision.tasks)} again{wait}; the training goes on')
    return Plan(evaluator_restart=not decision.preempted, say=(line,), restart_tasks=decision.tasks,
                restart_reason=decision.reason,
                due={name: now + delay for name in decision.tasks}, start=True)


def restart_cluster(state: SupervisorState, decision: Decision, cause: str, can_save: bool) -> Plan:
    """Stop every task (the chief checkpoints first if it can) to start them all again: one more
    restart of the run's. `cause` and `can_save`: the fault in words and whether the chief can
    still save (faults.py cause, which asks the tasks). What follows the stop is `resume`'s."""
    number = state.restarts + (not decision.preempted)
    count = 'after a preemption' if decision.preempted else f'restart {number}/{state.policy.max_restarts}'
    return Plan(relaunch=Relaunch(number, decision.reason, can_save, preempted=decision.preempted),
                say=(f'{count}: {cause}; stopping every task'
                     + ('' if can_save else ' (no checkpoint can be saved without the lost task)'),))


def resume(state: SupervisorState, relaunch: Relaunch, step: int | None, delay: float,
           recoveries: Sequence[MendedFault]) -> Plan:
    """Once every task stopped for `relaunch`: the attempt ends, the next begins from the checkpoint
    at `step` (None: none was written) and every live task starts after `delay` (the backoff,
    counted once the stop was done); the chief notes the restart in TensorBoard (RESTART_ENV).
    `recoveries`: the faults mended so far, for the ending attempt's result."""
    number, most = relaunch.number, state.policy.max_restarts
    assert number is not None, 'a restart of the cluster is one of the run\'s'
    count = 'after a preemption' if relaunch.preempted else f'restart {number}/{most}'
    line = (f'{count}: resuming from '
            + (f'the checkpoint at global step {step}' if step is not None else
               'step 0 (no checkpoint was written yet)')
            + (f' in {delay:g}s (supervise.backoff_secs, doubling while restarts do not bring the training back)'
               if delay else ''))
    reason = f'{count}: {relaunch.reason}'
    ended = RunResult(state=RunState.FAILED, exit_code=EXIT_FAILED, restarts=number - (not relaunch.preempted),
                      failures=list(state.attempt.failures), global_step=state.attempt.global_step,
                      recoveries=list(recoveries))
    return Plan(say=(line,), attempt=NewAttempt(reason, step, ended, {RESTART_ENV: reason}),
                start_all=StartAll(delay, number))


def lost_in_start(state: SupervisorState, loss: StartLoss, statuses: Sequence[TaskStatus]) -> Decision:
    """A task lost while the cluster started again (`loss`): one more fault under the same
    policy (restart again while restarts are left, else give up), in its own words where the
    look at the tasks (`statuses`) saw it fail, else in start-up's."""
    lost = next((t for t in statuses if t.name == loss.task), None)
    how = (policy.how_lost(lost) if lost and lost.state is TaskState.FAILED
           else loss.how or f'{loss.task} {describe_exit(loss.exit_code)}') + ' while the cluster started again'
    decision = policy.during_recovery(state.policy, state.restarts, loss.task, how, loss.exit_code)
    return policy.on_full_disk(decision, state.attempt.progress(state.spec.train.steps))


def plan_for(state: SupervisorState, decision: Decision, statuses: Sequence[TaskStatus], now: float) -> Plan | None:
    """What to do about a tolerate or a restart of some tasks (None: a restart of the cluster,
    `restart_cluster`, whose words need the tasks asked). A tolerated worker whose host cannot
    be reached is failed over onto a spare, where one can be."""
    if decision.action is Action.TOLERATE:
        return fail_over(state, decision, statuses, state.history.peek(state.policy, now)) \
            or tolerate(state, decision)
    if decision.action is Action.RESTART_TASKS and policy.evaluator_only(decision):
        return restart_evaluator(state, decision, now)
    if decision.action is Action.RESTART_TASKS:
        return restart_tasks(state, decision, state.history.peek(state.policy, now))
    return None


class Recovery:
    """What is done about a decision on faults: the event log's account of them first (faults.py),
    then the plan for the decision, applied by the loop."""

    def __init__(self, run: RecoveringRun) -> None:
        self.run = run

    def act(self, decision: Decision, statuses: list[TaskStatus]) -> bool:
        """Carry out a decision about lost or stuck tasks; True when the cluster was started again.
        TaskFailed when the run is given up."""
        seen_at = time.monotonic()      # before the account: a stall's stack dumps take seconds
        decision = self._account(decision, statuses)
        if decision.action is Action.GIVE_UP:
            self.run.apply(self._give_up(decision))
        if decision.action in (Action.RESTART, Action.RESTART_TASKS) and not policy.evaluator_only(decision):
            notice = preemption.clocked(self.run.state, decision.tasks) if decision.preempted else None
            self.run.clock.fault(decision.tasks, decision.action is Action.RESTART, self.run.state.attempt.step, seen_at,
                                 notice)
        plan = plan_for(self.run.state, decision, statuses, time.monotonic()) or self._restart(decision)
        self.run.apply(plan)
        return plan.relaunch is not None

    def lost_in_start(self, loss: StartLoss) -> None:
        """A task lost while the cluster started (the loop saw `loss` in its round): one more
        fault; the cluster starts again under the policy, or the run is given up (TaskFailed)."""
        run = self.run
        statuses = run.state.attempt.observe(run.state.records, run.backends, run.say)
        decision = self._account(lost_in_start(run.state, loss, statuses), statuses)
        if decision.action is Action.GIVE_UP:
            run.apply(self._give_up(decision))
        run.clock.fault(decision.tasks, True, None)     # joins the fault being mended
        run.apply(self._restart(decision))

    def _account(self, decision: Decision, statuses: list[TaskStatus]) -> Decision:
        """The event log's account of a fault first, then the repeat rule: a restart that would fail
        as the last one did becomes giving up."""
        run = self.run
        if decision.preempted and decision.action is not Action.GIVE_UP:
            return decision         # told as it came (preemption.py): no fault to account for, nor to repeat
        starting = {name for name, said in run.state.serving.items() if not said.is_set()}
        decision = faults.dump_stacks(run.life, decision, run.state.records, run.backends, starting)   # before any stop
        errors, failures = faults.record_faults(run.life, decision, statuses, run.state.records, run.backends)
        run.state.attempt.failures.extend(failures)
        if policy.evaluator_only(decision):      # its own budget bounds it; the run's repeat rule is the training's
            return decision
        return run.state.history.escalate(decision, errors, run.life.checkpoint_step)

    def _restart(self, decision: Decision) -> Plan:
        """The restart of the cluster for `decision`, in the words of the tasks as they are now."""
        cause, can_save = faults.cause(decision, self.run.state.records, self.run.backends)
        return restart_cluster(self.run.state, decision, cause, can_save)

    def _give_up(self, decision: Decision) -> Plan:
        """The run given up: its one line (faults.py Verdict), said once every task is stopped."""
        run = self.run
        return Plan(give_up=faults.judge(decision, run.state.records, run.backends, run.state.policy,
                                         run.state.restarts))
