"""Recovery as plans (launch/run/supervised/recovery.py): given the run's state and a decision of
the policy, the plan the loop is to apply. Table tests, no process started."""
from __future__ import annotations

import pytest

from cluster.runtime.membership import Members
from launch.records.event_types import Tolerated
from launch.run.policy import Action, Decision, TaskState, TaskStatus
from launch.run.supervised import recovery
from launch.run.supervised.plan import Backoff, Plan
from launch.run.supervised.state import SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import fake_cluster, record_of

R, F, U = TaskState.RUNNING, TaskState.FAILED, TaskState.UNKNOWN


def state_of(tmp_path, workers: int = 3, live: int | None = None, **settings) -> SupervisorState:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=workers, **settings))
    state = SupervisorState.new(spec, plans, live)
    state.records = [record_of(p) for p in plans if p.task.job == 'ps' or p.task.index in state.members.workers]
    return state


def status(name: str, state: TaskState = R, code: int | None = None) -> TaskStatus:
    job, index = name.split(':')
    return TaskStatus(name, job, int(index), state, exit_code=code)


@pytest.mark.parametrize('lost, coordinator, members, left', [
    (('worker:2',), False, {0: 1, 1: 1}, 'training goes on with 2 worker(s)'),
    (('worker:1', 'worker:2'), False, {0: 1}, 'training goes on with 1 worker(s)'),
    (('worker:0',), False, None, 'training goes on with 2 worker(s)'),       # never the chief
])
def test_a_tolerated_worker_leaves_the_live_set(tmp_path, lost, coordinator, members, left):
    state = state_of(tmp_path, sync=False)
    plan = recovery.tolerate(state, Decision(Action.TOLERATE, lost, 'worker lost'))
    assert plan.tolerate == frozenset(lost)
    assert plan.events == tuple(Tolerated(task=name, cause='worker lost') for name in lost)
    assert plan.say == (f'worker lost; {left}',)
    assert plan.members == (None if members is None else Members(2, members))
    assert not plan.publish and not plan.due and plan.restart is None


def test_an_evaluator_let_go_leaves_the_training_as_it_is(tmp_path):
    state = state_of(tmp_path)
    plan = recovery.tolerate(state, Decision(Action.TOLERATE, ('evaluator:0',), 'evaluator lost', note='no restarts'))
    assert plan.say == ('evaluator lost; no restarts; training goes on without evaluation',)
    assert plan.members is None and plan.tolerate == {'evaluator:0'}


@pytest.mark.parametrize('tasks, delay, line, kill, chief', [
    (('worker:1',), 0.0, 'restart 1/3: worker:1 lost; starting worker:1 again, it rejoins the training', (), False),
    (('worker:1', 'worker:2'), 2.0, 'restart 1/3: worker:1 lost; starting worker:1, worker:2 again in 2s '
     '(supervise.backoff_secs), it rejoins the training', (), False),
])
def test_lost_workers_start_again_after_their_backoff(tmp_path, tasks, delay, line, kill, chief):
    state = state_of(tmp_path, supervise={'restart': 'on-failure', 'max_restarts': 3})
    backoff = Backoff(1, 100.0, delay)
    plan = recovery.restart_tasks(state, Decision(Action.RESTART_TASKS, tasks, 'worker:1 lost'), backoff)
    assert plan == Plan(restart=backoff, say=(line,), restart_tasks=tasks, restart_reason='worker:1 lost', kill=kill,
                        restarted_chief=chief, due={name: 100.0 + delay for name in tasks}, start=True)


def test_an_evaluator_restart_is_its_own_and_not_the_runs(tmp_path):
    state = state_of(tmp_path, supervise={'restart': 'on-failure', 'max_restarts': 3})
    state.evaluator_restarts = 1
    plan = recovery.restart_evaluator(state, Decision(Action.RESTART_TASKS, ('evaluator:0',), 'evaluator:0 lost'), 50.0)
    assert plan.restart is None and plan.evaluator_restart
    assert plan.say[0].startswith("evaluator restart 2/3 (its own, not the run's): evaluator:0 lost; "
                                  'starting evaluator:0 again')
    assert plan.restart_tasks == ('evaluator:0',) and list(plan.due) == ['evaluator:0'] and plan.start


@pytest.mark.parametrize('action, expect', [
    (Action.TOLERATE, 'tolerate'),
    (Action.RESTART_TASKS, 'restart'),
    (Action.RESTART, None),        # the cluster: recovery.restart_cluster, whose words ask the tasks
])
def test_each_decision_gets_its_plan(tmp_path, action, expect):
    state = state_of(tmp_path, sync=False, supervise={'restart': 'on-failure', 'max_restarts': 3})
    statuses = [status('ps:0'), status('worker:0'), status('worker:1'), status('worker:2', F, 1)]
    plan = recovery.plan_for(state, Decision(action, ('worker:2',), 'worker:2 lost'), statuses, 10.0)
    if expect is None:
        assert plan is None
    elif expect == 'tolerate':
        assert plan is not None and plan.tolerate == {'worker:2'} and plan.restart is None
    else:
        assert plan is not None and plan.restart is not None and plan.due == {'worker:2': 10.0 + plan.restart.delay}
