"""`launch render --format tfjob`: checked against the published TFJob API (the Kubeflow training
SDK's models, as the API server would decode them) and the training operator's own admission rules,
and run: the rendered pods' command lines train a cluster of local processes that get nothing but
the TF_CONFIG the operator would set."""
from __future__ import annotations

import json
import logging
import os

import pytest
import yaml

from cluster.spec import SpecError, TrainConfig, load_spec
from launch.errors import UsageError
from launch.render.options import RenderOptions
from launch.render.tfjob import render, tfjob
from tests.harness.tfjob import LOCAL2, SPECS, api_model, check_operator_rules


def rendered(path: str, *overrides: str, **options) -> dict:
    job = tfjob(load_spec(path, list(overrides)), **options)
    api_model(job)
    check_operator_rules(job)
    return job


def container(job: dict, kind: str) -> dict:
    return job['spec']['tfReplicaSpecs'][kind]['template']['spec']['containers'][0]


def settings(job: dict, kind: str) -> dict[str, str]:
    args = container(job, kind)['args']
    assert args[::2] == ['--set'] * (len(args) // 2) and len(args) % 2 == 0, args
    return dict(a.removeprefix('train.').split('=', 1) for a in args[1::2])


def test_local2_is_one_ps_and_two_workers_running_cluster_task():
    job = rendered(LOCAL2)
    assert job['metadata'] == {'name': 'local2'}
    ps, worker = (job['spec']['tfReplicaSpecs'][k] for k in ('PS', 'Worker'))
    assert (ps['replicas'], worker['replicas']) == (1, 2)
    assert ps['restartPolicy'] == worker['restartPolicy'] == 'Never'
    assert job['spec']['runPolicy'] == {'cleanPodPolicy': 'Running'}
    for kind in ('PS', 'Worker'):
        c = container(job, kind)
        assert c['image'] == 'tfcluster:latest'
        assert c['command'] == ['python', '-m', 'cluster.task']
        assert settings(job, kind) == {'steps': '200', 'batch_size': '64', 'train_dir': 'runs/local2'}
        assert 'resources' not in c
    assert container(job, 'Worker')['volumeMounts'] == [{'name': 'train-dir', 'mountPath': '/tfcluster/runs/local2'}]
    assert 'volumeMounts' not in container(job, 'PS')


def test_async_spec_passes_its_settings():
    job = rendered(os.path.join(SPECS, 'local2-async.yaml'))
    assert job['metadata']['name'] == 'local2-async'
    assert settings(job, 'Worker') == {'sync': 'false', 'steps': '200', 'batch_size': '64',
                                       'train_dir': 'runs/local2-async'}


def test_gpu_devices_ask_each_worker_pod_for_that_many_gpus():
    job = rendered(LOCAL2, 'train.devices=[gpu:0, gpu:1, cpu:0]')
    assert container(job, 'Worker')['resources'] == {'limits': {'nvidia.com/gpu': '2'}}
    assert 'resources' not in container(job, 'PS')       # variables live in the ps's host memory
    assert yaml.safe_load(settings(job, 'Worker')['devices']) == ['gpu:0', 'gpu:1', 'cpu:0']


def test_cpu_towers_ask_for_no_gpu():
    job = rendered(LOCAL2, 'train.devices=2')
    assert settings(job, 'Worker')['devices'] == '2'
    assert all('resources' not in container(job, k) for k in ('PS', 'Worker'))


def test_restart_on_failure_is_on_failure_within_the_restart_budget():
    job = rendered(LOCAL2, 'supervise.restart=on-failure', 'supervise.max_restarts=5')
    assert {r['restartPolicy'] for r in job['spec']['tfReplicaSpecs'].values()} == {'OnFailure'}
    assert job['spec']['runPolicy'] == {'cleanPodPolicy': 'Running', 'backoffLimit': 5}


def test_ssh_hosts_and_isolation_are_not_used(tmp_path):
    """The operator places the pods: a spec's hosts and isolation need no change, and nothing of them shows."""
    job = rendered(os.path.join(SPECS, 'two-hosts.yaml'))
    text = yaml.safe_dump(job)
    assert 'node1' not in text and 'ubuntu' not in text
    assert rendered(LOCAL2, 'isolation=netns')['spec'] == rendered(LOCAL2)['spec']


def test_name_namespace_and_image_options():
    job = rendered(LOCAL2, name='cifar-run-7', namespace='team-ml', image='registry.example:5000/tfcluster:1.2')
    assert job['metadata'] == {'name': 'cifar-run-7', 'namespace': 'team-ml'}
    assert {container(job, k)['image'] for k in ('PS', 'Worker')} == {'registry.example:5000/tfcluster:1.2'}


@pytest.mark.parametrize('file, name', [('My Spec_v2.YAML', 'my-spec-v2'), ('2hosts.yaml', 'tf-2hosts'),
                                        ('x' * 80 + '.yaml', 'x' * 54), ('__.yaml', 'tf')])
def test_default_name_is_the_spec_file_name_as_a_dns_label(tmp_path, file, name):
    path = tmp_path / file
    with open(LOCAL2) as src:
        path.write_text(src.read())
    assert rendered(str(path))['metadata']['name'] == name    # 54: local2-worker-1 must stay within 63


@pytest.mark.parametrize('name', ['Local2', 'local_2', '2local', 'local2-', '', 'x' * 55])
def test_a_name_that_is_no_dns_1035_label_or_too_long_is_refused(name):
    with pytest.raises(UsageError, match='DNS-1035 label'):
        tfjob(load_spec(LOCAL2), name=name)


@pytest.mark.parametrize('train_dir', ['/', '..', '/srv/..'])
def test_a_train_dir_that_is_the_pods_root_is_refused(train_dir):
    with pytest.raises(SpecError, match=r'train\.train_dir: is / inside the pods'):
        tfjob(load_spec(LOCAL2, [f'train.train_dir={train_dir}']))


# Values YAML would read as another type if written plainly, and floats PyYAML only reads with a dot.
TRICKY = ['train.learning_rate=0.00001', 'train.data="2024-01-01"', 'train.train_dir="on"', 'train.seed=7',
          'train.devices=[gpu:3, cpu:1]', 'train.deterministic=true', 'train.checkpoint_secs=2.5',
          'train.replicas_to_aggregate=1', 'train.sync=false', 'train.checkpoint_steps=0']


@pytest.mark.parametrize('overrides', [[], TRICKY], ids=['local2', 'tricky-values'])
def test_cluster_task_reads_back_the_same_train_settings(monkeypatch, overrides):
    """Each pod's arguments, read as cluster.task reads them under the operator's TF_CONFIG, give
    the spec's train settings exactly."""
    from cluster import task
    spec = load_spec(LOCAL2, overrides)
    job = rendered(LOCAL2, *overrides)
    cluster = {'ps': ['local2-ps-0.default.svc:2222'],
               'worker': ['local2-worker-0.default.svc:2222', 'local2-worker-1.default.svc:2222']}
    monkeypatch.delenv('CLUSTER_SPEC', raising=False)
    for kind in ('PS', 'Worker'):
        for index in range(job['spec']['tfReplicaSpecs'][kind]['replicas']):
            monkeypatch.setenv('TF_CONFIG', json.dumps({'cluster': cluster, 'environment': 'cloud',
                                                        'task': {'type': kind.lower(), 'index': index}}))
            read, me = task.resolve_task(task.parse_args(container(job, kind)['args']))
            assert read.train == spec.train
            assert (me.job, me.index) == (kind.lower(), index)
    given = {o.split('=')[0].removeprefix('train.') for o in overrides} - {'checkpoint_steps'}   # the default
    assert set(settings(job, 'Worker')) == given | {'steps', 'batch_size', 'train_dir'}
    assert TrainConfig() == load_spec(None, [], cluster=cluster).train


def test_pvc_puts_the_workers_train_dir_on_the_claim():
    """--pvc: the checkpoints outlive the pods, and the header says so instead of how to edit the file."""
    job = rendered(LOCAL2, pvc='ckpt.team-ml')
    pods = {kind: r['template']['spec'] for kind, r in job['spec']['tfReplicaSpecs'].items()}
    assert pods['Worker']['volumes'] == [{'name': 'train-dir', 'persistentVolumeClaim': {'claimName': 'ckpt.team-ml'}}]
    assert 'volumes' not in pods['PS']
    head = ' '.join(line[1:].strip() for line in render(load_spec(LOCAL2), RenderOptions(pvc='ckpt')).splitlines()
                    if line.startswith('#'))
    assert 'on the PersistentVolumeClaim ckpt' in head and 'emptyDir' not in head
    with pytest.raises(UsageError, match="--pvc 'Ckpt': a PersistentVolumeClaim name is a DNS-1123 subdomain"):
        tfjob(load_spec(LOCAL2), pvc='Ckpt')


def test_hosts_and_isolation_are_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        render(load_spec(os.path.join(SPECS, 'two-hosts.yaml')), None)
        render(load_spec(LOCAL2, ['isolation=netns']), None)
    assert [r.getMessage().split(': ', 1)[1] for r in caplog.records] == [
        'hosts not used by a TFJob: Kubernetes places and names the pods',
        'isolation: netns not used by a TFJob: Kubernetes places and names the pods']
