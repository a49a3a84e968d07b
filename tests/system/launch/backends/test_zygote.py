"""The start-up zygote (#41; launch/backends/local/zygote.py, cluster/zygote.py): a run's tasks
are forked from one TensorFlow import, each then the launcher's own child (the kernel gives the
orphan to the launcher, a subreaper), so the launcher reads a forked task's end and exit code as
it reads a cold start's; the zygote is gone once the tasks are started; a zygote that cannot
serve leaves the tasks to start cold."""
from __future__ import annotations

import os
import re
import signal
import stat

import pytest

from cluster.runtime import ports
from cluster.runtime.contract import LEASE_ENV, LEASE_SECS_ENV, TASK_MODULE
from cluster.runtime.ports import RUN_ENV
from cluster.runtime.standby import ZYGOTE_MODULE
from cluster.spec import TaskSpec
from cluster.zygote import adopted
from launch.backends.local.zygote import Zygotes
from launch.planning.plan import TaskPlan
from tests.conftest import launch_bg, read_until, write_spec
from tests.harness.faults import task_pid
from tests.harness.parts import processes_naming, task_processes
from tests.harness.standby import wait_for

pytestmark = pytest.mark.slow     # a real local cluster; real processes

SUPERVISE = {'restart': 'on-failure', 'max_restarts': 3, 'standby': 1, 'backoff_secs': 0}


def _ppid(pid: int) -> int:
    with open(f'/proc/{pid}/stat') as f:
        return int(f.read().rsplit(')', 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
        return f.read().replace(b'\0', b' ').decode()


def test_tasks_forked_from_one_import_are_the_launcher_s_children_and_their_ends_are_read(tmp_path):
    spec = write_spec(tmp_path, steps=2400, sync=False, program='tests.harness.paced_program:train',
                      supervise=SUPERVISE)
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    lines: list[str] = []
    try:
        lines += read_until(proc, 'servers are up')
        names = ('ps:0', 'worker:0', 'worker:1')
        pids = {name: task_pid(run, name) for name in names}
        for name, pid in pids.items():
            assert _ppid(pid) == proc.pid, f'{name} (pid {pid}) is not the launcher\'s child'
            assert ZYGOTE_MODULE in _cmdline(pid), f'{name} was not forked from the zygote: {_cmdline(pid)}'
            # /proc shows the task's environment, as a cold start's: its port's holder is named by task and run
            assert re.fullmatch(rf'{name} of run \S+ \(pid {pid}\)', ports.describe(pid)), ports.describe(pid)
            fds = [os.readlink(f'/proc/{pid}/fd/{fd}') for fd in (0, 1, 2)]     # none of the zygote's pipes
            assert fds[0] == os.devnull and fds[1] == fds[2] and fds[1].endswith('.log'), (name, fds)
        # The zygote itself left once the tasks were started: what runs its command line is a task.
        wait_for('the zygote gone', lambda: set(processes_naming(ZYGOTE_MODULE)) <= set(pids.values()))

        # A forked task killed hard: the launcher reads its end (waitid on its own child) as a
        # cold start's, SIGKILL named, and starts it again.
        os.kill(pids['worker:1'], signal.SIGKILL)
        lines += read_until(proc, 'worker:1 was killed by SIGKILL')
        wait_for('worker:1 started again', lambda: task_pid(run, 'worker:1') not in (0, pids['worker:1']))
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        lines.append(out)
    finally:
        proc.kill()
        proc.wait()
    text = ''.join(lines)
    assert proc.returncode == 143, text
    assert not task_processes(str(tmp_path)), task_processes(str(tmp_path))


def _plan(tmp_path, python: str) -> TaskPlan:
    env = {LEASE_ENV: str(tmp_path / 'lease'), LEASE_SECS_ENV: '30', RUN_ENV: 'r1'}
    return TaskPlan(TaskSpec('worker', 0, 'localhost', 2222), 'local', (python, '-m', TASK_MODULE), env,
                    str(tmp_path), 'run/spec.yaml', 'run/logs/worker-0.log', keras=False)


@pytest.mark.parametrize('answer', ['exit', 'garbage'])
def test_a_zygote_that_cannot_serve_leaves_the_task_to_start_cold(tmp_path, answer):
    """A Python whose zygote ends at once, or says no JSON: no fork (the task starts cold), the
    zygote is ended, and the next start does not wait for it again."""
    fake = tmp_path / 'python'
    fake.write_text('#!/bin/sh\n' + ('exit 3\n' if answer == 'exit' else 'echo not-json; sleep 60\n'))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    plan = _plan(tmp_path, str(fake))
    zygotes = Zygotes(lambda p: dict(p.env))
    zygotes.open([plan])
    try:
        assert zygotes.fork(plan, plan.env, str(tmp_path / 'run/logs/worker-0.log')) is None
        assert zygotes.fork(plan, plan.env, str(tmp_path / 'run/logs/worker-0.log')) is None
    finally:
        zygotes.close()
    assert not processes_naming(str(tmp_path / 'python'))


def test_a_middle_gone_before_the_wait_began_is_seen_gone():
    """The race CI met: the middle left before the task looked, so its parent was already the
    adopter. Read then with getppid, the 'middle' was the adopter and the task waited out 5 s."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:         # the middle: fork the task and leave at once
        me = os.getpid()
        if os.fork() == 0:
            try:
                os.close(r)
                while os.getppid() == me:       # the middle is gone before the wait begins
                    pass
                os.write(w, b'1' if adopted(me, wait=60.0) else b'0')
            finally:
                os._exit(0)
        os._exit(0)
    os.close(w)
    os.waitpid(middle, 0)
    with os.fdopen(r, 'rb') as f:
        said = f.read()
    assert said == b'1'
