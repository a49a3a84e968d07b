"""Recovery of a supervised run: carry out what `launch/run/policy.py` decided about lost or
stuck tasks. A lost worker is tolerated, replaced by a spare (launch/run/failover.py) or started
again while the rest train on; a fatal fault stops the cluster and starts it again from its
checkpoint; a run that cannot recover is given up with one line that says why.

Every fault is told to the event log before anything is done about it, and a restart that would
repeat the last one's failure exactly is no restart (launch/run/faults.py FaultHistory).
"""
from __future__ import annotations

import threading
import time
from typing import Protocol
from collections.abc import Mapping

from cluster.runtime import rundir
from cluster.runtime.contract import TaskName, job_of
from cluster.runtime.rundir import EXIT_FAILED
from launch.backends.base import stop_all
from launch.run import faults
from launch.run import policy as supervise
from launch.run.failover import FailedOverRun, fail_over
from launch.run.faults import FaultHistory, TaskFailed
from launch.run.lifecycle import RunResult, RunState
from launch.run.mending import RecoveryClock
from launch.run.policy import Action, Decision, TaskState, TaskStatus, describe_exit


class RecoveringRun(FailedOverRun, Protocol):
    """What recovery asks of the run it acts on (launch/run/supervised.py SupervisedRun), besides
    what failover does."""
    history: FaultHistory
    clock: RecoveryClock
    evaluator_restarts: int                 # a coordinator run's evaluator's own (never the run's)
    serving: dict[str, threading.Event]     # set once a task's own log says it serves

    @property
    def interrupted(self) -> threading.Event: ...

    def check_run_dir(self) -> None: ...

    def teardown(self, checkpoint: bool = True) -> None: ...

    def new_attempt(self, reason: str, step: int | None, ended: RunResult,
                    env: Mapping[str, str] | None = None) -> None: ...

    def start_cluster(self, restart: int | None = None) -> None: ...


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
        if decision.action in (Action.RESTART, Action.RESTART_TASKS) and not supervise.evaluator_only(decision):
            self.run.clock.fault(decision.tasks, decision.action is Action.RESTART, self.run.attempt.step, seen_at)
        if decision.action is Action.TOLERATE:
            if not fail_over(self.run, decision, statuses):
                self._tolerate(decision)
        elif decision.action is Action.RESTART_TASKS and supervise.evaluator_only(decision):
            self._restart_evaluator(decision)
        elif decision.action is Action.RESTART_TASKS:
            self._restart_tasks(decision)
        elif decision.action is Action.RESTART:
            self._restart_cluster(decision)
            return True
        return False

    def _account(self, decision: Decision, statuses: list[TaskStatus]) -> Decision:
        """The event log's account of a fault first, then the repeat rule: a restart that would fail
        as the last one did becomes giving up."""
        run = self.run
        starting = {name for name, said in run.serving.items() if not said.is_set()}
        decision = faults.dump_stacks(run.life, decision, run.records, run.backends, starting)   # before any stop
        errors, failures = faults.record_faults(run.life, decision, statuses, run.records, run.backends)
        run.attempt.failures.extend(failures)
        if supervise.evaluator_only(decision):      # its own budget bounds it; the run's repeat rule is the training's
            return decision
        return run.history.escalate(decision, errors, run.life.checkpoint_step)

    def _give_up(self, decision: Decision) -> TaskFailed:
        """The one line a lost run ends with (launch/run/faults.py Verdict), once every task is
        stopped: the chief's checkpoint first, so the step a new `launch up` resumes from is current."""
        run = self.run
        verdict = faults.judge(decision, run.records, run.backends, run.policy, run.restarts)
        run.clock.forget()
        run.teardown(checkpoint=verdict.can_save)
        return verdict.failed(run.life.checkpoint_step)

    def _tolerate(self, decision: Decision) -> None:
        """Let the lost tasks go: the workers among them leave the live set (the lease tells the
        others within a second), so the count said here, the state file, `launch scale` and the
        closing line all count the workers that train (a coordinator run's workers stay: PSS
        takes one back when it returns)."""
        run = self.run
        run.attempt.tolerated.update(decision.tasks)
        for name in decision.tasks:
            run.life.emit('tolerated', task=name, cause=decision.reason)
        if supervise.evaluator_only(decision):
            run.say(f'{decision.reason}{"; " + decision.note if decision.note else ""}; '
                    'training goes on without evaluation')
            return
        if not run.spec.coordinator:    # ParameterServerStrategy fixed its workers when the chief built it
            run.members = run.members.without(TaskName.parse(name).index for name in decision.tasks
                                              if job_of(name) == 'worker')
        left = sum(f'worker:{i}' not in run.attempt.tolerated for i in run.members.indices)
        run.say(f'{decision.reason}; training goes on with {left} worker(s)')

    def _restart_tasks(self, decision: Decision) -> None:
        """Start the lost workers again once their backoff has passed; the rest keep training."""
        run = self.run
        delay = run.count_restart()
        wait = f' in {delay:g}s (supervise.backoff_secs)' if delay else ''
        run.say(f'restart {run.restarts}/{run.policy.max_restarts}: {decision.reason}; '
                f'starting {", ".join(decision.tasks)} again{wait}, it rejoins the training')
        run.life.next_attempt(decision.reason, None, tasks=decision.tasks)
        if any(job_of(name) == 'ps' for name in decision.tasks):
            # A coordinator without its ps cannot save: end it now rather than after a grace.
            chief = [r for r in run.records if r.job == 'chief' and r.name in decision.tasks]
            stop_all(chief, run.backends, grace=0)
        if any(job_of(name) == 'chief' for name in decision.tasks):
            run.attempt.restarted_chief()       # it resumes from a checkpoint: an older step is progress
        for name in decision.tasks:
            run.attempt.due[name] = time.monotonic() + delay
        run.start_due()

    def _restart_evaluator(self, decision: Decision) -> None:
        """Start the lost evaluator again once its backoff has passed, on its own restarts: the
        training never stopped for it, so none of the run's is spent and no "training again" follows."""
        run = self.run
        run.evaluator_restarts += 1
        delay = supervise.backoff_delay(run.policy, run.evaluator_restarts)
        wait = f' in {delay:g}s (supervise.backoff_secs)' if delay else ''
        run.say(f'evaluator restart {run.evaluator_restarts}/{run.policy.max_restarts} (its own, not the run\'s): '
                f'{decision.reason}; starting {", ".join(decision.tasks)} again{wait}; the training goes on')
        run.life.next_attempt(decision.reason, None, tasks=decision.tasks)
        for name in decision.tasks:
            run.attempt.due[name] = time.monotonic() + delay
        run.start_due()

    def _restart_cluster(self, decision: Decision) -> None:
        """Stop every task (the chief checkpoints first if it can), then start them all again: the
        chief restores the newest checkpoint and training goes on to the requested step. A task
        lost while they start again is one more fault, under the same policy."""
        run = self.run
        while True:
            delay = self._stop_for_restart(decision)
            if run.interrupted.wait(delay):
                return
            run.clock.phase('backoff', from_step=run.attempt.from_step)
            run.check_run_dir()
            try:
                run.start_cluster(restart=run.restarts)
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
        run.restarts += 1
        cause, can_save = faults.cause(decision, run.records, run.backends)
        run.say(f'restart {run.restarts}/{run.policy.max_restarts}: {cause}; stopping every task'
                + ('' if can_save else ' (no checkpoint can be saved without the lost task)'))
        run.teardown(checkpoint=can_save)
        run.clock.phase('stop')
        step = run.life.checkpoint_step()
        delay = run.history.backoff(run.policy)
        run.say(f'restart {run.restarts}/{run.policy.max_restarts}: resuming from '
                + (f'the checkpoint at global step {step}' if step is not None else
                   'step 0 (no checkpoint was written yet)')
                + (f' in {delay:g}s (supervise.backoff_secs, doubling while restarts do not bring the training back)' if delay else ''))
        reason = f'restart {run.restarts}/{run.policy.max_restarts}: {decision.reason}'
        ended = RunResult(state=RunState.FAILED, exit_code=EXIT_FAILED, restarts=run.restarts - 1,
                          failures=list(run.attempt.failures), global_step=run.attempt.global_step,
                          recoveries=list(run.clock.done))
        # The chief notes the restart in TensorBoard.
        run.new_attempt(reason, step, ended, env={rundir.RESTART_ENV: reason})
        return delay

    def _lost_in_restart(self, task: str, e: TaskFailed) -> Decision:
        """`task` died while the cluster started again (`e`): one more fault for the same policy;
        the decision to carry out next (TaskFailed once it is to give up)."""
        run = self.run
        statuses = run.attempt.observe(run.records, run.backends, run.say)
        lost = next((t for t in statuses if t.name == task), None)
        how = (supervise.how_lost(lost) if lost and lost.state is TaskState.FAILED
               else e.how or f'{task} {describe_exit(e.exit_code)}') + ' while the cluster started again'
        decision = supervise.during_recovery(run.policy, run.restarts, task, how, e.exit_code)
        decision = supervise.on_full_disk(decision, run.attempt.progress(run.spec.train.steps))
        decision = self._account(decision, statuses)
        if decision.action is Action.GIVE_UP:
            raise self._give_up(decision) from None
        run.clock.fault(decision.tasks, True, None)     # joins the fault being mended
        return decision
