"""A real `train.program` that installs its own SIGTERM handler (tests/harness/sigterm_program.py) on a
local TF1 cluster with `max_restarts: 0` (plan C.3.1): `launch preempt` to its chief is still a notice
(the chief saves at once and goes "preempted", the cluster resumes from that checkpoint and ends done,
no fault counted), and the program's handler is called too; the launcher's marked stops of the other
tasks (the restart's teardown, the run's end) still end them, with no notice said."""
from __future__ import annotations

import glob
import json
import os

import pytest

from cluster.runtime import rundir
from tests.conftest import launch, launch_bg, write_spec
from tests.harness.faults import finish, until_step
from tests.harness.sigterm_program import noted_path

pytestmark = pytest.mark.slow     # a real local cluster

NOTICE = 'preemption notice (SIGTERM from outside the launcher)'


def test_a_programs_own_sigterm_handler_is_called_and_the_notice_still_works(tmp_path):
    spec = write_spec(tmp_path, program='tests.harness.sigterm_program:train', sync=False, steps=1200,
                      batch_size=32, learning_rate=0.1, checkpoint_secs=600,
                      supervise={'restart': 'on-failure', 'max_restarts': 0, 'backoff_secs': 5})
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    try:
        lines = until_step(proc, 20)
        sent = launch('preempt', run, 'worker:0')
    finally:
        out = finish(proc, 300)
    out = ''.join(lines) + out
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert proc.returncode == 0, out
    with open(os.path.join(run, 'run.json')) as f:
        result = json.load(f)
    assert (result['state'], result['restarts'], result['failures'], result.get('preemptions')) == \
        ('done', 0, [], 1), result
    chief = rundir.read_text(rundir.attempt_log_path(run, 1, 'worker', 0)) or ''
    assert f'worker:0: {NOTICE}' in chief and 'preemption notice received: saved a checkpoint at global step' in chief, chief
    assert 'user handler: signal 15' in chief, chief
    assert rundir.read_text(noted_path(run, 'worker', 0)) == '15\n'
    # The other tasks were stopped by the launcher (marked): no notice in any log but the chief's first.
    logs = {p: rundir.read_text(p) or '' for p in glob.glob(os.path.join(run, 'logs', 'attempt-*', '*.log'))}
    noticed = sorted(os.path.relpath(p, run) for p, text in logs.items() if NOTICE in text)
    assert noticed == [os.path.relpath(rundir.attempt_log_path(run, 1, 'worker', 0), run)], noticed
    recovered = [json.loads(line) for line in open(os.path.join(run, 'events.jsonl'))
                 if '"recovered"' in line]
    assert recovered and recovered[0].get('preempted') is True and 'save' in recovered[0]['phases'], recovered
    print('recovered:', recovered[0])
