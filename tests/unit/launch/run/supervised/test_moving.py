"""A task moved as the whole cluster starts again (launch/run/supervised/placing.py): which tasks
moved, the plans of the new placement carrying what the run gave the old ones, the loop saying
where and why and giving every task the new cluster; and the restart that becomes
one of the whole cluster when a ps lost with its node can move (policy.py TaskStatus.movable).
Over the fake backend: no process started."""
from __future__ import annotations

import dataclasses
import os

import pytest

from cluster.runtime import rundir
from cluster.runtime.contract import RESTART_ENV
from launch.planning.plan import TaskPlan
from launch.run.console import Console
from launch.run.lifecycle import Lifecycle
from launch.run.policy import Action, Decision, Policy, Progress, TaskState, TaskStatus, decide_coordinator
from launch.run.supervised import SupervisedRun, recovery
from launch.run.supervised.placing import Placement, carried, moves
from tests.conftest import write_spec
from tests.harness.fake_backend import FakeBackend, fake_cluster, record_of

ON_FAILURE = {'restart': 'on-failure', 'max_restarts': 3, 'backoff_secs': 0}
R, U = TaskState.RUNNING, TaskState.UNKNOWN
WHY = 'its node 127.0.0.4 left the Ray cluster'


def moved_ps(spec, host: str = '127.0.0.9', port: int = 23456):
    tasks = tuple(dataclasses.replace(t, host=host, port=port) if t.name == 'ps:0' else t for t in spec.tasks)
    return dataclasses.replace(spec, tasks=tasks)


def test_moves_names_each_task_whose_address_changed(tmp_path):
    spec, _ = fake_cluster(write_spec(tmp_path, workers=2))
    ps = spec.task('ps', 0)
    assert moves(spec, spec) == []
    assert moves(spec, moved_ps(spec)) == [('ps:0', ps.address, '127.0.0.9:23456')]


def test_the_new_plans_keep_the_attempt_and_what_the_run_added_and_take_the_new_addresses(tmp_path):
    spec, plans = fake_cluster(write_spec(tmp_path, workers=2))
    old = [dataclasses.replace(p, attempt=3, restart=2, env={**p.env, RESTART_ENV: 'why', 'TF_CONFIG': 'old'})
           for p in plans]
    new = [dataclasses.replace(p, env={**p.env, 'TF_CONFIG': 'new'}) for p in plans]
    out = carried(old, new)
    assert [(p.attempt, p.restart, p.env[RESTART_ENV], p.env['TF_CONFIG']) for p in out] == [(3, 2, 'why', 'new')] * 3


class PlacingBackend(FakeBackend):
    """The fake backend, remembering the spec each prepare wrote."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.prepared: list[str] = []

    def prepare(self, plans: list[TaskPlan], spec_yaml: str) -> None:
        self.prepared.append(spec_yaml)


def run_over(tmp_path, monkeypatch, backend, spec, plans, place_again, emitted: list) -> SupervisedRun:
    run = SupervisedRun(spec, 'first', plans, {'fake': backend}, start_timeout=5, place_again=place_again)
    run.life = Lifecycle(spec, Console(stream=open(tmp_path / 'out', 'w')))
    monkeypatch.setattr(run.life, '_strategy', run)
    monkeypatch.setattr(run.life, 'emit', emitted.append)
    monkeypatch.setattr(run, 'check_run_dir', lambda: None)
    run.state.records = [record_of(p) for p in plans]
    os.makedirs(spec.train.train_dir, exist_ok=True)
    return run


def serving(plans) -> dict[str, list[str]]:
    return {p.name: [rundir.serving_line(p.name, p.task.address, 1)] for p in plans}


@pytest.mark.parametrize('moved', [True, False])
def test_a_restart_of_the_cluster_places_again_and_tells_every_task_where_a_task_moved(tmp_path, monkeypatch, moved):
    spec, plans = fake_cluster(write_spec(tmp_path, workers=2, supervise=ON_FAILURE))
    there = moved_ps(spec) if moved else spec
    new_plans = [dataclasses.replace(p, task=there.task(p.task.job, p.task.index)) for p in plans]
    asked = []

    def again() -> Placement:
        asked.append(1)
        return Placement(there, 'placed again', new_plans, {'ps:0': WHY} if moved else {})

    backend = PlacingBackend({p.name: None for p in plans}, {**serving(plans), **serving(new_plans)})
    emitted: list = []
    run = run_over(tmp_path, monkeypatch, backend, spec, plans, again, emitted)
    run.apply(recovery.restart_cluster(run.state, Decision(Action.RESTART, ('ps:0',), 'ps:0 lost'), 'ps:0 lost', True))
    run.teardown()
    assert asked == [1] and backend.started == ['ps:0', 'worker:0', 'worker:1']
    text = (tmp_path / 'out').read_text()
    line = f'ps:0 moves from {spec.task("ps", 0).address} to 127.0.0.9:23456: {WHY}'
    got = [e.to_json() for e in emitted if e.kind == 'moved']
    if moved:
        assert line in text and backend.prepared == ['placed again'] and run.spec_yaml == 'placed again'
        assert run.state.plan_of('ps:0').task.address == '127.0.0.9:23456' == run.state.spec.task('ps', 0).address
        assert run.state.plan_of('ps:0').env[RESTART_ENV] == 'restart 1/3: ps:0 lost'
        assert [(e['task'], e['before'], e['address'], e['cause']) for e in got] == [
            ('ps:0', spec.task('ps', 0).address, '127.0.0.9:23456', WHY)]
    else:
        assert 'moves from' not in text and backend.prepared == [] and got == []
        assert run.state.plan_of('ps:0').task == spec.task('ps', 0)


@pytest.mark.parametrize('movable, action', [
    (True, Action.RESTART),      # lost with its node, it can start elsewhere: with the whole cluster
    (False, Action.GIVE_UP),     # pinned to a node that left (or a host that cannot be reached)
])
def test_a_ps_lost_with_its_node_restarts_the_whole_cluster_where_it_can_move(movable, action):
    rules = Policy(sync=False, num_workers=2, replicas_to_aggregate=2, restart='on-failure', unreachable_secs=2,
                   coordinator=True)
    tasks = [TaskStatus('chief:0', 'chief', 0, R), TaskStatus('ps:0', 'ps', 0, U, since=3, movable=movable),
             TaskStatus('worker:0', 'worker', 0, R), TaskStatus('worker:1', 'worker', 1, R),
             TaskStatus('evaluator:0', 'evaluator', 0, R)]
    decision = decide_coordinator(rules, tasks, set(), 0, Progress(step=40, total=100, quiet_secs=1))
    assert decision.action is action
    if movable:
        assert decision.tasks == ('chief:0', 'ps:0', 'worker:0', 'worker:1')
        assert decision.reason.endswith("; the cluster starts again elsewhere, from the chief's checkpoint")


@pytest.mark.parametrize('ps, action', [
    (U, Action.CONTINUE),           # the ps cannot be asked: its verdict first, one restart for both
    (R, Action.RESTART_TASKS),      # the ps answers: the chief alone starts again
])
def test_a_chief_lost_while_a_ps_cannot_be_asked_waits_for_the_ps(ps, action):
    rules = Policy(sync=False, num_workers=2, replicas_to_aggregate=2, restart='on-failure', unreachable_secs=5,
                   coordinator=True)
    tasks = [TaskStatus('chief:0', 'chief', 0, TaskState.FAILED, exit_code=1),
             TaskStatus('ps:0', 'ps', 0, ps, since=1), TaskStatus('worker:0', 'worker', 0, R)]
    decision = decide_coordinator(rules, tasks, set(), 0, Progress(step=40, total=100, quiet_secs=1))
    assert decision.action is action
