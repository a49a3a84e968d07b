"""The desired set held against what was started (launch/run/supervised/reconcile.py): what the
loop starts and stops once per round, after the plans of recovery, failover and scaling changed
the desired set. Table tests over the fake backend, no process started."""
from __future__ import annotations

import os

import pytest

from cluster.runtime import rundir
from launch.run.console import Console
from launch.run.control import ScaleRequest
from launch.run.lifecycle import Lifecycle
from launch.run.policy import Action, Decision, TaskState, TaskStatus
from launch.run.supervised import SupervisedRun, recovery
from launch.run.supervised.failover import fail_over
from launch.run.supervised.plan import Backoff, Plan
from launch.run.supervised.reconcile import reconcile
from launch.run.supervised.scaling import ScaleMove, change_live
from launch.run.supervised.state import SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import FakeBackend, fake_cluster, record_of

ON_FAILURE = {'restart': 'on-failure', 'max_restarts': 3}
HOSTS = ['127.0.0.1', '127.0.0.1', '127.0.0.2', '127.0.0.1', '127.0.0.2']      # ps:0, worker:0..3 (1, 3: .2)


def state_of(tmp_path, live: int | None = None, **settings) -> SupervisorState:
    """A run of four workers (`live` of them live), every desired task started."""
    spec, plans = fake_cluster(write_spec(tmp_path, workers=4, sync=False, supervise=ON_FAILURE, **settings))
    state = SupervisorState.new(spec, plans, live)
    state.records = [record_of(p) for p in state.desired()]
    return state


def applied(state: SupervisorState, plan: Plan) -> SupervisorState:
    """The desired set as the loop leaves it after `plan` (loop.py SupervisedRun.apply)."""
    state.restarts += plan.restart is not None
    state.retired |= plan.retire
    state.attempt.tolerated = (state.attempt.tolerated | plan.tolerate) - plan.welcome
    state.members = plan.members or state.members
    state.dropped |= set(plan.drop)
    state.attempt.due.update(plan.due)
    return state


def test_nothing_due_and_nothing_failed_over_is_the_empty_plan(tmp_path):
    assert reconcile(state_of(tmp_path), 100.0).empty


@pytest.mark.parametrize('now, starts', [
    (9.0, ()),
    (10.0, ('worker:2',)),                          # due now: started
    (20.0, ('worker:2', 'worker:1')),               # the earliest first
])
def test_the_due_tasks_whose_time_came_start_earliest_first(tmp_path, now, starts):
    state = state_of(tmp_path)
    state.attempt.due = {'worker:1': 15.0, 'worker:2': 10.0}
    assert reconcile(state, now) == Plan(starts=starts)


def test_lost_workers_restarted_start_once_their_backoff_passed(tmp_path):
    state = state_of(tmp_path)
    plan = recovery.restart_tasks(state, Decision(Action.RESTART_TASKS, ('worker:1',), 'worker:1 lost'),
                                  Backoff(1, 100.0, 2.0))
    applied(state, plan)
    assert reconcile(state, 101.0).empty                     # in its backoff: still desired, not started
    assert reconcile(state, 102.0) == Plan(starts=('worker:1',))


def test_a_failed_over_worker_is_stopped_once_and_its_spare_started_when_due(tmp_path):
    state = state_of(tmp_path, live=2, task_hosts=HOSTS)
    seen = [TaskStatus('worker:1', 'worker', 1, TaskState.UNKNOWN, since=60)]
    plan = fail_over(state, Decision(Action.TOLERATE, ('worker:1',), 'worker:1 unreachable'), seen,
                     Backoff(1, 20.0, 1.5))
    assert plan is not None
    state.retired |= plan.retire                # the desired set changed, nothing stopped yet
    state.attempt.tolerated |= plan.tolerate
    state.attempt.due.update(plan.due)
    assert reconcile(state, 20.0) == Plan(drop=('worker:1',))
    state.dropped |= {'worker:1'}               # as the loop applies it: never stopped twice
    assert reconcile(state, 21.5) == Plan(starts=('worker:2',))


def test_a_worker_let_go_is_left_as_it_is(tmp_path):
    state = state_of(tmp_path)
    applied(state, recovery.tolerate(state, Decision(Action.TOLERATE, ('worker:3',), 'worker:3 lost')))
    assert 'worker:3' not in [p.name for p in state.desired()] and reconcile(state, 100.0).empty


@pytest.mark.parametrize('live, want, starts', [
    (2, 3, ('worker:2',)),          # a joiner, due at once
    (4, 2, ()),                     # leavers: their lease tells them, they stop by themselves
])
def test_an_async_scale_starts_the_joiners_and_lets_the_leavers_go_by_themselves(tmp_path, live, want, starts):
    state = state_of(tmp_path, live=live)
    move = ScaleMove.of(state.members, 4, set(), want)
    applied(state, change_live(state, ScaleRequest('r1', want), move, 5.0))
    assert reconcile(state, 5.0) == Plan(starts=starts)


def run_over(tmp_path, script: dict[str, object] | None = None) -> tuple[SupervisedRun, FakeBackend]:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=3, sync=False, supervise=ON_FAILURE))
    backend = FakeBackend({p.name: None for p in plans} | (script or {}),
                          {p.name: [rundir.serving_line(p.name, p.task.address, 1)] for p in plans})
    run = SupervisedRun(spec, '', plans, {'fake': backend})
    run.life = Lifecycle(spec, Console(stream=open(tmp_path / 'out', 'w')))
    run.state.records = [record_of(p) for p in plans]
    os.makedirs(spec.train.train_dir, exist_ok=True)
    return run, backend


def test_the_loop_starts_what_reconcile_says_and_stops_a_frozen_copy_first(tmp_path):
    run, backend = run_over(tmp_path, {'worker:1': 'frozen', 'worker:2': 1})
    run.state.attempt.due = {'worker:1': 0.0, 'worker:2': 0.0, 'worker:0': 10 ** 9}
    run.apply(reconcile(run.state, 1.0))
    run.life.unfollow(['worker:1', 'worker:2'])
    assert backend.started == ['worker:1', 'worker:2'] and backend.stopped[0][0] == 'worker:1'
    assert run.state.attempt.due == {'worker:0': 10 ** 9}
    assert [r.pid for r in run.state.records if r.name in ('worker:1', 'worker:2')] == [1001, 1002]


def test_a_plan_that_asks_for_it_is_reconciled_at_once(tmp_path):
    run, backend = run_over(tmp_path, {'worker:2': 1})
    plan = recovery.restart_tasks(run.state, Decision(Action.RESTART_TASKS, ('worker:2',), 'worker:2 lost'),
                                  Backoff(1, 0.0, 0.0))
    run.apply(plan)
    run.life.unfollow(['worker:2'])
    assert plan.start and backend.started == ['worker:2'] and not run.state.attempt.due
