"""The rule that tells the launcher's stop from a preemption notice (cluster/runtime/notice.py), and
what the notice thread does with each signal, on a Notices of the test's own (never installed:
no signal handler or wakeup fd of the test process changes). Real signals to a real process:
tests/system/cluster/runtime/test_notice_exit.py."""
from __future__ import annotations

import logging
import signal
import threading

import pytest

from cluster.runtime import notice, rundir
from cluster.runtime.contract import EXIT_PREEMPTED
from cluster.runtime.notice import Kind, Notices, Role, classify

TERM, INT = signal.SIGTERM, signal.SIGINT


@pytest.mark.parametrize('signum, marked, stopping, grace, kind', [
    (TERM, False, False, 30.0, Kind.PREEMPTED),     # from outside the launcher: a notice
    (TERM, True, False, 30.0, Kind.STOP),           # the launcher marked it (its own mark, or `all`)
    (TERM, False, True, 30.0, Kind.STOP),           # the task stops itself (its lease went stale)
    (TERM, False, False, 0.0, Kind.STOP),           # supervise.preemption_grace: 0: as before notices
    (INT, False, False, 30.0, Kind.STOP),           # SIGINT is always a stop
    (INT, True, True, 0.0, Kind.STOP),
])
def test_the_rule(signum, marked, stopping, grace, kind):
    assert classify(signum, marked, stopping, grace) is kind


@pytest.mark.parametrize('grace, secs', [(30.0, 28.0), (10.0, 8.0), (4.0, 2.0), (1.0, 0.5)])
def test_a_preempted_task_is_gone_before_its_grace_ends(grace, secs):
    assert notice.deadline_secs(grace) == secs


def test_the_marks_lie_under_the_train_dir_and_are_found_from_a_tasks_log():
    assert rundir.stop_mark_path('/r/run', 'worker', 1) == '/r/run/stops/worker-1'
    assert rundir.stop_all_path('run') == 'run/stops/all'
    for log in ('/r/run/logs/attempt-3/worker-1.log', '/r/run/logs/worker-1.log'):
        assert rundir.train_dir_of_log(log) == '/r/run'
    assert rundir.train_dir_of_log('run/logs/attempt-1/ps-0.log') == 'run'


class Exited(Exception):
    """What the patched exit_now/die_of raise instead of ending the test's process."""


@pytest.fixture()
def notices(tmp_path, monkeypatch):
    """A Notices for worker:1 of a run in tmp_path, as `install` leaves it (without the signals),
    with the process's ends and the deadline's timer made visible to the test."""
    ends: list[tuple] = []

    def end(*args):
        ends.append(args)
        raise Exited(args)
    monkeypatch.setattr(notice, 'exit_now', lambda code, level, message: end('exit', code, message))
    monkeypatch.setattr(notice, 'die_of', lambda signum: end('die', signum))
    timers: list[threading.Timer] = []
    real_timer = threading.Timer

    def timer(*args, **kw):
        t = real_timer(*args, **kw)
        timers.append(t)
        return t
    monkeypatch.setattr(notice.threading, 'Timer', timer)
    n = Notices()
    n.task, n.grace = 'worker:1', 30.0
    train_dir = tmp_path / 'run'
    n.marks = (rundir.stop_mark_path(str(train_dir), 'worker', 1), rundir.stop_all_path(str(train_dir)))
    n.step = lambda: 812
    n.installed = True
    (train_dir / rundir.STOPS_DIR).mkdir(parents=True)
    n.ends = ends       # type: ignore[attr-defined]
    yield n
    for t in timers:
        t.cancel()      # no deadline of a test's notice ever ends the test run
    notice.STOPPING.clear()


def mark(path: str) -> None:
    open(path, 'w').close()


@pytest.mark.parametrize('which', [0, 1])
def test_a_marked_sigterm_is_the_role_s_stop(notices, which):
    stops: list[int] = []
    notices.role = Role(on_stop=stops.append)
    mark(notices.marks[which])
    notices.handle(TERM)
    assert stops == [TERM] and not notices.preempted.is_set()


def test_a_stop_to_a_role_without_one_dies_of_the_signal(notices):
    notice.STOPPING.set()
    with pytest.raises(Exited):
        notices.handle(TERM)
    assert notices.ends == [('die', TERM)]


def test_sigint_goes_to_a_role_that_takes_it_and_is_python_s_elsewhere(notices):
    stops: list[int] = []
    notices.role = Role(on_stop=stops.append)
    notices.handle(INT)
    assert stops == []          # KeyboardInterrupt in the main thread, as before
    notices.role = Role(on_stop=stops.append, interrupt=True)
    notices.handle(INT)
    assert stops == [INT]


def test_a_notice_is_said_at_once_and_the_role_acts(notices, caplog):
    acted = threading.Event()
    notices.role = Role(on_stop=lambda s: pytest.fail('a notice is not a stop'), on_preempted=acted.set)
    with caplog.at_level(logging.INFO, logger='cluster.task'):
        notices.handle(TERM)
    assert acted.wait(10) and notices.preempted.is_set()
    assert ('worker:1: preemption notice (SIGTERM from outside the launcher) at global step 812: 30s to save '
            'and go') in caplog.text
    notices.handle(TERM)            # another notice: already on the way out
    assert notices.ends == []
    mark(notices.marks[0])          # then the launcher's marked stop: it goes at once, preempted
    with pytest.raises(Exited):
        notices.handle(TERM)
    assert notices.ends == [('exit', EXIT_PREEMPTED, 'worker:1: stopped after the preemption notice')]


def test_a_sigterm_once_the_tasks_parent_is_gone_is_a_stop(notices):
    """A Ray actor's death signal (PR_SET_PDEATHSIG) comes when the task has a new parent: the
    keeper went (with its launcher), which is no notice to save and linger for."""
    stops: list[int] = []
    notices.role = Role(on_stop=stops.append)
    notices.parent = -1
    notices.handle(TERM)
    assert stops == [TERM] and not notices.preempted.is_set()


def test_no_grace_makes_every_sigterm_a_stop(notices):
    stops: list[int] = []
    notices.grace = 0.0
    notices.role = Role(on_stop=stops.append)
    notices.handle(TERM)
    assert stops == [TERM] and not notices.preempted.is_set()


def test_a_role_taken_after_a_notice_acts_on_it_at_once(notices):
    notices.handle(TERM)            # during the import: no role yet, the task goes on
    acted: list[bool] = []
    notices.take(Role(on_preempted=lambda: acted.append(True)))
    assert acted == [True]


def test_other_signals_are_not_the_notice_thread_s(notices):
    notices.role = Role(on_stop=lambda s: pytest.fail('not a stop'))
    notices.handle(signal.SIGUSR1)
    notices.handle(signal.SIGHUP)
    assert notices.ends == [] and not notices.preempted.is_set()
