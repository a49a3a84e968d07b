"""Coordinator runs (a `chief`: TF2 ParameterServerStrategy) in every file tfcluster writes and in
every scheduler's placement: the JobSet, TrainJob and TFJob validate strictly with chief and
evaluator, success follows the chief and every container has the PSS variables; the batch
script runs one rank per task and ends with the chief; compose has chief-0 and evaluator-0; the
Slurm and JobSet placement tables; and worker 0 is never taken for the chief. Tables, no
processes, except the few marked slow (a rank wrapper, a real Slurm step)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from launch.render import sbatch
from launch.render.jobset import jobset
from launch.render.options import RenderOptions
from tests.conftest import REPO
from tests.harness.jobset import container, environment_of
from tests.harness.render_roles import pss_spec


# -- the coordinator wrapper and a real Slurm step ---------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize('rank, task', [(0, 'ps-0'), (1, 'chief-0'), (2, 'evaluator-0'), (3, 'worker-0'),
                                        (4, 'worker-1')])
def test_coordinator_wrapper_names_each_rank_and_the_chief_leaves_its_exit_code(tmp_path, rank, task):
    """Outside Slurm the chief's scancel fails: its rank then exits non-zero after a moment, which
    srun's --kill-on-bad-exit would take as the end of the step."""
    ended = tmp_path / 'ended'
    wrapper = sbatch.coordinator_wrapper({'ps': 'export P=1;'})
    out = subprocess.run(['bash', '-c', wrapper, 'tfcluster-task', '1', '1', str(tmp_path), str(ended),
                          'sh', '-c', 'echo "${P-no} $0"; exit 3'], env={**os.environ, 'SLURM_PROCID': str(rank),
                                                                        'PATH': '/usr/bin:/bin'},
                         capture_output=True, timeout=30)
    assert (tmp_path / f'{task}.log').read_text() == f'{"1" if task == "ps-0" else "no"} sh\n'
    if task == 'chief-0':
        assert ended.read_text() == '3\n' and out.returncode == 3
    else:
        assert not ended.exists() and out.returncode == 3


@pytest.mark.slow
def test_a_slurm_step_ends_when_the_chief_does_and_the_job_takes_its_exit_code(tmp_path, slurm_cluster):
    """The rendered script's step, with stand-ins for the tasks: the ps (which ignores SIGTERM)
    and the workers would serve for ever; the evaluator says it finished; the chief ends after a
    moment, and so does the job,
    COMPLETED, at once (not KillWait later), the chief's log and exit code written."""
    spec = pss_spec(tmp_path, overrides=[f'train.train_dir={tmp_path / "run"}'])
    script = sbatch.render(spec, RenderOptions())
    stand_in = ("sh -c 'if [ \"$SLURM_PROCID\" = 1 ]; then echo chief done; exit 0; fi; "
                "if [ \"$SLURM_PROCID\" = 2 ]; then echo I evaluator:0 finished; exit 0; fi; exec sleep 300'")
    script = re.sub(r"    \S+ -m cluster\.task --spec \"\$train_dir/spec\.yaml\" --slurm --port-base 8888",
                    '    ' + stand_in.replace('\\', r'\\'), script)
    assert stand_in in script
    path = tmp_path / 'job.sh'
    path.write_text(script)
    started = time.monotonic()
    job = slurm_cluster.run('sbatch', '--parsable', str(path)).stdout.strip()
    assert job.isdigit(), job
    assert slurm_cluster.wait_empty(60)
    took = time.monotonic() - started
    info = slurm_cluster.run('scontrol', 'show', 'job', job).stdout
    assert 'JobState=COMPLETED' in info and 'ExitCode=0:0' in info, info
    logs = tmp_path / 'run' / 'logs'
    assert (logs / 'chief-0.log').read_text() == 'chief done\n'
    assert not list((tmp_path / 'run').glob('chief-exit.*'))
    assert took < 25, took          # KillWait is 10 s there: scancel --signal=KILL ended the step at once


@pytest.mark.slow
def test_jobset_pods_of_a_coordinator_run_train_and_the_chief_ends_the_run(tmp_path):
    """chief, ps, 2 workers and the evaluator run their pods' command lines verbatim with nothing
    but a JobSet pod's environment (TFCLUSTER_JOBSET_RESOLVE points the DNS names at local ports):
    the chief trains to the end and exits 0, the evaluator evaluates the final checkpoint and
    exits 0, and the ps and workers are still serving, for JobSet's successPolicy to end."""
    from tests.conftest import free_ports
    run = tmp_path / 'run'
    spec = pss_spec(tmp_path, overrides=[f'train.train_dir={run}', 'train.steps=30', 'train.log_every_secs=0.5',
                                         'train.program=tests.harness.pss_programs:train',
                                         'train.evaluator=tests.harness.pss_programs:evaluate'])
    obj = jobset(spec, name='t')
    names = [f't-{r["name"]}-0-{i}.t' for r in obj['spec']['replicatedJobs']
             for i in range(r['template']['spec']['completions'])]
    resolve_to = ','.join(f'{n}=127.0.0.1:{p}' for n, p in zip(names, free_ports(len(names))))
    base = {k: v for k, v in os.environ.items()
            if k not in ('TF_CONFIG', 'CLUSTER_SPEC', 'JOB_COMPLETION_INDEX') and not k.startswith('TFCLUSTER_')}
    base.update(PYTHONPATH=REPO, TFCLUSTER_JOBSET_RESOLVE=resolve_to)
    procs: dict[str, subprocess.Popen] = {}
    try:
        for rjob in obj['spec']['replicatedJobs']:
            c = container(rjob)
            for index in range(rjob['template']['spec']['completions']):
                log = open(tmp_path / f'{rjob["name"]}-{index}.log', 'w')
                procs[f'{rjob["name"]}-{index}'] = subprocess.Popen(
                    [sys.executable, *c['command'][1:], *c['args']], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                    env={**base, **environment_of(obj, rjob, index)})
        logs = {name: lambda name=name: (tmp_path / f'{name}.log').read_text() for name in procs}
        assert procs['chief-0'].wait(timeout=240) == 0, logs['chief-0']()
        assert procs['evaluator-0'].wait(timeout=60) == 0, logs['evaluator-0']()
        assert 'evaluation at global step 30' in logs['evaluator-0']()
        assert [n for n in ('ps-0', 'worker-0', 'worker-1') if procs[n].poll() is not None] == []
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert re.search(r'^model_checkpoint_path: ".*ckpt-30"', (run / 'checkpoint').read_text(), re.M)

