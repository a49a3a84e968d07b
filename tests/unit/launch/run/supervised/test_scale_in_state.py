"""The scale under way held in the state and changed only by plans the loop applies
(launch/run/supervised/scaling.py followed, ask_checkpoint; plan.py SaveFirst; state.py
SupervisorState.scale). Table tests over the fake backend, no process started."""
from __future__ import annotations

import pytest

from cluster.runtime.membership import Members
from launch.run.console import Console
from launch.run.control import ScaleRequest
from launch.run.lifecycle import CHECKPOINT_GRACE_SECS, Failure, Lifecycle
from launch.run.supervised import SupervisedRun
from launch.run.supervised.plan import Plan, SaveFirst
from launch.run.supervised.scaling import ScaleNews, ScaleOp, ask_checkpoint, followed
from launch.run.supervised.state import SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import FakeBackend, fake_cluster


def state_of(tmp_path, stall: float = 60.0) -> SupervisorState:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=3, supervise={'stall_secs': stall}))
    return SupervisorState.new(spec, plans, 2)


def op_of(state: SupervisorState) -> ScaleOp:
    return ScaleOp(ScaleRequest('r1', 3), ['worker:2'], [], ['scaling 2 -> 3 workers'], 100.0, 60.0, state.attempt, 0)


@pytest.mark.parametrize('news, deadline', [
    (ScaleNews(), 100.0),
    (ScaleNews(('restart 1/3: the cluster started again while the change was under way',), anew=True), 110.0),
])
def test_a_look_gives_the_scale_its_lines_and_its_time_anew_where_it_says(tmp_path, news, deadline):
    state = state_of(tmp_path)
    state.attempt.failures.append(Failure('worker:2', 'worker:2 exited with code 1'))
    op = op_of(state)
    after = followed(op, news, state, 50.0)
    assert after.lines == op.lines + list(news.lines) and after.deadline == deadline
    assert after.attempt is state.attempt and after.failures_seen == 1
    assert op.lines == ['scaling 2 -> 3 workers']          # the one held before is left as it was


@pytest.mark.parametrize('stall, secs', [
    (30.0, 15.0),                   # half the stall limit: a chief stuck that long is stuck
    (600.0, CHECKPOINT_GRACE_SECS),     # at most a stopping chief's time to save
])
def test_a_sync_scale_asks_the_chief_for_a_checkpoint_first(tmp_path, stall, secs):
    state = state_of(tmp_path, stall)
    plan = ask_checkpoint(state, 40)
    assert plan.members == Members(1, {0: 1, 1: 1}, 1) and plan.publish
    assert plan.save_first == SaveFirst(40, secs)


def run_over(tmp_path, monkeypatch, steps: list[int | None]) -> SupervisedRun:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=3))
    run = SupervisedRun(spec, '', plans, {'fake': FakeBackend()}, workers=2)
    run.life = Lifecycle(spec, Console(stream=open(tmp_path / 'out', 'w')))
    seen = iter(steps)
    monkeypatch.setattr(run.life, 'checkpoint_step', lambda: next(seen))
    return run


@pytest.mark.parametrize('steps, secs, saved', [
    ([40, 50], 5.0, True),          # a new checkpoint read back
    ([40], 0.0, False),             # none within the time given: the scale is refused
])
def test_the_loop_waits_for_the_checkpoint_a_plan_asks_for(tmp_path, monkeypatch, steps, secs, saved):
    run = run_over(tmp_path, monkeypatch, steps)
    before = run.life.checkpoint_step()
    run.apply(Plan(members=Members(1, {0: 1, 1: 1}, 1), publish=True, save_first=SaveFirst(before, secs)))
    assert run.state.saved_first is saved and run.state.members.save == 1
    assert run.backends['fake'].leases       # told to every lease before the wait


def test_the_scale_under_way_is_set_and_cleared_by_plans(tmp_path, monkeypatch):
    run = run_over(tmp_path, monkeypatch, [])
    op = op_of(run.state)
    run.apply(Plan(scale=op))
    assert run.scaling.op is op and run.scaling.asked == 3
    run.apply(Plan())
    assert run.state.scale is op
    run.apply(Plan(scale_over=True))
    assert run.scaling.op is None and run.scaling.asked is None
