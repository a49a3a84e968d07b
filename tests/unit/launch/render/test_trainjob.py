"""`launch render --format trainjob`: the TrainingRuntime and TrainJob against the
kubeflow-trainer-api package's models, the runtime's JobSet template against the JobSet CRD's
schema made strict, and Kubeflow Trainer's own rules for a runtime, written out here from its
sources (pkg/webhooks/trainingruntime_webhook.go, pkg/runtime/core/trainingruntime.go, the plainml
and jobset plugins) rather than taken from launch/render/trainjob.py."""
from __future__ import annotations

import logging
import os

import pytest
import yaml

from cluster.env.jobset import place
from cluster.spec import load_spec
from launch.errors import UsageError
from launch.render.trainjob import objects, render
from tests.conftest import REPO
from tests.harness.k8s_models import check_jobset_spec, kubernetes_round_trip, trainer_round_trip
from tests.harness.jobset import Args, check_jobset_rules, container, environment_of, prose
from tests.harness.trainjob import check_trainer_rules

LOCAL2 = os.path.join(REPO, 'specs', 'local2.yaml')


def rendered(*overrides: str, **options) -> tuple[dict, dict]:
    runtime, train_job = objects(load_spec(LOCAL2, list(overrides)), **options)
    trainer_round_trip(runtime, 'TrainerV1alpha1TrainingRuntime')
    trainer_round_trip(train_job, 'TrainerV1alpha1TrainJob')
    for obj in (runtime, train_job):
        kubernetes_round_trip(obj['metadata'], 'V1ObjectMeta')
    check_jobset_spec(runtime['spec']['template']['spec'])
    check_trainer_rules(runtime, train_job)
    # the JobSet the Trainer makes of them: the TrainJob's name, the runtime's template
    jobset = {'apiVersion': 'jobset.x-k8s.io/v1alpha2', 'kind': 'JobSet', 'metadata': train_job['metadata'],
              'spec': runtime['spec']['template']['spec']}
    check_jobset_rules(jobset)
    return runtime, train_job


def test_local2_is_a_ps_job_and_the_workers_as_the_trainer_node_job():
    runtime, train_job = rendered()
    assert runtime['metadata'] == train_job['metadata'] == {'name': 'local2'}
    rjobs = {r['name']: r for r in runtime['spec']['template']['spec']['replicatedJobs']}
    assert list(rjobs) == ['ps', 'node']
    assert [r['template']['spec']['parallelism'] for r in rjobs.values()] == [1, 2]
    assert [container(r)['name'] for r in rjobs.values()] == ['tfcluster', 'node']
    assert runtime['spec']['template']['spec']['successPolicy'] == {'operator': 'All', 'targetReplicatedJobs': ['node']}
    jobset = {'metadata': train_job['metadata']}
    worker = place(environment_of(jobset, rjobs['node'], 1))
    assert (worker.job, worker.index) == ('worker', 1)
    assert worker.cluster == {'ps': ['local2-ps-0-0.local2:2222'],
                              'worker': ['local2-node-0-0.local2:2222', 'local2-node-0-1.local2:2222']}
    assert place(environment_of(jobset, rjobs['ps'], 0)).job == 'ps'


def test_gpus_pvc_namespace_and_restarts():
    runtime, train_job = rendered('train.devices=[gpu:0]', 'supervise.restart=on-failure',
                                  'supervise.preemption_grace=0', pvc='ckpt',     # notices: test_preemption.py
                                  namespace='team-ml', name='cifar', image='reg.example/tfcluster:2')
    assert runtime['metadata'] == train_job['metadata'] == {'name': 'cifar', 'namespace': 'team-ml'}
    template = runtime['spec']['template']['spec']
    node = template['replicatedJobs'][1]
    assert container(node)['resources'] == {'limits': {'nvidia.com/gpu': '1'}}
    assert 'resources' not in container(template['replicatedJobs'][0])
    assert node['template']['spec']['template']['spec']['volumes'] == [
        {'name': 'train-dir', 'persistentVolumeClaim': {'claimName': 'ckpt'}}]
    assert template['failurePolicy'] == {'maxRestarts': 3, 'restartStrategy': 'BlockingRecreate'}
    assert {container(r)['image'] for r in template['replicatedJobs']} == {'reg.example/tfcluster:2'}


def test_the_name_must_leave_room_for_the_node_pods():
    rendered(name='x' * 48)                 # x...x-node-0-1-abcde: 63 characters
    with pytest.raises(UsageError, match=r'TrainJob name must be a DNS-1035 label.*at most 48'):
        objects(load_spec(LOCAL2), name='x' * 49)


def test_the_file_is_the_runtime_then_the_trainjob_with_a_header(caplog):
    with caplog.at_level(logging.WARNING):
        text = render(load_spec(LOCAL2), Args())
    runtime, train_job = yaml.safe_load_all(text)
    assert (runtime, train_job) == objects(load_spec(LOCAL2))
    assert 'a TrainJob cannot set the ps count' in prose(text)
    assert 'kubectl delete trainjob local2 && kubectl delete trainingruntime local2' in text
    assert not caplog.records
