"""A disk that refuses the run's files, on real small file systems: a tmpfs a few MB large (full:
ENOSPC), remounted read-only (EROFS), and a folder this process may not write (EACCES). Every
refusal reaches the user as one line with its path and its cause; nothing half-written stays;
the newest complete checkpoint still restores.

The file systems are mounted with mount(2) itself (no process is started, so the in-process tests
stay in the fast tier); that needs root, else the tests skip, saying so."""
from __future__ import annotations

import glob
import os
import re

import pytest

from cluster.checks import data
from cluster.runtime import rundir
from tests.conftest import launch, write_spec
from tests.harness.disk import _free, fill


# -- a real cluster whose train_dir fills up ----------------------------------------------------
@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_ends_the_run_naming_it(small_fs, tmp_path):
    """A train_dir on a 12 MB tmpfs: the checkpoint at step 5 (8.8 MB: two shards, ps and chief)
    fits, the one at step 10 does not. The chief's line names the cause, the checkpoint and the
    path; the launcher's closing line and event log carry it; no `_temp` folder is left; the
    earlier checkpoint still restores; the second identical failure ends the run with two
    restarts unspent."""
    data_dir = str(tmp_path / 'data')
    data.write_synthetic(data_dir, records_per_file=100, test_records=100)     # the data elsewhere
    train_dir = small_fs('12m')
    spec = write_spec(tmp_path, steps=40, checkpoint_steps=5, checkpoint_secs=600, data=data_dir,
                      train_dir=train_dir, supervise={'restart': 'on-failure', 'max_restarts': 3})
    result = launch('up', spec, timeout=400)
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    # The chief's own line, shown whole (the second save: at step 10, or the step after if it missed it).
    refused = re.search(rf'E worker:0: SaveError: No space left on device \(ENOSPC\): cannot save checkpoint '
                        rf'model\.ckpt-(\d+) in {re.escape(train_dir)}$', out, re.M)
    assert refused, out
    error = [line for line in out.splitlines() if line.startswith('[launch]') and 'error:' in line]
    # The closing line may shorten the task's error (the whole is in its log): the cause comes first.
    assert error and 'its last error: SaveError: No space left on device (ENOSPC)' in error[-1], out
    # The same failure after a restart, with no newer checkpoint: the run ends, restarts unspent.
    assert 'restart 1/3' in out and 'restart 2/3' not in out, out
    assert 'the same failure as before the last restart' in error[-1], error[-1]
    assert 'Traceback' not in out
    assert not glob.glob(os.path.join(train_dir, '*_temp*')), os.listdir(train_dir)
    lost = [e for e in _events(train_dir) if e['event'] == 'task_lost']
    assert lost and refused.group(0)[len('E worker:0: '):] in lost[0]['error'], lost
    saved = rundir.checkpoint_step(rundir.read_text(rundir.checkpoint_index_path(train_dir)))
    assert saved is not None and saved < int(refused.group(1)), out
    from tests.harness.local import checkpoint_step
    assert checkpoint_step(train_dir) == saved          # the newest complete checkpoint, read back by TensorFlow


@pytest.mark.slow
def test_a_full_disk_at_a_pss_checkpoint_is_named_and_the_chief_not_started_into_it(small_fs, tmp_path):
    """Issue 37 #2: a coordinator run whose train_dir lies on a 10 MB tmpfs, 4 MB a checkpoint:
    those at steps 50 and 100 fit, the one at 150 does not, and once its half is removed the disk
    has room again (statvfs sees nothing). The chief's line names the cause, the checkpoint and
    the path (not TensorFlow's out-of-memory hint); the launcher names the disk at once (line and
    `disk_full` event); the chief is not started again into it; the closing line keeps the cause
    and resumes from step 100; no `_temp` is left."""
    from tests.conftest import write_coordinator_spec
    train_dir = small_fs('10m')
    spec = write_coordinator_spec(tmp_path, evaluator=None, steps=400, checkpoint_steps=50, train_dir=train_dir,
                                  top={'env': {'TFCLUSTER_TEST_BALLAST_FLOATS': 1_000_000}})
    result = launch('up', spec, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert re.search(rf'E chief:0: SaveError: No space left on device \(ENOSPC\): cannot save checkpoint '
                     rf'model\.ckpt-150 in {re.escape(train_dir)}$', out, re.M), out
    assert 'Hint:' not in out and 'restart 1/' not in out, out
    assert (f'warning: the disk under {train_dir} is full: No space left on device (ENOSPC), as chief:0\'s last error '
            'says') in out, out
    closing = [line for line in out.splitlines() if line.startswith('[launch]') and 'error:' in line][-1]
    assert closing.startswith(f'[launch]   error: the disk under {train_dir} is full: No space left on device (ENOSPC); '
                              'chief:0'), closing
    assert 'no restart while the disk is full' in closing, closing
    assert closing.endswith('a new `launch up` resumes from the checkpoint at global step 100'), closing
    log = _events(train_dir)
    assert [(e['path'], e['cause']) for e in log if e['event'] == 'disk_full'] == \
        [(train_dir, 'No space left on device (ENOSPC)')], log
    assert [e['step'] for e in log if e['event'] == 'checkpoint'] == [50, 100]
    assert not [e for e in log if e['event'] == 'restart'] and log[-1]['result']['restarts'] == 0
    assert not glob.glob(os.path.join(train_dir, '*_temp*')), os.listdir(train_dir)


@pytest.mark.slow
def test_a_full_disk_under_the_logs_is_named_first_and_the_training_goes_on(small_fs, tmp_path):
    """Issue 31 #2: the train_dir's tmpfs fills up while the cluster trains (the logs stop, no
    checkpoint fits). The launcher names the disk and ENOSPC at once, hears the steps in the
    tasks' pulses, and declares no stall for longer than stall_secs; once there is room again
    the logs go on at a later step and the run ends as asked (Ctrl-C), not as a deadlock."""
    import signal
    import time
    from tests.conftest import launch_bg, read_until
    from tests.harness.faults import finish, until_step
    data_dir = str(tmp_path / 'data')
    data.write_synthetic(data_dir, records_per_file=100, test_records=100)     # the data elsewhere
    train_dir = small_fs('32m')
    spec = write_spec(tmp_path, steps=100000, checkpoint_secs=600, data=data_dir, train_dir=train_dir,
                      supervise={'stall_secs': 5})
    proc = launch_bg('up', spec)
    try:
        lines = until_step(proc, 1)
        fill(train_dir)
        at_fill = max(int(s) for s in re.findall(r'step (\d+)/100000', ''.join(lines)))
        lines += read_until(proc, 'No space left on device (ENOSPC)', timeout=10)
        time.sleep(5 + 3)       # past stall_secs with the logs stopped
        assert proc.poll() is None, ''.join(lines) + finish(proc)
        _free(train_dir)
        lines += read_until(proc, 'has room again', timeout=10)
        lines += read_until(proc, '  loss ', timeout=20)
        proc.send_signal(signal.SIGINT)
    finally:
        out = ''.join(lines) + finish(proc, 120)
    assert proc.returncode == 130, out
    named = [line for line in out.splitlines() if 'ENOSPC' in line]
    assert named[0] == (f'[launch]   warning: the disk under {train_dir} is full: No space left on device (ENOSPC); '
                        'no log, checkpoint or record of the run can be written there, and the next checkpoint '
                        'fails: free space there'), named
    assert 'deadlock' not in out and 'stall:' not in out and 'no new global step' not in out, out
    after = re.findall(r'step (\d+)/100000', out[out.index('has room again'):])
    assert after and int(after[0]) > at_fill + 3, (at_fill, after[:3])    # it trained on while full
    told = [e['event'] for e in _events(train_dir) if e['event'] in ('disk_full', 'disk_free', 'stall')]
    assert told == ['disk_full', 'disk_free'], told


def _events(train_dir: str) -> list[dict]:
    from launch.records.events import read_events
    return read_events(rundir.events_path(train_dir))


@pytest.mark.slow
def test_synthetic_data_that_does_not_fit_stops_the_launch_with_one_line(small_fs, tmp_path):
    train_dir = small_fs('4m')
    result = launch('up', write_spec(tmp_path, train_dir=train_dir), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert re.search(rf'train\.train_dir: cannot write {re.escape(train_dir)}/{data.SYNTHETIC_SUBDIR}/\S+\.bin: '
                     r'No space left on device \(ENOSPC\)', result.stderr), result.stdout + result.stderr
    assert 'Traceback' not in result.stdout + result.stderr
    assert not glob.glob(os.path.join(train_dir, data.SYNTHETIC_SUBDIR, '.*.tmp'))

