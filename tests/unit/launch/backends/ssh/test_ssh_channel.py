"""An SSH task's channel (launch/backends/ssh/scripts.py, cluster/runtime/messages.py): each start
empties it on the host, after the earlier copy is gone and before the new one runs, so a task started
again within its attempt has the records of its own start alone, as a local task has."""
from __future__ import annotations

import shlex

from cluster.runtime.messages import channel_beside
from launch.backends.ssh.scripts import TaskProcess, start_script

WORKDIR = "/w/it's here"


def test_a_start_removes_the_channel_beside_the_attempt_log_once_the_earlier_copy_is_gone():
    log_file = WORKDIR + '/run/logs/attempt-2/worker-1.log'
    earlier = TaskProcess(pid=101, ident='7', group=100, group_ident='7')
    lines = start_script('sleep 300', WORKDIR, WORKDIR + '/run/logs/worker-1.log', log_file,
                         WORKDIR + '/run/logs/attempt-0', earlier).splitlines()
    removal = f'rm -f {shlex.quote(WORKDIR + "/run/logs/attempt-2/worker-1.records")}'
    assert channel_beside(log_file) == WORKDIR + '/run/logs/attempt-2/worker-1.records'
    assert removal in lines
    started = next(i for i, line in enumerate(lines) if line.startswith('setsid nohup sh -c '))
    assert 1 < lines.index(removal) < started       # after the earlier copy's end (line 1), before the start
