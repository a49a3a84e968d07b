"""Supervision under harder faults, on real local clusters: a second fault while a restart starts
the cluster again, a failure that repeats exactly, a frozen ps, checkpoints that do not restore,
a train_dir removed under the run, and a launcher killed hard. Each asserts the outcome, the line
the user reads, and (through the autouse guard) that nothing is left running."""
from __future__ import annotations

import datetime
import glob
import json
import os
import re
import signal
import time

import pytest

from tests.conftest import launch, launch_bg, read_until, write_spec
from tests.harness.faults import finish, kill_when, remove_while_written, task_pid, until_step
from tests.harness.local import checkpoint_step, worker_results

pytestmark = pytest.mark.slow     # real local clusters


def events(run: str) -> list[dict]:
    with open(os.path.join(run, 'events.jsonl')) as f:
        return [json.loads(line) for line in f if line.strip()]


def error_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith('[launch]   error:')]


def new_pid(run: str, name: str, old: int, timeout: float = 60) -> int:
    """The pid of task `name`'s next start, as soon as the launcher records it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid = task_pid(run, name)
        except (OSError, ValueError, StopIteration):
            pid = old
        if pid != old:
            return pid
        time.sleep(0.01)
    pytest.fail(f'the restarted {name} never appeared in the state file')


def test_tasks_lost_or_frozen_while_a_restart_starts_up_are_faults_of_the_policy(tmp_path):
    """kill -9 of the ps; then kill -9 of the new ps before its server is up, and SIGSTOP of the
    next start's worker:1 half a second after it appears: each is one more fault of the same policy
    (the frozen one caught after stall_secs, not --start-timeout), and once no restart is left the
    closing line names the frozen task and the step a new `launch up` resumes from; run.json keeps
    that step and the faults."""
    spec = write_spec(tmp_path, steps=400, checkpoint_secs=1, sync=False,
                      supervise={'restart': 'on-failure', 'max_restarts': 2, 'backoff_secs': 0.5, 'stall_secs': 6})
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec, '--start-timeout', '300')
    lines = read_until(proc, 'saved a checkpoint at global step')      # a checkpoint to resume from
    lines += kill_when(proc, run, 1, 'ps:0')
    first = task_pid(run, 'ps:0')
    lines += read_until(proc, 'resuming from')
    os.kill(new_pid(run, 'ps:0', first), signal.SIGKILL)
    lines += read_until(proc, 'restart 2/2')
    worker = task_pid(run, 'worker:1')
    lines += read_until(proc, 'resuming from')
    frozen = new_pid(run, 'worker:1', worker)
    time.sleep(0.5)
    os.kill(frozen, signal.SIGSTOP)
    began = time.monotonic()
    out = ''.join(lines) + finish(proc)
    assert time.monotonic() - began < 60, 'the frozen task was waited for as long as --start-timeout'
    assert proc.returncode == 1, out
    assert 'restart 1/2: ps:0 was killed by SIGKILL' in out
    assert 'restart 2/2: ps:0 was killed by SIGKILL while the cluster started again' in out, out
    resumed = int(re.findall(r'restart 2/2: resuming from the checkpoint at global step (\d+)', out)[0])
    errors = error_lines(out)
    assert len(errors) == 1, out
    assert 'worker:1' in errors[0] and 'is stopped' in errors[0] and 'while the cluster started again' in errors[0]
    assert '2 restart(s) made' in errors[0] and re.search(r'resumes from the checkpoint at global step \d+',
                                                          errors[0]), errors[0]
    record = json.load(open(os.path.join(run, 'run.json')))
    assert record['state'] == 'failed' and record['global_step'] is not None and record['global_step'] >= resumed
    assert [f['task'] for f in record['failures']] == ['worker:1'], record['failures']
    found = events(run)
    assert [e['task'] for e in found if e['event'] == 'task_lost'].count('ps:0') == 2, found
    assert 'worker:1' in [e['task'] for e in found if e['event'] == 'task_lost']
    assert len([e for e in found if e['event'] == 'restart']) == 2, found


PROGRAM = '''
import time


def train(ctx):
    time.sleep(3)           # after the launcher has seen every server up
    raise RuntimeError('the same failure, every time')
'''


def test_a_first_restart_is_immediate_and_an_identical_failure_ends_the_run_early(tmp_path):
    """A chief that fails the same way at the same step: one restart (at once: the first in a row
    waits no backoff), then the run ends with that error instead of spending every restart."""
    (tmp_path / 'same_failure.py').write_text(PROGRAM)
    spec = write_spec(tmp_path, workers=1, program='same_failure:train',
                      supervise={'restart': 'on-failure', 'max_restarts': 5, 'backoff_secs': 2})
    result = launch('up', spec, cwd=str(tmp_path), timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert out.count('restart 1/5') >= 1 and 'restart 2/5' not in out, out
    assert '(supervise.backoff_secs' not in out, out
    [error] = error_lines(out)
    assert 'RuntimeError: the same failure, every time' in error
    assert 'the same failure as before the last restart' in error and len(error) < 400, error
    found = events(str(tmp_path / 'run'))
    restart = next(e for e in found if e['event'] == 'restart')
    at = {id(e): datetime.datetime.fromisoformat(e['time']).timestamp() for e in found}
    again = [at[id(e)] for e in found if e['event'] == 'task_started' and at[id(e)] >= at[id(restart)]]
    assert again, found


def test_a_frozen_ps_is_announced_and_its_checkpoint_is_not_waited_for(tmp_path):
    """SIGSTOP of the ps: half way to the stall limit the launcher says what the training waits
    for; at the limit it restarts at once (no checkpoint can be written while the ps holds the
    variables frozen), and the run reaches its last step."""
    spec = write_spec(tmp_path, steps=60, supervise={'restart': 'on-failure', 'max_restarts': 1, 'stall_secs': 8})
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    lines = kill_when(proc, run, 1, 'ps:0', signal.SIGSTOP)
    lines += read_until(proc, 'warning: no new global step')
    assert re.search(r'warning: no new global step for \d+s \(at \d+/60\); ps:0 is stopped \(SIGSTOP, or a '
                     r'debugger\) and does not answer on localhost:\d+; worker:0, worker:1 answer and wait for it; '
                     r'a stall is declared at 8s', lines[-1]), lines[-1]
    lines += read_until(proc, 'stopping every task')
    stopping = time.monotonic()
    assert 'no checkpoint can be saved without the lost task' in lines[-1], lines[-1]
    lines += read_until(proc, 'resuming from')
    assert time.monotonic() - stopping < 12, ''.join(lines)       # not the chief's 20 s checkpoint grace
    out = ''.join(lines) + finish(proc)
    assert proc.returncode == 0, out
    assert all(r['global_step'] == 60 for r in worker_results(run))


def test_checkpoints_that_do_not_restore_end_with_a_short_true_line(tmp_path):
    """Every checkpoint damaged: the run ends with one line under 300 characters that does not
    recommend resuming from any of them."""
    spec = write_spec(tmp_path, steps=6, checkpoint_steps=3)
    run = str(tmp_path / 'run')
    assert launch('up', spec).returncode == 0
    for path in glob.glob(os.path.join(run, 'model.ckpt-*.data-*')):
        with open(path, 'r+b') as f:
            f.truncate(8)
    result = launch('up', spec, '--set', 'train.steps=12', '--set', 'supervise.restart=on-failure')
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    [error] = error_lines(out)
    assert 'no checkpoint in' in error and 'restores' in error, error
    assert 'resumes from the checkpoint' not in error and 'moved away' in error, error
    assert len(error) < 300 + len('[launch]   '), error
    assert 'restart 1/' not in out          # a restart cannot help, and is not tried


def test_a_train_dir_removed_mid_run_is_one_line_and_a_clean_stop(tmp_path):
    spec = write_spec(tmp_path, steps=100000, supervise={'restart': 'on-failure'})
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    lines = until_step(proc, 1)
    remove_while_written(run)      # the tasks write into it meanwhile (logs, channels, checkpoints)
    out = ''.join(lines) + finish(proc, 120)
    assert proc.returncode == 1, out
    [error] = error_lines(out)
    assert f"the run's directory {run} was removed while the run went on" in error, error
    assert 'Traceback' not in out and 'Errno' not in out, out


def test_a_new_up_takes_over_from_a_launcher_killed_hard(tmp_path):
    """kill -9 of `launch up`, then `launch up` again at once: the dead launcher's tasks are
    stopped (saying so) and the new run goes on from the checkpoint."""
    spec = write_spec(tmp_path, steps=100000, checkpoint_steps=2)
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    try:
        until_step(proc, 3)
        dead = proc.pid
        proc.kill()
        proc.wait()
    finally:
        proc.kill()
    result = launch('up', spec, '--set', 'train.steps=200', timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert f'the launcher of an earlier run of this spec (pid {dead}) is gone; stopping what it left running' in out
    assert 'already running' not in out
    assert checkpoint_step(run) == 200


def test_an_async_chief_frozen_while_the_other_worker_trains_is_restarted(tmp_path):
    """SIGSTOP of the chief in async mode: worker:1 trains on, and once it is done the run would
    wait for ever. Stopped for stall_secs, the chief is a lost task: the cluster restarts and
    reaches its last step (400 steps: the chief is stopped at its first). Which rule names the
    freeze first is a race of two equal clocks: the chief's stop, or the global step's quiet
    (a non-chief worker logs its steps every 10 s at most, and worker:1 alone can train to the
    end in less); both restart for worker:0, stopped."""
    spec = write_spec(tmp_path, steps=400, sync=False, learning_rate=0.05,
                      supervise={'restart': 'on-failure', 'max_restarts': 1, 'stall_secs': 6})
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    lines = kill_when(proc, run, 1, 'worker:0', signal.SIGSTOP)
    out = ''.join(lines) + finish(proc, 300)
    assert proc.returncode == 0, out
    assert re.search(r'restart 1/1: (worker:0 has been stopped \(SIGSTOP, or paused\) for \d+s|'
                     r'stall: no new global step for \d+s \(stuck at \d+/400\); worker:0 is stopped)', out), out
    assert all(r['global_step'] >= 400 for r in worker_results(run)), out
