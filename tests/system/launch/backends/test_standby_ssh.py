"""Warm standbys over SSH (launch/backends/ssh/standby.py), through the real `launch up` against the
real sshd of tests/harness/sshd.py on 127.0.0.2 and 127.0.0.3: a remote worker killed mid-run comes
back in the standby that waited on its host, pid and all, and trains; the run, then stopped by
SIGTERM (as test_standby_local.py's frozen-standby test stops its own: training on to train.steps
would prove nothing more, at a minute's cost), ends 143 with nothing left, task or standby.

sshd passes no PYTHONPATH, so tasks started over SSH would import the INSTALLED tfcluster: the
hosts' `python` is a script that sets it to this tree and execs Python, for the pre-flight, the
tasks and the standbys alike."""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from cluster.runtime.standby import Ready, standby_dir
from tests.conftest import launch_bg, read_until
from tests.harness.parts import REPO
from tests.harness.ssh import assert_nothing_left, host_settings, remote_spec, run, workdir

pytestmark = pytest.mark.slow     # a real sshd, TensorFlow in every task and standby

WAIT_SECS = 240
HOST = '127.0.0.3'      # worker:1's host (tests/harness/ssh.py LAYOUT)


def _wait_for(what: str, look, timeout: float = WAIT_SECS):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = look()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f'no {what} within {timeout:g}s')


def _ready_standbys(folder: str) -> list[Ready]:
    """The standbys waiting in a host's standby folder, as their ready files say."""
    return [ready for _, ready in _ready_files(folder)]


def _ready_files(folder: str) -> list[tuple[str, Ready]]:
    out = []
    for path in glob.glob(os.path.join(folder, '*.ready')):
        try:
            with open(path) as f:
                out.append((path, Ready.parse(f.read())))
        except (OSError, ValueError):       # removed or replaced under us
            pass
    return out


def _wait_until_the_launcher_knows(tmp_path, folder: str, standby: Ready) -> None:
    """Until the launcher has seen `standby` ready (a restart before that starts cold, rightly):
    the state file says so where it lists the standbys; else, three heartbeats of its ready file
    (the launcher reports on every slot about each second)."""
    def listed() -> bool | None:
        try:
            with open(tmp_path / 'run' / 'launch-state.json') as f:
                views = json.load(f).get('standbys')
        except (OSError, ValueError):
            return False
        return None if views is None else any(v['pid'] == standby.pid and v['state'] == 'ready' for v in views)
    beats: set[int] = set()

    def beaten() -> bool:
        for path, ready in _ready_files(folder):
            if ready.pid == standby.pid:
                with contextlib.suppress(OSError):
                    beats.add(os.stat(path).st_mtime_ns)
        return len(beats) > 3
    _wait_for('the launcher to see the standby', lambda: listed() or (listed() is None and beaten()))


def _task(tmp_path, name: str) -> dict | None:
    try:
        with open(tmp_path / 'run' / 'launch-state.json') as f:
            return next((t for t in json.load(f)['tasks'] if t['name'] == name), None)
    except (OSError, ValueError):
        return None


def _python_of_this_tree(tmp_path) -> str:
    path = tmp_path / 'python'
    path.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(REPO)} exec {shlex.quote(sys.executable)} "$@"\n')
    path.chmod(0o755)
    return str(path)


def _up(ssh_hosts, tmp_path, steps: int) -> tuple[str, subprocess.Popen]:
    """`launch up` of a TF1 async run, 1 ps + 2 workers over 127.0.0.2/.3, with one standby per host."""
    python = _python_of_this_tree(tmp_path)
    hosts = host_settings(ssh_hosts, tmp_path, **{a: {'python': python} for a in ssh_hosts.addresses})
    spec = remote_spec(ssh_hosts, tmp_path, hosts=hosts, steps=steps, sync=False, learning_rate=0.05, batch_size=32,
                       supervise={'restart': 'on-failure', 'max_restarts': 3, 'standby': 1})
    return spec, launch_bg('up', spec, '--ssh-config', str(ssh_hosts.ssh_config), cwd=str(tmp_path))


def _kill_worker_1(tmp_path) -> dict:
    """SIGKILL of worker:1 (its pid from its .task file, as the chaos harness reads it); its new record."""
    with open(workdir(tmp_path, HOST) / 'run' / 'logs' / 'worker-1.task') as f:
        killed = int(f.read())
    os.kill(killed, signal.SIGKILL)
    return _wait_for('new worker:1', lambda: (t := _task(tmp_path, 'worker:1')) and t['pid'] != killed and t)


def _log(tmp_path) -> str:
    try:
        return (workdir(tmp_path, HOST) / 'run' / 'logs' / 'worker-1.log').read_text()
    except OSError:
        return ''


def _trains_again(tmp_path) -> str:
    """worker:1's log once the standby, as the task, served and said a progress line (a worker
    says one on its first step): both starts' lines in one log. The log."""
    serving = f'worker:1 serving on {HOST}'

    def trained() -> str | None:
        log = _log(tmp_path)
        second = log.find(serving, log.find(serving) + 1) if serving in log else -1
        return log if second >= 0 and '  loss ' in log[second:] else None
    return _wait_for('worker:1 training again', trained)


def _stopped_clean(ssh_hosts, tmp_path, proc: subprocess.Popen, lines: list[str], again: dict,
                   standby: Ready) -> None:
    """worker:1 restarted once, in `standby`, and trained; then SIGTERM: the run stops, exit 143
    (128 + SIGTERM) and its closing line, and nothing is left: no task, standby, ready file or
    SSH session."""
    assert again['pid'] == standby.pid and again.get('warm') is True, (again, standby)
    log = _trains_again(tmp_path)
    proc.send_signal(signal.SIGTERM)        # "stop the run": the standbys go with the tasks
    out, _ = proc.communicate(timeout=600)
    out = ''.join(lines) + out
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert 'SIGTERM received: stopping every task' in out and re.search(r'^\S*launch\S* +stopped; ', out, re.M), out
    assert out.count('restart 1/3: worker:1 was killed by SIGKILL') == 1 and 'lost worker:1' not in out, out
    log = _log(tmp_path) or log
    assert log.count(f'worker:1 serving on {HOST}') == 2 and 'ready: imported' not in log, log
    assert not _ready_standbys(_folder(tmp_path))
    assert_nothing_left(ssh_hosts)


def _folder(tmp_path) -> str:
    return standby_dir(str(workdir(tmp_path, HOST) / 'run'), HOST)


def test_a_stopped_standby_is_replaced_and_a_killed_remote_worker_comes_back_in_the_fresh_one(ssh_hosts, tmp_path):
    """SIGSTOP of the host's standby while it waits (its heartbeat goes stale over SSH): killed,
    replaced, never used; then a SIGKILL of worker:1 brings it back in the fresh standby, its pid
    and log, and it trains; SIGTERM then stops the run, 143, with nothing left. (A standby killed
    rather than stopped: the local test and the chaos runs; the SSH report of a gone process: the
    fast tests.)"""
    hit = signal.SIGSTOP
    spec, proc = _up(ssh_hosts, tmp_path, steps=100_000)     # never done by itself: the test stops it
    folder = _folder(tmp_path)
    try:
        lines = read_until(proc, 'servers are up')
        first = _wait_for('ready standby on 127.0.0.3', lambda: _ready_standbys(folder))[0]
        _wait_until_the_launcher_knows(tmp_path, folder, first)
        os.kill(first.pid, hit)
        # The launcher kills it (its group: a stopped one too) and spawns another, which it then knows ready.
        _wait_for('the hit standby gone', lambda: not os.path.exists(f'/proc/{first.pid}'))
        fresh = _wait_for('a fresh standby', lambda: [r for r in _ready_standbys(folder) if r.pid != first.pid])[0]
        _wait_until_the_launcher_knows(tmp_path, folder, fresh)
        again = _kill_worker_1(tmp_path)
        assert again['pid'] != first.pid
        _stopped_clean(ssh_hosts, tmp_path, proc, lines, again, fresh)
    finally:
        proc.kill()
        proc.wait()
        run(ssh_hosts, tmp_path, 'down', spec, timeout=60)
