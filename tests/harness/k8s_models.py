"""Checks of rendered Kubernetes objects without a cluster, for tests/unit/launch/render/test_jobset.py and
tests/unit/launch/render/test_trainjob.py: the JobSet CRD's published schema made strict, the kubernetes client's
models for what the schema leaves to Kubernetes (object metadata, Job and pod templates), and the
kubeflow-trainer-api package's pydantic models for JobSets, TrainingRuntimes and TrainJobs."""
from __future__ import annotations

import copy
import functools
import json
import os

import yaml

from tests.harness.parts import REPO

SCHEMA = os.path.join(REPO, 'tests', 'data', 'jobset-v1alpha2-schema.yaml')
TRIMMED = 'x-tfcluster-trimmed'
POD_SPEC = 'pod-spec'       # a trimmed subtree the kubernetes client's V1PodSpec validates instead


def _strict(node):
    """The schema with every object that lists its properties closed to others
    (additionalProperties: false), a trimmed subtree refusing any value (false), and the pod
    template's spec left open for the kubernetes models to check."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    if TRIMMED in node:
        return {'type': 'object'} if node[TRIMMED] == POD_SPEC else False
    out = {k: _strict(v) for k, v in node.items()}
    if out.get('type') == 'object' and 'properties' in out and 'additionalProperties' not in out:
        out['additionalProperties'] = False
    return out


@functools.cache
def _validator():
    import jsonschema
    with open(SCHEMA) as f:
        schema = _strict(yaml.safe_load(f))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_errors(obj: dict) -> list[str]:
    """Every place where `obj` breaks the strict JobSet schema, as 'path: message'."""
    return [f'{"/".join(map(str, e.absolute_path))}: {e.message}'
            for e in sorted(_validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))]


def kubernetes_round_trip(obj: dict, type_name: str):
    """Decode `obj` into the kubernetes client's model `type_name` (e.g. 'V1JobTemplateSpec') as
    the client decodes an API response, with client-side validation (a missing required field
    raises), and require that encoding gives `obj` back: a field the API lacks (a typo) is
    dropped by decoding, a value of the wrong type converted, and either shows as a difference."""
    from kubernetes.client import ApiClient, Configuration

    class Response:
        data = json.dumps(obj)

    assert Configuration.get_default_copy().client_side_validation
    client = ApiClient()
    model = client.deserialize(Response, type_name)
    assert client.sanitize_for_serialization(model) == obj, type_name
    return model


def trainer_round_trip(obj: dict, model_name: str):
    """The same with the kubeflow-trainer-api models (pydantic, strict types): `from_dict`
    ignores unknown fields, so `to_dict` must give `obj` back."""
    from kubeflow_trainer_api import models
    model = getattr(models, model_name).from_dict(copy.deepcopy(obj))
    assert model.to_dict() == obj, model_name
    return model


def pod_templates(jobset_spec: dict) -> list[dict]:
    return [r['template']['spec']['template'] for r in jobset_spec['replicatedJobs']]


def check_jobset_spec(jobset_spec: dict) -> None:
    """A JobSet spec (a JobSet's, or a runtime's template) as the API would take it."""
    errors = schema_errors({'apiVersion': 'jobset.x-k8s.io/v1alpha2', 'kind': 'JobSet', 'spec': jobset_spec})
    assert not errors, '\n'.join(errors)
    for rjob in jobset_spec['replicatedJobs']:
        kubernetes_round_trip(rjob['template'], 'V1JobTemplateSpec')
    for template in pod_templates(jobset_spec):
        kubernetes_round_trip(template, 'V1PodTemplateSpec')
    trainer_round_trip(jobset_spec, 'JobsetV1alpha2JobSetSpec')
