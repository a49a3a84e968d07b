"""A task and everything it started live and die together, and a port is counted only for the
task that holds it. On real local launchers, tasks and TensorFlow servers:

- a coordinator run's chief runs its `train.command` through a shell script (the Python that
  trains is the task's grandchild, as in most users' scripts); `kill -9` of the chief's pid takes
  the script and its Python along, the restart finds the port free and the command resumes from
  its checkpoint; with the launcher killed first, `launch status` shows what the chief left and
  `launch down` stops it; a task started by hand takes its command along too;
- two runs started a second apart whose ports collide (one run's worker port is the other's ps
  port): the run that loses the port ends with one line naming the port and the other run.

The autouse guard fails a test that leaves a task or launcher behind; the commands' own processes
are checked here (their command lines name the test's train_dir)."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import REPO, launch, launch_bg, read_until, write_coordinator_spec
from tests.harness.documented import check_documented
from tests.harness.parts import processes_naming
from tests.harness.faults import finish, task_pid

pytestmark = pytest.mark.slow     # real launchers, tasks and TensorFlow servers


def wrapped_command(tmp_path, train_dir, steps: int, pause: float) -> str:
    """A train.command as users write them: a shell script that runs Python without exec."""
    script = tmp_path / 'train.sh'
    script.write_text('#!/bin/sh\n' + shlex.join([sys.executable, f'{REPO}/tests/harness/pss_command.py', '--train_dir',
                                                  str(train_dir), '--steps', str(steps), '--pause', str(pause)])
                      + '\necho "the script ends"\n')
    return f'sh {script}'


def until_own_line(proc, step: int) -> list[str]:
    """The launcher's output up to the command's first line at global step `step` or later."""
    lines: list[str] = []
    while True:
        lines += read_until(proc, 'my own line: at ')
        if int(re.search(r'at (\d+),', lines[-1]).group(1)) >= step:
            return lines


def none_left(text: str, timeout: float = 15) -> dict[int, str]:
    """Wait up to `timeout` for no process naming `text`; what is left then (killed, to clean up)."""
    deadline = time.monotonic() + timeout
    while processes_naming(text) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = processes_naming(text)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def gone(pid: int, timeout: float = 15) -> bool:
    """Whether `pid` is gone (or a zombie) within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f'/proc/{pid}/stat') as f:
                if f.read().rsplit(')', 1)[1].split()[0] == 'Z':
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_a_chief_killed_hard_takes_its_command_along_and_the_restart_resumes(tmp_path):
    """kill -9 of the chief's pid (the one `launch status` shows): its script and the script's
    Python end with it, the chief is started again on its free port, the command resumes from
    its newest checkpoint and the run ends well, nothing left running."""
    train_dir = tmp_path / 'run'
    spec = write_coordinator_spec(tmp_path, program=None, evaluator=None,
                                  command=wrapped_command(tmp_path, train_dir, 300, 0.1))
    proc = launch_bg('up', spec)
    try:
        lines = until_own_line(proc, 40)
        killed_at = int(re.search(r'at (\d+),', lines[-1]).group(1))
        os.kill(task_pid(str(train_dir), 'chief:0'), signal.SIGKILL)
        out = ''.join(lines) + finish(proc)
    finally:
        left = none_left(str(train_dir))
    assert proc.returncode == 0, out
    assert 'restart 1/3: chief:0 was killed by SIGKILL' in out and 'already in use' not in out, out
    after = out[out.index('restart 1/3'):]
    resumed = [int(n) for n in re.findall(r'my own line: at (\d+),', after)]
    assert resumed and resumed[0] > killed_at and resumed[-1] == 300, after      # from its checkpoint, to the end
    assert not left, f'left running: {left}'


def test_status_and_down_see_what_a_dead_chief_left(tmp_path):
    """The launcher killed -9, then the chief: the Python its script started runs on in the
    chief's process group. `launch status` names it on the chief's row (and in --json), `launch
    down` stops it with the rest, and nothing is left."""
    train_dir = tmp_path / 'run'
    spec = write_coordinator_spec(tmp_path, program=None, evaluator=None,
                                  command=wrapped_command(tmp_path, train_dir, 100000, 0.2))
    proc = launch_bg('up', spec)
    try:
        until_own_line(proc, 20)
        chief = task_pid(str(train_dir), 'chief:0')
        proc.kill()
        proc.wait()
        os.kill(chief, signal.SIGKILL)
        assert gone(chief)
        python = [pid for pid, command in processes_naming(str(train_dir)).items() if 'pss_command.py' in command
                  and not command.startswith('sh ')]
        assert len(python) == 1, processes_naming(str(train_dir))
        status = launch('status', spec, '--json', timeout=120)
        row = next(t for t in json.loads(status.stdout)['tasks'] if t['task'] == 'chief:0')
        assert row['alive'] is False and row['left'] == python, row
        text = launch('status', spec, timeout=120).stdout
        assert f'ended, but its process group still runs (pid {python[0]})' in text, text
        down = launch('down', spec, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
        assert gone(python[0], timeout=10), 'launch down left the command running'
    finally:
        if proc.poll() is None:
            proc.kill()
        left = none_left(str(train_dir))
    assert not left, f'left running: {left}'


def test_a_task_started_by_hand_takes_its_command_along(tmp_path):
    """No launcher: `python -m cluster.task` of a chief whose command only sleeps, killed -9;
    the command ends with it (the parent-death signal), not at its own pace."""
    marker = f'sleep-of-{tmp_path.name}'
    spec = write_coordinator_spec(tmp_path, program=None, evaluator=None,
                                  command=f'python -c "import time; time.sleep(600)" {marker}')
    task = subprocess.Popen([sys.executable, '-m', 'cluster.task', '--spec', spec, '--job', 'chief', '--index', '0'],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = read_until(task, ' chief:0 started: ', timeout=60)[-1]
        command = int(re.search(r'\(pid (\d+)\)', line).group(1))
        task.kill()
        task.wait()
        assert gone(command, timeout=10), f'the command (pid {command}) outlived its task'
    finally:
        if task.poll() is None:
            task.kill()
        left = none_left(marker, timeout=1)
    assert not left


def test_two_runs_whose_ports_collide(tmp_path):
    """Run B's worker:0 port is run A's ps port, B started a second after A: whichever task
    comes second to the port ends its run with one line naming the port and the other run (exit
    code 2 from the task, 1 from its launcher); the other run trains on."""
    specs = {}
    for name in ('a', 'b'):
        (tmp_path / name).mkdir()
        specs[name] = write_coordinator_spec(tmp_path / name, evaluator=None, steps=100000,
                                             top={'env': {'TFCLUSTER_TEST_STEP_SECS': 0.25}})
    a, b = (yaml.safe_load(open(specs[n])) for n in 'ab')
    port = int(a['cluster']['ps'][0].rsplit(':', 1)[1])
    b['cluster']['worker'][0] = a['cluster']['ps'][0]
    (tmp_path / 'b' / 'spec.yaml').write_text(yaml.safe_dump(b, sort_keys=False))
    procs = {'a': launch_bg('up', specs['a'])}
    time.sleep(1)       # the scenario: the second run a second later
    procs['b'] = launch_bg('up', specs['b'])
    try:
        deadline = time.monotonic() + 300
        while all(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        loser = next(n for n, p in procs.items() if p.poll() is not None)
        winner = 'b' if loser == 'a' else 'a'
        lost = procs[loser].communicate()[0]
        # The winner trains on: its servers may come up after the loser has ended (with the start-up
        # zygote every task starts after one import, the loser's port check too), so wait for them.
        up = read_until(procs[winner], 'servers are up')
        procs[winner].send_signal(signal.SIGINT)
        won = ''.join(up) + finish(procs[winner])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    other_run = re.search(r'run (\S+), attempt 1', won).group(1)
    assert procs[loser].returncode == 1, lost
    errors = [line for line in lost.splitlines() if line.startswith('[launch]   error: ')]
    assert len(errors) == 1, lost
    line = errors[0][len('[launch]   error: '):]
    assert re.fullmatch(rf'\w+:0 exited with code 2 during start-up: port {port} is already in use by '
                        rf'\w+:0 of run {re.escape(other_run)} \(pid \d+\)', line), lost
    check_documented('port-taken-at-start', line)
    assert 'servers are up' not in lost and 'unknown device' not in lost.lower(), lost
    assert 'servers are up' in won and procs[winner].returncode == 128 + signal.SIGINT, won


def test_over_ssh_a_chief_killed_hard_takes_its_command_along(ssh_hosts, tmp_path):
    """The same guarantee on SSH hosts (the wrapper ends its task's whole session before it
    writes the exit code): kill -9 of the chief's pid, the restart serves on the free port, the
    command resumes from its checkpoint and the run ends well; nothing is left on any host."""
    from tests.harness.ssh import assert_nothing_left, host_settings, workdir
    chief_dir = workdir(tmp_path, '127.0.0.2') / 'run'
    spec = write_coordinator_spec(tmp_path, program=None, evaluator=None, host='127.0.0.2',
                                  worker_hosts=('127.0.0.2', '127.0.0.3'), hosts=host_settings(ssh_hosts, tmp_path),
                                  train_dir='run', command=wrapped_command(tmp_path, chief_dir, 300, 0.1))
    proc = launch_bg('up', spec, '--ssh-config', str(ssh_hosts.ssh_config), cwd=str(tmp_path))
    try:
        lines = until_own_line(proc, 40)
        killed_at = int(re.search(r'at (\d+),', lines[-1]).group(1))
        os.kill(task_pid(str(tmp_path / 'run'), 'chief:0'), signal.SIGKILL)
        out = ''.join(lines) + finish(proc)
    finally:
        left = none_left(str(chief_dir))
    assert proc.returncode == 0, out
    assert 'restart 1/3: chief:0 was killed by SIGKILL' in out and 'already in use' not in out, out
    resumed = [int(n) for n in re.findall(r'my own line: at (\d+),', out[out.index('restart 1/3'):])]
    assert resumed and resumed[0] > killed_at and resumed[-1] == 300, out
    assert not left, f'left running: {left}'
    assert_nothing_left(ssh_hosts)
