"""The task side of preemption (#41) on a real local TF1 cluster started by `launch up`: a SIGTERM
from outside the launcher (os.kill, no stop mark) to the chief mid-run is a notice: the chief says
so, saves a checkpoint at once and exits EXIT_PREEMPTED (200), whatever the launcher then makes of
it. The launcher's own stop (`launch down`) is marked, so it ends the run as before: the chief
saves on SIGTERM, and no task says a word of preemption."""
from __future__ import annotations

import glob
import os
import re
import signal

import pytest

from cluster.runtime import rundir
from cluster.runtime.contract import EXIT_PREEMPTED
from tests.conftest import launch, launch_bg, write_spec
from tests.harness.faults import finish, task_pid, until_step
from tests.harness.local import checkpoint_step

pytestmark = pytest.mark.slow     # real local clusters

NOTICE = 'preemption notice (SIGTERM from outside the launcher)'


def chief_log(run: str) -> str:
    return rundir.read_text(rundir.attempt_log_path(run, 1, 'worker', 0)) or ''


def test_a_sigterm_from_outside_has_the_tf1_chief_save_at_once_and_exit_preempted(tmp_path):
    spec = write_spec(tmp_path, steps=100000, checkpoint_secs=600)     # no save by schedule before the notice
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    try:
        lines = until_step(proc, 5)
        os.kill(task_pid(run, 'worker:0'), signal.SIGTERM)
    finally:
        out = finish(proc, 180)
    out = ''.join(lines) + out
    log = chief_log(run)
    assert re.search(rf'worker:0: {re.escape(NOTICE)} at global step \d+: 30s to save and go', log), log
    after = log[log.index(NOTICE):]
    saved = re.search(r'preemption notice received: saved a checkpoint at global step (\d+), exiting', after)
    assert saved, log
    assert checkpoint_step(run) == int(saved.group(1)) > 0
    # Today's launcher takes the exit for a fault (the lead's side makes it a preemption): either
    # way it names the chief's code, or calls it preempted.
    assert f'code {EXIT_PREEMPTED}' in out or 'preempt' in out, out


def test_the_launchers_stop_is_marked_and_ends_the_run_as_before(tmp_path):
    spec = write_spec(tmp_path, steps=100000, checkpoint_secs=600)
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    try:
        lines = until_step(proc, 5)
        down = launch('down', spec)
    finally:
        out = finish(proc, 180)
    out = ''.join(lines) + out + down.stdout + down.stderr
    assert down.returncode == 0, out
    assert 'SIGTERM received: saved a checkpoint at global step' in chief_log(run), chief_log(run)
    logs = {path: rundir.read_text(path) or '' for path in glob.glob(os.path.join(run, 'logs', 'attempt-*', '*.log'))}
    assert logs and not any('preemption' in text for text in logs.values()), logs
    assert 'preemption' not in out, out
