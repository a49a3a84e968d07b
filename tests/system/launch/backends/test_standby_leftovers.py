"""Standbys an earlier launcher left (it was killed hard) are found by their command line and
killed by `launch down` (LocalBackend.release) and by the `launch up` that takes the run over
(LocalBackend.prepare): the lease they watch is renewed again by the new launcher, so they would
otherwise wait, unused, until its run ends. Stand-ins with a standby's command line, no TensorFlow."""
from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from cluster.runtime.standby import standby_dir
from launch.backends.local import LocalBackend
from launch.backends.local.standby import kill_left
from launch.planning.plan import plan_cluster
from cluster.spec import load_spec
from tests.harness.standby import wait_for

pytestmark = pytest.mark.slow     # starts processes

WAIT = 'import time\nwhile True: time.sleep(1)'


def _stand_in(train_dir: str) -> subprocess.Popen:
    """A process whose command line is a standby's of `train_dir` (python -c ... ignores the rest)."""
    argv = [sys.executable, '-c', WAIT, '-m', 'cluster.standby', '--dir', standby_dir(train_dir, 'localhost'),
            '--slot', '1-1']
    return subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL)


def _gone(proc: subprocess.Popen) -> bool:
    return proc.poll() is not None


def test_kill_left_kills_the_standbys_of_its_train_dirs_only(tmp_path):
    mine, other, spared = str(tmp_path / 'run'), str(tmp_path / 'other'), str(tmp_path / 'run')
    procs = [_stand_in(mine), _stand_in(other), _stand_in(spared)]
    try:
        wait_for('the stand-ins running', lambda: all(psutil.pid_exists(p.pid) for p in procs), 30)
        assert kill_left({mine}, mine=frozenset({procs[2].pid})) == 1
        wait_for('the left standby killed', lambda: _gone(procs[0]), 30)
        assert not _gone(procs[1]) and not _gone(procs[2])
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize('how', ['down', 'up'])
def test_down_and_a_take_over_kill_what_a_dead_launcher_left(tmp_path, how):
    spec_file = tmp_path / 'spec.yaml'
    spec_file.write_text(f'cluster:\n  ps: [localhost:2222]\n  worker: [localhost:2223]\n'
                         f'train:\n  train_dir: {tmp_path / "run"}\n')
    plans = list(plan_cluster(load_spec(str(spec_file))))
    left = _stand_in(os.path.abspath(str(tmp_path / 'run')))
    try:
        wait_for('the stand-in running', lambda: psutil.pid_exists(left.pid), 30)
        backend = LocalBackend()
        if how == 'down':
            backend.release(plans)
        else:
            backend.prepare(plans, 'cluster: {}\n')
        wait_for('the left standby killed', lambda: _gone(left), 30)
    finally:
        left.kill()
        left.wait()
