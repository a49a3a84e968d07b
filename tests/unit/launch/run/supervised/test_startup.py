"""The start-up of a supervised cluster (launch/run/supervised/startup.py) over the fake
backend: every task up, or the first task that is not and why, naming it for the policy."""
from __future__ import annotations

import threading

import pytest

from launch.run.supervised.faults import TaskFailed
from launch.run.supervised.startup import wait_for_servers
from tests.conftest import write_spec
from tests.harness.fake_backend import FROZEN, FakeBackend, fake_cluster, record_of


def start(tmp_path, script, logs=None):
    _, plans = fake_cluster(write_spec(tmp_path, workers=2))
    backend = FakeBackend({p.name: None for p in plans} | script, logs)
    return [record_of(p) for p in plans], {'fake': backend}


def test_every_task_up_and_reported_ends_the_wait(tmp_path):
    records, backends = start(tmp_path, {'worker:1': 0})      # one already finished well: up
    wait_for_servers(records, backends, float('inf'), threading.Event())


@pytest.mark.parametrize('script, logs, message, task, tail', [
    ({'worker:1': 1}, {'worker:1': ['ValueError: bad input']}, 'worker:1 exited with code 1 during start-up',
     'worker:1', ['ValueError: bad input']),
    ({'ps:0': -9}, {}, 'ps:0 was killed by SIGKILL during start-up', 'ps:0', []),
])
def test_a_task_that_died_on_the_way_is_named(tmp_path, script, logs, message, task, tail):
    records, backends = start(tmp_path, script, logs)
    with pytest.raises(TaskFailed) as failed:
        wait_for_servers(records, backends, float('inf'), threading.Event())
    assert (str(failed.value), failed.value.task, failed.value.log_tail) == (message, task, tail)


def test_a_task_frozen_for_the_stall_limit_is_a_fault(tmp_path):
    records, backends = start(tmp_path, {'worker:0': FROZEN})
    with pytest.raises(TaskFailed) as failed:
        wait_for_servers(records, backends, float('inf'), threading.Event(), stall_secs=0)
    assert str(failed.value).startswith('worker:0 is stopped (SIGSTOP, or a debugger) during start-up for 0s')
    assert failed.value.task == 'worker:0'


def test_a_task_not_reported_by_the_deadline_is_late(tmp_path):
    records, backends = start(tmp_path, {})
    with pytest.raises(TaskFailed) as failed:
        wait_for_servers(records, backends, 0.0, threading.Event(), reported=lambda name: name != 'worker:1')
    assert failed.value.task == 'worker:1' and failed.value.how == 'worker:1 was not up within --start-timeout'


@pytest.mark.parametrize('logs, message', [
    ({}, 'worker:1: localhost:{port} answers, but not from this task (it never reported serving): '
         'another process holds that port?'),
    # Its log says it serves, and its follower had not read that yet (CI saw it so): late, not a stranger.
    ({'worker:1': ['2026-11-29T12:54:06.505+00:00 I worker:1 serving on localhost:{port} (pid 10830)']},
     'worker:1 (localhost:{port}) came up only as the time ran out; raise the limit with --start-timeout'),
])
def test_a_task_late_to_report_is_told_from_a_stranger_on_its_port_by_its_log(tmp_path, logs, message):
    _, plans = fake_cluster(write_spec(tmp_path, workers=2))
    port = next(p.task.port for p in plans if p.name == 'worker:1')
    records = [record_of(p) for p in plans]
    backends = {'fake': FakeBackend({p.name: None for p in plans},
                                    {t: [line.format(port=port) for line in lines] for t, lines in logs.items()})}
    with pytest.raises(TaskFailed) as failed:
        wait_for_servers(records, backends, 0.0, threading.Event(), reported=lambda name: name != 'worker:1')
    assert str(failed.value) == message.format(port=port)
