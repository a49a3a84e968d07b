"""Warm standbys (#41) with real processes and real TensorFlow, started by hand (no launcher): two
standbys become the ps and the worker of a TF1 async run and train it to the end in their own
processes; a standby leaves by itself when its lease goes stale or on SIGTERM; a stopped one's
heartbeat stops (so the launcher's freshness rule never picks it)."""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import time

import pytest

from cluster.runtime import rundir
from cluster.runtime.standby import FRESH_SECS
from tests.conftest import write_spec
from tests.harness import standby as sb

pytestmark = pytest.mark.slow     # real TensorFlow imports, a real cluster

MARK = 'set-at-become'


def test_two_standbys_become_the_ps_and_the_worker_and_train_to_the_end(tmp_path):
    spec = write_spec(tmp_path, workers=1, sync=False, steps=20, top={'env': {'SB_MARK': MARK}})
    lease = tmp_path / 'lease'
    lease.touch()
    folder = str(tmp_path)
    procs = []
    try:
        for slot in ('0', '1'):
            procs.append(sb.start_standby(folder, slot, str(lease)))
        readies = [sb.ready(proc, files) for proc, files in procs]
        assert 'SB_MARK' not in os.environ     # the task gets it only from the Become
        logs, offsets = {}, {}
        for (proc, files), job, ready in zip(procs, ('ps', 'worker'), readies):
            logs[job] = str(tmp_path / f'{job}-0.log')
            with open(logs[job], 'w') as f:
                f.write('a line of an earlier attempt\n')
            env = {**os.environ, 'PYTHONPATH': sb.REPO, 'SB_MARK': MARK, 'CUDA_VISIBLE_DEVICES': ''}
            sb.hand(files, sb.task_become(spec, job, 0, logs[job], env))
            became = sb.became(files)
            assert became.pid == proc.pid == ready.pid
            offsets[job] = became.offset
            assert not os.path.exists(files.become) and not os.path.exists(files.ready)
        codes = [proc.wait(timeout=sb.SLOW_SECS) for proc, _ in procs]
        task_lines = {job: (rundir.read_text(logs[job]) or '')[offsets[job]:] for job in logs}
        assert codes == [0, 0], task_lines
    finally:
        sb.stop_all([proc for proc, _ in procs])
    for (proc, files), job in zip(procs, ('ps', 'worker')):
        lines = task_lines[job]
        assert offsets[job] == len('a line of an earlier attempt\n')
        assert re.search(rf'{job}:0 serving on \S+ \(pid {proc.pid}\)', lines), lines
        assert f"SB_MARK='{MARK}'" in lines, lines        # the environment: line, from the Become's env
        assert 'cluster.standby' not in lines, lines      # the standby's own lines stay in its slot log
        assert 'ready: imported in' in (rundir.read_text(files.log) or '')
    assert re.search(r'done: 20 local steps, global step 20', task_lines['worker']), task_lines['worker']
    assert 'worker:0 is done; 0 to go' in task_lines['ps'], task_lines['ps']
    assert 'device:GPU' not in task_lines['worker'], task_lines['worker']    # CUDA_VISIBLE_DEVICES='' at become


def test_a_standby_whose_lease_is_stale_leaves_by_itself_without_becoming_anything(tmp_path):
    lease = tmp_path / 'lease'
    lease.touch()
    os.utime(lease, (time.time() - 3600, time.time() - 3600))     # its launcher died an hour ago
    proc, files = sb.start_standby(str(tmp_path), '0', str(lease), lease_secs=5)
    try:
        code = proc.wait(timeout=sb.SLOW_SECS)
    finally:
        sb.stop_all([proc])
    log = rundir.read_text(files.log) or ''
    assert code == 0, log
    assert 'has not renewed' in log and 'Traceback' not in log, log
    assert not os.path.exists(files.ready) and not os.path.exists(files.became)


def test_a_sigterm_while_it_waits_has_a_standby_leave_quietly(tmp_path):
    lease = tmp_path / 'lease'
    lease.touch()
    proc, files = sb.start_standby(str(tmp_path), '0', str(lease))
    try:
        sb.ready(proc, files)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        sb.stop_all([proc])
    log = rundir.read_text(files.log) or ''
    assert code == 0, log
    assert 'Traceback' not in log, log
    assert not os.path.exists(files.ready)


def stopped(pid: int) -> bool:
    with open(f'/proc/{pid}/stat') as f:
        return f.read().rsplit(')', 1)[1].split()[0] == 'T'


def test_a_stopped_standbys_ready_file_goes_stale_and_beats_again_once_it_continues(tmp_path):
    lease = tmp_path / 'lease'
    lease.touch()
    proc, files = sb.start_standby(str(tmp_path), '0', str(lease))
    try:
        sb.ready(proc, files)
        first = os.stat(files.ready).st_mtime_ns
        sb.wait_for('a heartbeat', lambda: os.stat(files.ready).st_mtime_ns > first)
        proc.send_signal(signal.SIGSTOP)
        sb.wait_for('the standby stopped', lambda: stopped(proc.pid))
        frozen = os.stat(files.ready).st_mtime_ns
        sb.wait_for('a ready file older than FRESH_SECS',
                    lambda: time.time() - os.stat(files.ready).st_mtime > 2 * FRESH_SECS)
        assert os.stat(files.ready).st_mtime_ns == frozen     # not one beat while stopped
        proc.send_signal(signal.SIGCONT)
        sb.wait_for('a heartbeat after SIGCONT', lambda: os.stat(files.ready).st_mtime_ns > frozen)
    finally:
        sb.stop_all([proc])


def test_a_become_of_anything_but_a_cluster_task_is_one_line_and_exit_2(tmp_path):
    lease = tmp_path / 'lease'
    lease.touch()
    proc, files = sb.start_standby(str(tmp_path), '0', str(lease))
    try:
        sb.ready(proc, files)
        become = sb.task_become('spec.yaml', 'ps', 0, str(tmp_path / 'ps-0.log'), os.environ)
        sb.hand(files, dataclasses.replace(become, argv=('python', '-m', 'cluster.eval', '--spec', 'spec.yaml')))
        code = proc.wait(timeout=60)
    finally:
        sb.stop_all([proc])
    log = rundir.read_text(files.log) or ''
    assert code == 2, log
    assert f'cluster.standby: error: cannot become a task: {files.become}: a standby becomes only a cluster.task' \
        in log, log
    assert 'Traceback' not in log and not os.path.exists(files.ready) and not os.path.exists(files.became), log
