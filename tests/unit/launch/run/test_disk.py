"""A disk that refuses the run's files, on real small file systems: a tmpfs a few MB large (full:
ENOSPC), remounted read-only (EROFS), and a folder this process may not write (EACCES). Every
refusal reaches the user as one line with its path and its cause; nothing half-written stays;
the newest complete checkpoint still restores.

The file systems are mounted with mount(2) itself (no process is started, so the in-process tests
stay in the fast tier); that needs root, else the tests skip, saying so."""
from __future__ import annotations

import contextlib
import errno
import glob
import json
import logging
import os
import re

import numpy as np
import pytest

from cluster.checks import data
from cluster.runtime import causes, rundir
from launch.records.event_types import FirstStep, OtherEvent, Progress
from tests.conftest import REPO, write_spec
from tests.harness.disk import _free, fill
NOBODY = 65534


@pytest.fixture(scope='module')
def tf():
    """TensorFlow's import runs `uname -p` once: imported before a fast test's watch begins."""
    import tensorflow
    tensorflow.compat.v1.disable_eager_execution()
    return tensorflow


@contextlib.contextmanager
def as_nobody():
    """This process (every thread: glibc's seteuid) acts as user nobody, whom root's folders refuse."""
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)


# -- the cause, from an OSError or from TensorFlow's text ----------------------------------------
def test_os_cause_names_strerror_and_the_errno_name():
    assert rundir.os_cause(OSError(errno.ENOSPC, 'x', '/a')) == 'No space left on device (ENOSPC)'
    assert rundir.os_cause(PermissionError(errno.EACCES, 'x')) == 'Permission denied (EACCES)'
    tf_text = ('Graph execution error:\n\nDetected at node save/SaveV2\n/run/model.ckpt-2_temp/part-00000'
               '.tempstate1146; Read-only file system\n\t [[{{node save/SaveV2}}]]\nPermission denied')
    assert rundir.os_cause(tf_text) == 'Read-only file system (EROFS)'     # the first named
    assert rundir.os_cause(RuntimeError('Graph execution error:\nUnavailable: ps:0 is gone')) is None


def test_a_tasks_error_line_is_the_cause_not_tensorflows_preamble():
    """TensorFlow 2 starts a graph error with `Graph execution error:` and where the op was built
    (as TensorFlow 2.15 writes it); a task's one error line is the cause after them."""
    text = ("Graph execution error:\n\nDetected at node 'CheckNumerics' defined at (most recent call last):\n"
            '    File "train.py", line 5, in <module>\n      y = check(x)\nNode: \'CheckNumerics\'\n'
            'bad value : Tensor had NaN values\n\t [[{{node CheckNumerics}}]]')
    assert causes.cause_line(text) == 'bad value : Tensor had NaN values'
    remote = 'Graph execution error:\n\nFrom /job:ps/replica:0/task:0:\nWorker session gone\n\t [[{{node x}}]]'
    assert causes.cause_line(remote) == 'Worker session gone'
    assert causes.cause_line('Socket closed\nmore') == 'Socket closed'
    assert causes.cause_line('', '(no message)') == '(no message)'
    assert causes.cause_line('Graph execution error:') == 'Graph execution error:'


DISK_FULL = os.path.join(REPO, 'tests', 'data', 'disk-full')     # see its README
OOM_HINT = ('Hint: If you want to see a list of allocated tensors when OOM happens, add report_tensor_allocations_'
            'upon_oom to RunOptions for current allocation info. This isn\'t available when running in Eager mode.')


def test_a_full_disk_under_a_pss_save_is_the_cause_line_never_the_oom_hint():
    """Issue 37 #2: TensorFlow calls a full disk RESOURCE_EXHAUSTED, as it does memory, and adds its
    out-of-memory hint. The line a task shows names the disk's refusal: from the recorded message
    (two root errors), and from its one-error shape, whose cause follows the last frame directly."""
    recorded = open(os.path.join(DISK_FULL, 'pss-save-message.txt')).read()
    line = causes.cause_line(recorded)
    assert line.endswith('model.ckpt-160_temp/part-00000-of-00002.data-00000-of-00001.tempstate10141648925417585121; '
                         'No space left on device'), line
    second = recorded.index('Detected at node', recorded.index('Detected at node') + 1)
    head = recorded[:second]        # the preamble and one block of frames, as a one-error message has them
    one = head + ('/runs/r/model.ckpt-160_temp/part-00000-of-00001.data-00000-of-00001.tempstate1; No space left on '
                  f'device\n\t [[{{{{node SaveV2}}}}]]\n{OOM_HINT}\n\n0 successful operations.')
    assert causes.cause_line(one).endswith('; No space left on device'), causes.cause_line(one)
    # A train.command's own traceback: the last error line with its cause from the message after it.
    traceback = ['Traceback (most recent call last):', '  File "my_pss.py", line 9, in <module>',
                 'tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:',
                 *one.splitlines()[1:]]
    assert causes.last_error_line(traceback).endswith('; No space left on device')


def test_a_tasks_own_error_of_a_full_disk_names_the_folder():
    from launch.run import disk
    cause = 'No space left on device (ENOSPC)'
    assert disk.refused_space(f'SaveError: {cause}: cannot save checkpoint model.ckpt-150 in /runs/r', '/runs/r') == \
        ('/runs/r', cause)
    tf_words = ('ResourceExhaustedError: /mnt/c/ckpt/model.ckpt-160_temp/part-00000-of-00002.data-00000-of-00001'
                '.tempstate1; No space left on device')
    assert disk.refused_space(tf_words, '/runs/r') == ('/mnt/c/ckpt', cause)
    assert disk.refused_space('OSError: [Errno 122] Disk quota exceeded', '/runs/r') == \
        ('/runs/r', 'Disk quota exceeded (EDQUOT)')
    for other in ('UnavailableError: Socket closed', 'PermissionError: [Errno 13] Permission denied: /x', None):
        assert disk.refused_space(other, '/runs/r') is None


def test_the_supervisor_reads_a_lost_tasks_own_full_disk_once(tmp_path):
    """launch/run/disk.py Refusals, on real logs: the first lost task whose last error is a full
    disk becomes Progress.disk's words; each start of a task is read once."""
    from launch.backends.local import LocalBackend
    from launch.run.disk import Refusals
    train_dir = str(tmp_path)
    chief, worker = _record(train_dir, 'chief:0', 21), _record(train_dir, 'worker:0', 22)
    with open(worker.log, 'w') as f:
        f.write('2026-11-27T23:45:27.474+00:00 E worker:0: UnavailableError: Socket closed\n')
    with open(chief.log, 'w') as f:
        f.write('2026-11-27T23:45:27.474+00:00 I step 140/300  loss 4.398\n2026-11-27T23:45:27.474+00:00 E chief:0: '
                f'SaveError: No space left on device (ENOSPC): cannot save checkpoint model.ckpt-150 in {train_dir}\n')
    refusals, backends = Refusals(), {'local': LocalBackend()}
    assert refusals.hear([worker, chief], backends, train_dir) == ('chief:0', train_dir, 'No space left on device (ENOSPC)')
    assert refusals.full == f'the disk under {train_dir} is full: No space left on device (ENOSPC)'
    assert refusals.hear([worker, chief], backends, train_dir) is None       # said once


def test_the_closing_line_keeps_a_refusal_of_the_disk_however_long_the_path():
    from launch.run.supervised.faults import Verdict
    path = '/runs/r/' + 'deep/' * 30 + 'model.ckpt-160_temp/part-00000-of-00002.data-00000-of-00001.tempstate1'
    verdict = Verdict('chief:0 (pid 9 on localhost) exited with code 1', 1, [], True,
                      error=f'ResourceExhaustedError: (0) RESOURCE_EXHAUSTED: {path}; No space left on device')
    line = str(verdict.failed(lambda: 100))
    assert 'its last error: No space left on device (ENOSPC): ResourceExhaustedError: (0)' in line, line
    assert line.endswith('(see its log); a new `launch up` resumes from the checkpoint at global step 100'), line


# -- checkpoints --------------------------------------------------------------------------------
def _model(tf, floats: int):
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        v1.get_variable('weights', [floats], initializer=v1.ones_initializer())
        v1.train.get_or_create_global_step()
        saver = v1.train.Saver(max_to_keep=5, sharded=True)      # as the trainer's: <ckpt>_temp/ folders
        init = v1.global_variables_initializer()
    sess = v1.Session(graph=graph)
    sess.run(init)
    return sess, saver


def _restores(train_dir: str, step: int) -> None:
    from cluster.runtime import session
    prefix = session.restorable_checkpoint(train_dir)
    assert prefix == os.path.join(train_dir, f'model.ckpt-{step}')
    import tensorflow as tf
    assert np.all(tf.train.load_variable(prefix, 'weights') == 1)


def test_a_full_disk_is_named_at_the_save_and_leaves_no_temp(tf, small_fs):
    from cluster.runtime import session
    train_dir = small_fs('600k')
    sess, saver = _model(tf, 100_000)       # 400 kB a checkpoint: one fits, a second does not
    with sess:
        session.save_checkpoint(saver, sess, train_dir, 1)
        complete = sorted(os.listdir(train_dir))
        errors = []
        for _ in range(2):                  # the same save again (a restart): the same line
            with pytest.raises(session.SaveError) as caught:
                session.save_checkpoint(saver, sess, train_dir, 2)
            errors.append(caught.value.message)
    assert errors == [f'No space left on device (ENOSPC): cannot save checkpoint model.ckpt-2 in {train_dir}'] * 2
    assert '\n' not in errors[0]
    assert sorted(os.listdir(train_dir)) == complete        # no model.ckpt-2_temp, nothing of step 2
    assert not glob.glob(os.path.join(train_dir, '*_temp*'))
    _restores(train_dir, 1)


def test_a_read_only_train_dir_is_named_at_the_save(tf, small_fs):
    from cluster.runtime import session
    train_dir = small_fs('2m')
    sess, saver = _model(tf, 1000)
    with sess:
        session.save_checkpoint(saver, sess, train_dir, 1)
        small_fs.read_only(train_dir)
        with pytest.raises(session.SaveError, match=re.escape(
                f'Read-only file system (EROFS): cannot save checkpoint model.ckpt-2 in {train_dir}')):
            session.save_checkpoint(saver, sess, train_dir, 2)
    _restores(train_dir, 1)


def test_a_train_dir_the_task_may_not_write_is_named_at_the_save(tf, small_fs):
    from cluster.runtime import session
    if os.geteuid() != 0:
        pytest.skip('EACCES is shown as root acting as user nobody (root itself passes every permission)')
    train_dir = small_fs('2m')
    sess, saver = _model(tf, 1000)
    with sess:
        session.save_checkpoint(saver, sess, train_dir, 1)
        os.chmod(train_dir, 0o755)
        with as_nobody(), pytest.raises(session.SaveError, match=re.escape(
                f'Permission denied (EACCES): cannot save checkpoint model.ckpt-2 in {train_dir}')):
            session.save_checkpoint(saver, sess, train_dir, 2)
    _restores(train_dir, 1)


def test_leftovers_of_a_failed_save_go_and_nothing_else(tmp_path):
    from cluster.runtime import session
    d = str(tmp_path)
    index = 'model_checkpoint_path: "model.ckpt-5"\nall_model_checkpoint_paths: "model.ckpt-5"\n'
    (tmp_path / 'checkpoint').write_text(index)
    old = ['model.ckpt-5.index', 'model.ckpt-5.data-00000-of-00001', 'model.ckpt-5.meta', 'model.ckpt-9_temp']
    for name in old:
        (tmp_path / name).write_text('old')
    before = set(os.listdir(d))
    (tmp_path / 'model.ckpt-10_temp').mkdir()
    (tmp_path / 'model.ckpt-10_temp' / 'part-00000-of-00002.data-00000-of-00001').write_text('half')
    (tmp_path / 'model.ckpt-10.index').write_text('merged, never recorded')
    (tmp_path / 'checkpoint.tmp0123abcd').write_text('model_checkpoint_path: "model.ck')
    (tmp_path / 'model.ckpt-100_temp').mkdir()          # another step's: not this save's
    removed = session.remove_save_leftovers(d, 'model.ckpt-10', before)
    assert sorted(os.path.basename(p) for p in removed) == ['checkpoint.tmp0123abcd', 'model.ckpt-10.index',
                                                          'model.ckpt-10_temp']
    assert sorted(os.listdir(d)) == sorted(old + ['checkpoint', 'model.ckpt-100_temp'])
    assert (tmp_path / 'checkpoint').read_text() == index

    # Recorded in the index before the save failed (writing its .meta): its data stays, the cut .meta goes.
    before = set(os.listdir(d))
    (tmp_path / 'checkpoint').write_text(index.replace('ckpt-5', 'ckpt-11'))
    for name in ('model.ckpt-11.index', 'model.ckpt-11.data-00000-of-00001', 'model.ckpt-11.meta'):
        (tmp_path / name).write_text('new')
    assert [os.path.basename(p) for p in session.remove_save_leftovers(d, 'model.ckpt-11', before)] == \
        ['model.ckpt-11.meta']
    assert os.path.exists(tmp_path / 'model.ckpt-11.index')

    # A chief starting: any save's leftovers go (no save is under way), the checkpoints stay.
    removed = session.remove_save_leftovers(d)
    assert sorted(os.path.basename(p) for p in removed) == ['model.ckpt-100_temp', 'model.ckpt-9_temp']
    assert os.path.exists(tmp_path / 'model.ckpt-5.meta') and os.path.exists(tmp_path / 'model.ckpt-11.index')


# -- synthetic data -----------------------------------------------------------------------------
def _spec(tmp_path, train_dir: str):
    from cluster.spec import load_spec
    return load_spec(write_spec(tmp_path, train_dir=train_dir))


def test_synthetic_data_on_a_too_small_disk_names_the_file_and_leaves_no_temp(small_fs, tmp_path):
    train_dir = small_fs('4m')        # the set is 6 files of 3 MB
    spec = _spec(tmp_path, train_dir)
    with pytest.raises(ValueError) as caught:
        data.resolve_spec_data(spec)
    message = str(caught.value)
    found = re.search(r'train\.train_dir: cannot write (\S+): No space left on device \(ENOSPC\)$', message)
    assert found, message
    assert os.path.dirname(found.group(1)) == os.path.join(train_dir, data.SYNTHETIC_SUBDIR)
    assert os.path.basename(found.group(1)) in data.TRAIN_FILES
    assert not [n for n in os.listdir(os.path.join(train_dir, data.SYNTHETIC_SUBDIR)) if n.endswith('.tmp')]


def test_synthetic_data_on_a_read_only_disk_names_the_folder(small_fs, tmp_path):
    train_dir = small_fs('1m')
    small_fs.read_only(train_dir)
    expected = f'train.train_dir: cannot write {train_dir}/{data.SYNTHETIC_SUBDIR}: Read-only file system (EROFS)'
    with pytest.raises(ValueError, match=re.escape(expected)):
        data.resolve_spec_data(_spec(tmp_path, train_dir))


# -- summaries ----------------------------------------------------------------------------------
def test_summaries_on_a_full_disk_are_one_warning_and_training_goes_on(tf, small_fs, caplog):
    from cluster.training import summaries
    logdir = small_fs('128k')
    writer = summaries.writer(logdir)
    with caplog.at_level(logging.WARNING, logger='cluster.training.summaries'):
        for step in range(12):
            writer.add_summary(summaries.text('restarts', 'x' * 30000), step)
            writer.flush()
        writer.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [f'TensorBoard summaries in {logdir} are off: No space left on device (ENOSPC); '
                        'training goes on without them'], warnings


def test_summaries_on_a_read_only_disk_are_one_warning(tf, small_fs, caplog):
    from cluster.training import summaries
    train_dir = small_fs('1m')
    os.mkdir(os.path.join(train_dir, 'eval'))
    small_fs.read_only(train_dir)
    with caplog.at_level(logging.WARNING, logger='cluster.training.summaries'):
        summaries.write_precision(train_dir, 0.5, 300)      # the folder exists, its file cannot be made
        w = summaries.writer(rundir.worker_summary_dir(train_dir, 1))     # the folder cannot be made
        w.add_summary(summaries.scalar(summaries.WORKER_STEPS, 3), 3)
        w.close()
    assert [r.getMessage() for r in caplog.records] == [
        f'TensorBoard summaries in {path} are off: Read-only file system (EROFS); training goes on without them'
        for path in (rundir.eval_summary_dir(train_dir), rundir.worker_summary_dir(train_dir, 1))]


# -- the launcher's files -----------------------------------------------------------------------
def test_the_event_log_on_a_full_disk_warns_once_and_keeps_whole_lines(small_fs, caplog):
    from launch.records.events import EventLog, read_events
    train_dir = small_fs('64k')
    events = EventLog(rundir.events_path(train_dir), 'run-1', 1)
    events.emit(Progress(step=1, total=9, loss=2.0, images_per_sec=None))
    fill(train_dir)
    with caplog.at_level(logging.WARNING, logger='launch.records.events'):
        for step in range(2, 40):
            events.emit(Progress(step=step, total=9, loss=2.0, images_per_sec=None, extra={'pad': 'x' * 300}))
        os.remove(os.path.join(train_dir, 'ballast'))
        events.emit(OtherEvent(event='finished', extra={'result': {}}))
    lines = open(rundir.events_path(train_dir)).read().splitlines()
    assert all(json.loads(line) for line in lines)          # whole lines only, none glued to the next
    written = read_events(rundir.events_path(train_dir))
    assert written[0]['step'] == 1 and written[-1]['event'] == 'finished'
    lost = 38 - (len(written) - 2)
    assert [r.getMessage() for r in caplog.records] == [
        f'cannot write {events.path}: No space left on device (ENOSPC); the events of the run are lost until it can',
        f'{events.path}: written again; {lost} event(s) were lost']


def test_a_file_of_the_run_the_disk_refuses_leaves_the_old_one_and_no_tmp(small_fs):
    train_dir = small_fs('64k')
    path = rundir.run_path(train_dir)
    rundir.write_atomically(path, '{"state": "done"}\n')
    fill(train_dir)
    with pytest.raises(OSError) as caught:
        rundir.write_atomically(path, 'x' * 200_000)
    assert caught.value.errno == errno.ENOSPC
    assert sorted(os.listdir(train_dir)) == ['ballast', 'run.json']
    assert open(path).read() == '{"state": "done"}\n'


def test_a_full_file_system_is_named_by_statvfs(small_fs):
    roomy, few = small_fs('1m'), small_fs('1m', name='few', inodes=3)
    assert rundir.no_room(roomy) is None
    fill(roomy)
    assert rundir.no_room(roomy) == 'No space left on device (ENOSPC)'
    _free(roomy)
    assert rundir.no_room(roomy) is None
    assert rundir.no_room(few) is None
    for name in ('a', 'b', 'c'):        # the root folder holds one inode: blocks left, no file can be made
        with contextlib.suppress(OSError):
            open(os.path.join(few, name), 'w').close()
    assert rundir.no_room(few) == 'No space left on device (ENOSPC)'
    assert rundir.no_room(os.path.join(roomy, 'gone')) is None       # cannot be asked: no verdict


def _task_log(train_dir: str, name: str = 'worker-0') -> str:
    path = os.path.join(train_dir, 'logs', 'attempt-1', f'{name}.log')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


@pytest.mark.parametrize('masked', [False, True], ids=['plain', 'masked'])
def test_a_pulse_beats_on_a_full_disk_and_says_the_log_is_refused(small_fs, masked):
    """... also through the stream that masks a task's hidden values (cluster/runtime/masking.py)."""
    from cluster.runtime import pulse
    from cluster.runtime.masking import Masker, MaskedStream
    train_dir = small_fs('256k')
    log_path = _task_log(train_dir)
    beats = pulse.Pulse()
    assert beats.open(pulse.beside(log_path))
    assert pulse.beside(log_path) == log_path[:-len('.log')] + '.pulse'
    logger = logging.getLogger('tests.pulse')
    logger.propagate = False
    with open(log_path, 'a', buffering=1) as stream:
        handler = pulse.LogHandler(MaskedStream(stream, Masker(['s3cret-value'])) if masked else stream, beats)
        logger.addHandler(handler)
        try:
            beats.beat(3, 10)
            logger.warning('step 3/10 with s3cret-value')
            fill(train_dir)
            logger.warning('step 4/10 ' + 'x' * 8000)      # more than any page the log still has
            beats.beat(4, 10)
            refused = f'cannot write {log_path}: No space left on device (ENOSPC)'
            assert pulse.parse(open(pulse.beside(log_path)).read()) == pulse.Beat(4, 10, refused)
            late = pulse.Pulse()        # a task that starts on the full disk: no pulse, no error
            assert not late.open(os.path.join(train_dir, 'logs', 'attempt-1', 'worker-1.pulse'))
            late.beat(1, 10)
            _free(train_dir)
            logger.warning('step 5/10')
        finally:
            logger.removeHandler(handler)
    assert pulse.parse(open(pulse.beside(log_path)).read()) == pulse.Beat(4, 10, None)   # heard again
    assert os.path.getsize(pulse.beside(log_path)) == pulse.PULSE_BYTES
    assert 'step 5/10' in open(log_path).read()
    assert ('step 3/10 with ***' if masked else 'step 3/10 with s3cret-value') in open(log_path).read()
    assert pulse.parse('{"step": tru') is None and pulse.parse(None) is None and pulse.parse('[1]') is None


def test_the_event_log_keeps_room_for_the_events_of_a_full_disk(small_fs):
    from launch.records.event_types import DiskFull
    from launch.records.events import RESERVE_BYTES, EventLog, read_events
    train_dir = small_fs('1m')
    events = EventLog(rundir.events_path(train_dir), 'run-1', 1)
    events.emit(FirstStep(step=1))
    fill(train_dir)
    events.emit(DiskFull(path=train_dir, cause='No space left on device (ENOSPC)'))
    for step in range(2, 22):
        events.emit(Progress(step=step, total=99, loss=2.0, images_per_sec=None))
    assert events.refused is None
    written = read_events(rundir.events_path(train_dir))
    assert [e['event'] for e in written] == ['first_step', 'disk_full'] + ['progress'] * 20
    assert written[1]['path'] == train_dir and written[1]['cause'] == 'No space left on device (ENOSPC)'
    for _ in range(RESERVE_BYTES // 100):       # the reserve spent: refused, whole lines kept
        events.emit(Progress(step=1, total=99, loss=2.0, images_per_sec=None, extra={'pad': 'x' * 100}))
    assert events.refused == 'No space left on device (ENOSPC)'
    assert all(json.loads(line) for line in open(rundir.events_path(train_dir)).read().splitlines())


def test_the_launchers_watch_names_a_full_disk_once_and_its_room_again(small_fs):
    from launch.records.events import EventLog, read_events
    from launch.run.disk import DiskWatch
    train_dir = small_fs('1m')
    events = EventLog(rundir.events_path(train_dir), 'run-1', 1)
    events.emit(FirstStep(step=1))
    said: list[str] = []
    watch = DiskWatch(train_dir, said.append, events.emit, events)
    assert watch.check() is None and said == []
    fill(train_dir)
    assert watch.check() == watch.check() == 'No space left on device (ENOSPC)'
    _free(train_dir)
    assert watch.check() is None
    assert said == [f'warning: the disk under {train_dir} is full: No space left on device (ENOSPC); no log, '
                    'checkpoint or record of the run can be written there, and the next checkpoint fails: free '
                    'space there', f'the disk under {train_dir} has room again']
    told = [(e['event'], e['path'], e.get('cause')) for e in read_events(events.path)[1:]]
    assert told == [('disk_full', train_dir, 'No space left on device (ENOSPC)'), ('disk_free', train_dir, None)]


def _record(train_dir: str, name: str, pid: int):
    from launch.backends.base import TaskRecord
    job, index = name.split(':')
    return TaskRecord(name=name, job=job, index=int(index), host='localhost', port=1, backend='local', pid=pid,
                      log=_task_log(train_dir, f'{job}-{index}'), cwd=train_dir)


def test_the_supervisor_hears_steps_from_the_pulses_and_sees_the_full_disk(small_fs):
    """What Attempt.observe does once a second (feel): the first beat of a start is where it
    stands (maybe an earlier start's), a later one with another step is progress; a full disk
    under the tasks' logs becomes the policy's Progress.disk."""
    from cluster.runtime import pulse
    from launch.backends.local import LocalBackend
    from launch.run.supervised.attempt import Attempt
    train_dir = small_fs('1m')
    records = [_record(train_dir, 'ps:0', 11), _record(train_dir, 'worker:0', 12), _record(train_dir, 'worker:1', 13)]
    backends = {'local': LocalBackend()}
    chief = pulse.Pulse()
    assert chief.open(pulse.beside(records[1].log))
    chief.beat(40, 100)             # left by an earlier start, or this one's: not a step heard
    attempt, said = Attempt(), []
    attempt.step_at -= 5            # the logs quiet for 5s
    attempt.feel(records, backends, said.append)
    assert attempt.step is None and attempt.progress(100).disk is None
    chief.beat(41, 100)
    attempt.feel(records, backends, said.append)
    assert attempt.step == 41 and attempt.progress(100).quiet_secs < 1
    fill(train_dir)
    chief.beat(42, 100)
    attempt.step_at -= 5
    attempt.feel(records, backends, said.append)
    full = f'the disk under {train_dir} is full: No space left on device (ENOSPC)'
    assert attempt.step == 42 and attempt.progress(100).disk == full
    assert said == []               # the launcher's own watch names a disk it sees (DiskWatch)
    _free(train_dir)
    chief.refuse(f'cannot write {records[1].log}: No space left on device (ENOSPC)')    # as on another host
    attempt.step_at -= 5
    attempt.feel(records, backends, said.append)
    assert attempt.progress(100).disk == f'worker:0 cannot write {records[1].log}: No space left on device (ENOSPC)'
    assert said == [f'warning: worker:0 cannot write {records[1].log}: No space left on device (ENOSPC); its steps '
                    'are read from its pulse file meanwhile (a checkpoint fails while the disk is full: free space '
                    'there)']
    # A step heard in the pulse makes the logs look loud again: the refusal holds until a pulse clears it.
    chief.beat(43, 100)
    attempt.pulses._at = 0
    attempt.feel(records, backends, said.append)
    assert attempt.step == 43 and attempt.progress(100).quiet_secs < 1
    attempt.pulses._at = 0          # the next reading, a second later: the logs look loud
    attempt.feel(records, backends, said.append)
    assert attempt.progress(100).disk.startswith('worker:0 cannot write')
    chief.refuse(None)
    attempt.pulses._at = 0
    attempt.feel(records, backends, said.append)
    assert attempt.progress(100).disk is None


FULL = 'the disk under /runs/r is full: No space left on device (ENOSPC)'


def _policy(**kw):
    from launch.run.policy import Policy
    return Policy(**{'sync': True, 'num_workers': 2, 'replicas_to_aggregate': 2, 'stall_secs': 10, **kw})


def _tasks(lost: str | None = None, code: int = 1):
    from launch.run.policy import TaskState, TaskStatus
    return [TaskStatus(name, name.split(':')[0], int(name[-1]), TaskState.FAILED if name == lost else TaskState.RUNNING,
                       exit_code=code if name == lost else None) for name in ('ps:0', 'worker:0', 'worker:1')]


def test_a_stall_on_a_full_disk_is_the_disks_and_ends_the_run():
    from launch.run.policy import Action, Progress, decide
    stalled = Progress(40, 100, 12.0, 20, disk=FULL)
    d = decide(_policy(restart='on-failure'), _tasks(), set(), 0, stalled)
    assert (d.action, d.stalled, d.disk) == (Action.GIVE_UP, True, FULL)
    assert d.note.startswith('no restart while the disk is full')
    d = decide(_policy(), _tasks(), set(), 0, stalled)       # restart: never
    assert (d.action, d.disk, d.note) == (Action.GIVE_UP, FULL, '')
    # A run that goes on (the pulses show steps) goes on; a disk with room changes nothing.
    assert decide(_policy(), _tasks(), set(), 0, Progress(40, 100, 2.0, 20, disk=FULL)).action is Action.CONTINUE
    assert decide(_policy(restart='on-failure'), _tasks(), set(), 0, Progress(40, 100, 12.0)).action is Action.RESTART


def test_a_fault_on_a_full_disk_names_it_first_and_restarts_no_cluster():
    from launch.run.supervised import faults
    from launch.run.policy import Action, Progress, decide
    on_failure = _policy(restart='on-failure')
    d = decide(on_failure, _tasks('worker:0'), set(), 0, Progress(40, 100, 1.0, 20, disk=FULL))
    assert (d.action, d.disk) == (Action.GIVE_UP, FULL) and 'no restart while the disk is full' in d.note
    assert faults.cause(d, [], {}) == (f'{FULL}; worker:0 exited with code 1', False)
    d = decide(_policy(restart='on-failure', sync=False), _tasks('worker:1'), set(), 0,
               Progress(40, 100, 1.0, 20, disk=FULL))
    assert (d.action, d.disk) == (Action.RESTART_TASKS, FULL)       # a worker rejoins: nothing to save


def test_the_words_of_a_stall_blame_the_training_only_when_the_disk_has_room():
    from launch.run.supervised.faults import StallView, first, stall_words
    answering = StallView([], [], ['ps:0', 'worker:0'], None)
    assert stall_words(answering).endswith('the cause is inside the training (a lost gradient, a deadlock)')
    answering.disk = FULL
    words = first(answering.disk, stall_words(answering))
    assert words.startswith(FULL + '; ') and 'deadlock' not in words and 'inside the training' not in words
    stopped = StallView(['worker:1 is stopped (SIGSTOP) and does not answer on h:1'], ['worker:1'], ['worker:0'], FULL)
    assert stall_words(stopped) == 'worker:1 is stopped (SIGSTOP) and does not answer on h:1; worker:0 answers ' \
                                   'and waits for it'
