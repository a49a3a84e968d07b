"""A sync scale as plans (launch/run/supervised/scaling.py restart_scaled, resume_scaled): the
cluster stops (the chief saves first) and starts again with the new live set from the checkpoint,
spending none of the run's restarts; and the loop applying them over the fake backend. Table
tests, no process started."""
from __future__ import annotations

import os

import pytest

from cluster.runtime import rundir
from cluster.runtime.membership import Members
from launch.records.event_types import Scale
from launch.run.console import Console
from launch.run.control import ScaleRequest
from launch.run.lifecycle import Lifecycle, RunState
from launch.run.supervised import SupervisedRun
from launch.run.supervised.plan import Plan, Relaunch, StartAll
from launch.run.supervised.scaling import restart_scaled, resume_scaled
from launch.run.supervised.state import StartLoss, SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import FakeBackend, fake_cluster, record_of

THREE = Members(2, {0: 1, 1: 1, 2: 2})
STOP = ('scaling 2 -> 3 workers: sync training fixes its number of replicas (SyncReplicasOptimizer), so the '
        'cluster restarts through a checkpoint; the chief saves first')


def state_of(tmp_path, live: int = 2) -> SupervisorState:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=3))
    state = SupervisorState.new(spec, plans, live)
    state.records = [record_of(p) for p in plans if p.task.job == 'ps' or p.task.index in state.members.workers]
    return state


def test_a_sync_scale_stops_every_task_and_spends_no_restart(tmp_path):
    state = state_of(tmp_path)
    plan = restart_scaled(state, ScaleRequest('r1', 3, pid=77), THREE, ['worker:2'], [])
    assert plan == Plan(say=(STOP,), events=(Scale(to=3, add=['worker:2'], remove=[], pid=77),),
                        relaunch=Relaunch(None, 'scale 2 -> 3 workers', True, THREE, ()))


@pytest.mark.parametrize('step, resumed', [
    (40, 'the checkpoint at global step 40'),
    (None, 'step 0 (no checkpoint yet)'),
])
def test_the_new_live_set_starts_from_the_checkpoint_the_stop_left(tmp_path, step, resumed):
    state = state_of(tmp_path, live=3)
    state.restarts = 1
    plan = resume_scaled(state, Relaunch(None, 'scale 3 -> 2 workers', True, Members(2, {0: 1, 1: 1}),
                                         ('worker:2',)), step)
    assert plan.members == Members(2, {0: 1, 1: 1}) and plan.leaving == ('worker:2',) and plan.publish
    assert plan.say == (f'scaling 3 -> 2 workers: starting the cluster again from {resumed}',)
    assert plan.start_all == StartAll(0.0, None) and plan.relaunch is None
    assert plan.attempt is not None and (plan.attempt.reason, plan.attempt.from_step) == ('scale 3 -> 2 workers', step)
    assert (plan.attempt.ended.state, plan.attempt.ended.restarts) == (RunState.SCALED, 1)


def run_over(tmp_path, monkeypatch, on_start=None) -> tuple[SupervisedRun, FakeBackend]:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=3))
    backend = FakeBackend({p.name: None for p in plans},
                          {p.name: [rundir.serving_line(p.name, p.task.address, 1)] for p in plans}, on_start)
    run = SupervisedRun(spec, '', plans, {'fake': backend}, start_timeout=5, workers=2)
    run.life = Lifecycle(spec, Console(stream=open(tmp_path / 'out', 'w')))
    monkeypatch.setattr(run.life, '_strategy', run)
    run.state.records = [record_of(p) for p in plans if p.name != 'worker:2']
    os.makedirs(spec.train.train_dir, exist_ok=True)
    return run, backend


def test_the_loop_restarts_the_cluster_with_the_new_live_set(tmp_path, monkeypatch):
    run, backend = run_over(tmp_path, monkeypatch)
    run.scaling._restart(ScaleRequest('r1', 3, pid=77), THREE, ['worker:2'], [])
    run.teardown()
    assert run.state.members == THREE and run.state.restarts == 0 and run.life.attempt == 1
    assert backend.started == ['ps:0', 'worker:0', 'worker:1', 'worker:2']
    op = run.scaling.op
    assert op is not None and op.attempt is run.state.attempt and op.lines == [STOP]
    assert op.add == ['worker:0', 'worker:1', 'worker:2'] and op.secs > 0
    lines = [line.removeprefix('[launch]').strip() for line in (tmp_path / 'out').read_text().splitlines()
             if line.startswith('[launch]')]
    assert lines == [STOP, 'scaling 2 -> 3 workers: starting the cluster again from step 0 (no checkpoint yet)']


def test_a_task_lost_while_a_sync_scale_starts_is_left_for_the_loop(tmp_path, monkeypatch):
    run, _ = run_over(tmp_path, monkeypatch, on_start={'worker:2': 1})
    run.scaling._restart(ScaleRequest('r1', 3, pid=77), THREE, ['worker:2'], [])
    run.teardown()
    assert run.state.lost_starting == StartLoss('worker:2', None, 1)
    assert run.scaling.op is not None and run.scaling.op.attempt is run.state.attempt
