"""Preemption on real local clusters (#41): with `max_restarts: 0`, a preemption notice to the TF1
chief (`launch preempt`) mid-run, and in another run a plain SIGTERM to the ps of a PSS run, end
exit 0 at the last step, with `preempted` events, no fault counted (run.json: restarts 0, no
failures, preemptions 1), and no more steps redone than since the notice. SIGTERM to the launcher
itself still stops the run (tests/system/cluster/test_preemption_notice.py: the marked stop)."""
from __future__ import annotations

import json
import os
import signal

import pytest

from tests.conftest import launch, launch_bg, write_coordinator_spec, write_spec
from tests.harness.faults import finish, task_pid, until_step

pytestmark = pytest.mark.slow     # real local clusters

NO_RESTARTS = {'restart': 'on-failure', 'max_restarts': 0, 'backoff_secs': 5}


def events(run: str) -> list[dict]:
    with open(os.path.join(run, 'events.jsonl')) as f:
        return [json.loads(line) for line in f]


def run_json(run: str) -> dict:
    with open(os.path.join(run, 'run.json')) as f:
        return json.load(f)


def check_preempted(run: str, task: str, out: str) -> list[dict]:
    """The run ended done at its last step with the one preemption and no fault; its events."""
    log = events(run)
    notices = [e for e in log if e['event'] == 'preempted']
    assert [e['task'] for e in notices] == [task], log
    assert not [e for e in log if e['event'] == 'task_lost'], log
    result = run_json(run)
    assert (result['state'], result['restarts'], result['failures'], result.get('preemptions')) == \
        ('done', 0, [], 1), result
    assert f'{task} got a preemption notice' in out and 'not counted against supervise.max_restarts' in out, out
    redone = [r['steps_redone'] for e in log if e['event'] == 'recovered' for r in [e]]
    assert redone and all(n <= notices[0]['step'] - (notices[0]['checkpoint'] or 0) for n in redone), (redone, notices)
    return log


def test_a_tf1_chief_preempted_with_no_restarts_left_resumes_and_ends_done(tmp_path):
    spec = write_spec(tmp_path, steps=400, checkpoint_secs=600, supervise=NO_RESTARTS)
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    try:
        lines = until_step(proc, 20)
        sent = launch('preempt', run, 'worker:0')
    finally:
        out = finish(proc, 240)
    out = ''.join(lines) + out
    assert sent.returncode == 0 and 'sent a preemption notice to worker:0' in sent.stdout, sent.stdout + sent.stderr
    assert proc.returncode == 0, out
    log = check_preempted(run, 'worker:0', out)
    assert [e.get('tasks') for e in log if e['event'] == 'restart'] == [None], log     # the whole cluster, once
    assert 'after a preemption: resuming from the checkpoint at global step' in out, out


def test_a_pss_ps_preempted_by_a_plain_sigterm_has_the_chief_save_and_ends_done(tmp_path):
    spec = write_coordinator_spec(tmp_path, evaluator=None, steps=300, checkpoint_steps=1000, supervise=NO_RESTARTS,
                                  top={'env': {'TFCLUSTER_TEST_STEP_SECS': 0.25}})
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    try:
        lines = until_step(proc, 60)
        os.kill(task_pid(run, 'ps:0'), signal.SIGTERM)      # any SIGTERM from outside is a notice
    finally:
        out = finish(proc, 240)
    out = ''.join(lines) + out
    assert proc.returncode == 0, out
    log = check_preempted(run, 'ps:0', out)
    notice = next(i for i, e in enumerate(log) if e['event'] == 'preempted')
    assert any(e['event'] == 'checkpoint' for e in log[notice:]), log      # the chief saved after the notice
