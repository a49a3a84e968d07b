"""A real 1 ps + 2 worker cluster of local processes, driven through the `launch` command line."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import (REPO, TASK_ENV, environment_words, envs_through, launch, launch_bg, project_processes,
                            read_until, run_by_hand, write_spec)
from tests.harness.local import checkpoint_step, worker_results

pytestmark = pytest.mark.slow     # real local clusters and `python -m cluster.task`


def test_sync_run_trains_to_the_end(tmp_path):
    """... with a secret in the spec, one taken from the launcher's environment and one given by
    --set: each task gets them in its environment, and none is in the output, the spec copy (0600),
    the event log, run.json or the report."""
    secrets = ('s3cret-in-spec', 's3cret-from-env', 's3cret-from-set')
    spec = write_spec(tmp_path, steps=20, top={'env': {'TFC_TEST_TOKEN': secrets[0],
                                                      'TFC_TEST_FROM': {'from_env': 'TFC_TEST_SOURCE'}}})
    result = launch('up', spec, '--set', f'tasks.worker.env.TFC_TEST_PASSWORD={secrets[2]}',
                    env={**os.environ, 'TFC_TEST_SOURCE': secrets[1]})
    assert result.returncode == 0, result.stdout + result.stderr
    said = {task: next(x for x in result.stdout.splitlines() if f'{task}: environment:' in x).split(': environment: ')[1]
            for task in ('ps:0', 'worker:1')}
    assert said == {'ps:0': 'TFC_TEST_FROM=*** TFC_TEST_TOKEN=***',
                    'worker:1': 'TFC_TEST_FROM=*** TFC_TEST_PASSWORD=*** TFC_TEST_TOKEN=***'}, said
    run_dir = tmp_path / 'run'
    assert stat.S_IMODE(os.stat(run_dir / 'spec.yaml').st_mode) == 0o600
    for text in [result.stdout, result.stderr] + [(run_dir / name).read_text() for name in
                                                  ('spec.yaml', 'events.jsonl', 'run.json', 'report.html')]:
        assert not any(s in text for s in secrets), text
    train_dir = str(tmp_path / 'run')
    assert checkpoint_step(train_dir) == 20
    for r in worker_results(train_dir):
        # Every global step aggregated exactly one gradient from each worker.
        assert r['local_steps'] == 20 and r['global_step'] == 20
        assert r['applied_at'] == [[0, 19]]
    out = result.stdout
    assert '[worker:0]' in out and '[ps:0]' in out and 'step 20/20' in out
    assert 'images/s' in out and 'loss' in out
    for name in ('ps-0', 'worker-0', 'worker-1'):
        assert os.path.getsize(tmp_path / 'run' / 'logs' / f'{name}.log') > 0
    assert not os.path.exists(tmp_path / 'run' / 'launch-state.json')


def test_async_run_trains_to_the_end(tmp_path):
    spec = write_spec(tmp_path, steps=40, sync=False)
    result = launch('up', spec)
    assert result.returncode == 0, result.stdout + result.stderr
    results = worker_results(str(tmp_path / 'run'))
    # Each worker applied its own updates: together they made every global step. A worker leaves
    # at step 40 while the other may still land one more update, so the last to finish saw them all
    # (and the chief's checkpoint holds 40, or one more if the chief finished last).
    last = max(r['global_step'] for r in results)
    assert sum(r['local_steps'] for r in results) == last
    assert 40 <= checkpoint_step(str(tmp_path / 'run')) <= last
    assert all(r['local_steps'] > 0 for r in results)


def test_a_crashing_worker_fails_the_run_and_stops_everything(tmp_path):
    spec = write_spec(tmp_path, steps=100000)
    proc = launch_bg('up', spec)
    try:
        read_until(proc, 'step 1/')
        with open(tmp_path / 'run' / 'launch-state.json') as f:
            pid = next(t['pid'] for t in json.load(f)['tasks'] if t['name'] == 'worker:1')
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, out
    assert 'error: worker:1' in out and 'SIGKILL' in out, out


@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGHUP], ids=['ctrl-c', 'terminal-closed'])
def test_a_signal_stops_everything_within_ten_seconds(tmp_path, sig):
    spec = write_spec(tmp_path, steps=100000)
    proc = launch_bg('up', spec)
    try:
        read_until(proc, 'step 1/')
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=15)
        elapsed = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, out
    assert elapsed < 10, elapsed
    assert f'{sig.name} received' in out


def test_status_and_down_after_the_launcher_is_killed(tmp_path):
    spec = write_spec(tmp_path, steps=100000)
    proc = launch_bg('up', spec)
    try:
        read_until(proc, 'servers are up')
        status = launch('status', spec)
        assert status.returncode == 0
        rows = [line.split() for line in status.stdout.splitlines() if line.startswith(('ps:', 'worker:'))]
        assert len(rows) == 3 and all(r[-2:] == ['yes', 'yes'] for r in rows), status.stdout
        proc.kill()                 # a crashed launcher leaves its tasks running for a few seconds
        proc.wait()                 # (until their lease runs out: tests/system/launch/run/test_faults.py)...
        assert len(project_processes()) >= 3
        down = launch('down', spec)  # ...and `down` finds and stops whatever is left of them
        assert down.returncode == 0, down.stdout + down.stderr
        assert re.search(r'stopped [1-3] task\(s\)|nothing left running', down.stdout), down.stdout
        assert not project_processes()
        status = launch('status', spec)
        assert 'yes' not in status.stdout.split('LISTENING', 1)[1], status.stdout
        again = launch('down', spec)
        assert again.returncode == 0 and 'nothing' in again.stdout
    finally:
        proc.kill()
        launch('down', spec)


def test_down_stops_a_running_launcher_cleanly(tmp_path):
    spec = write_spec(tmp_path, steps=100000)
    proc = launch_bg('up', spec)
    try:
        read_until(proc, 'servers are up')
        down = launch('down', spec)
        assert down.returncode == 0, down.stdout + down.stderr
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        proc.kill()


def test_start_timeout_names_the_task(tmp_path):
    spec = write_spec(tmp_path)
    result = launch('up', spec, '--start-timeout', '0.5')
    assert result.returncode == 1
    # A task not serving yet, or one that came up just as the time ran out (its port answers, and
    # its log says it serves): either way the task, and the flag that gives it more time.
    assert re.search(r'error: (ps|worker):\d \(localhost:\d+\) (did not accept gRPC connections in time|'
                     r'came up only as the time ran out); raise the limit with --start-timeout', result.stdout), \
        result.stdout


def test_cluster_started_by_hand_trains(tmp_path):
    spec = write_spec(tmp_path, steps=15)
    os.makedirs(tmp_path / 'run')
    codes, outs = run_by_hand(spec)
    assert codes == [0, 0, 0], outs
    assert checkpoint_step(str(tmp_path / 'run')) == 15
    assert 'worker:0 is done' in outs[0] and 'worker:1 is done' in outs[0]


def test_task_short_form_reads_cluster_spec_env(tmp_path):
    spec = write_spec(tmp_path)
    result = subprocess.run([sys.executable, '-m', 'cluster.task', '--job', 'worker', '--index', '7'], cwd=REPO,
                            env={**os.environ, 'CLUSTER_SPEC': spec}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count('\n') == 1 and 'worker:7 does not exist' in result.stderr and spec in result.stderr


def test_check_imports_tensorflow_and_names_a_busy_port(tmp_path):
    spec = write_spec(tmp_path)
    ok = launch('check', spec, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.fullmatch(r'localhost: ok: 3 task\(s\), tensorflow [\d.]+\S*, ports \d+, \d+, \d+ free\n', ok.stdout), \
        ok.stdout
    port = int(yaml.safe_load(open(spec))['cluster']['worker'][1].rsplit(':', 1)[1])
    with socket.socket() as s:
        s.bind(('', port))
        s.listen()
        busy = launch('check', spec, timeout=120)
    assert busy.returncode == 2
    line = f'worker:1: port {port} on localhost is already in use by pid {os.getpid()} ('     # the holder: this test
    assert busy.stdout.startswith(f'localhost: error: {line}') and busy.stdout.count('\n') == 1, busy.stdout
    assert busy.stderr.splitlines()[-1] == f'launch: error: {spec}: {busy.stdout.split(": ", 2)[2].strip()}'


@pytest.mark.slow
def test_a_local_task_gets_the_spec_env_and_only_an_allow_list_of_the_launchers(tmp_path, monkeypatch):
    """The spec's env: reaches each task as given (per job), while the launcher's own environment
    reaches it only through launch/backends/local/backend.py INHERITED: the same spec behaves alike on every backend."""
    from cluster.spec import load_spec
    from launch.backends.local import LocalBackend
    from launch.planning.plan import plan_cluster
    monkeypatch.setenv('TFC_TEST_LAUNCHER_ONLY', 'not for tasks')
    monkeypatch.setenv('LC_TFC_TEST', 'kept')
    monkeypatch.setenv('TFC_TEST_SOURCE', 'from the launcher')
    hidden = {'TFC_TEST_TOKEN': "a 'secret'", 'TFC_TEST_FROM': {'from_env': 'TFC_TEST_SOURCE'}}
    spec = load_spec(write_spec(tmp_path, top={**TASK_ENV, 'env': {**TASK_ENV['env'], **hidden}}))
    seen = envs_through(LocalBackend(), spec, list(plan_cluster(spec)))
    copy = (tmp_path / 'run' / 'spec.yaml').read_text()      # written by the backend's prepare
    assert 'secret' not in copy and 'from the launcher' not in copy and 'TFC_TEST_TOKEN' in copy
    for task, job in (('ps:0', 'ps'), ('worker:0', 'worker'), ('worker:1', 'worker')):
        env = seen[task]
        assert [f'{k}={env.get(k)!r}' for k in sorted(TASK_ENV['env'])] == environment_words(job), env
        assert env['TFC_TEST_TOKEN'] == "a 'secret'" and env['TFC_TEST_FROM'] == 'from the launcher', env
        assert 'TFC_TEST_LAUNCHER_ONLY' not in env and env['LC_TFC_TEST'] == 'kept', env
        assert env['PATH'] == os.environ['PATH']
        assert env.get('CUDA_VISIBLE_DEVICES') == ('' if job == 'ps' else None)     # auto, the count not asked
        assert json.loads(env['TF_CONFIG'])['task'] == {'type': job, 'index': int(task[-1])}
