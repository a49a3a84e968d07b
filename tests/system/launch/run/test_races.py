"""Races and signals on real local clusters: two launchers of one train_dir, two clusters on one
port, a port answered by a stranger, a closed terminal, an impatient second Ctrl-C."""
from __future__ import annotations

import dataclasses
import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import threading
import time
from concurrent import futures

import grpc
import pytest
import yaml

from tests.conftest import launch_bg, read_until, write_spec

pytestmark = pytest.mark.slow     # real launchers and tasks


def test_two_launchers_of_one_spec_started_together(tmp_path):
    """Exactly one trains; the other is refused at once, naming the launcher that holds the
    train_dir, and writes nothing into its logs."""
    spec = write_spec(tmp_path, steps=8)
    procs = [launch_bg('up', spec, cwd=str(tmp_path)) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    winner, loser = (0, 1) if procs[0].returncode == 0 else (1, 0)
    assert f'is in use by launcher pid {procs[winner].pid}' in outs[loser], outs[loser]
    assert outs[loser].count('\n') == 1
    log = (tmp_path / 'run' / 'logs' / 'worker-0.log').read_text()
    assert log.count(' worker:0 serving on ') == 1            # one task wrote it, once


def test_two_clusters_sharing_a_port_never_both_report_up(tmp_path):
    """Two specs whose workers share a port, started together: one trains, the other fails
    (before or at start-up) and never says its servers are up, however the race goes."""
    a_dir, b_dir = tmp_path / 'a', tmp_path / 'b'
    a_dir.mkdir(), b_dir.mkdir()
    a = write_spec(a_dir, workers=1, steps=8)
    b = write_spec(b_dir, workers=1, steps=8)
    shared = yaml.safe_load(open(a))
    other = yaml.safe_load(open(b))
    other['cluster']['worker'] = shared['cluster']['worker']
    (b_dir / 'spec.yaml').write_text(yaml.safe_dump(other))
    procs = [launch_bg('up', s, cwd=str(d)) for s, d in ((a, a_dir), (b, b_dir))]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert sorted(p.returncode == 0 for p in procs) == [False, True], outs
    loser = outs[0] if procs[0].returncode else outs[1]
    assert 'servers are up' not in loser, loser
    assert re.search(r'already in use|worker:0 exited with code 2 during start-up', loser), loser


def test_readiness_needs_the_tasks_own_report(tmp_path):
    """A gRPC server of someone else answering on a task's port is not the task being up."""
    from cluster.spec import load_spec
    from launch.backends.local import LocalBackend
    from launch.planning.plan import plan_cluster
    from launch.run.supervised import TaskFailed, wait_for_servers

    spec = load_spec(write_spec(tmp_path, workers=1))
    plan = dataclasses.replace(plan_cluster(spec)[1], argv=('sleep', '60'), env={})
    os.makedirs(tmp_path / 'run' / 'logs')
    stranger = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    stranger.add_insecure_port(f'localhost:{plan.task.port}')
    stranger.start()
    backend = LocalBackend()
    record = backend.start(plan)
    try:
        with pytest.raises(TaskFailed, match='answers, but not from this task'):
            wait_for_servers([record], {'local': backend}, time.monotonic() + 3, threading.Event(),
                             reported=lambda name: False)
        wait_for_servers([record], {'local': backend}, time.monotonic() + 30, threading.Event(),
                         reported=lambda name: True)
    finally:
        backend.stop([record], grace=1)
        stranger.stop(0)


def _read_pty(fd: int, needle: str, timeout: float = 180) -> str:
    out, deadline = '', time.monotonic() + timeout
    while needle not in out:
        left = deadline - time.monotonic()
        assert left > 0, f'no {needle!r} on the terminal within {timeout}s:\n{out}'
        if select.select([fd], [], [], left)[0]:
            try:
                out += os.read(fd, 4096).decode(errors='replace')
            except OSError:        # EIO: the other side is gone
                break
    return out


def test_closing_the_terminal_stops_everything_with_129(tmp_path):
    """`launch up` in a terminal that goes away (SIGHUP, then EIO on every write): exit 129,
    every task stopped, no traceback."""
    spec = write_spec(tmp_path, steps=100000)
    master, slave = pty.openpty()

    def own_terminal():             # a session of its own, with the pty as its controlling terminal
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen([sys.executable, '-m', 'launch', 'up', spec], cwd=str(tmp_path), stdin=slave,
                            stdout=slave, stderr=slave, preexec_fn=own_terminal, close_fds=True)
    os.close(slave)
    try:
        _read_pty(master, '  loss ')
    finally:
        os.close(master)            # the terminal window closes: the kernel hangs up its session
    try:
        assert proc.wait(timeout=120) == 129
    finally:
        proc.kill()
    assert not os.path.exists(tmp_path / 'run' / 'launch-state.json')
    log = (tmp_path / 'run' / 'logs' / 'worker-0.log').read_text()
    assert 'saved a checkpoint' in log or 'checkpoint' in log


def test_a_second_ctrl_c_kills_what_is_left_at_once(tmp_path):
    """With the ps stopped, the chief cannot save and the first Ctrl-C would wait out the
    checkpoint grace (25 s); a second Ctrl-C kills every task at once."""
    spec = write_spec(tmp_path, steps=100000)
    proc = launch_bg('up', spec, cwd=str(tmp_path))
    try:
        read_until(proc, '  loss ')
        import json
        with open(tmp_path / 'run' / 'launch-state.json') as f:
            ps = next(t for t in json.load(f)['tasks'] if t['name'] == 'ps:0')
        os.kill(ps['pid'], signal.SIGSTOP)
        proc.send_signal(signal.SIGINT)
        read_until(proc, 'SIGINT received')
        time.sleep(1)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, out
    assert 'SIGINT again: killing every task now' in out
    assert took < 20, f'the second Ctrl-C took {took:.1f}s to end the run'   # the grace alone is 25 s
