"""The local backend's status_many (launch/backends/local/backend.py): a supervisor's round reaps
only the children the kernel names as ended, and reads a running task's /proc stat at most once per
STOPPED_SECS. No process is started: the children are stand-in Popen objects and the kernel's
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
    """waitid over the launcher's children: `ended` (pid -> exit code) are the waitable ones."""

    def __init__(self) -> None:
        self.ended: dict[int, int] = {}

    def waitid(self, idtype: int, ident: int, options: int) -> types.SimpleNamespace | None:
        assert options & os.WNOWAIT and options & os.WNOHANG
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


def test_a_stopped_task_is_read_from_proc_stat_at_most_once_a_second(kernel, monkeypatch):
    reads: list[int] = []

    def stat(pid: int) -> list[str]:
        reads.append(pid)
        return ['T' if pid == 1002 else 'S']
    monkeypatch.setattr(local, 'read_stat_fields', stat)
    backend, records, _ = tasks(kernel, 4)
    first = backend.status_many(records)
    assert first['worker:2'].frozen and first['worker:2'].stopped == 'is stopped (SIGSTOP, or a debugger)'
    assert not first['worker:1'].frozen and len(reads) == 4
    kernel.ended = {1001: -9}
    again = backend.status_many(records)        # within STOPPED_SECS: the end seen, no stat read
    assert again['worker:1'].state == ENDED and again['worker:2'].frozen and len(reads) == 4
    backend._stopped_at -= local.STOPPED_SECS     # a second later
    backend.status_many(records)
    assert sorted(reads[4:]) == [1000, 1002, 1003]


def test_the_state_letters_say_what_psutil_said():
    assert local.STATE_LETTERS['D'] == 'is in uninterruptible sleep (disk or network I/O)'
    assert local.STATE_LETTERS['t'] == local.STATE_LETTERS['T'] == 'is stopped (SIGSTOP, or a debugger)'


def test_not_answering_reads_this_process_as_running():
    assert local.not_answering(os.getpid()) is None
