"""`launch render --format jobset` and `cluster.task --jobset`: where a task finds its place
from a JobSet pod's environment (a table), the rendered JobSet against the JobSet CRD's schema made
strict, the kubernetes client's and kubeflow-trainer-api's models and JobSet's admission rules, and
run: the pods' command lines train a cluster of local processes that get nothing but the
environment a JobSet pod would have."""
from __future__ import annotations

import copy
import json
import logging
import os

import pytest
import yaml

from cluster.env import jobset as jobset_env
from cluster.env.jobset import JobSetEnvError, place
from cluster.spec import SpecError, load_spec
from launch.errors import UsageError
from launch.render.jobset import jobset, render
from tests.conftest import REPO
from tests.harness.k8s_models import kubernetes_round_trip, schema_errors
from tests.harness.jobset import Args, LOCAL2, container, environment_of, prose, validated


# -- the place-from-JobSet function ----------------------------------------------------------------
def pod_env(name='run', rjob='worker', index=0, ps=('ps', 1), workers=('worker', 2), port=2222, **extra) -> dict:
    """The environment of a JobSet pod as tfcluster renders it and JobSet and Kubernetes fill it in."""
    env = {'TFCLUSTER_JOBSET_NAME': name, 'TFCLUSTER_JOBSET_REPLICATED_JOB': rjob, 'JOB_COMPLETION_INDEX': str(index),
           'TFCLUSTER_JOBSET_PS_JOB': ps[0], 'TFCLUSTER_JOBSET_NUM_PS': str(ps[1]),
           'TFCLUSTER_JOBSET_WORKER_JOB': workers[0], 'TFCLUSTER_JOBSET_NUM_WORKERS': str(workers[1]),
           'TFCLUSTER_JOBSET_PORT': str(port)}
    env.update({k: v for k, v in extra.items()})
    return {k: v for k, v in env.items() if v is not None}


PLACES = [  # (environment, job, index, cluster)
    (pod_env(rjob='ps', index=0), 'ps', 0,
     {'ps': ['run-ps-0-0.run:2222'], 'worker': ['run-worker-0-0.run:2222', 'run-worker-0-1.run:2222']}),
    (pod_env(rjob='worker', index=0), 'worker', 0, None),
    (pod_env(rjob='worker', index=1), 'worker', 1, None),
    (pod_env('big', 'ps', 1, ps=('ps', 2), workers=('worker', 4), port=7000), 'ps', 1,
     {'ps': ['big-ps-0-0.big:7000', 'big-ps-0-1.big:7000'],
      'worker': [f'big-worker-0-{i}.big:7000' for i in range(4)]}),
    (pod_env('big', 'worker', 3, ps=('ps', 2), workers=('worker', 4)), 'worker', 3, None),
    (pod_env('tj', 'node', 1, workers=('node', 2)), 'worker', 1,        # a TrainJob's workers are `node`
     {'ps': ['tj-ps-0-0.tj:2222'], 'worker': ['tj-node-0-0.tj:2222', 'tj-node-0-1.tj:2222']}),
    (pod_env(rjob='ps', TFCLUSTER_JOBSET_SUBDOMAIN='net'), 'ps', 0,
     {'ps': ['run-ps-0-0.net:2222'], 'worker': ['run-worker-0-0.net:2222', 'run-worker-0-1.net:2222']}),
    (pod_env(rjob='worker', index=1, TFCLUSTER_JOBSET_RESOLVE='run-ps-0-0.run=127.0.0.1:5000, '
             'run-worker-0-0.run=127.0.0.1:5001,run-worker-0-1.run=localhost:5002'), 'worker', 1,
     {'ps': ['127.0.0.1:5000'], 'worker': ['127.0.0.1:5001', 'localhost:5002']}),
]


@pytest.mark.parametrize('env, job, index, cluster', PLACES)
def test_a_pod_finds_its_task_and_every_tasks_dns_name(env, job, index, cluster):
    found = place(env)
    assert (found.job, found.index) == (job, index)
    if cluster is not None:
        assert found.cluster == cluster
    assert json.loads(found.tf_config()) == {'cluster': found.cluster, 'task': {'type': job, 'index': index}}


BAD_ENVIRONMENTS = [  # (environment, the variable the one line names, what else it says)
    (pod_env(name=None), 'TFCLUSTER_JOBSET_NAME', 'is not set'),
    (pod_env(rjob=''), 'TFCLUSTER_JOBSET_REPLICATED_JOB', 'is not set'),
    (pod_env(JOB_COMPLETION_INDEX=None), 'JOB_COMPLETION_INDEX', 'is not set'),
    (pod_env(TFCLUSTER_JOBSET_NUM_WORKERS=None), 'TFCLUSTER_JOBSET_NUM_WORKERS', 'is not set'),
    (pod_env(TFCLUSTER_JOBSET_PORT=None), 'TFCLUSTER_JOBSET_PORT', 'is not set'),
    (pod_env(index=2), 'JOB_COMPLETION_INDEX', "'2': expected a whole number 0..1"),
    (pod_env(index=-1), 'JOB_COMPLETION_INDEX', 'expected a whole number'),
    (pod_env(workers=('worker', 0)), 'TFCLUSTER_JOBSET_NUM_WORKERS', '1 or more'),
    (pod_env(ps=('ps', 'two')), 'TFCLUSTER_JOBSET_NUM_PS', "'two'"),
    (pod_env(port=70000), 'TFCLUSTER_JOBSET_PORT', '1..65535'),
    (pod_env(rjob='evaluator'), 'TFCLUSTER_JOBSET_REPLICATED_JOB', 'neither the ps job (ps) nor the worker job'),
    (pod_env(name='Run_1'), 'TFCLUSTER_JOBSET_NAME', 'DNS-1035 label'),
    (pod_env(workers=('ps', 2)), 'TFCLUSTER_JOBSET_PS_JOB', 'both'),
    (pod_env(name='x' * 53), 'TFCLUSTER_JOBSET_NAME', 'longer than 63'),
    (pod_env(TFCLUSTER_JOBSET_SUBDOMAIN='a.b'), 'TFCLUSTER_JOBSET_SUBDOMAIN', 'DNS-1035 label'),
    (pod_env(TFCLUSTER_JOBSET_RESOLVE='run-ps-0-0.run'), 'TFCLUSTER_JOBSET_RESOLVE', 'expected NAME=HOST:PORT'),
    (pod_env(TFCLUSTER_JOBSET_RESOLVE='run-ps-0-0.run=h:1,run-worker-0-0.run=h:2,other=h:3'),
     'TFCLUSTER_JOBSET_RESOLVE', 'no task is named other; no address for run-worker-0-1.run'),
]


@pytest.mark.parametrize('env, variable, says', BAD_ENVIRONMENTS, ids=[f'{i}-{c[1]}' for i, c in
                                                                      enumerate(BAD_ENVIRONMENTS)])
def test_a_missing_or_wrong_variable_is_one_line_naming_it(env, variable, says):
    with pytest.raises(JobSetEnvError) as e:
        place(env)
    assert str(e.value).startswith(f'${variable}') and '\n' not in str(e.value), str(e.value)
    assert says in str(e.value)


def test_cluster_task_reads_its_place_and_the_same_train_settings(monkeypatch):
    """Each pod's arguments and environment, read as cluster.task reads them, give the spec's
    train settings and the pod's task in the cluster its labels name."""
    from cluster import task
    overrides = ['train.learning_rate=0.00001', 'train.data="2024-01-01"', 'train.devices=[gpu:3, cpu:1]',
                 'train.sync=false']
    spec = load_spec(LOCAL2, overrides)
    obj = rendered(LOCAL2, *overrides, name='run')
    for name in list(os.environ):
        if name.startswith('TFCLUSTER_') or name in ('TF_CONFIG', 'CLUSTER_SPEC'):
            monkeypatch.delenv(name)
    for rjob in obj['spec']['replicatedJobs']:
        for index in range(rjob['template']['spec']['completions']):
            for k, v in environment_of(obj, rjob, index).items():
                monkeypatch.setenv(k, v)
            read, me = task.resolve_task(task.parse_args(container(rjob)['args']))
            assert read.train == spec.train
            assert (me.job, me.index, me.port) == (rjob['name'], index, 2222)
            assert me.host == f'run-{rjob["name"]}-0-{index}.run'


def rendered(path: str, *overrides: str, **options) -> dict:
    return validated(jobset(load_spec(path, list(overrides)), **options))


def replicated(obj: dict) -> dict[str, dict]:
    return {r['name']: r for r in obj['spec']['replicatedJobs']}


def settings(rjob: dict) -> dict[str, str]:
    args = container(rjob)['args']
    assert args[0] == '--jobset' and args[1::2] == ['--set'] * (len(args) // 2), args
    return dict(a.removeprefix('train.').split('=', 1) for a in args[2::2])


def test_local2_is_a_ps_job_of_one_pod_and_a_worker_job_of_two():
    obj = rendered(LOCAL2)
    assert obj['metadata'] == {'name': 'local2'}
    ps, worker = replicated(obj)['ps'], replicated(obj)['worker']
    assert [r['replicas'] for r in (ps, worker)] == [1, 1]
    assert [r['template']['spec']['completions'] for r in (ps, worker)] == [1, 2]
    assert {r['template']['spec']['backoffLimit'] for r in (ps, worker)} == {0}
    assert obj['spec']['successPolicy'] == {'operator': 'All', 'targetReplicatedJobs': ['worker']}
    assert obj['spec']['failurePolicy'] == {'maxRestarts': 0}      # supervise.restart: never
    for rjob in (ps, worker):
        c = container(rjob)
        assert c['image'] == 'tfcluster:latest' and c['command'] == ['python', '-m', 'cluster.task']
        assert settings(rjob) == {'steps': '200', 'batch_size': '64', 'train_dir': 'runs/local2'}
        assert 'resources' not in c
    assert container(worker)['volumeMounts'] == [{'name': 'train-dir', 'mountPath': '/tfcluster/runs/local2'}]
    assert worker['template']['spec']['template']['spec']['volumes'] == [{'name': 'train-dir', 'emptyDir': {}}]
    assert 'volumeMounts' not in container(ps)
    assert environment_of(obj, worker, 1) == {
        'JOB_COMPLETION_INDEX': '1', 'TFCLUSTER_JOBSET_NAME': 'local2', 'TFCLUSTER_JOBSET_REPLICATED_JOB': 'worker',
        'TFCLUSTER_JOBSET_PS_JOB': 'ps', 'TFCLUSTER_JOBSET_NUM_PS': '1', 'TFCLUSTER_JOBSET_WORKER_JOB': 'worker',
        'TFCLUSTER_JOBSET_NUM_WORKERS': '2', 'TFCLUSTER_JOBSET_PORT': '2222'}


def test_two_ps_and_four_workers(tmp_path):
    spec = tmp_path / 'wide.yaml'
    spec.write_text(yaml.safe_dump({'cluster': {'ps': ['a:1', 'a:2'], 'worker': [f'b:{p}' for p in range(1, 5)]},
                                    'train': {'replicas_to_aggregate': 4}}))
    obj = rendered(str(spec))
    assert [(r['name'], r['template']['spec']['parallelism']) for r in obj['spec']['replicatedJobs']] == \
        [('ps', 2), ('worker', 4)]
    env = environment_of(obj, replicated(obj)['ps'], 1)
    assert place(env).cluster == {'ps': ['wide-ps-0-0.wide:2222', 'wide-ps-0-1.wide:2222'],
                                  'worker': [f'wide-worker-0-{i}.wide:2222' for i in range(4)]}
    assert (env['TFCLUSTER_JOBSET_NUM_PS'], env['TFCLUSTER_JOBSET_NUM_WORKERS']) == ('2', '4')


def test_gpu_towers_ask_each_worker_pod_for_that_many_gpus():
    obj = rendered(LOCAL2, 'train.devices=[gpu:0, gpu:1, cpu:0]')
    assert container(replicated(obj)['worker'])['resources'] == {'limits': {'nvidia.com/gpu': '2'}}
    assert 'resources' not in container(replicated(obj)['ps'])
    assert 'resources' not in container(replicated(rendered(LOCAL2, 'train.devices=2'))['worker'])


def test_pvc_puts_the_train_dir_on_the_claim_and_restarts_resume(caplog):
    obj = rendered(LOCAL2, 'supervise.restart=on-failure', 'supervise.max_restarts=5', 'supervise.preemption_grace=0',
                   pvc='ckpt.team-ml')     # without notices: tests/unit/launch/render/test_preemption.py has them
    worker = replicated(obj)['worker']['template']['spec']['template']['spec']
    assert worker['volumes'] == [{'name': 'train-dir', 'persistentVolumeClaim': {'claimName': 'ckpt.team-ml'}}]
    assert obj['spec']['failurePolicy'] == {'maxRestarts': 5, 'restartStrategy': 'BlockingRecreate'}
    with caplog.at_level(logging.WARNING):
        text = render(load_spec(LOCAL2, ['supervise.restart=on-failure']), Args(pvc='ckpt'))
    assert 'PersistentVolumeClaim ckpt' in prose(text)
    assert 'resumes from the newest checkpoint on the claim' in prose(text)
    assert not caplog.records


def test_restarts_without_a_claim_start_over_and_say_so(caplog):
    with caplog.at_level(logging.WARNING):
        text = render(load_spec(LOCAL2, ['supervise.restart=on-failure']), Args())
    assert 'a restart of the set starts again from step 0' in prose(text)
    assert [r.getMessage() for r in caplog.records] == [
        f'{LOCAL2}: supervise.restart is on-failure but the train_dir is an emptyDir: a restart of the set starts '
        'again from step 0; render with --pvc CLAIM to resume from the checkpoint']


def test_hosts_and_isolation_are_not_used_and_a_warning_says_so(caplog):
    with caplog.at_level(logging.WARNING):
        text = render(load_spec(os.path.join(REPO, 'specs', 'two-hosts.yaml'), ['isolation=none']), Args())
    assert 'node1' not in text[text.index('apiVersion:'):]
    assert [r.getMessage() for r in caplog.records] == [
        f'{REPO}/specs/two-hosts.yaml: hosts not used by a JobSet: Kubernetes places and names the pods']
    assert rendered(LOCAL2, 'isolation=netns')['spec'] == rendered(LOCAL2)['spec']


def test_the_header_shows_the_cluster_every_pod_computes():
    text = render(load_spec(LOCAL2), Args(name='cifar'))
    head = text[:text.index('apiVersion:')]
    assert all(line.startswith('#') for line in head.splitlines())
    obj = yaml.safe_load(text)
    worker = replicated(obj)['worker']
    config = place(environment_of(obj, worker, 1)).tf_config()
    assert f"# worker 1's TF_CONFIG would be: {config}\n" in head
    assert '#   worker: cifar-worker-0-0.cifar:2222, cifar-worker-0-1.cifar:2222\n' in head
    assert 'kubectl apply -f' in head and 'docker push' in head


def test_name_namespace_and_image_options():
    obj = rendered(LOCAL2, name='cifar-run-7', namespace='team-ml', image='registry.example:5000/tfcluster:1.2')
    assert obj['metadata'] == {'name': 'cifar-run-7', 'namespace': 'team-ml'}
    assert {container(r)['image'] for r in obj['spec']['replicatedJobs']} == {'registry.example:5000/tfcluster:1.2'}


@pytest.mark.parametrize('name', ['Local2', 'local_2', '2local', 'local2-', '', 'x' * 47])
def test_a_name_that_is_no_dns_1035_label_or_too_long_is_refused(name):
    with pytest.raises(UsageError, match=r'DNS-1035 label.*at most 46 .*NAME-worker-0-1-xxxxx'):
        jobset(load_spec(LOCAL2), name=name)
    rendered(LOCAL2, name='x' * 46)       # x...x-worker-0-1-abcde: 63 characters


def test_a_long_spec_file_name_is_cut_to_fit(tmp_path):
    path = tmp_path / ('y' * 80 + '.yaml')
    path.write_text(open(LOCAL2).read())
    assert rendered(str(path))['metadata']['name'] == 'y' * 46


@pytest.mark.parametrize('claim', ['Ckpt', 'ckpt_1', '-ckpt', 'ckpt.', 'a..b', 'x' * 254, ''])
def test_a_claim_that_is_no_dns_1123_subdomain_is_refused(claim):
    with pytest.raises(UsageError, match='--pvc .*DNS-1123 subdomain'):
        jobset(load_spec(LOCAL2), pvc=claim)


def test_spec_env_keeps_out_of_the_jobset_variables():
    obj = rendered(LOCAL2, 'env.OMP_NUM_THREADS=4', 'tasks.worker.env.ROLE=w')
    assert container(replicated(obj)['worker'])['env'][-2:] == [{'name': 'OMP_NUM_THREADS', 'value': '4'},
                                                                {'name': 'ROLE', 'value': 'w'}]
    with pytest.raises(SpecError, match='env.TFCLUSTER_JOBSET_PORT: TFCLUSTER_JOBSET_PORT cannot be set'):
        jobset(load_spec(LOCAL2, ['env.TFCLUSTER_JOBSET_PORT=1']))


@pytest.mark.parametrize('train_dir', ['/', '..'])
def test_a_train_dir_that_is_the_pods_root_is_refused(train_dir):
    with pytest.raises(SpecError, match=r'train\.train_dir: is / inside the pods'):
        jobset(load_spec(LOCAL2, [f'train.train_dir={train_dir}']))


def test_the_strict_schema_catches_what_the_api_would_drop():
    """The checks above would see a typo: an unknown field anywhere, a value of the wrong type, a
    field of a subtree tfcluster does not render."""
    good = rendered(LOCAL2)
    for path, key, value in ((['spec'], 'sucessPolicy', {}), (['spec', 'network'], 'enableDnsHostnames', True),
                             (['spec', 'replicatedJobs', 0, 'template', 'spec'], 'parallelizm', 1),
                             (['spec', 'replicatedJobs', 0, 'template', 'spec'], 'selector', {}),
                             (['spec', 'failurePolicy'], 'maxRestarts', '3'), (['status'], 'restarts', 1)):
        bad = copy.deepcopy(good)
        node = bad
        for step in path:
            node = node.setdefault(step, {}) if isinstance(step, str) else node[step]
        node[key] = value
        assert schema_errors(bad), (path, key)
    pod = copy.deepcopy(good['spec']['replicatedJobs'][0]['template']['spec']['template'])
    pod['spec']['containers'][0]['volumeMount'] = []
    with pytest.raises(AssertionError):
        kubernetes_round_trip(pod, 'V1PodTemplateSpec')


def test_every_variable_the_function_reads_is_named_in_the_module():
    assert set(jobset_env.VARIABLES) >= set(pod_env(TFCLUSTER_JOBSET_SUBDOMAIN='s', TFCLUSTER_JOBSET_RESOLVE='r'))
