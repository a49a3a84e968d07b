"""Failover as a plan (launch/run/supervised/failover.py): a lost worker whose host cannot be
reached is replaced by a spare of the pool on a host that can be."""
from __future__ import annotations

from cluster.runtime.membership import Members
from launch.records.event_types import Failover
from launch.run.policy import Action, Decision, TaskState, TaskStatus
from launch.run.supervised.failover import fail_over
from launch.run.supervised.plan import Backoff
from launch.run.supervised.state import SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import fake_cluster, record_of

HOSTS = ['127.0.0.1', '127.0.0.1', '127.0.0.2', '127.0.0.1', '127.0.0.2']      # ps:0, worker:0..3 (1, 3: .2)
BACKOFF = Backoff(1, 20.0, 1.5)


def state_of(tmp_path, restart: str = 'on-failure', restarts: int = 0) -> SupervisorState:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=4, task_hosts=HOSTS, sync=False,
                                          supervise={'restart': restart, 'max_restarts': 2}))
    state = SupervisorState.new(spec, plans, 2)
    state.records = [record_of(p) for p in plans if p.task.job == 'ps' or p.task.index in state.members.workers]
    state.restarts = restarts
    return state


def seen(unknown: str) -> list[TaskStatus]:
    return [TaskStatus(n, n.split(':')[0], int(n[-1]), TaskState.UNKNOWN if n == unknown else TaskState.RUNNING)
            for n in ('ps:0', 'worker:0', 'worker:1')]


def test_a_spare_on_a_reachable_host_takes_the_lost_workers_place(tmp_path):
    state = state_of(tmp_path)
    decision = Decision(Action.TOLERATE, ('worker:1',), 'worker:1 cannot be reached')
    plan = fail_over(state, decision, seen('worker:1'), BACKOFF)
    assert plan is not None
    spare = state.plan_of('worker:2')
    assert plan.members == Members(2, {0: 1, 2: 2})
    assert plan.retire == plan.tolerate == {'worker:1'} and plan.publish and plan.restart == BACKOFF
    assert plan.say == (f'restart 1/2: worker:1 cannot be reached; starting worker:2 on {spare.task.address} in its '
                        'place (a spare of the pool)',)
    assert plan.events == (Failover(task='worker:1', to='worker:2', host='127.0.0.1',
                                    cause='worker:1 cannot be reached'),)
    assert plan.drop == ('worker:1',) and plan.due == {'worker:2': 21.5} and plan.start


def test_no_failover_without_restarts_left_or_a_spare(tmp_path):
    decision = Decision(Action.TOLERATE, ('worker:1',), 'worker:1 cannot be reached')
    assert fail_over(state_of(tmp_path, restart='never'), decision, seen('worker:1'), BACKOFF) is None
    assert fail_over(state_of(tmp_path, restarts=2), decision, seen('worker:1'), BACKOFF) is None
    state = state_of(tmp_path)
    state.retired = {'worker:2'}
    assert fail_over(state, decision, seen('worker:1'), BACKOFF) is None       # worker:3 is on the lost host
