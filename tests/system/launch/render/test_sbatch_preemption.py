"""The batch script's preemption trap run for real (#41): with stand-ins for srun, scancel and
scontrol, a SIGTERM to the script is passed on to the step, marked, and the job requeued; the
launcher's stop mark (stops/all) keeps it from both; a job cancelled meanwhile is not requeued;
and without a signal the script exits with the step's code. Then on a real single-node Slurm
(tests/harness/slurm.py): `scancel --signal=TERM --batch JOB` mid-run requeues the job, whose
second run is the next attempt (SLURM_RESTART_COUNT) and completes, the first attempt's logs kept."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from cluster.runtime.contract import EXIT_PREEMPTED
from launch.render import sbatch
from launch.render.options import RenderOptions
from tests.harness.render_roles import pss_spec
from cluster.spec import load_spec
from tests.conftest import REPO

LOCAL2 = os.path.join(REPO, 'specs', 'local2.yaml')
TASK = re.compile(r'    \S+ -m cluster\.task --spec "\$train_dir/spec\.yaml" --slurm --port-base 8888')
# Stand-ins: srun records its pid and runs until a SIGTERM (the step's tasks, exiting "preempted")
# or FAKE_EXIT is given; scancel --signal=TERM signals it; scontrol answers FAKE_STATE and logs.
FAKES = {
    'srun': f'''#!/bin/bash
echo "srun" >>"$FAKE_DIR/calls"
trap 'echo "step TERM" >>"$FAKE_DIR/calls"; exit {EXIT_PREEMPTED}' TERM
echo $$ >"$FAKE_DIR/srun.pid.new" && mv "$FAKE_DIR/srun.pid.new" "$FAKE_DIR/srun.pid"
if [ -n "${{FAKE_EXIT-}}" ]; then exit "$FAKE_EXIT"; fi
while :; do sleep 30 & wait $!; done
''',
    'scancel': '''#!/bin/bash
echo "scancel $*" >>"$FAKE_DIR/calls"
if [ "$1" = --signal=TERM ]; then kill -TERM "$(cat "$FAKE_DIR/srun.pid")"; fi
''',
    'scontrol': '''#!/bin/bash
echo "scontrol $*" >>"$FAKE_DIR/calls"
if [ "$1" = show ]; then echo "JobId=$3 JobName=x"; echo "   JobState=${FAKE_STATE:-RUNNING} Reason=None"; fi
''',
}


def fake_slurm(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {'PATH': f'{bin_dir}:/usr/bin:/bin', 'FAKE_DIR': str(tmp_path), 'SLURM_JOB_ID': '42',
            'SLURM_JOB_NODELIST': 'node1', 'HOME': str(tmp_path)}


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f'{path} never appeared'
        time.sleep(0.05)


def run_script(tmp_path: Path, spec, term: bool, stop_mark: bool = False, **env: str) -> tuple[int, str]:
    """Run the rendered script with the stand-ins; `term`: SIGTERM it once the step runs."""
    path = tmp_path / 'job.sh'
    path.write_text(sbatch.render(spec, RenderOptions(), attempt=1))
    train_dir = Path(spec.train.train_dir)
    if stop_mark:
        (train_dir / 'stops').mkdir(parents=True)
        (train_dir / 'stops' / 'all').write_text('')
    proc = subprocess.Popen(['bash', str(path)], env={**fake_slurm(tmp_path), **env}, stdin=subprocess.DEVNULL)
    try:
        if term:
            wait_for(tmp_path / 'srun.pid')
            proc.send_signal(signal.SIGTERM)
            if stop_mark:       # the launcher signals the tasks itself (job.py _cancel)
                os.kill(int((tmp_path / 'srun.pid').read_text()), signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    calls = (tmp_path / 'calls').read_text() if (tmp_path / 'calls').exists() else ''
    return code, calls


def local2(tmp_path: Path, *overrides: str):
    return load_spec(LOCAL2, [f'train.train_dir={tmp_path / "run"}', 'supervise.restart=on-failure', *overrides])


@pytest.mark.slow
@pytest.mark.parametrize('coordinator', [False, True], ids=['tf1', 'coordinator'])
def test_a_sigterm_to_the_script_is_a_notice_to_the_step_and_a_requeue(tmp_path, coordinator):
    spec = pss_spec(tmp_path, overrides=[f'train.train_dir={tmp_path / "run"}', 'supervise.restart=on-failure']) \
        if coordinator else local2(tmp_path)
    code, calls = run_script(tmp_path, spec, term=True)
    assert code == 0, calls
    assert calls.splitlines() == ['srun', 'scancel --signal=TERM 42', 'step TERM', 'scontrol show job 42',
                                  'scontrol requeue 42']
    out = (tmp_path / 'run' / 'logs' / 'slurm-42.out').read_text()
    assert 'a preemption notice to every task, then a requeue' in out and 'job 42 requeued' in out
    assert not list((tmp_path / 'run').glob('preempted.*'))


@pytest.mark.slow
def test_the_launchers_stop_mark_is_no_notice(tmp_path):
    code, calls = run_script(tmp_path, local2(tmp_path), term=True, stop_mark=True)
    assert code == EXIT_PREEMPTED and 'scancel' not in calls and 'requeue' not in calls, calls


@pytest.mark.slow
def test_a_job_cancelled_meanwhile_is_not_requeued(tmp_path):
    code, calls = run_script(tmp_path, local2(tmp_path), term=True, FAKE_STATE='CANCELLED')
    assert 'scontrol requeue' not in calls and code == EXIT_PREEMPTED, calls
    out = (tmp_path / 'run' / 'logs' / 'slurm-42.out').read_text()
    assert 'was not requeued' in out


@pytest.mark.slow
def test_without_a_signal_the_script_exits_with_the_step(tmp_path):
    code, calls = run_script(tmp_path, local2(tmp_path), term=False, FAKE_EXIT='7')
    assert (code, calls) == (7, 'srun\n')


# -- a real Slurm -----------------------------------------------------------------------------------------

def job_fields(slurm_cluster, job: str) -> str:
    return slurm_cluster.run('scontrol', 'show', 'job', job).stdout


def stir_when_eligible(slurm_cluster, job: str, timeout: float = 90) -> None:
    """Once the requeued `job` pends past its EligibleTime (cred_expire after the requeue), have
    the scheduler look at it: sched/builtin looks at a queue no event stirs only every
    sched_interval (60 s), and a job update that succeeds (a comment here) makes it look at once.
    Nothing to do if the job has started meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        fields = job_fields(slurm_cluster, job)
        if not re.search(r'JobState=(PENDING|COMPLETING|REQUEUED)', fields):
            return
        eligible = re.search(r'EligibleTime=(\d{4}-\d\d-\d\dT[\d:]+)', fields)
        if 'JobState=PENDING' in fields and eligible and \
                datetime.now() > datetime.fromisoformat(eligible.group(1)) + timedelta(seconds=1):
            updated = slurm_cluster.run('scontrol', 'update', f'JobId={job}', 'Comment=eligible')
            assert updated.returncode == 0, updated.stderr
            return
        assert time.monotonic() < deadline, fields
        time.sleep(0.2)


@pytest.mark.slow
def test_scancel_batch_requeues_the_job_and_the_next_attempt_completes(tmp_path, slurm_cluster, monkeypatch):
    """Each rank stands in for a task: the first run waits for its notice and exits "preempted"
    (the ps ignores it, as the wrapper makes it, and goes at KillWait), the requeued run exits 0."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / 'run'
    spec = local2(tmp_path)
    stand_in = ('sh -c \'echo "start ${SLURM_RESTART_COUNT:-0}"; [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0; '
                f'trap "echo notice; exit {EXIT_PREEMPTED}" TERM; while :; do sleep 30 & wait $!; done\'')
    script = TASK.sub('    ' + stand_in.replace('\\', r'\\'), sbatch.render(spec, RenderOptions(), attempt=1))
    assert stand_in in script and '#SBATCH --requeue' in script
    (tmp_path / 'job.sh').write_text(script)
    job = slurm_cluster.run('sbatch', '--parsable', str(tmp_path / 'job.sh')).stdout.strip()
    assert job.isdigit(), job
    first = run / 'logs' / 'attempt-1' / 'worker-0.log'
    wait_for(first, 60)
    deadline = time.monotonic() + 30
    while 'start 0' not in first.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    slurm_cluster.run('scancel', '--signal=TERM', '--batch', job)
    deadline = time.monotonic() + 60
    while 'Restarts=1' not in (fields := job_fields(slurm_cluster, job)):
        assert time.monotonic() < deadline, fields
        time.sleep(0.2)
    # The requeued job waits out its credential's lifetime (cred_expire: 20 s in the harness)
    stir_when_eligible(slurm_cluster, job)
    assert slurm_cluster.wait_empty(150), job_fields(slurm_cluster, job)
    fields = job_fields(slurm_cluster, job)
    assert 'JobState=COMPLETED' in fields and 'Restarts=1' in fields, fields
    said = first.read_text().splitlines()       # the notice, and the shell's word on its sleep, in any order
    assert said[0] == 'start 0' and 'notice' in said, said
    assert (run / 'logs' / 'attempt-2' / 'worker-0.log').read_text() == 'start 1\n'
    assert os.readlink(run / 'logs' / 'worker-0.log') == 'attempt-2/worker-0.log'
    out = (run / 'logs' / f'slurm-{job}.out').read_text()
    assert out.count('a preemption notice to every task') == 1, out
