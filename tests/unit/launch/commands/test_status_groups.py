"""`launch status` at 1,000 tasks (issue 39): one line per job, the tasks in an ordinary state
counted and those to look at named; the table of a small run as it always was; the tasks asked
in parallel, their rows in the plans' order."""
from __future__ import annotations

import threading

from launch.backends.base import ENDED, RUNNING, UNKNOWN, Observation
from launch.commands import status_view
from launch.commands.status_view import TaskRow, grouped, seen_words, table


def _row(task: str, seen: Observation | None, listening: bool = True, pid: int | None = 100, note: str = '') -> TaskRow:
    alive, said = seen_words(seen)
    return TaskRow(task, f'localhost:{1000 + len(task)}', 'local', pid if seen is not None else None, alive,
                   listening, note or said, seen.left if seen else (), seen.exit_code if seen else None)


def _thousand() -> list[TaskRow]:
    rows = [_row(f'ps:{i}', Observation(RUNNING)) for i in range(20)]
    for i in range(980):
        seen = Observation(ENDED, -9) if i == 17 else \
            Observation(RUNNING, stopped='is stopped (SIGSTOP, or a debugger)') if i == 402 else Observation(RUNNING)
        rows.append(_row(f'worker:{i}', seen, listening=i != 555))
    return rows


def test_a_thousand_tasks_are_one_line_per_job_with_the_unhealthy_named():
    assert grouped(_thousand()) == [
        'ps 20: 20 running',
        'worker 980: 977 running; 3 to look at: worker:17 (ended, exit -9), '
        'worker:402 (is stopped (SIGSTOP, or a debugger)), worker:555 (running, not listening)']


def test_ordinary_states_are_counted_not_named():
    spare = TaskRow('worker:1', 'h:1', 'local', None, False, False, 'spare: in the pool, not running (`launch scale`)')
    rows = [_row('ps:0', Observation(ENDED, 0)), _row('worker:0', None), spare,
            _row('worker:2', Observation(ENDED, None)), _row('evaluator:0', Observation(RUNNING), listening=False)]
    assert grouped(rows) == ['ps 1: 1 ended', 'worker 3: 1 ended; 1 spare; 1 not started', 'evaluator 1: 1 running']


def test_a_host_that_cannot_be_asked_and_a_group_left_behind_are_named():
    rows = [_row('worker:0', Observation(UNKNOWN, error='ssh: host b unreachable')),
            _row('worker:1', Observation(ENDED, 0, left=(4242,)))]
    line, = grouped(rows)
    assert line.startswith('worker 2: 2 to look at: worker:0 (unknown: ssh: host b unreachable), worker:1 (ended, '
                           'its process group still runs (pid 4242))')


def test_many_to_look_at_are_cut_with_a_pointer_to_all():
    rows = [_row(f'worker:{i}', Observation(ENDED, 1)) for i in range(30)]
    line, = grouped(rows)
    assert line.count('(ended, exit 1)') == status_view.NAMED
    assert line.endswith(', and 10 more (`launch status --all`)')


def test_the_table_is_the_one_it_always_was():
    assert table([_row('ps:0', Observation(RUNNING)), _row('worker:0', None, listening=False)]) == [
        'TASK       ADDRESS                BACKEND     PID  ALIVE  LISTENING  NOTE',
        'ps:0       localhost:1004         local       100  yes    yes',
        'worker:0   localhost:1008         local         -  no     no']


def test_the_json_keeps_its_keys():
    assert _row('worker:17', Observation(ENDED, -9)).to_json() == {
        'task': 'worker:17', 'address': 'localhost:1009', 'backend': 'local', 'pid': 100, 'alive': False,
        'listening': True, 'note': '', 'left': [], 'sample': None}       # keys are added, never renamed


def test_tasks_are_asked_at_once_and_answered_in_order():
    """Every asker waits until ASKERS of them wait together: in series the first would wait forever."""
    together = threading.Barrier(status_view.ASKERS, timeout=30)

    def ask(n: int) -> int:
        if n < status_view.ASKERS:
            together.wait()
        return n * n
    assert status_view.ask_all(ask, list(range(100))) == [n * n for n in range(100)]
