"""Helpers of the tests of tfjob, used by tests/system/launch/render/test_tfjob.py,
tests/unit/launch/render/test_render_roles.py, tests/unit/launch/render/test_tfjob.py: here, since no test
module imports another."""
from __future__ import annotations

import json
import os
import re


from tests.conftest import REPO

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

