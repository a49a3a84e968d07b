"""`launch render --format tfjob`: checked against the published TFJob API (the Kubeflow training
SDK's models, as the API server would decode them) and the training operator's own admission rules,
and run: the rendered pods' command lines train a cluster of local processes that get nothing but
the TF_CONFIG the operator would set."""
from __future__ import annotations

import json
import logging
import os
import re
import sys

import pytest
import yaml

from cluster.spec import SpecError, TrainConfig, load_spec
from launch.errors import UsageError
from launch.render.options import RenderOptions
from launch.render.tfjob import render, tfjob
from tests.conftest import REPO, check_trained, free_ports, launch, run_tasks

SPECS = os.path.join(REPO, 'specs')
LOCAL2 = os.path.join(SPECS, 'local2.yaml')
# The operator's rules (training-operator pkg/webhooks, kubeflow.org/v1 types), written out here
# rather than taken from launch/render/tfjob.py, so that a mistake there is not checked against itself.
REPLICA_TYPES = {'Chief', 'PS', 'Worker', 'Evaluator', 'Master'}
RESTART_POLICIES = {'Always', 'OnFailure', 'Never', 'ExitCode'}
CLEAN_POD_POLICIES = {'All', 'Running', 'None'}
DNS1035_LABEL = re.compile(r'^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$')


def api_model(job: dict):
    """Decode `job` into the SDK's KubeflowOrgV1TFJob the way the SDK decodes an API response, with
    client-side validation on (a missing required field raises), and require that encoding the model
    gives `job` back: a field the API does not have (a typo) is dropped by decoding, and a value of
    the wrong type is converted, so either shows up as a difference."""
    from kubeflow.training import KubeflowOrgV1TFJob
    from kubeflow.training.api_client import ApiClient
    from kubernetes.client import Configuration

    class Response:
        data = json.dumps(job)

    assert Configuration.get_default_copy().client_side_validation
    client = ApiClient()
    model = client.deserialize(Response, 'KubeflowOrgV1TFJob')
    assert isinstance(model, KubeflowOrgV1TFJob)
    assert client.sanitize_for_serialization(model) == job
    return model


def check_operator_rules(job: dict) -> None:
    """What the training operator's admission webhook and controller require of a TFJob."""
    assert job['apiVersion'] == 'kubeflow.org/v1' and job['kind'] == 'TFJob'
    name = job['metadata']['name']
    assert DNS1035_LABEL.match(name), name
    specs = job['spec']['tfReplicaSpecs']
    assert specs and set(specs) <= REPLICA_TYPES, set(specs)
    assert len(set(specs) & {'Chief', 'Master'}) <= 1
    assert job['spec']['runPolicy']['cleanPodPolicy'] in CLEAN_POD_POLICIES
    for kind, replica in specs.items():
        assert replica['replicas'] >= 1
        if kind in ('Chief', 'Master'):
            assert replica['replicas'] == 1
        assert replica['restartPolicy'] in RESTART_POLICIES
        containers = replica['template']['spec']['containers']
        assert [c['name'] for c in containers].count('tensorflow') == 1
        assert all(c['image'] for c in containers)
        tf = next(c for c in containers if c['name'] == 'tensorflow')
        assert {'name': 'tfjob-port', 'containerPort': 2222} in tf['ports']
        for index in range(replica['replicas']):     # every pod's service: <name>-<type>-<index>
            assert DNS1035_LABEL.match(f'{name}-{kind.lower()}-{index}')


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


@pytest.mark.slow
def test_bad_name_and_namespace_are_one_line_and_exit_2():
    for option, rule in (('--name=Bad_Name', 'DNS-1035 label'), ('--namespace=Team', 'DNS-1123 label'),
                         ('--image=', 'image reference')):
        result = launch('render', LOCAL2, '--format', 'tfjob', option, timeout=60)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith('launch: error: ') and result.stderr.count('\n') == 1, result.stderr
        assert rule in result.stderr and not result.stdout


@pytest.mark.slow
def test_output_file_holds_a_commented_tfjob(tmp_path):
    out = tmp_path / 'local2-tfjob.yaml'
    result = launch('render', LOCAL2, '--format', 'tfjob', '-o', str(out), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f'wrote {out} (tfjob)\n'
    text = out.read_text()
    assert text == render(load_spec(LOCAL2), None)
    head = text[:text.index('apiVersion:')]
    assert all(line.startswith('#') for line in head.splitlines())
    assert 'kubectl apply' in head and 'docker push' in head and '/tfcluster/runs/local2' in head
    assert yaml.safe_load(text) == tfjob(load_spec(LOCAL2))


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


@pytest.mark.slow
def test_rendered_pods_train_as_the_operator_would_start_them(tmp_path):
    """1 ps and 2 workers run each pod's command and arguments verbatim, with the TF_CONFIG the
    operator would set (localhost ports instead of services) and no spec: all end with 0, and the
    chief wrote its final checkpoint."""
    run = tmp_path / 'run'
    spec = load_spec(LOCAL2, [f'train.train_dir={run}', 'train.steps=20', 'train.batch_size=16'])
    job = tfjob(spec)
    ports = free_ports(3)
    cluster = {'ps': [f'localhost:{ports[0]}'], 'worker': [f'localhost:{p}' for p in ports[1:]]}
    pod_dir = tmp_path / 'pod'          # the image's WORKDIR
    pod_dir.mkdir()
    base_env = {k: v for k, v in os.environ.items()
                if k not in ('TF_CONFIG', 'CLUSTER_SPEC') and not k.startswith('TFCLUSTER_')}
    base_env['PYTHONPATH'] = REPO       # this tree's cluster.task, as the image holds it
    tasks = []
    for kind, replica in job['spec']['tfReplicaSpecs'].items():
        c = replica['template']['spec']['containers'][0]
        assert c['command'][0] == 'python'
        argv = [sys.executable, *c['command'][1:], *c['args']]
        for index in range(replica['replicas']):
            tf_config = {'cluster': cluster, 'task': {'type': kind.lower(), 'index': index}, 'environment': 'cloud'}
            tasks.append((argv, {**base_env, 'TF_CONFIG': json.dumps(tf_config)}))
    check_trained(run, *run_tasks(tasks, cwd=pod_dir), steps=20)


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
