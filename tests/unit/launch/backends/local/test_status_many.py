"""The local backend's status_many (launch/backends/local/backend.py): a supervisor's round reaps
only the children the kernel names as ended, takes the kernel's reports of stopped and continued
children, and reads a running task's /proc stat at most once per STOPPED_SECS. No process is started: the children are stand-in Popen objects and the kernel's
answers (waitid, /proc) are fakes."""
from __future__ import annotations

import os
import types

import pytest

from launch.backends import sessions
from launch.backends.base import ENDED, RUNNING, TaskRecord
from launch.backends.local import backend as local


class Child:
    """A Popen as the backend uses it: its pid, its returncode once reaped, poll()."""

    def __init__(self, kernel: Kernel, pid: int) -> None:
        self.kernel, self.pid = kernel, pid
        self.returncode: int | None = None
        self.polls = 0

    def poll(self) -> int | None:
        self.polls += 1
        if self.returncode is None and self.pid in self.kernel.ended:
            self.returncode = self.kernel.ended.pop(self.pid)
        return self.returncode


class Kernel:
    """waitid over the launcher's children: `ended` (pid -> exit code) are the waitable ones;
    `halts` the stop and continue reports not yet taken (pid, CLD_STOPPED or CLD_CONTINUED)."""

    def __init__(self) -> None:
        self.ended: dict[int, int] = {}
        self.halts: list[tuple[int, int]] = []

    def waitid(self, idtype: int, ident: int, options: int) -> types.SimpleNamespace | None:
        assert options & os.WNOHANG
        if options & os.WSTOPPED:       # a report of a stop or a continue is taken as it is given
            assert options & os.WCONTINUED and not options & (os.WEXITED | os.WNOWAIT) and idtype == os.P_ALL
            if not self.halts:
                return None
            pid, code = self.halts.pop(0)
            return types.SimpleNamespace(si_pid=pid, si_code=code)
        assert options & os.WNOWAIT and options & os.WEXITED
        pids = list(self.ended) if idtype == os.P_ALL else [ident] if ident in self.ended else []
        return types.SimpleNamespace(si_pid=pids[0]) if pids else None


@pytest.fixture
def kernel(monkeypatch):
    k = Kernel()
    monkeypatch.setattr(local.os, 'waitid', k.waitid)
    monkeypatch.setattr(sessions, 'end_session', lambda pid: None)
    return k


def tasks(kernel: Kernel, n: int) -> tuple[local.LocalBackend, list[TaskRecord], dict[int, Child]]:
    backend = local.LocalBackend()
    children = {1000 + i: Child(kernel, 1000 + i) for i in range(n)}
    backend._children.update(children)      # type: ignore[arg-type]
    records = [TaskRecord(f'worker:{i}', 'worker', i, 'localhost', 2000 + i, 'local', 1000 + i, f'/logs/w{i}.log')
               for i in range(n)]
    return backend, records, children


def test_only_the_children_that_ended_are_reaped(kernel, monkeypatch):
    monkeypatch.setattr(local, 'read_stat_fields', lambda pid: ['S'])
    backend, records, children = tasks(kernel, 50)
    kernel.ended = {1007: -9, 1031: 0}
    seen = backend.status_many(records)
    assert (seen['worker:7'].state, seen['worker:7'].exit_code) == (ENDED, -9)
    assert (seen['worker:31'].state, seen['worker:31'].exit_code) == (ENDED, 0)
    assert all(seen[r.name].state == RUNNING and not seen[r.name].frozen for r in records
               if r.pid not in (1007, 1031))
    assert {pid for pid, c in children.items() if c.polls} == {1007, 1031}


def test_a_child_that_is_no_task_makes_the_round_poll_each(kernel, monkeypatch):
    monkeypatch.setattr(local, 'read_stat_fields', lambda pid: ['S'])
    backend, records, children = tasks(kernel, 5)
    kernel.ended = {99: 0, 1003: 1}        # 99: a command another thread waits for, not to be reaped here
    seen = backend.status_many(records)
    assert seen['worker:3'].exit_code == 1 and 99 in kernel.ended
    assert all(c.polls for c in children.values())


def test_proc_stat_is_read_at_most_once_per_stopped_secs(kernel, monkeypatch):
    """What the kernel does not report to a parent (a debugger's stop, uninterruptible sleep) is
    read from /proc, each task at most once per STOPPED_SECS."""
    reads: list[int] = []

    def stat(pid: int) -> list[str]:
        reads.append(pid)
        return ['D' if pid == 1002 else 'S']
    monkeypatch.setattr(local, 'read_stat_fields', stat)
    backend, records, _ = tasks(kernel, 4)
    first = backend.status_many(records)
    assert first['worker:2'].stopped == 'is in uninterruptible sleep (disk or network I/O)'
    assert first['worker:1'].stopped is None and len(reads) == 4
    kernel.ended = {1001: -9}
    again = backend.status_many(records)        # within STOPPED_SECS: the end seen, no stat read
    assert again['worker:1'].state == ENDED and again['worker:2'].stopped and len(reads) == 4
    backend._stopped_at -= local.STOPPED_SECS     # STOPPED_SECS later
    backend.status_many(records)
    assert sorted(reads[4:]) == [1000, 1002, 1003]


def test_a_stop_and_a_continue_the_kernel_reports_are_seen_at_the_next_round(kernel, monkeypatch):
    """SIGSTOP and SIGCONT of a child: the kernel tells its parent (waitid WSTOPPED|WCONTINUED), so a
    freeze is seen at the next round, with no /proc read, and so is its end."""
    reads: list[int] = []
    monkeypatch.setattr(local, 'read_stat_fields', lambda pid: reads.append(pid) or ['S'])
    backend, records, _ = tasks(kernel, 3)
    backend.status_many(records)
    assert len(reads) == 3
    kernel.halts = [(1001, os.CLD_STOPPED)]
    seen = backend.status_many(records)
    assert seen['worker:1'].frozen and seen['worker:1'].stopped == 'is stopped (SIGSTOP, or a debugger)'
    assert not seen['worker:0'].frozen and len(reads) == 3
    assert backend.status_many(records)['worker:1'].frozen        # a report is given once; the stop holds
    kernel.halts = [(1001, os.CLD_CONTINUED)]
    assert not backend.status_many(records)['worker:1'].frozen
    kernel.halts = [(1002, os.CLD_STOPPED)]
    backend.status_many(records)
    kernel.ended = {1002: -9}          # killed while stopped: its end, not its stop
    seen = backend.status_many(records)
    assert seen['worker:2'].state == ENDED and 1002 not in backend._halted


def test_the_state_letters_say_what_psutil_said():
    assert local.STATE_LETTERS['D'] == 'is in uninterruptible sleep (disk or network I/O)'
    assert local.STATE_LETTERS['t'] == local.STATE_LETTERS['T'] == 'is stopped (SIGSTOP, or a debugger)'


def test_not_answering_reads_this_process_as_running():
    assert local.not_answering(os.getpid()) is None
