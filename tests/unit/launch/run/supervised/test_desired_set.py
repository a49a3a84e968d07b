"""The desired set (launch/run/supervised/state.py SupervisorState.desired): the tasks that should
run, as tolerate, failover and scale plans leave it once the loop applied them. Table tests over
the fake backend's plans, no process started."""
from __future__ import annotations

import pytest

from cluster.runtime.membership import Members
from launch.run.policy import Action, Decision, TaskState, TaskStatus
from launch.run.supervised import recovery
from launch.run.supervised.plan import Backoff
from launch.run.supervised.state import SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import fake_cluster

ON_FAILURE = {'restart': 'on-failure', 'max_restarts': 3}


def state_of(tmp_path, live: int | None = None, **settings) -> SupervisorState:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=4, **settings))
    return SupervisorState.new(spec, plans, live)


def names(state: SupervisorState) -> list[str]:
    return [p.name for p in state.desired()]


@pytest.mark.parametrize('live, want', [
    (None, ['ps:0', 'worker:0', 'worker:1', 'worker:2', 'worker:3']),
    (2, ['ps:0', 'worker:0', 'worker:1']),          # the rest of the pool waits for `launch scale`
])
def test_at_the_start_the_ps_tasks_and_the_live_workers_are_desired(tmp_path, live, want):
    assert names(state_of(tmp_path, live)) == want


def test_a_worker_let_go_is_no_longer_desired(tmp_path):
    state = state_of(tmp_path, sync=False)
    plan = recovery.tolerate(state, Decision(Action.TOLERATE, ('worker:3',), 'worker:3 lost'))
    state.attempt.tolerated |= plan.tolerate            # as the loop applies it
    state.members = plan.members or state.members
    assert names(state) == ['ps:0', 'worker:0', 'worker:1', 'worker:2']


def test_a_failed_over_worker_gives_its_place_to_the_spare(tmp_path):
    spec, plans = fake_cluster(write_spec(tmp_path, workers=4, sync=False, supervise=ON_FAILURE,
                                          task_hosts=['127.0.0.1', '127.0.0.1', '127.0.0.2', '127.0.0.1', '127.0.0.2']))
    state = SupervisorState.new(spec, plans, 2)
    statuses = [TaskStatus('worker:1', 'worker', 1, TaskState.UNKNOWN, since=60)]   # its host, .2, is lost
    plan = recovery.plan_for(state, Decision(Action.TOLERATE, ('worker:1',), 'worker:1 unreachable'), statuses, 0.0)
    assert plan is not None and plan.retire == {'worker:1'}
    state.retired |= plan.retire                        # as the loop applies it
    state.attempt.tolerated |= plan.tolerate
    state.members = plan.members or state.members
    assert names(state) == ['ps:0', 'worker:0', 'worker:2']


def test_a_scale_changes_the_desired_set(tmp_path):
    state = state_of(tmp_path, live=2)
    state.members = Members(2, {0: 1, 1: 1, 2: 2})
    assert names(state) == ['ps:0', 'worker:0', 'worker:1', 'worker:2']


def test_a_backoff_does_not_take_a_task_out_of_the_desired_set(tmp_path):
    state = state_of(tmp_path, supervise=ON_FAILURE)
    plan = recovery.restart_tasks(state, Decision(Action.RESTART_TASKS, ('worker:1',), 'lost'), Backoff(1, 0.0, 5.0))
    state.attempt.due.update(plan.due)
    assert 'worker:1' in names(state)
