"""Preemption as plans (launch/run/supervised/preemption.py) and decisions (launch/run/policy.py):
a notice told once, with the chief asked for a checkpoint unless it is the one preempted; a task
whose notice is done counts as left preempted; a preemption restarts what the policy's rules
say, spending none of supervise.max_restarts and waiting no backoff. No process started."""
from __future__ import annotations

import dataclasses

import pytest

from cluster.runtime.contract import EXIT_PREEMPTED
from launch.records.event_types import Preempted
from launch.run.policy import Action, Decision, Policy, Progress, TaskState, TaskStatus, decide
from launch.run.supervised import preemption, recovery
from launch.run.supervised.attempt import Notice
from launch.run.supervised.faults import Backoff
from launch.run.supervised.state import SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import fake_cluster

R, F = TaskState.RUNNING, TaskState.FAILED
NO_RESTARTS = {'restart': 'on-failure', 'max_restarts': 0, 'backoff_secs': 5}


def state_of(tmp_path, coordinator: bool = False, **supervise) -> SupervisorState:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=2, sync=False, supervise={**NO_RESTARTS, **supervise}))
    if coordinator:
        spec = dataclasses.replace(spec, coordinator=True)
    return SupervisorState.new(spec, plans, None)


def running(state) -> list[TaskStatus]:
    return [TaskStatus(p.name, p.task.job, p.task.index, R) for p in state.plans]


@pytest.mark.parametrize('task, asks', [('ps:0', True), ('worker:1', True), ('worker:0', False)])
def test_a_notice_is_told_once_and_the_chief_asked_to_save_unless_it_is_the_one(tmp_path, task, asks):
    state = state_of(tmp_path)
    state.attempt.saved = 40
    state.attempt.saw_notice(task, 30.0, 52)
    first = preemption.step(state, running(state), now=0.0)
    assert first.plan is not None
    assert first.plan.events == (Preempted(task=task, cause='a SIGTERM from outside the launcher', grace=30.0,
                                           step=52, checkpoint=40),)
    assert 'not counted against supervise.max_restarts' in first.plan.say[0]
    assert (first.plan.members is not None and first.plan.members.save == 1 and first.plan.publish) is asks
    again = preemption.step(state, running(state), now=0.0)
    assert again.plan is None


@pytest.mark.parametrize('saved, later, done', [
    (40, 1.0, False),      # no newer checkpoint, grace not up: the task keeps serving
    (60, 1.0, True),       # the chief saved after the notice
    (40, 29.0, True),      # the grace (less the margin) is up
])
def test_a_task_counts_as_left_preempted_once_the_chief_saved_or_its_grace_is_up(tmp_path, saved, later, done):
    state = state_of(tmp_path)
    state.attempt.saved = 40
    state.attempt.saw_notice('ps:0', 30.0, 52)
    at = state.attempt.notices['ps:0'].at
    state.attempt.saved = saved
    seen = preemption.step(state, running(state), now=at + later).statuses
    ps = next(t for t in seen if t.name == 'ps:0')
    assert (ps.state, ps.exit_code, ps.preempted) == ((F, EXIT_PREEMPTED, True) if done else (R, None, False))


def test_a_notice_of_the_start_before_is_forgotten_as_the_task_starts_again(tmp_path):
    state = state_of(tmp_path)
    state.attempt.saw_notice('worker:1', 30.0, 52)
    preemption.step(state, running(state), now=1e9)
    state.attempt.forget_notice('worker:1')
    assert state.attempt.notices_now() == [] and not state.attempt.told and not state.attempt.done


RULES = Policy(sync=False, num_workers=2, replicas_to_aggregate=2, restart='on-failure', max_restarts=0)


@pytest.mark.parametrize('lost, action, as_fault', [
    ('ps:0', Action.RESTART, Action.GIVE_UP),               # TF1: a ps is the whole cluster's
    ('worker:0', Action.RESTART, Action.GIVE_UP),           # ... and so is the chief
    ('worker:1', Action.RESTART_TASKS, Action.TOLERATE),    # an async worker alone (a fault: let go)
])
def test_a_preemption_restarts_as_a_fault_would_with_no_restart_left(lost, action, as_fault):
    tasks = [TaskStatus('ps:0', 'ps', 0, R), TaskStatus('worker:0', 'worker', 0, R),
             TaskStatus('worker:1', 'worker', 1, R)]
    tasks = [dataclasses.replace(t, state=F, exit_code=EXIT_PREEMPTED, preempted=True) if t.name == lost else t
             for t in tasks]
    progress = Progress(step=50, total=100, quiet_secs=1)
    decision = decide(RULES, tasks, set(), 0, progress)
    assert (decision.action, decision.tasks[0], decision.preempted) == (action, lost, True)
    assert decision.reason.startswith(f'{lost} was preempted')
    fault = decide(RULES, [dataclasses.replace(t, preempted=False) for t in tasks], set(), 0, progress)
    assert fault.action is as_fault and not fault.preempted       # max_restarts: 0


def test_a_preempted_restart_spends_no_restart_and_waits_no_backoff(tmp_path):
    state = state_of(tmp_path)
    decision = Decision(Action.RESTART_TASKS, ('worker:1',), 'worker:1 was preempted', preempted=True)
    plan = recovery.restart_tasks(state, decision, Backoff(at=100.0, delay=5.0, streak=1))
    assert plan.restart is None and plan.due == {'worker:1': 100.0}
    assert plan.say[0].startswith('after a preemption: worker:1 was preempted; starting worker:1 again,')
    whole = recovery.restart_cluster(state, dataclasses.replace(decision, action=Action.RESTART, tasks=('ps:0',)),
                                     'ps:0 was preempted', True)
    assert whole.relaunch is not None and whole.relaunch.number == 0 and whole.relaunch.preempted
    assert whole.say == ('after a preemption: ps:0 was preempted; stopping every task',)
    resumed = recovery.resume(state, whole.relaunch, 40, 0.0, ())
    assert resumed.say == ('after a preemption: resuming from the checkpoint at global step 40',)
    assert resumed.attempt is not None and resumed.attempt.ended.restarts == 0


def test_notice_fields_are_kept():
    n = Notice('ps:0', 1.0, 30.0, 5, None)
    assert preemption.is_done(n, 1, 2.0) and not preemption.is_done(n, None, 2.0) and preemption.is_done(n, None, 29.0)


def test_a_task_that_left_preempted_before_its_notice_line_was_read_is_told_all_the_same(tmp_path):
    """The chief saves and goes at once: its exit code can be seen before the log follower read
    its notice line (CI saw the count lost so). The exit code is the notice then, told once."""
    state = state_of(tmp_path, preemption_grace=20)
    state.attempt.saw_step(77)
    gone = [dataclasses.replace(t, state=F, exit_code=EXIT_PREEMPTED, preempted=True) if t.name == 'worker:0' else t
            for t in running(state)]
    first = preemption.step(state, gone, now=0.0)
    assert first.plan is not None and first.plan.preemptions == 1
    assert first.plan.events == (Preempted(task='worker:0', cause='a SIGTERM from outside the launcher', grace=20.0,
                                           step=77, checkpoint=None),)
    state.attempt.saw_notice('worker:0', 20.0, 77)      # the line, read late, is not a second notice
    assert preemption.step(state, gone, now=0.0).plan is None
