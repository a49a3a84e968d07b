"""A restart of the whole cluster as plans (launch/run/supervised/recovery.py restart_cluster,
resume, lost_in_start) and the loop applying them over the fake backend: every task stopped,
a new attempt begun from the checkpoint the stop left, every task started; a task lost on the
way is an observation for the next round. Table tests, no process started."""
from __future__ import annotations

import os

import pytest

from cluster.runtime import rundir
from cluster.runtime.contract import RESTART_ENV
from cluster.runtime.rundir import EXIT_NO_RESTART
from launch.run.console import Console
from launch.run.lifecycle import Failure, Lifecycle, RunState
from launch.run.policy import Action, Decision, TaskState, TaskStatus
from launch.run.supervised import SupervisedRun, recovery
from launch.run.supervised.plan import Plan, Relaunch, StartAll
from launch.run.supervised.state import StartLoss, SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import FakeBackend, fake_cluster, record_of

ON_FAILURE = {'restart': 'on-failure', 'max_restarts': 3, 'backoff_secs': 0}
R, F = TaskState.RUNNING, TaskState.FAILED


def state_of(tmp_path, **settings) -> SupervisorState:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=2, supervise=ON_FAILURE, **settings))
    state = SupervisorState.new(spec, plans, None)
    state.records = [record_of(p) for p in plans]
    return state


@pytest.mark.parametrize('restarts, can_save, line', [
    (0, True, 'restart 1/3: ps:0 lost; stopping every task'),
    (2, False, 'restart 3/3: ps:0 lost; stopping every task (no checkpoint can be saved without the lost task)'),
])
def test_a_restart_of_the_cluster_stops_every_task_first(tmp_path, restarts, can_save, line):
    state = state_of(tmp_path)
    state.restarts = restarts
    plan = recovery.restart_cluster(state, Decision(Action.RESTART, ('ps:0',), 'the ps'), 'ps:0 lost', can_save)
    assert plan == Plan(relaunch=Relaunch(restarts + 1, 'the ps', can_save), say=(line,))
    assert state.restarts == restarts       # the loop counts it, applying the plan


@pytest.mark.parametrize('step, delay, line', [
    (40, 0.0, 'restart 2/3: resuming from the checkpoint at global step 40'),
    (None, 0.5, 'restart 2/3: resuming from step 0 (no checkpoint was written yet) in 0.5s '
                '(supervise.backoff_secs, doubling while restarts do not bring the training back)'),
])
def test_what_the_stop_left_decides_the_rest(tmp_path, step, delay, line):
    state = state_of(tmp_path)
    state.restarts = 2
    state.attempt.failures.append(Failure('ps:0', 'ps:0 lost'))
    plan = recovery.resume(state, Relaunch(2, 'ps:0 lost', True), step, delay, ())
    assert plan.say == (line,) and plan.start_all == StartAll(delay, 2)
    assert plan.attempt is not None and plan.attempt.reason == 'restart 2/3: ps:0 lost'
    assert plan.attempt.from_step == step and plan.attempt.env == {RESTART_ENV: 'restart 2/3: ps:0 lost'}
    ended = plan.attempt.ended
    assert (ended.state, ended.restarts, [f.task for f in ended.failures]) == (RunState.FAILED, 1, ['ps:0'])


@pytest.mark.parametrize('restarts, seen, loss, action, how', [
    (1, F, StartLoss('worker:1', None, 1), Action.RESTART, 'worker:1 exited with code 1'),
    (1, R, StartLoss('worker:1', 'worker:1 was not up within --start-timeout', None), Action.RESTART,
     'worker:1 was not up within --start-timeout'),
    (3, F, StartLoss('worker:1', None, 1), Action.GIVE_UP, 'worker:1 exited with code 1'),
    (1, F, StartLoss('worker:1', None, EXIT_NO_RESTART), Action.GIVE_UP, None),
])
def test_a_task_lost_while_starting_is_one_more_fault(tmp_path, restarts, seen, loss, action, how):
    state = state_of(tmp_path)
    state.restarts = restarts
    code = loss.exit_code if seen is F else None
    statuses = [TaskStatus('ps:0', 'ps', 0, R), TaskStatus('worker:1', 'worker', 1, seen, exit_code=code)]
    decision = recovery.lost_in_start(state, loss, statuses)
    assert decision.action is action and decision.tasks == ('worker:1',)
    if how is not None:
        assert decision.reason == f'{how} while the cluster started again'


def serving(plans) -> dict[str, list[str]]:
    return {p.name: [rundir.serving_line(p.name, p.task.address, 1)] for p in plans}


def run_over(tmp_path, monkeypatch, backend: FakeBackend, plans, spec) -> SupervisedRun:
    """A run whose tasks run (no `up`: its lifecycle reads the checkpoint from this run)."""
    run = SupervisedRun(spec, '', plans, {'fake': backend}, start_timeout=5)
    run.life = Lifecycle(spec, Console(stream=open(tmp_path / 'out', 'w')))
    monkeypatch.setattr(run.life, '_strategy', run)
    monkeypatch.setattr(run, 'check_run_dir', lambda: None)
    run.state.records = [record_of(p) for p in plans]
    os.makedirs(spec.train.train_dir, exist_ok=True)
    return run


def test_the_loop_stops_every_task_and_starts_them_in_a_new_attempt(tmp_path, monkeypatch):
    spec, plans = fake_cluster(write_spec(tmp_path, workers=2, supervise=ON_FAILURE))
    backend = FakeBackend({p.name: None for p in plans}, serving(plans))
    run = run_over(tmp_path, monkeypatch, backend, plans, spec)
    run.apply(recovery.restart_cluster(run.state, Decision(Action.RESTART, ('ps:0',), 'ps:0 lost'), 'ps:0 lost', True))
    run.teardown()
    assert run.state.restarts == 1 and run.life.attempt == 1 and run.state.lost_starting is None
    assert sorted(name for name, _ in backend.stopped[:3]) == ['ps:0', 'worker:0', 'worker:1']
    assert backend.started == ['ps:0', 'worker:0', 'worker:1']
    assert all(p.env[RESTART_ENV] == 'restart 1/3: ps:0 lost' for p in run.state.plans)
    text = (tmp_path / 'out').read_text()
    assert 'restart 1/3: ps:0 lost; stopping every task\n' in text
    assert 'restart 1/3: resuming from step 0 (no checkpoint was written yet)\n' in text


def test_a_task_lost_while_the_cluster_starts_is_left_to_the_next_round(tmp_path, monkeypatch):
    spec, plans = fake_cluster(write_spec(tmp_path, workers=2, supervise=ON_FAILURE))
    backend = FakeBackend({p.name: None for p in plans}, serving(plans), on_start={'worker:1': 1})
    run = run_over(tmp_path, monkeypatch, backend, plans, spec)
    run.apply(recovery.restart_cluster(run.state, Decision(Action.RESTART, ('ps:0',), 'ps:0 lost'), 'ps:0 lost', True))
    run.teardown()
    assert run.state.lost_starting == StartLoss('worker:1', None, 1)
    assert run.state.restarts == 1 and run.life.attempt == 1
