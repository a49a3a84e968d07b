"""The loop applies plans (launch/run/supervised/loop.py SupervisedRun.apply) over the fake
backend: the state it writes, the lines it says, the tasks it starts and stops."""
from __future__ import annotations

from launch.run.console import Console
from launch.run.lifecycle import Lifecycle
from launch.run.policy import Action, Decision
from launch.run.supervised import SupervisedRun, recovery
from launch.run.supervised.plan import Backoff
from tests.conftest import write_spec
from tests.harness.fake_backend import FakeBackend, fake_cluster, record_of


def test_a_restart_of_some_tasks_counts_and_starts_them(tmp_path):
    spec, plans = fake_cluster(write_spec(tmp_path, workers=2, supervise={'restart': 'on-failure',
                                                                          'max_restarts': 3}))
    backend = FakeBackend({p.name: None for p in plans} | {'worker:1': 1})
    run = SupervisedRun(spec, '', plans, {'fake': backend})
    out = tmp_path / 'out'
    with open(out, 'w') as stream:
        run.life = Lifecycle(spec, Console(stream=stream))
        run.state.records = [record_of(p) for p in plans]
        backoff = Backoff(1, 0.0, 0.0)
        run.apply(recovery.restart_tasks(run.state, Decision(Action.RESTART_TASKS, ('worker:1',), 'worker:1 lost'),
                                         backoff))
        run.life.unfollow(['worker:1'])
    assert run.state.restarts == 1 and run.state.history.streak == 1
    assert backend.started == ['worker:1'] and not run.state.attempt.due
    assert [r.pid for r in run.state.records if r.name == 'worker:1'] == [1001]
    assert 'restart 1/3: worker:1 lost; starting worker:1 again, it rejoins the training' in out.read_text()


def test_an_empty_plan_changes_nothing(tmp_path):
    spec, plans = fake_cluster(write_spec(tmp_path, workers=2))
    run = SupervisedRun(spec, '', plans, {'fake': FakeBackend()})
    before = (run.state.members, run.state.restarts, set(run.state.attempt.tolerated))
    from launch.run.supervised.plan import Plan
    run.apply(Plan())
    assert (run.state.members, run.state.restarts, set(run.state.attempt.tolerated)) == before
