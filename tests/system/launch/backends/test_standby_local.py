"""Warm standbys on real local TF1 async runs (#41; launch/backends/local/standby.py): a lost
worker is restarted by the standby the state file showed ready (its pid, its record `warm`), and
trains; a standby killed, or frozen by SIGSTOP, while it waits is never used and is replaced; the
run, stopped by SIGTERM once that is shown (training on to its end would prove nothing more, at a
minute's cost), ends 143, and nothing of it (task or standby) is left running.

The workers run a paced program (tests/harness/paced_program.py), so the run lasts long enough
for a standby to import on a busy machine (standbys spawn only once the run trains)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading

import psutil
import pytest

from cluster.runtime import rundir
from cluster.runtime.standby import STANDBY_MODULE
from tests.conftest import launch_bg, write_spec
from tests.harness.faults import task_pid
from tests.harness.standby import wait_for

pytestmark = pytest.mark.slow     # real local clusters, TensorFlow imported by each task and standby

SUPERVISE = {'restart': 'on-failure', 'max_restarts': 5, 'standby': 1, 'backoff_secs': 0}


def _spec(tmp_path, steps: int = 2400) -> str:
    """At least steps * PACE_SECS / 2 seconds of training (2 workers): 120 s for 2400."""
    return write_spec(tmp_path, steps=steps, sync=False, program='tests.harness.paced_program:train',
                      supervise=SUPERVISE)


def _state(run: str) -> dict:
    try:
        with open(os.path.join(run, 'launch-state.json')) as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return {}


def _ready(run: str, but: tuple[int, ...] = ()) -> list[int]:
    """The pids of the standbys the state file shows ready, but `but`."""
    return [s['pid'] for s in _state(run).get('standbys', []) if s['state'] == 'ready' and s['pid'] not in but]


def _restarted(run: str, name: str, before: int) -> dict | None:
    """The task's record once it names another pid than `before`."""
    record = next((t for t in _state(run).get('tasks', []) if t['name'] == name), None)
    return record if record and record['pid'] not in (0, before) else None


def _live(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _drain(proc: subprocess.Popen) -> list[str]:
    """The launcher's output, read in a thread of its own (a full pipe would block it)."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return lines


def _ended_clean(proc: subprocess.Popen, lines: list[str], run: str, pids: set[int], code: int = 143) -> None:
    """The run ended with `code` (143: stopped by SIGTERM), and no pid it had (tasks, standbys)
    nor any standby of its own runs."""
    proc.wait(timeout=600)
    out = ''.join(lines)
    assert proc.returncode == code, out
    wait_for('every task and standby gone', lambda: not any(_live(p) for p in pids), 30)
    mine = os.path.join(run, 'standby') + os.sep
    left = [p.pid for p in psutil.process_iter(['cmdline'])
            if STANDBY_MODULE in (p.info['cmdline'] or []) and any(a.startswith(mine) for a in p.info['cmdline'])]
    assert not left, left


def _stepped(run: str, name: str, pid: int) -> bool:
    """Whether the task's log shows a training step after its start as process `pid`."""
    job, index = name.split(':')
    text = rundir.read_text(rundir.log_path(run, job, int(index))) or ''
    start = re.search(rf'{re.escape(name)} serving on \S+ \(pid {pid}\)', text)
    return bool(start and re.search(r' step \d+/\d+  loss ', text[start.end():]))


def test_a_lost_worker_becomes_the_ready_standby_and_nothing_is_left(tmp_path):
    """Once the standby, now worker:1, trains a step, the run is stopped (SIGTERM): training on to
    its end would prove nothing more (the run stopped with its standbys: the next test)."""
    run = str(tmp_path / 'run')
    proc = launch_bg('up', _spec(tmp_path))     # a standby is ready some 15 s in
    try:
        lines = _drain(proc)
        standby = wait_for('a ready standby', lambda: _ready(run), 400)[0]
        before = task_pid(run, 'worker:1')
        os.kill(before, signal.SIGKILL)
        record = wait_for('worker:1 started again', lambda: _restarted(run, 'worker:1', before), 120)
        assert (record['pid'], record['warm']) == (standby, True), record
        wait_for('a step of worker:1 as the standby', lambda: _stepped(run, 'worker:1', standby), 120)
        pids = {t['pid'] for t in _state(run)['tasks']} | {standby, before}
        proc.send_signal(signal.SIGTERM)
        _ended_clean(proc, lines, run, pids)
    finally:
        if proc.poll() is None:     # failed midway: its tasks and standbys leave by their lease
            proc.kill()
            proc.wait()


def test_a_killed_or_frozen_standby_is_never_used_and_is_replaced(tmp_path):
    run = str(tmp_path / 'run')
    proc = launch_bg('up', _spec(tmp_path))
    try:
        lines = _drain(proc)
        killed = wait_for('a ready standby', lambda: _ready(run), 400)[0]
        os.kill(killed, signal.SIGKILL)
        frozen = wait_for('a standby in place of the killed one', lambda: _ready(run, but=(killed,)), 240)[0]
        os.kill(frozen, signal.SIGSTOP)
        before = task_pid(run, 'worker:1')
        os.kill(before, signal.SIGKILL)         # at once: the launcher may not have seen the stop yet
        record = wait_for('worker:1 started again', lambda: _restarted(run, 'worker:1', before), 120)
        assert record['pid'] not in (killed, frozen), (record, killed, frozen)
        wait_for('the frozen standby killed', lambda: not _live(frozen), 60)
        again = wait_for('a standby in place of the frozen one',
                         lambda: _ready(run, but=(killed, frozen, record['pid'])), 240)[0]
        pids = {t['pid'] for t in _state(run)['tasks']} | {killed, frozen, again, before}
        proc.send_signal(signal.SIGTERM)    # "stop the run": the standbys go with the tasks
        _ended_clean(proc, lines, run, pids)
    finally:
        if proc.poll() is None:     # failed midway: its tasks and standbys leave by their lease
            proc.kill()
            proc.wait()
