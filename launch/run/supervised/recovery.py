"""Recovery of a supervised run: what is done about what `launch/run/policy.py` decided of lost
or stuck tasks. A lost worker is tolerated, replaced by a spare (failover.py) or started again
while the rest train on: each a plan (plan.py), from the run's state and the decision, that the
loop applies. A fatal fault stops the cluster and starts it again from its checkpoint (a
procedure: Recovery); a run that cannot recover is given up with one line that says why.

Every fault is told to the event log before anything is done about it, and a restart that would
repeat the last one's failure exactly is no restart (faults.py FaultHistory).
"""
from __future__ import annotations

import threading
import time
from typing import Protocol
from collections.abc import Callable, Mapping, Sequence

from cluster.runtime.contract import RESTART_ENV, TaskName, job_of
from cluster.runtime.contract import EXIT_FAILED
from cluster.spec import ClusterSpec
from launch.backends.base import Backend
from launch.records.event_types import Tolerated
from launch.run import policy
from launch.run.lifecycle import Lifecycle, RunResult, RunState
from launch.run.policy import Action, Decision, TaskState, TaskStatus, describe_exit
from launch.run.supervised import faults
from launch.run.supervised.failover import fail_over
from launch.run.supervised.faults import TaskFailed
from launch.run.supervised.mending import RecoveryClock
from launch.run.supervised.plan import Backoff, Plan
from launch.run.supervised.state import SupervisorState


class RecoveringRun(Protocol):
    """What a restart of the cluster asks of the loop (loop.py SupervisedRun): its state, and the
    procedures that stop and start every task."""
    spec: ClusterSpec
    backends: Mapping[str, Backend]
    life: Lifecycle
    state: SupervisorState
    clock: RecoveryClock

    @property
    def say(self) -> Callable[[str], None]: ...

    @property
    def interrupted(self) -> threading.Event: ...

    def apply(self, plan: Plan) -> None: ...

    def check_run_dir(self) -> None: ...

    def teardown(self, checkpoint: bool = True) -> None: ...

    def new_attempt(self, reason: str, step: int | None, ended: RunResult,
                    env: Mapping[str, str] | None = None) -> None: ...

    def start_cluster(self, restart: int | None = None) -> None: ...


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
    """Start the lost tasks again once their backoff has passed; the rest keep training."""
    wait = f' in {backoff.delay:g}s (supervise.backoff_secs)' if backoff.delay else ''
    line = (f'restart {state.restarts + 1}/{state.policy.max_restarts}: {decision.reason}; '
            f'starting {", ".join(decision.tasks)} again{wait}, it rejoins the training')
    # A coordinator without its ps cannot save: end it now rather than after a grace.
    kill = tuple(r.name for r in state.records if r.job == 'chief' and r.name in decision.tasks) \
        if any(job_of(name) == 'ps' for name in decision.tasks) else ()
    return Plan(restart=backoff, say=(line,), restart_tasks=decision.tasks, restart_reason=decision.reason,
                kill=kill, restarted_chief=any(job_of(name) == 'chief' for name in decision.tasks),
                due={name: backoff.at + backoff.delay for name in decision.tasks}, start=True)


def restart_evaluator(state: SupervisorState, decision: Decision, now: float) -> Plan:
    """Start the lost evaluator again once its backoff has passed, on its own restarts: the
    training never stopped for it, so none of the run's is spent and no "training again" follows."""
    restarts = state.evaluator_restarts + 1
    delay = policy.backoff_delay(state.policy, restarts)
    wait = f' in {delay:g}s (supervise.backoff_secs)' if delay else ''
    line = (f'evaluator restart {restarts}/{state.policy.max_restarts} (its own, not the run\'s): '
            f'{decision.reason}; starting {", ".join(decision.tasks)} again{wait}; the training goes on')
    return Plan(evaluator_restart=True, say=(line,), restart_tasks=decision.tasks, restart_reason=decision.reason,
                due={name: now + delay for name in decision.tasks}, start=True)


def plan_for(state: SupervisorState, decision: Decision, statuses: Sequence[TaskStatus], now: float) -> Plan | None:
    """What to do about a tolerate or a restart of some tasks (None: a restart of the cluster,
    which is no plan but a procedure: Recovery._restart_cluster). A tolerated worker whose host
    cannot be reached is failed over onto a spare, where one can be."""
    if decision.action is Action.TOLERATE:
        return fail_over(state, decision, statuses, state.history.peek(state.policy, now)) \
            or tolerate(state, decision)
    if decision.action is Action.RESTART_TASKS and policy.evaluator_only(decision):
        return restart_evaluator(state, decision, now)
    if decision.action is Action.RESTART_TASKS:
        return restart_tasks(state, decision, state.history.peek(state.policy, now))
    return None


class Recovery:
    """Carries out the decisions about faults on a run."""

    def __init__(self, run: RecoveringRun) -> None:
        self.run = run

    def act(self, decision: Decision, statuses: list[TaskStatus]) -> bool:
        """Carry out a decision about lost or stuck tasks; True once the cluster started again.
        TaskFailed when the run is given up."""
        seen_at = time.monotonic()      # before the account: a stall's stack dumps take seconds
        decision = self._account(decision, statuses)
        if decision.action is Action.GIVE_UP:
            raise self._give_up(decision)
        if decision.action in (Action.RESTART, Action.RESTART_TASKS) and not policy.evaluator_only(decision):
            self.run.clock.fault(decision.tasks, decision.action is Action.RESTART, self.run.state.attempt.step, seen_at)
        plan = plan_for(self.run.state, decision, statuses, time.monotonic())
        if plan is not None:
            self.run.apply(plan)
            return False
        self._restart_cluster(decision)
        return True

    def _account(self, decision: Decision, statuses: list[TaskStatus]) -> Decision:
        """The event log's account of a fault first, then the repeat rule: a restart that would fail
        as the last one did becomes giving up."""
        run = self.run
        starting = {name for name, said in run.state.serving.items() if not said.is_set()}
        decision = faults.dump_stacks(run.life, decision, run.state.records, run.backends, starting)   # before any stop
        errors, failures = faults.record_faults(run.life, decision, statuses, run.state.records, run.backends)
        run.state.attempt.failures.extend(failures)
        if policy.evaluator_only(decision):      # its own budget bounds it; the run's repeat rule is the training's
            return decision
        return run.state.history.escalate(decision, errors, run.life.checkpoint_step)

    def _give_up(self, decision: Decision) -> TaskFailed:
        """The one line a lost run ends with (faults.py Verdict), once every task is
        stopped: the chief's checkpoint first, so the step a new `launch up` resumes from is current."""
        run = self.run
        verdict = faults.judge(decision, run.state.records, run.backends, run.state.policy, run.state.restarts)
        run.clock.forget()
        run.teardown(checkpoint=verdict.can_save)
        return verdict.failed(run.life.checkpoint_step)

    def _restart_cluster(self, decision: Decision) -> None:
        """Stop every task (the chief checkpoints first if it can), then start them all again: the
        chief restores the newest checkpoint and training goes on to the requested step. A task
        lost while they start again is one more fault, under the same policy."""
        run = self.run
        while True:
            delay = self._stop_for_restart(decision)
            if run.interrupted.wait(delay):
                return
            run.clock.phase('backoff', from_step=run.state.attempt.from_step)
            run.check_run_dir()
            try:
                run.start_cluster(restart=run.state.restarts)
                run.clock.phase('start')
                return
            except TaskFailed as e:
                if e.task is None:          # not a task lost on the way (a port, a timeout): as before
                    raise
                decision = self._lost_in_restart(e.task, e)

    def lost_while_starting(self, e: TaskFailed) -> None:
        """A task lost (`e` names it) while the cluster started for some other reason (a sync
        scale): one more fault, and the cluster starts again under the policy, as after a fault."""
        assert e.task is not None, 'only a task lost on the way is a fault to restart for'
        self._restart_cluster(self._lost_in_restart(e.task, e))

    def _stop_for_restart(self, decision: Decision) -> float:
        """Count the restart, stop every task and begin the next attempt; returns its backoff."""
        run = self.run
        run.state.restarts += 1
        cause, can_save = faults.cause(decision, run.state.records, run.backends)
        run.say(f'restart {run.state.restarts}/{run.state.policy.max_restarts}: {cause}; stopping every task'
                + ('' if can_save else ' (no checkpoint can be saved without the lost task)'))
        run.teardown(checkpoint=can_save)
        run.clock.phase('stop')
        step = run.life.checkpoint_step()
        delay = run.state.history.backoff(run.state.policy)
        run.say(f'restart {run.state.restarts}/{run.state.policy.max_restarts}: resuming from '
                + (f'the checkpoint at global step {step}' if step is not None else
                   'step 0 (no checkpoint was written yet)')
                + (f' in {delay:g}s (supervise.backoff_secs, doubling while restarts do not bring the training back)' if delay else ''))
        reason = f'restart {run.state.restarts}/{run.state.policy.max_restarts}: {decision.reason}'
        ended = RunResult(state=RunState.FAILED, exit_code=EXIT_FAILED, restarts=run.state.restarts - 1,
                          failures=list(run.state.attempt.failures), global_step=run.state.attempt.global_step,
                          recoveries=list(run.clock.done))
        # The chief notes the restart in TensorBoard.
        run.new_attempt(reason, step, ended, env={RESTART_ENV: reason})
        return delay

    def _lost_in_restart(self, task: str, e: TaskFailed) -> Decision:
        """`task` died while the cluster started again (`e`): one more fault for the same policy;
        the decision to carry out next (TaskFailed once it is to give up)."""
        run = self.run
        statuses = run.state.attempt.observe(run.state.records, run.backends, run.say)
        lost = next((t for t in statuses if t.name == task), None)
        how = (policy.how_lost(lost) if lost and lost.state is TaskState.FAILED
               else e.how or f'{task} {describe_exit(e.exit_code)}') + ' while the cluster started again'
        decision = policy.during_recovery(run.state.policy, run.state.restarts, task, how, e.exit_code)
        decision = policy.on_full_disk(decision, run.state.attempt.progress(run.spec.train.steps))
        decision = self._account(decision, statuses)
        if decision.action is Action.GIVE_UP:
            raise self._give_up(decision) from None
        run.clock.fault(decision.tasks, True, None)     # joins the fault being mended
        return decision
