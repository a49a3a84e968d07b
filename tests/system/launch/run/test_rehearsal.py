"""`launch up SPEC --rehearse` on real local processes: every task a stand-in that serves, reaches
its peers and ends; the link table in run.json; nothing left running (tests/conftest.py)."""
from __future__ import annotations

import json
import os
import signal

import pytest

from tests.conftest import launch, launch_bg, read_until, write_coordinator_spec, write_spec
from tests.harness.faults import finish, kill_when

pytestmark = pytest.mark.slow


def test_a_rehearsal_of_two_ps_and_three_workers_ends_with_its_link_table(tmp_path):
    spec = write_spec(tmp_path, workers=3, ps=2, steps=150, checkpoint_steps=50)
    train_dir = str(tmp_path / 'run' / 'rehearsal')     # a run of its own beside the real run's files
    out = launch('up', spec, '--rehearse', timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'rehearsal: every task runs as a stand-in' in out.stdout
    assert 'rehearsal done in' in out.stdout
    assert 'rehearsal: 5 stand-in task(s); 6 of 6 link(s) reached' in out.stdout
    with open(os.path.join(train_dir, 'report.html')) as f:
        assert '<h2>Rehearsal</h2>' in f.read()
    with open(os.path.join(train_dir, 'run.json')) as f:
        record = json.load(f)
    assert record['state'] == 'done' and record['global_step'] == 150
    found = record['rehearsal']
    assert found['tasks'] == 5 and found['unreported'] == []
    pairs = {(x['source'], x['target']) for x in found['links']}
    assert pairs == {(f'worker:{w}', f'ps:{p}') for w in range(3) for p in range(2)}
    assert all(x['error'] == '' and x['rtt_ms'] > 0 and x['mb_per_s'] > 0 for x in found['links'])
    with open(os.path.join(train_dir, 'checkpoint')) as f:     # a stand-in's save: the index the launcher reads
        assert 'model.ckpt-150' in f.read()
    assert not [n for n in os.listdir(train_dir) if n.startswith('model.ckpt')]     # and no model behind it
    assert sorted(os.listdir(tmp_path / 'run')) == ['rehearsal']        # and nothing of the real run's is made
    real = launch('up', spec, '--set', 'train.steps=3', timeout=300)    # the real run starts after it, fresh
    assert real.returncode == 0, real.stdout + real.stderr
    assert 'resuming' not in real.stdout and 'global step 3' in real.stdout, real.stdout
    with open(os.path.join(train_dir, 'events.jsonl')) as f:
        kinds = [json.loads(line)['event'] for line in f]
    assert kinds.count('serving') == 5 and 'checkpoint' in kinds and kinds[-1] == 'finished'


def test_a_coordinator_rehearsal_reaches_every_ps_and_worker_from_the_chief(tmp_path):
    spec = write_coordinator_spec(tmp_path, steps=100)
    out = launch('up', spec, '--rehearse', timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(str(tmp_path / 'run' / 'rehearsal'), 'run.json')) as f:
        found = json.load(f)['rehearsal']
    assert sorted((x['source'], x['target']) for x in found['links']) == \
        [('chief:0', 'ps:0'), ('chief:0', 'worker:0'), ('chief:0', 'worker:1')]
    assert 'evaluation at global step 100' in out.stdout


def test_a_killed_stand_in_is_restarted_as_its_task_would_be(tmp_path):
    spec = write_spec(tmp_path, workers=2, ps=1, steps=400, supervise={'restart': 'on-failure', 'max_restarts': 2})
    run = str(tmp_path / 'run' / 'rehearsal')
    proc = launch_bg('up', spec, '--rehearse')
    lines = kill_when(proc, run, 1, 'ps:0')
    lines += read_until(proc, 'resuming from')
    out = ''.join(lines) + finish(proc)
    assert proc.returncode == 0, out
    assert 'restart 1/2: ps:0 was killed by SIGKILL' in out and '(1 restart(s))' in out
    with open(os.path.join(run, 'run.json')) as f:
        record = json.load(f)
    assert record['restarts'] == 1 and len(record['rehearsal']['links']) == 2, record


def test_thirty_one_stand_ins_come_up_and_end_on_one_machine(tmp_path):
    spec = write_spec(tmp_path, workers=30, ps=1, steps=100)
    out = launch('up', spec, '--rehearse', timeout=500)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]
    assert 'all 31 servers are up' in out.stdout


def test_a_rehearsal_stopped_by_ctrl_c_says_how_to_rehearse_again_not_how_to_resume(tmp_path):
    spec = write_spec(tmp_path, workers=2, ps=1, steps=100_000)
    proc = launch_bg('up', spec, '--rehearse')
    lines = read_until(proc, 'servers are up')
    proc.send_signal(signal.SIGINT)
    out = ''.join(lines) + finish(proc)
    assert proc.returncode == 128 + signal.SIGINT, out
    stopped = [line for line in out.splitlines() if 'stopped;' in line]
    assert len(stopped) == 1 and f'`launch up {spec} --rehearse` rehearses again' in stopped[0], out
    assert 'a new `launch up` resumes' not in out, out


def test_status_logs_debug_scale_and_down_work_on_a_rehearsal_as_on_a_run(tmp_path):
    """The commands a user points at a run, pointed at a rehearsal's (its train_dir): status names
    every stand-in, logs prints one's log, debug gets every stand-in's stacks, an async scale
    takes a worker out live and brings it back, and down stops what is left: nothing survives."""
    spec = write_spec(tmp_path, workers=3, ps=1, steps=1_000_000, sync=False)
    run = str(tmp_path / 'run' / 'rehearsal')
    proc = launch_bg('up', spec, '--rehearse')
    try:
        lines = read_until(proc, 'servers are up')
        status = launch('status', run, timeout=60)
        assert status.returncode == 0 and all(t in status.stdout for t in ('ps:0', 'worker:0', 'worker:2')), status.stdout
        logs = launch('logs', run, 'worker:1', timeout=60)
        assert logs.returncode == 0 and 'worker:1: a rehearsal stand-in (no TensorFlow)' in logs.stdout, logs.stdout
        debug = launch('debug', run, timeout=60)
        assert debug.returncode == 0, debug.stdout + debug.stderr
        dumped = sorted(os.listdir(os.path.join(run, 'stacks', 'attempt-1')))
        assert len(dumped) == 4, dumped
        assert all('in play' in open(os.path.join(run, 'stacks', 'attempt-1', f)).read() for f in dumped), dumped
        shrink = launch('scale', run, '--workers', '2', timeout=120)
        assert shrink.returncode == 0 and 'worker:2 finishes its step and leaves' in shrink.stdout, shrink.stdout
        grow = launch('scale', run, '--workers', '3', timeout=120)
        assert grow.returncode == 0 and '3 worker(s) train now' in grow.stdout, grow.stdout + grow.stderr
        down = launch('down', run, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
    finally:
        out = ''.join(lines) + finish(proc)
    assert proc.returncode == 128 + signal.SIGTERM, out       # stopped by `down`
    with open(os.path.join(run, 'events.jsonl')) as f:
        kinds = [json.loads(line)['event'] for line in f]
    assert 'restart' not in kinds and 'task_lost' not in kinds, kinds      # a scale is no fault
