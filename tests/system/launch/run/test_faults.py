"""Fault injection on real local clusters: kill -9 of workers, ps, chief and the launcher itself,
SIGSTOP, SIGTERM, a truncated checkpoint. Each test asserts the outcome (exit code, final step,
the line that names the task) and, through the autouse guard, that nothing is left running."""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import time

import pytest

from cluster.runtime import rundir
from launch.records.events import read_events
from tests.conftest import launch, launch_bg, project_processes, read_until, write_spec
from tests.harness.local import checkpoint_step, worker_results
from tests.harness.faults import finish, kill_when, task_pid, until_step

pytestmark = pytest.mark.slow     # real local clusters


def run_and_kill(spec: str, run: str, step: int, name: str) -> tuple[int, str]:
    """`launch up` to the end, with task `name` killed -9 at global step `step` once every server is
    up (before, a sync run with a backup worker can step while one task still starts, and a kill
    then is a start-up fault): (exit code, output)."""
    proc = launch_bg('up', spec)
    lines = read_until(proc, 'servers are up')
    lines += kill_when(proc, run, step, name)
    out = ''.join(lines) + finish(proc)
    return proc.returncode, out


def test_async_run_survives_a_lost_worker(tmp_path):
    # 300 steps: an async run trains ~80 steps a second here, and the kill must come before its end.
    spec = write_spec(tmp_path, steps=300, sync=False, learning_rate=0.05)
    run = str(tmp_path / 'run')
    code, out = run_and_kill(spec, run, 1, 'worker:1')
    assert code == 0, out
    assert 'worker:1 was killed by SIGKILL; training goes on with 1 worker(s)' in out
    assert re.search(r'done in .*global step 30\d.*\(lost worker:1\)', out), out
    assert checkpoint_step(run) >= 300


def test_sync_run_survives_a_lost_backup_worker(tmp_path):
    spec = write_spec(tmp_path, workers=3, replicas_to_aggregate=2, steps=40)
    run = str(tmp_path / 'run')
    code, out = run_and_kill(spec, run, 5, 'worker:2')
    assert code == 0, out
    assert 'worker:2 was killed by SIGKILL; training goes on with 2 worker(s)' in out
    assert checkpoint_step(run) == 40


def test_lost_ps_and_chief_restart_from_the_checkpoint(tmp_path):
    """on-failure: kill -9 of the ps, then of the chief; each time the cluster comes back from the
    checkpoint the chief wrote while being stopped, and the run ends at the requested step."""
    spec = write_spec(tmp_path, steps=150, checkpoint_secs=600, supervise={'restart': 'on-failure',
                                                                             'max_restarts': 2})
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    lines = kill_when(proc, run, 1, 'ps:0')
    lines += read_until(proc, 'resuming from')
    lines += kill_when(proc, run, 1, 'worker:0')
    lines += read_until(proc, 'resuming from')
    out = ''.join(lines) + finish(proc)
    assert proc.returncode == 0, out
    assert 'restart 1/2: ps:0 was killed by SIGKILL' in out
    assert 'restart 2/2: worker:0 was killed by SIGKILL' in out
    assert re.search(r'restart 2/2: resuming from (the checkpoint at global step \d+|step 0)', out), out
    assert checkpoint_step(run) == 150
    assert all(r['global_step'] == 150 for r in worker_results(run))
    assert '(2 restart(s))' in out
    # Each fault's time to training again, phase by phase, in the console, the event log and run.json.
    assert len(re.findall(r'training again [\d.]+s after the fault \(stop [\d.]+s, backoff [\d.]+s, '
                          r'start [\d.]+s, step [\d.]+s', out)) == 2, out
    with open(os.path.join(run, 'events.jsonl')) as f:
        mended = [json.loads(line) for line in f if '"recovered"' in line]
    with open(os.path.join(run, 'run.json')) as f:
        record = json.load(f)
    assert [m['tasks'][0] for m in mended] == ['ps:0', 'worker:0'], mended
    assert [m['attempt'] for m in mended] == [2, 3], mended
    for m in mended:
        assert 0 < m['seconds'] < 120 and abs(sum(m['phases'].values()) - m['seconds']) < 0.1, m
        assert set(m['phases']) == {'stop', 'backoff', 'start', 'step'} and m['steps_redone'] >= 0, m
    assert [r['seconds'] for r in record['recoveries']] == [m['seconds'] for m in mended], record


def test_lost_ps_without_a_policy_ends_with_one_line(tmp_path):
    spec = write_spec(tmp_path, steps=100000)
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    lines = kill_when(proc, run, 1, 'ps:0')
    out = ''.join(lines) + finish(proc, 120)
    assert proc.returncode == 1, out
    error = [line for line in out.splitlines() if line.startswith('[launch]   error:')]
    assert len(error) == 1, out
    assert re.match(r'\[launch\]   error: ps:0 \(pid \d+ on localhost\) was killed by SIGKILL[;( ]', error[0]), error
    assert re.search(r'(resumes from the checkpoint at global step \d+|starts from step 0)$', error[0]), error
    assert 'Traceback' not in out


def test_sigterm_saves_and_up_resumes_at_the_step_reached(tmp_path):
    """SIGTERM to `launch up`: the chief checkpoints before anything stops. Then a truncated newest
    checkpoint: the next `up` restores the one before it, with a warning naming the files."""
    spec = write_spec(tmp_path, steps=100000, checkpoint_steps=5, checkpoint_secs=600)
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    try:
        lines = until_step(proc, 12)        # past two checkpoints (5 and 10)
        seen = max(int(m) for m in re.findall(r'step (\d+)/', ''.join(lines)))
        proc.send_signal(signal.SIGTERM)
    finally:
        out = finish(proc, 120)
    assert proc.returncode == 143, out
    saved = re.search(r'SIGTERM received: saved a checkpoint at global step (\d+)', out)
    assert saved, out
    assert int(saved.group(1)) >= seen and checkpoint_step(run) == int(saved.group(1))

    # Truncate the newest checkpoint's data: the previous one (a multiple of 5) is restored.
    newest = int(saved.group(1))
    for path in glob.glob(os.path.join(run, f'model.ckpt-{newest}.data-*')):
        with open(path, 'r+b') as f:
            f.truncate(16)
    result = launch('up', spec, '--set', f'train.steps={newest + 3}')
    assert result.returncode == 0, result.stdout + result.stderr
    assert f'checkpoint(s) that do not restore were skipped: {run}/model.ckpt-{newest}.data' in result.stdout
    previous = re.search(r'restoring \S+model\.ckpt-(\d+)', result.stdout)
    assert previous and int(previous.group(1)) < newest, result.stdout
    assert 'session ready after' in result.stdout and f'at global step {previous.group(1)}' in result.stdout
    assert checkpoint_step(run) == newest + 3


def stack_files(run: str) -> dict[str, str]:
    """The stacks files of attempt 1: task file name -> text."""
    folder = os.path.join(run, 'stacks', 'attempt-1')
    return {name: rundir.read_text(os.path.join(folder, name)) or '' for name in sorted(os.listdir(folder))}


def test_a_stopped_worker_is_named_by_the_stall_watchdog(tmp_path):
    """`launch debug` while the cluster trains: every task writes its stacks. Then worker:1 is
    stopped: the stall line names it, and where the stacks of the two that answered are."""
    spec = write_spec(tmp_path, steps=100000, supervise={'stall_secs': 6})
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    try:
        lines = until_step(proc, 1)
        debug = launch('debug', run, timeout=60)
        dumped = stack_files(run)
        os.kill(task_pid(run, 'worker:1'), signal.SIGSTOP)
        stopped = time.monotonic()
        for _ in range(10):         # the launcher saves the step it saw within a fraction of a second
            status = launch('status', spec, timeout=60)
            if 'global step: none seen yet' not in status.stdout:
                break
            time.sleep(0.3)
    finally:
        out = finish(proc, 120)
    out = ''.join(lines) + out
    assert re.search(r'global step \d+/100000, seen \d+s ago', status.stdout), status.stdout
    assert re.search(r'worker:1 .* is stopped \(SIGSTOP', status.stdout), status.stdout
    assert proc.returncode == 1, out
    assert re.search(r'error: stall: no new global step for \d+s \(stuck at \d+/100000\); worker:1 is stopped '
                     r'\(SIGSTOP, or a debugger\) and does not answer on localhost:\d+; ps:0, worker:0 answer and '
                     r'wait for it', out), out
    assert time.monotonic() - stopped < 6 + 40      # the stall, the probe and a checkpointing stop
    assert debug.returncode == 0 and debug.stdout.startswith(f'stacks of ps:0, worker:0, worker:1 in {run}/stacks/'
                                                             'attempt-1\n'), debug.stdout + debug.stderr
    assert sorted(dumped) == ['ps-0.txt', 'worker-0.txt', 'worker-1.txt'], dumped
    assert re.search(r'File ".*/cluster/training/train\.py", line \d+ in run_worker', dumped['worker-1.txt'])
    assert re.search(r'File ".*/cluster/task\.py", line \d+ in serve_and_train', dumped['ps-0.txt'])
    assert re.search(rf'; stacks of ps:0, worker:0 in {run}/stacks/attempt-1 \(worker:1 did not answer\)', out), out
    after = stack_files(run)
    for name in ('ps-0.txt', 'worker-0.txt'):      # the stall's dump added to debug's
        assert after[name].startswith(dumped[name]) and len(after[name]) > len(dumped[name]) + 100, name
    stall = next(e for e in read_events(os.path.join(run, 'events.jsonl')) if e['event'] == 'stall')
    assert (stall['stacks'], stall['no_stacks']) == ('stacks/attempt-1', ['worker:1']), stall


def test_tasks_outlive_a_killed_launcher_by_seconds_only(tmp_path):
    spec = write_spec(tmp_path, steps=100000)
    proc = launch_bg('up', spec)
    try:
        read_until(proc, '  loss ')
        mine = set(project_processes()) - {proc.pid}
        assert len(mine) == 3, mine
        proc.kill()
        proc.wait()
        killed = time.monotonic()
        while set(project_processes()) & mine and time.monotonic() - killed < 20:
            time.sleep(0.2)
        left = set(project_processes()) & mine
        assert not left and time.monotonic() - killed < 10, (left, time.monotonic() - killed)
    finally:
        proc.kill()
    logs = ''.join(open(p).read() for p in glob.glob(str(tmp_path / 'run' / 'logs' / '*.log')))
    assert 'the launcher has not renewed' in logs
    down = launch('down', spec, timeout=60)
    assert down.returncode == 0, down.stdout + down.stderr
