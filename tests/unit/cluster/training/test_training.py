"""Proofs that the distributed training computes what it claims, on real clusters."""
from __future__ import annotations

import re

import pytest

from cluster.runtime import causes, rundir
from tests.harness.training import summaries_in


# -- in-process: what a task writes for TensorBoard and its log lines --------------------------
@pytest.fixture(scope='module')
def tf():
    """TensorFlow's import runs `uname -p` once (platform.processor): imported here, before a fast
    test's watch for started processes begins, as tests/unit/cluster/training/test_data.py does at its own import."""
    import tensorflow
    return tensorflow


def test_scalar_and_text_summaries_are_protos_tensorboard_reads(tf):
    from cluster.training import summaries
    value, = summaries.scalar('images_per_sec', 412).value
    assert (value.tag, value.simple_value) == ('images_per_sec', 412.0)
    value, = summaries.text('restarts', 'restart 1/3: ps:0 was killed by SIGKILL').value
    assert value.tag == 'restarts' and value.metadata.plugin_data.plugin_name == 'text'
    assert tf.make_ndarray(value.tensor).item() == b'restart 1/3: ps:0 was killed by SIGKILL'


def test_a_restarted_chief_writes_the_cause_as_text_at_the_restored_step(tf, tmp_path):
    from cluster.training import summaries
    cause = 'restart 1/3: ps:0 was killed by SIGKILL'
    writer = summaries.writer(str(tmp_path))
    try:
        assert summaries.note_restart(writer, 120, {rundir.RESTART_ENV: cause}) == cause
        assert summaries.note_restart(writer, 130, {}) is None          # a first start: nothing
        assert summaries.note_restart(writer, 130, {rundir.RESTART_ENV: ''}) is None
    finally:
        writer.close()
    assert summaries_in(str(tmp_path)) == {'restarts': [(120, cause)]}


def test_the_restart_cause_comes_from_the_environment(tf, monkeypatch):
    from cluster.training import summaries
    monkeypatch.setenv(rundir.RESTART_ENV, 'restart 2/3: worker:1 exited with code 1')
    assert summaries.restart_cause() == 'restart 2/3: worker:1 exited with code 1'
    monkeypatch.delenv(rundir.RESTART_ENV)
    assert summaries.restart_cause() is None


def test_eval_precision_goes_under_eval_at_the_checkpoint_step(tf, tmp_path):
    from cluster.training import summaries
    summaries.write_precision(str(tmp_path), 0.9375, 300)
    summaries.write_precision(str(tmp_path), 0.95, 400)      # a later checkpoint: a new point, none lost
    evals = summaries_in(rundir.eval_summary_dir(str(tmp_path)))
    assert evals == {'precision_at_1': [(300, 0.9375), (400, pytest.approx(0.95))]}


ISO_LINE = re.compile(r'^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d) ([IE]) (.*)$')


def test_a_task_line_carries_the_full_time_with_its_utc_offset():
    import datetime
    import logging
    formatter = rundir.TaskLogFormatter()
    record = logging.LogRecord('cluster.task', logging.INFO, __file__, 1, '%s', (rundir.progress_line(57, 200, 3.1),),
                               None)
    line = formatter.format(record)
    m = ISO_LINE.match(line)
    assert m and m.group(2, 3) == ('I', 'step 57/200  loss 3.100'), line
    written = datetime.datetime.fromisoformat(m.group(1))
    assert abs(written.timestamp() - record.created) < 0.001 and written.utcoffset() is not None
    assert rundir.step_of(line) == (57, 200) and rundir.logged_time(line) == m.group(1)
    error = formatter.format(logging.LogRecord('cluster.task', logging.ERROR, __file__, 1,
                                               'worker:1: UnavailableError: Socket closed', (), None))
    assert causes.last_error_line([error, line]) == 'worker:1: UnavailableError: Socket closed'
    assert rundir.logged_time('E1122 12:00:02.100 123 grpc.cc:1] chatter') is None
    assert rundir.logged_time('Traceback (most recent call last):') is None


def test_an_aborted_step_is_tried_again_a_few_times_then_fails(tf, caplog):
    """TensorFlow's AbortedError means "a conflict: retry" (MonitoredSession retries it too): a
    step that raises it runs again, with one warning line naming the cause; a step that keeps
    raising it fails the task on the fourth."""
    from cluster.training import train
    aborted = tf.errors.AbortedError(None, None, 'Graph execution error:\n\nFrom /job:ps/replica:0/task:0:\n'
                                     'Step 7 cancelled\n\t [[{{node x}}]]')
    calls = []

    def flaky(failures):
        def run():
            calls.append(1)
            if len(calls) <= failures:
                raise aborted
            return 'out'
        return run
    with caplog.at_level('WARNING'):
        assert train.run_retrying(flaky(2), 'the step after global step 5') == 'out'
    assert len(calls) == 3
    assert [r.getMessage() for r in caplog.records] == [
        f'the step after global step 5 was aborted (Step 7 cancelled); trying it again ({n} of 3)' for n in (1, 2)]
    calls.clear()
    with pytest.raises(tf.errors.AbortedError):
        train.run_retrying(flaky(10), 'a step')
    assert len(calls) == 4

