"""A 300-task local rehearsal (10 ps + 290 async workers, stand-ins of ~20 MB each) through a kill
and a freeze: the killed worker is restarted and named, the frozen one is caught as the policy
says (stopped for stall_secs while the others train on: lost, restarted), the launcher's file
descriptors stay bounded while it runs, the link table goes to its own file and run.json keeps
the bounded summary, and nothing is left running at the end (tests/conftest.py)."""
from __future__ import annotations

import json
import os
import signal

import pytest

from cluster.runtime import rundir
from launch.records.rehearsal import LINKS_FILE, read_links_file
from tests.conftest import launch_bg, read_until, write_spec
from tests.harness.faults import finish, task_pid

pytestmark = pytest.mark.slow

PS, WORKERS = 10, 290


def _open_fds(pid: int) -> int:
    return len(os.listdir(f'/proc/{pid}/fd'))


def test_three_hundred_stand_ins_through_a_kill_and_a_freeze(tmp_path):
    # A stand-in steps on its own clock from the newest checkpoint it finds at its start, so a worker
    # that started (or restarted) just before a save trains on up to checkpoint_steps / 100 s after
    # the chief is done: 250 steps keep that tail to 2.5 s (1000 made it 10 s of the test's 53).
    spec = write_spec(tmp_path, workers=WORKERS, ps=PS, steps=4000, sync=False,
                      checkpoint_steps=250, supervise={'restart': 'on-failure', 'max_restarts': 3, 'stall_secs': 4})
    run = str(tmp_path / 'run' / 'rehearsal')
    proc = launch_bg('up', spec, '--rehearse')
    lines: list[str] = []
    try:
        lines += read_until(proc, f'all {PS + WORKERS} servers are up', timeout=240)
        fds = [_open_fds(proc.pid)]
        lines += read_until(proc, '  loss ', timeout=120)
        os.kill(task_pid(run, 'worker:7'), signal.SIGKILL)
        os.kill(task_pid(run, 'worker:8'), signal.SIGSTOP)
        lines += read_until(proc, 'worker:8 has been stopped', timeout=120)
        fds.append(_open_fds(proc.pid))
    finally:
        out = ''.join(lines) + finish(proc, 300)
    assert proc.returncode == 0, out[-6000:]
    assert 'worker:7 was killed by SIGKILL' in out and 'restart 1/3' in out, out[-6000:]
    assert '(2 restart(s))' in out, out[-3000:]
    assert max(fds) < 4 * (PS + WORKERS) + 256, fds       # the pre-flight's bound (SCALE-PLAN P0.1)
    with open(os.path.join(run, 'run.json')) as f:
        found = json.load(f)['rehearsal']
    assert found['tasks'] == PS + WORKERS and found['links_tried'] >= WORKERS * PS, found
    assert found['unreachable_count'] == 0 and found['links_file'] == LINKS_FILE
    assert 'links' not in found and [p['peer'] for p in found['peers']] == [f'ps:{i}' for i in range(PS)]
    links = read_links_file(os.path.join(run, LINKS_FILE))
    assert {(x.source, x.target) for x in links} == {(f'worker:{w}', f'ps:{p}') for w in range(WORKERS) for p in range(PS)}
    assert os.path.getsize(os.path.join(run, 'run.json')) < 64_000
    assert not os.path.exists(os.path.join(run, rundir.SYNTHETIC_DATA_DIR))      # no data set made for stand-ins
