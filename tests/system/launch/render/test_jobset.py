"""`launch render --format jobset` and `cluster.task --jobset`: where a task finds its place
from a JobSet pod's environment (a table), the rendered JobSet against the JobSet CRD's schema made
strict, the kubernetes client's and kubeflow-trainer-api's models and JobSet's admission rules, and
run: the pods' command lines train a cluster of local processes that get nothing but the
environment a JobSet pod would have."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cluster.spec import load_spec
from launch.render.jobset import jobset, render
from tests.conftest import REPO, check_trained, free_ports, launch, run_tasks
from tests.harness.jobset import Args, LOCAL2, container, environment_of


# -- the command lines -----------------------------------------------------------------------------
@pytest.mark.slow
def test_output_file_holds_a_commented_jobset_and_bad_options_are_one_line(tmp_path):
    out = tmp_path / 'local2-jobset.yaml'
    result = launch('render', LOCAL2, '--format', 'jobset', '--pvc', 'ckpt', '-o', str(out), timeout=60)
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert result.stdout == f'wrote {out} (jobset)\n'
    assert out.read_text() == render(load_spec(LOCAL2), Args(pvc='ckpt'))
    for argv, says in ((['--name=Bad_Name'], 'DNS-1035 label'), (['--pvc=Claim'], 'DNS-1123 subdomain'),
                       (['--namespace=Team'], 'DNS-1123 label')):
        result = launch('render', LOCAL2, '--format', 'jobset', *argv, timeout=60)
        assert result.returncode == 2 and not result.stdout, result.stderr
        assert result.stderr.startswith('launch: error: ') and result.stderr.count('\n') == 1, result.stderr
        assert says in result.stderr
    result = launch('render', LOCAL2, '--format', 'sbatch', '--pvc', 'ckpt', timeout=60)
    assert result.returncode == 2 and '--pvc is for the Kubernetes formats' in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize('fmt', ['jobset', 'trainjob'])
def test_rendered_pods_train_with_nothing_but_a_jobset_pods_environment(tmp_path, fmt):
    """1 ps and 2 workers run each pod's command and arguments verbatim, with the environment a
    JobSet pod would have (labels through the downward API, JOB_COMPLETION_INDEX) and no spec or
    TF_CONFIG; only TFCLUSTER_JOBSET_RESOLVE points the DNS names the layout computes at local
    ports. All end with 0, and the chief wrote its final checkpoint. For a TrainJob, the JobSet is
    the one the Trainer makes: the TrainJob's name, the runtime's template."""
    from launch.render.trainjob import objects
    run = tmp_path / 'run'
    spec = load_spec(LOCAL2, [f'train.train_dir={run}', 'train.steps=20', 'train.batch_size=16'])
    if fmt == 'jobset':
        obj, workers = jobset(spec, name='t'), 'worker'
    else:
        runtime, train_job = objects(spec, name='t')
        obj, workers = {'metadata': train_job['metadata'], 'spec': runtime['spec']['template']['spec']}, 'node'
    names = ['t-ps-0-0.t', f't-{workers}-0-0.t', f't-{workers}-0-1.t']     # as JobSet names the pods
    resolve = ','.join(f'{n}=127.0.0.1:{p}' for n, p in zip(names, free_ports(3)))
    pod_dir = tmp_path / 'pod'          # the image's WORKDIR
    pod_dir.mkdir()
    base_env = {k: v for k, v in os.environ.items()
                if k not in ('TF_CONFIG', 'CLUSTER_SPEC', 'JOB_COMPLETION_INDEX') and not k.startswith('TFCLUSTER_')}
    base_env.update(PYTHONPATH=REPO, TFCLUSTER_JOBSET_RESOLVE=resolve)      # this tree's cluster.task
    tasks = []
    for rjob in obj['spec']['replicatedJobs']:
        c = container(rjob)
        assert c['command'][0] == 'python'
        for index in range(rjob['template']['spec']['completions']):
            tasks.append(([sys.executable, *c['command'][1:], *c['args']],
                          {**base_env, **environment_of(obj, rjob, index)}))
    check_trained(run, *run_tasks(tasks, cwd=pod_dir), steps=20)


@pytest.mark.slow
def test_a_task_outside_a_jobset_pod_is_one_line_and_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith('TFCLUSTER_') and k != 'JOB_COMPLETION_INDEX'}
    env['PYTHONPATH'] = REPO
    result = subprocess.run([sys.executable, '-m', 'cluster.task', '--jobset'], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr == ('cluster.task: error: $TFCLUSTER_JOBSET_NAME is not set: not in a pod of a JobSet '
                             'rendered by `launch render --format jobset` (or trainjob), or its container lost the '
                             'variable\n')
    result = subprocess.run([sys.executable, '-m', 'cluster.task', '--jobset', '--slurm'], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.endswith('error: give --slurm or --jobset, not both\n')

