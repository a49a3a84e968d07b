"""Coordinator runs (a `chief`: TF2 ParameterServerStrategy) in every file tfcluster writes and in
every scheduler's placement: the JobSet, TrainJob and TFJob validate strictly with chief and
evaluator, success follows the chief and every container has the PSS variables; the batch
script runs one rank per task and ends with the chief; compose has chief-0 and evaluator-0; the
Slurm and JobSet placement tables; and worker 0 is never taken for the chief. Tables, no
processes, except the few marked slow (a rank wrapper, a real Slurm step)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import types

import pytest
import yaml

from cluster.env import jobset as jobset_env
from cluster.env.jobset import JobSetEnvError, place
from cluster.env.slurm import SlurmEnvError, rank_tasks, resolve
from cluster.spec import load_spec
from launch.planning.plan import plan_cluster, plan_compose
from launch.render import compose, sbatch
from launch.render.jobset import jobset, render as render_jobset
from launch.render.options import RenderOptions
from launch.render.tfjob import render as render_tfjob, tfjob
from launch.render.trainjob import objects, render as render_trainjob
from tests.conftest import REPO
from tests.harness.k8s_models import check_jobset_spec, trainer_round_trip
from tests.harness.jobset import check_jobset_rules, container, environment_of, prose, validated
from tests.harness.tfjob import api_model, check_operator_rules
from tests.harness.trainjob import check_trainer_rules
from tests.harness.render_roles import pss_spec

PSS_ENV = {'GRPC_FAIL_FAST': 'use_caller', 'TF_USE_LEGACY_KERAS': '1'}
LOCAL2 = os.path.join(REPO, 'specs', 'local2.yaml')


def jobs_of(spec) -> list[str]:
    return [t.job for t in spec.tasks]


WITH_AND_WITHOUT = pytest.mark.parametrize('evaluator', [True, False], ids=['evaluator', 'no-evaluator'])


# -- JobSet ------------------------------------------------------------------------------------------

def rendered_jobset(spec, **options) -> dict:
    return validated(jobset(spec, **options))


def by_name(jobset_spec: dict) -> dict[str, dict]:
    return {r['name']: r for r in jobset_spec['replicatedJobs']}


def pod(rjob: dict) -> dict:
    return rjob['template']['spec']['template']['spec']


def env_names(c: dict) -> dict[str, str]:
    return {e['name']: e['value'] for e in c.get('env', []) if 'value' in e}


@WITH_AND_WITHOUT
def test_jobset_has_a_replicated_job_per_role_and_succeeds_with_the_chief(tmp_path, evaluator):
    spec = pss_spec(tmp_path, evaluator)
    obj = rendered_jobset(spec)
    rjobs = by_name(obj['spec'])
    assert list(rjobs) == ['ps', 'chief', *(['evaluator'] if evaluator else []), 'worker']     # the ranks' order
    assert {n: r['template']['spec']['completions'] for n, r in rjobs.items()} == \
        {'ps': 1, 'chief': 1, 'worker': 2, **({'evaluator': 1} if evaluator else {})}
    assert obj['spec']['successPolicy'] == {'operator': 'All', 'targetReplicatedJobs': ['chief']}
    assert obj['spec']['failurePolicy'] == {'maxRestarts': 0}
    for name, rjob in rjobs.items():
        c = container(rjob)
        assert env_names(c).items() >= PSS_ENV.items(), name
        assert 'resources' not in c
        mounted = 'volumeMounts' in c
        assert mounted is (name in ('chief', 'evaluator')), name     # who writes or reads the checkpoints
        assert ('volumes' in pod(rjob)) is mounted
        assert rjob['template']['spec']['backoffLimit'] == 0


@WITH_AND_WITHOUT
def test_every_jobset_pod_finds_its_task_and_the_evaluator_stays_out_of_tf_config(tmp_path, evaluator, monkeypatch):
    """Each pod's environment, put through cluster.task's own reading, gives its task in a
    coordinator spec with the same train settings; TensorFlow is told the training cluster, or
    for the evaluator only itself."""
    from cluster import task
    spec = pss_spec(tmp_path, evaluator)
    obj = rendered_jobset(spec, name='run')
    for name in list(os.environ):
        if name.startswith('TFCLUSTER_') or name in ('TF_CONFIG', 'CLUSTER_SPEC'):
            monkeypatch.delenv(name)
    seen = []
    for rjob in obj['spec']['replicatedJobs']:
        for index in range(rjob['template']['spec']['completions']):
            env = environment_of(obj, rjob, index)
            here = place(env)
            assert (here.job, here.index) == (rjob['name'], index)
            config = json.loads(here.tf_config())
            if here.job == 'evaluator':
                assert config['cluster'] == {'evaluator': ['run-evaluator-0-0.run:2222']}
            else:
                assert set(config['cluster']) == {'chief', 'ps', 'worker'}
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            read, me = task.resolve_task(task.parse_args(container(rjob)['args']))
            assert read.train == spec.train and read.coordinator and jobs_of(read) == jobs_of(spec)
            assert json.loads(read.tf_config(me)) == config
            seen.append(me.name)
    assert sorted(seen) == sorted(t.name for t in spec.tasks)


def test_jobset_restarts_follow_pss_recovery(tmp_path):
    """With on-failure a chief, worker or evaluator pod is replaced alone (backoffLimit), a ps
    fails its Job and so restarts the set; GPUs go to the workers only."""
    spec = pss_spec(tmp_path, overrides=['supervise.restart=on-failure', 'supervise.max_restarts=4',
                                         'train.devices=[gpu:0]'])
    rjobs = by_name(rendered_jobset(spec, pvc='ckpt')['spec'])
    assert {n: r['template']['spec']['backoffLimit'] for n, r in rjobs.items()} == \
        {'ps': 0, 'chief': 4, 'evaluator': 4, 'worker': 4}
    assert {n for n, r in rjobs.items() if 'resources' in container(r)} == {'worker'}
    assert container(rjobs['worker'])['resources'] == {'limits': {'nvidia.com/gpu': '1'}}
    assert pod(rjobs['evaluator'])['volumes'] == [{'name': 'train-dir', 'persistentVolumeClaim': {'claimName': 'ckpt'}}]
    tf1 = rendered_jobset(load_spec(str(tmp_path / 'pss.yaml'), ['cluster.chief=null', 'cluster.evaluator=null',
                                                                   'train.evaluator=null',
                                                                   'supervise.restart=on-failure']))
    assert {r['template']['spec']['backoffLimit'] for r in tf1['spec']['replicatedJobs']} == {0}   # as before


def test_jobset_header_names_the_chief_not_worker_0(tmp_path, caplog):
    spec = pss_spec(tmp_path)
    text = render_jobset(spec, RenderOptions(name='run'))
    head = prose(text)
    assert 'worker 0 is the chief' not in head.lower()
    assert 'jobset.sigs.k8s.io/replicatedjob-name=chief,batch.kubernetes.io/job-completion-index=0' in head
    assert 'The run succeeds once the chief job has completed' in head
    assert 'GRPC_FAIL_FAST=use_caller and TF_USE_LEGACY_KERAS=1' in head
    assert "The evaluator's emptyDir is its own" in head
    assert any('render with --pvc CLAIM (ReadWriteMany) so that the evaluator sees them' in r.getMessage()
               for r in caplog.records)
    assert yaml.safe_load(text) == jobset(spec, name='run')


def test_a_long_name_leaves_room_for_the_evaluator_pods(tmp_path):
    spec = pss_spec(tmp_path)
    rendered_jobset(spec, name='x' * 43)          # x...x-evaluator-0-0-abcde: 63 characters
    with pytest.raises(Exception, match=r'at most 43 .*NAME-evaluator-0-0-xxxxx'):
        jobset(spec, name='x' * 44)


# -- the JobSet placement function -------------------------------------------------------------------

def pss_env(rjob: str, index: int = 0, evaluator: bool = True, **extra) -> dict[str, str]:
    env = {'TFCLUSTER_JOBSET_NAME': 'run', 'TFCLUSTER_JOBSET_REPLICATED_JOB': rjob, 'JOB_COMPLETION_INDEX': str(index),
           'TFCLUSTER_JOBSET_PS_JOB': 'ps', 'TFCLUSTER_JOBSET_NUM_PS': '1', 'TFCLUSTER_JOBSET_WORKER_JOB': 'node',
           'TFCLUSTER_JOBSET_NUM_WORKERS': '2', 'TFCLUSTER_JOBSET_CHIEF_JOB': 'chief', 'TFCLUSTER_JOBSET_PORT': '2222',
           **({'TFCLUSTER_JOBSET_EVALUATOR_JOB': 'evaluator'} if evaluator else {}), **extra}
    return {k: v for k, v in env.items() if v is not None}


CLUSTER = {'chief': ['run-chief-0-0.run:2222'], 'ps': ['run-ps-0-0.run:2222'],
           'worker': ['run-node-0-0.run:2222', 'run-node-0-1.run:2222'], 'evaluator': ['run-evaluator-0-0.run:2222']}
TRAINING = {k: v for k, v in CLUSTER.items() if k != 'evaluator'}
PSS_PLACES = [  # (environment, job, index, cluster, TF_CONFIG's cluster)
    (pss_env('chief'), 'chief', 0, CLUSTER, TRAINING),
    (pss_env('ps'), 'ps', 0, CLUSTER, TRAINING),
    (pss_env('node', 1), 'worker', 1, CLUSTER, TRAINING),
    (pss_env('evaluator'), 'evaluator', 0, CLUSTER, {'evaluator': ['run-evaluator-0-0.run:2222']}),
    (pss_env('chief', evaluator=False), 'chief', 0, TRAINING, TRAINING),
]


@pytest.mark.parametrize('env, job, index, cluster, told', PSS_PLACES,
                         ids=[f'{p[1]}-{i}' for i, p in enumerate(PSS_PLACES)])
def test_a_coordinator_pod_finds_its_task(env, job, index, cluster, told):
    found = place(env)
    assert (found.job, found.index, found.cluster) == (job, index, cluster)
    assert list(found.cluster) == list(cluster)         # the spec's order of jobs
    assert json.loads(found.tf_config()) == {'cluster': told, 'task': {'type': job, 'index': index}}


PSS_BAD = [  # (environment, the variable the line starts with, what else it says)
    (pss_env('chief', TFCLUSTER_JOBSET_CHIEF_JOB=None), 'TFCLUSTER_JOBSET_EVALUATOR_JOB', 'without'),
    (pss_env('chief', JOB_COMPLETION_INDEX='1'), 'JOB_COMPLETION_INDEX', '0..0'),
    (pss_env('chief', TFCLUSTER_JOBSET_EVALUATOR_JOB='chief'), 'TFCLUSTER_JOBSET_CHIEF_JOB', "are both 'chief'"),
    (pss_env('chief', TFCLUSTER_JOBSET_CHIEF_JOB='Chief'), 'TFCLUSTER_JOBSET_CHIEF_JOB', 'DNS-1035 label'),
    (pss_env('other'), 'TFCLUSTER_JOBSET_REPLICATED_JOB',
     'none of the ps job (ps), the worker job (node), the chief job (chief) and the evaluator job (evaluator)'),
]


@pytest.mark.parametrize('env, variable, says', PSS_BAD, ids=[f'{i}-{b[1]}' for i, b in enumerate(PSS_BAD)])
def test_a_wrong_coordinator_variable_is_one_line(env, variable, says):
    with pytest.raises(JobSetEnvError) as e:
        place(env)
    assert str(e.value).startswith(f'${variable}') and '\n' not in str(e.value), str(e.value)
    assert says in str(e.value)


def test_the_new_variables_are_reserved():
    assert {'TFCLUSTER_JOBSET_CHIEF_JOB', 'TFCLUSTER_JOBSET_EVALUATOR_JOB'} <= set(jobset_env.VARIABLES)


# -- TrainJob ----------------------------------------------------------------------------------------

@WITH_AND_WITHOUT
def test_trainjob_runtime_holds_chief_and_evaluator_and_the_workers_stay_the_trainer(tmp_path, evaluator):
    spec = pss_spec(tmp_path, evaluator)
    runtime, train_job = objects(spec)
    trainer_round_trip(runtime, 'TrainerV1alpha1TrainingRuntime')
    trainer_round_trip(train_job, 'TrainerV1alpha1TrainJob')
    check_jobset_spec(runtime['spec']['template']['spec'])
    check_trainer_rules(runtime, train_job)
    check_jobset_rules({'apiVersion': 'jobset.x-k8s.io/v1alpha2', 'kind': 'JobSet', 'metadata': train_job['metadata'],
                        'spec': runtime['spec']['template']['spec']})
    template = runtime['spec']['template']['spec']
    rjobs = by_name(template)
    assert list(rjobs) == ['ps', 'chief', *(['evaluator'] if evaluator else []), 'node']
    assert runtime['spec']['mlPolicy'] == {'numNodes': 2}
    assert template['successPolicy'] == {'operator': 'All', 'targetReplicatedJobs': ['chief']}
    assert all(env_names(container(r)).items() >= PSS_ENV.items() for r in rjobs.values())
    here = place(environment_of({'metadata': train_job['metadata']}, rjobs['node'], 1))
    assert (here.job, here.index) == ('worker', 1) and 'chief' in here.cluster
    text = render_trainjob(spec, None)
    assert 'worker 0 is the chief' not in prose(text).lower()
    assert 'replicatedjob-name=chief' in text


# -- TFJob -------------------------------------------------------------------------------------------

def rendered_tfjob(spec, **options) -> dict:
    job = tfjob(spec, **options)
    api_model(job)
    check_operator_rules(job)
    return job


def operator_tf_config(job: dict, kind: str, index: int) -> dict:
    """The TF_CONFIG the training operator sets (pkg/controller.v1/tensorflow/tensorflow.go
    genClusterSpec): every replica type but the Evaluator in the cluster, `<name>-<type>-<i>`."""
    name = job['metadata']['name']
    cluster = {k.lower(): [f'{name}-{k.lower()}-{i}.default.svc:2222' for i in range(r['replicas'])]
               for k, r in job['spec']['tfReplicaSpecs'].items() if k != 'Evaluator'}
    return {'cluster': cluster, 'task': {'type': kind.lower(), 'index': index}, 'environment': 'cloud'}


@WITH_AND_WITHOUT
def test_tfjob_has_chief_and_evaluator_replicas_and_the_pss_environment(tmp_path, evaluator):
    spec = pss_spec(tmp_path, evaluator, overrides=['train.devices=[gpu:0, gpu:1]'])
    job = rendered_tfjob(spec)
    replicas = job['spec']['tfReplicaSpecs']
    assert list(replicas) == ['Chief', 'PS', 'Worker', *(['Evaluator'] if evaluator else [])]
    assert {k: r['replicas'] for k, r in replicas.items()} == \
        {'Chief': 1, 'PS': 1, 'Worker': 2, **({'Evaluator': 1} if evaluator else {})}
    assert 'successPolicy' not in job['spec']      # the default: with a Chief, the job succeeds when it does
    assert job['spec']['runPolicy'] == {'cleanPodPolicy': 'Running'}
    for kind, replica in replicas.items():
        c = replica['template']['spec']['containers'][0]
        assert env_names(c) == PSS_ENV, kind
        assert ('resources' in c) is (kind == 'Worker')
        assert ('volumeMounts' in c) is (kind in ('Chief', 'Evaluator'))
    head = prose(render_tfjob(spec, None))
    assert 'worker 0 is the chief' not in head.lower() and 'kubectl logs -f pss-chief-0' in head
    assert 'The job succeeds when the Chief does' in head


def test_tfjob_training_pods_read_the_operators_tf_config(tmp_path, monkeypatch):
    from cluster import task
    spec = pss_spec(tmp_path)
    job = rendered_tfjob(spec)
    monkeypatch.delenv('CLUSTER_SPEC', raising=False)
    for kind in ('Chief', 'PS', 'Worker'):
        for index in range(job['spec']['tfReplicaSpecs'][kind]['replicas']):
            monkeypatch.setenv('TF_CONFIG', json.dumps(operator_tf_config(job, kind, index)))
            args = job['spec']['tfReplicaSpecs'][kind]['template']['spec']['containers'][0]['args']
            read, me = task.resolve_task(task.parse_args(args))
            # its cluster has no evaluator, so neither has its spec train.evaluator (tfjob.py says why)
            assert read.train == dataclasses.replace(spec.train, evaluator=None) and read.coordinator
            assert (me.job, me.index) == (kind.lower(), index)
            assert json.loads(read.tf_config(me))['cluster'] == operator_tf_config(job, kind, index)['cluster']


def test_tfjob_evaluator_reads_the_operators_tf_config(tmp_path, monkeypatch):
    from cluster import task
    job = rendered_tfjob(pss_spec(tmp_path))
    monkeypatch.delenv('CLUSTER_SPEC', raising=False)
    monkeypatch.setenv('TF_CONFIG', json.dumps(operator_tf_config(job, 'Evaluator', 0)))
    args = job['spec']['tfReplicaSpecs']['Evaluator']['template']['spec']['containers'][0]['args']
    read, me = task.resolve_task(task.parse_args(args))
    assert me.job == 'evaluator' and read.coordinator


def test_tfjob_name_leaves_room_for_the_evaluator_service(tmp_path):
    spec = pss_spec(tmp_path)
    rendered_tfjob(spec, name='x' * 51)         # x...x-evaluator-0: 63 characters
    with pytest.raises(Exception, match='NAME-evaluator-0'):
        tfjob(spec, name='x' * 52)


# -- Slurm: the batch script and the placement --------------------------------------------------------

def script_of(spec, monkeypatch, tmp_path, **options) -> str:
    monkeypatch.chdir(tmp_path)
    fields = {'name': None, 'partition': None, 'time_limit': None, 'port_base': None, **options}
    return sbatch.render(spec, types.SimpleNamespace(**fields))


@WITH_AND_WITHOUT
def test_sbatch_runs_a_rank_per_task_and_exits_with_the_chief(tmp_path, monkeypatch, evaluator):
    spec = pss_spec(tmp_path, evaluator)
    script = script_of(spec, monkeypatch, tmp_path)
    n = 5 if evaluator else 4
    assert f'#SBATCH --ntasks={n}' in script.splitlines()
    layout = 'rank 0 is ps:0; rank 1 is chief:0; ' + ('rank 2 is evaluator:0; ranks 3-4' if evaluator else 'ranks 2-3')
    assert f'# order; {layout} are worker:0-1;' in script
    assert '(worker:0 is the chief)' not in script
    assert 'export GRPC_FAIL_FAST=use_caller TF_USE_LEGACY_KERAS=1' in script.splitlines()
    srun = script[script.index('\nsrun '):].replace('\\\n', ' ')
    assert f'--ntasks={n}' in srun and '--kill-on-bad-exit=1' in srun
    assert sbatch.coordinator_wrapper({}).split('then')[0] in srun        # the chief's wrapper, not TF1's
    assert f'tfcluster-task 1 {int(evaluator)} "$train_dir/logs/attempt-$attempt" "$ended"' in srun
    assert script.rstrip().endswith('if [ -s "$ended" ]; then status=$(cat "$ended"); rm -f "$ended"; fi\n'
                                    'exit "$status"')
    assert re.search(r'--port-base 8888 \|\| status=\$\?\n', script)
    names = re.search(r'for t in (.*); do', script).group(1).split()
    assert sorted(names) == sorted(['chief-0', 'ps-0', 'worker-0', 'worker-1', *(['evaluator-0'] if evaluator else [])])


def test_sbatch_gpus_make_one_gpu_less_component_for_ps_chief_and_evaluator(tmp_path, monkeypatch):
    spec = pss_spec(tmp_path, overrides=['train.devices=[gpu:0]'])
    script = script_of(spec, monkeypatch, tmp_path).splitlines()
    asks = [x.removeprefix('#SBATCH ') for x in script if x.startswith('#SBATCH --ntasks') or x == '#SBATCH hetjob'
            or x.startswith('#SBATCH --gpus')]
    assert asks == ['--ntasks=3', 'hetjob', '--ntasks=2', '--gpus-per-task=1']
    wrapper = next(x for x in script if "bash -c 'if" in x)
    assert 'task=chief-0; export CUDA_VISIBLE_DEVICES=; elif' in wrapper
    assert 'task=evaluator-0; export CUDA_VISIBLE_DEVICES=; else' in wrapper
    assert 'export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"; fi' in wrapper


def test_a_tf1_script_keeps_its_wrapper_and_last_line(tmp_path, monkeypatch):
    script = script_of(load_spec(LOCAL2), monkeypatch, tmp_path)
    srun = script[script.index('\nsrun '):].replace('\\\n', ' ')
    assert 'tfcluster-task 1 "$train_dir/logs/attempt-$attempt" ' in srun and 'elif' not in srun
    assert 'ended=' not in script and script.rstrip().endswith('--slurm --port-base 8888')
    assert '(worker:0 is the chief)' in script and 'GRPC_FAIL_FAST' not in script


def _step(rank: int, nodelist: str, tasks: str, **extra) -> dict[str, str]:
    return {'SLURM_STEP_ID': '0', 'SLURM_PROCID': str(rank), 'SLURM_STEP_NODELIST': nodelist,
            'SLURM_STEP_TASKS_PER_NODE': tasks, **extra}


# (evaluator?, nodelist, tasks per node) -> every rank's (task, host, port)
PSS_LAYOUTS = {
    'one node': (True, 'vm', '5', [('ps:0', 'vm', 8888), ('chief:0', 'vm', 8889), ('evaluator:0', 'vm', 8890),
                                    ('worker:0', 'vm', 8891), ('worker:1', 'vm', 8892)]),
    'a node each': (True, 'n[1-5]', '1(x5)', [('ps:0', 'n1', 8888), ('chief:0', 'n2', 8888),
                                              ('evaluator:0', 'n3', 8888), ('worker:0', 'n4', 8888),
                                              ('worker:1', 'n5', 8888)]),
    'no evaluator, two nodes': (False, 'a,b', '2,2', [('ps:0', 'a', 8888), ('chief:0', 'a', 8889),
                                                      ('worker:0', 'b', 8888), ('worker:1', 'b', 8889)]),
}


@pytest.mark.parametrize('case', PSS_LAYOUTS)
def test_every_coordinator_rank_sees_the_same_layout(tmp_path, case):
    evaluator, nodelist, tasks, expected = PSS_LAYOUTS[case]
    spec = pss_spec(tmp_path, evaluator)
    assert [f'{j}:{i}' for j, i in rank_tasks(spec)] == [name for name, _, _ in expected]
    for rank, (name, host, port) in enumerate(expected):
        local = sum(1 for _, h, _ in expected[:rank] if h == host)
        placed, me = resolve(spec, _step(rank, nodelist, tasks, SLURMD_NODENAME=host, SLURM_LOCALID=str(local)))
        assert (me.name, me.host, me.port) == (name, host, port)
        assert jobs_of(placed) == jobs_of(spec)          # the spec's own order of tasks
        assert sorted((t.name, t.host, t.port) for t in placed.tasks) == sorted(expected)
        assert placed.coordinator and placed.chief.name == 'chief:0' and placed.train == spec.train
        if name == 'worker:0':
            assert me.job == 'worker' and placed.chief != me      # worker 0 only serves here


def test_a_coordinator_step_of_the_wrong_size_names_every_role(tmp_path):
    with pytest.raises(SlurmEnvError, match=r'has 3 task\(s\) but the spec has 1 chief \+ 1 ps \+ 2 worker\(s\) \+ '
                                            r'1 evaluator = 5: run it with `srun --ntasks=5`'):
        resolve(pss_spec(tmp_path), _step(0, 'vm', '3'))


# -- compose and GPUs --------------------------------------------------------------------------------

@WITH_AND_WITHOUT
def test_compose_has_a_service_per_role(tmp_path, evaluator):
    from launch.planning.plan import compose_spec
    spec = pss_spec(tmp_path, evaluator, overrides=['train.devices=[gpu:0]', 'gpus.localhost=2'])
    plans = plan_compose(spec)
    text = compose.render(compose_spec(spec), list(plans), spec.path)
    services = yaml.safe_load(text)['services']
    assert list(services) == ['chief-0', 'ps-0', 'worker-0', 'worker-1', *(['evaluator-0'] if evaluator else [])]
    for name, service in services.items():
        assert service['environment'].items() >= PSS_ENV.items(), name
        config = json.loads(service['environment']['TF_CONFIG'])
        assert (name == 'evaluator-0') is ('evaluator' in config['cluster'])
        assert ('deploy' in service) is name.startswith('worker'), name      # GPUs: the workers' only
        assert ('healthcheck' in service) is (name != 'evaluator-0'), name   # the evaluator serves nothing
    assert services['chief-0']['environment']['CUDA_VISIBLE_DEVICES'] == ''
    assert '# 1 chief + 1 ps + 2 worker(s)' in text


def test_gpus_go_to_the_workers_only(tmp_path):
    spec = pss_spec(tmp_path, overrides=['train.devices=[gpu:0]', 'gpus.localhost=2'])
    cuda = {p.name: p.env.get('CUDA_VISIBLE_DEVICES') for p in plan_cluster(spec, python=sys.executable)}
    assert cuda == {'chief:0': '', 'ps:0': '', 'worker:0': '0', 'worker:1': '1', 'evaluator:0': ''}
