"""A scale under way followed to its reply (launch/run/supervised/scaling.py look, scale_ended):
given the state and what the loop observed, the lines its reply gets, whether it is given its
time anew, and its end. Table tests, no process started."""
from __future__ import annotations

import pytest

from cluster.runtime.membership import Members
from launch.records.event_types import Scaled
from launch.run.control import Reply, ScaleRequest
from launch.run.lifecycle import Failure
from launch.run.policy import TaskState, TaskStatus
from launch.run.supervised.attempt import Attempt
from launch.run.supervised.plan import Plan
from launch.run.supervised.scaling import ScaleOp, look, scale_ended
from launch.run.supervised.state import SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import fake_cluster

R, F = TaskState.RUNNING, TaskState.FAILED


def state_of(tmp_path) -> SupervisorState:
    spec, plans = fake_cluster(write_spec(tmp_path, workers=3, sync=False, steps=100,
                                          supervise={'restart': 'on-failure', 'max_restarts': 3}))
    state = SupervisorState.new(spec, plans, 3)
    state.members = Members(2, {0: 1, 1: 1, 2: 2})
    return state


def op_of(state: SupervisorState, add=('worker:2',), remove=(), deadline: float = 100.0) -> ScaleOp:
    return ScaleOp(ScaleRequest('r1', 3), list(add), list(remove), ['scaling 2 -> 3 workers'], deadline, 60.0,
                   state.attempt, 0)


def statuses(**states: TaskState) -> list[TaskStatus]:
    return [TaskStatus(name.replace('_', ':'), name.split('_')[0], int(name.split('_')[1]), s)
            for name, s in states.items()]


def test_a_scale_is_done_once_every_joiner_stepped(tmp_path):
    state = state_of(tmp_path)
    state.stepped = {'worker:2'}
    news = look(op_of(state), state, statuses(worker_2=R), 50.0)
    assert (news.reply, news.line, news.lines, news.anew) == (
        Reply.DONE, '3 worker(s) train now (worker:0, worker:1, worker:2)', (), False)


@pytest.mark.parametrize('now, reply', [(50.0, None), (101.0, Reply.FAILED)])
def test_a_scale_fails_once_its_time_ran_out(tmp_path, now, reply):
    state = state_of(tmp_path)
    news = look(op_of(state), state, statuses(worker_2=R), now)
    assert news.reply is reply
    if reply:
        assert news.line == 'the change did not take effect within 60s'


def test_a_leaver_must_have_ended(tmp_path):
    state = state_of(tmp_path)
    op = op_of(state, add=(), remove=('worker:2',))
    assert look(op, state, statuses(worker_2=R), 50.0).reply is None
    assert look(op, state, statuses(worker_2=TaskState.SUCCEEDED), 50.0).reply is Reply.DONE


def test_a_joiner_let_go_fails_the_scale(tmp_path):
    state = state_of(tmp_path)
    state.attempt.tolerated = {'worker:2'}
    news = look(op_of(state), state, statuses(worker_2=F), 50.0)
    assert news.reply is Reply.FAILED
    assert news.line == ('worker:2 ended while joining the training and is not started again; '
                         '3 worker(s) train now (worker:0, worker:1, worker:2)')


def test_a_joiner_started_again_gives_the_scale_its_time_anew(tmp_path):
    state = state_of(tmp_path)
    state.restarts = 1
    state.attempt.failures.append(Failure('worker:2', 'worker:2 exited with code 1'))
    news = look(op_of(state), state, statuses(worker_2=R), 150.0)     # past the old deadline: its time starts anew
    assert news.lines == ('worker:2 ended while joining the training (worker:2 exited with code 1); '
                          'restart 1/3 starts it again',)
    assert news.anew and news.reply is None


def test_a_restart_of_the_cluster_is_a_line_of_the_reply(tmp_path):
    state = state_of(tmp_path)
    op = op_of(state)
    state.restarts, state.attempt = 2, Attempt()
    news = look(op, state, statuses(worker_2=R), 50.0)
    assert news.lines == ('restart 2/3: the cluster started again while the change was under way',) and news.anew


def test_the_end_of_a_scale_is_said_and_logged(tmp_path):
    state = state_of(tmp_path)
    assert scale_ended(state, Reply.DONE, '3 worker(s) train now') == Plan(
        say=('scale done: 3 worker(s) train now',),
        events=(Scaled(state=Reply.DONE, workers=[0, 1, 2], cause='3 worker(s) train now'),))
