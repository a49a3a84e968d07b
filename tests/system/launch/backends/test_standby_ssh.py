"""Warm standbys over SSH (launch/backends/ssh/standby.py), through the real `launch up` against the
real sshd of tests/harness/sshd.py on 127.0.0.2 and 127.0.0.3: a remote worker killed mid-run comes
back in the standby that waited on its host, pid and all, and the run ends well with nothing left.

sshd passes no PYTHONPATH, so tasks started over SSH would import the INSTALLED tfcluster: the
hosts' `python` is a script that sets it to this tree and execs Python, for the pre-flight, the
tasks and the standbys alike."""
from __future__ import annotations

import contextlib
import glob
import json
import os
import shlex
import signal
import sys
import time

import pytest

from cluster.runtime.standby import Ready, standby_dir
from tests.conftest import launch_bg, read_until
from tests.harness.parts import REPO
from tests.harness.ssh import assert_nothing_left, host_settings, remote_spec, run, workdir

pytestmark = pytest.mark.slow     # a real sshd, TensorFlow in every task and standby

WAIT_SECS = 240


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
    out = []
    for path in glob.glob(os.path.join(folder, '*.ready')):
        try:
            with open(path) as f:
                out.append(Ready.parse(f.read()))
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
        for path in glob.glob(os.path.join(folder, '*.ready')):
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


def test_a_killed_remote_worker_comes_back_in_its_host_s_standby(ssh_hosts, tmp_path):
    python = _python_of_this_tree(tmp_path)
    hosts = host_settings(ssh_hosts, tmp_path, **{a: {'python': python} for a in ssh_hosts.addresses})
    spec = remote_spec(ssh_hosts, tmp_path, hosts=hosts, steps=2500, sync=False, learning_rate=0.05, batch_size=32,
                       supervise={'restart': 'on-failure', 'max_restarts': 3, 'standby': 1})
    host = '127.0.0.3'
    folder = standby_dir(str(workdir(tmp_path, host) / 'run'), host)
    proc = launch_bg('up', spec, '--ssh-config', str(ssh_hosts.ssh_config), cwd=str(tmp_path))
    try:
        lines = read_until(proc, 'servers are up')
        standby = _wait_for('ready standby on 127.0.0.3', lambda: _ready_standbys(folder))[0]
        _wait_until_the_launcher_knows(tmp_path, folder, standby)
        with open(workdir(tmp_path, host) / 'run' / 'logs' / 'worker-1.task') as f:     # what the chaos harness reads
            killed = int(f.read())
        assert killed != standby.pid
        os.kill(killed, signal.SIGKILL)
        again = _wait_for('new worker:1', lambda: (t := _task(tmp_path, 'worker:1')) and t['pid'] != killed and t)
        out, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
        proc.wait()
        run(ssh_hosts, tmp_path, 'down', spec, timeout=60)
    out = ''.join(lines) + out
    assert proc.returncode == 0, out
    assert again['pid'] == standby.pid and again.get('warm') is True, (again, standby)
    assert out.count('restart 1/3: worker:1 was killed by SIGKILL') == 1, out
    assert 'lost worker:1' not in out, out
    # The task's log has both starts: the standby wrote the second's lines into it once it was the task.
    log = (workdir(tmp_path, host) / 'run' / 'logs' / 'worker-1.log').read_text()
    assert log.count(f'worker:1 serving on {host}') == 2 and 'ready: imported' not in log, log
    assert not _ready_standbys(folder)
    assert_nothing_left(ssh_hosts)
