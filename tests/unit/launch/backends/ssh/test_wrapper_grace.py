"""A remote task gone while its wrapper still writes its exit code (launch/backends/ssh/backend.py
SSHBackend._judge): it runs on for WRAPPER_GRACE_SECS, counted from when that start of the task
was first seen so, never from an earlier start's wait. No SSH: the snapshot's words are given."""
from __future__ import annotations

import time

from launch.backends.base import TaskRecord
from launch.backends.ssh import backend
from launch.backends.ssh.backend import RemoteState, SSHBackend, SSHHandle, _Tasks
from launch.backends.ssh.scripts import Seen


def stat(pid: int, started: str) -> str:
    return f'{pid} (python3) S ' + ' '.join(['0'] * 18) + f' {started} 0 0'


def record(pid: int, wrapper: int) -> TaskRecord:
    return TaskRecord('worker:0', 'worker', 0, '127.0.0.2', 2222, 'ssh', pid, 'logs/worker-0.log', ident='77',
                      handle=SSHHandle(rcfile='/w/worker-0.rc', group=wrapper, group_ident='66'))


def test_an_earlier_starts_wait_does_not_cut_a_later_starts_grace_short(monkeypatch):
    h = _Tasks()
    writing = Seen('', '', stat(500, '66'))         # the task gone, its wrapper alive, no rc yet
    assert SSHBackend._judge(h, record(501, 500), writing) == (RemoteState.RUNNING, None)
    clock = time.monotonic() + backend.WRAPPER_GRACE_SECS + 4      # 14 s on: the next start ends well
    monkeypatch.setattr(backend.time, 'monotonic', lambda: clock)
    later = Seen('', '', stat(600, '66'))
    assert SSHBackend._judge(h, record(601, 600), later) == (RemoteState.RUNNING, None)
    assert SSHBackend._judge(h, record(601, 600), Seen('0', '', '')) == (RemoteState.ENDED, 0)
