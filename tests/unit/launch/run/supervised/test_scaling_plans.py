"""Scaling as plans (launch/run/supervised/scaling.py): which change a `launch scale` request
makes of the live set, and the plan of an async change; the request and reply files as
dataclasses (launch/run/control.py)."""
from __future__ import annotations

import json

import pytest

from cluster.runtime import runjson
from cluster.runtime.membership import Members
from launch.records.event_types import Scale
from launch.run import control
from launch.run.control import Reply, ScaleReply, ScaleRequest
from launch.run.supervised.scaling import ScaleMove, change_live, refusal
from launch.run.supervised.state import SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import fake_cluster


@pytest.mark.parametrize('live, retired, want, add, remove', [
    ({0: 1, 1: 1}, set(), 4, [2, 3], []),
    ({0: 1, 1: 1, 2: 1, 3: 1}, set(), 2, [], [3, 2]),
    ({0: 1, 1: 1}, {'worker:2'}, 4, [3], []),               # a failed-over worker never comes back
    ({0: 1, 1: 1}, set(), 1, [], [1]),                      # never the chief
])
def test_a_scale_moves_the_lowest_free_in_and_the_highest_out(live, retired, want, add, remove):
    move = ScaleMove.of(Members(3, live), 4, retired, want)
    assert (move.add, move.remove, move.epoch) == (add, remove, 4)
    assert set(move.workers) == (set(live) | set(add)) - set(remove)
    assert all(move.workers[i] == 4 for i in add)


@pytest.mark.parametrize('settings, want, why', [
    ({}, 5, '--workers 5: expected 1..4 (the spec\'s pool of workers)'),
    ({'sync': True, 'replicas_to_aggregate': 3}, 2, '--workers 2: fewer than train.replicas_to_aggregate (3), '
                                                    'which each sync step needs'),
    ({'sync': False}, 3, None),
])
def test_requests_no_change_can_meet_are_refused(tmp_path, settings, want, why):
    spec, _ = fake_cluster(write_spec(tmp_path, workers=4, **settings))
    assert refusal(spec, want) == why


@pytest.mark.parametrize('live, want, line', [
    (2, 3, 'scaling 2 -> 3 workers: starting worker:2 (async: the others train on)'),
    (3, 2, 'scaling 3 -> 2 workers: worker:2 finishes its step and leaves (async: the others train on)'),
    (4, 2, 'scaling 4 -> 2 workers: worker:3, worker:2 finish their step and leave (async: the others train on)'),
])
def test_an_async_scale_changes_the_desired_set_at_once(tmp_path, live, want, line):
    spec, plans = fake_cluster(write_spec(tmp_path, workers=4, sync=False))
    state = SupervisorState.new(spec, plans, live)
    request = ScaleRequest('abc', want, 77, {'pid': 1, 'ident': 'x'})
    move = ScaleMove.of(state.members, 4, set(), want)
    plan = change_live(state, request, move, 5.0)
    assert plan.say == (line,) and plan.publish and plan.members == Members(2, move.workers)
    assert plan.events == (Scale(to=want, add=move.names_add, remove=move.names_remove, pid=77),)
    assert plan.welcome == set(move.names_add) and plan.unserved == tuple(move.names_add)
    assert plan.due == {name: 5.0 for name in move.names_add} and not plan.start


def test_the_request_and_reply_files_read_back_as_written(tmp_path):
    train_dir = str(tmp_path)
    me = control.this_launcher()
    ident = control.send(train_dir, 3, me)
    text = (tmp_path / control.REQUEST_FILE).read_text()
    assert list(json.loads(text)) == ['id', 'workers', 'pid', 'launcher']
    request = control.take(train_dir, me)
    assert request == ScaleRequest(ident, 3, json.loads(text)['pid'], me)
    assert runjson.dumps(request.to_json()) == text
    control.answer(train_dir, request, Reply.DONE, ['3 worker(s) train now'])
    reply = json.loads((tmp_path / control.REPLY_FILE).read_text())
    assert reply == {'id': ident, 'state': 'done', 'lines': ['3 worker(s) train now']}
    assert control.wait(train_dir, ident, lambda: True) == ScaleReply(ident, 'done', ['3 worker(s) train now'])
    assert not (tmp_path / control.REQUEST_FILE).exists()
