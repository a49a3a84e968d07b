"""Helpers of the tests of jobset, used by
tests/system/launch/render/test_jobset.py, tests/system/launch/render/test_render_roles.py,
tests/unit/launch/render/test_jobset.py, tests/unit/launch/render/test_render_roles.py,
tests/unit/launch/render/test_trainjob.py: here, since no test module imports another."""
from __future__ import annotations

import os
import re


from tests.conftest import REPO
from tests.harness.k8s_models import check_jobset_spec, kubernetes_round_trip, schema_errors, trainer_round_trip

LOCAL2 = os.path.join(REPO, 'specs', 'local2.yaml')
# JobSet's own rules (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_webhook.go), written out
# here rather than taken from launch/render/jobset.py, so that a mistake there is not checked against itself.
DNS1035_LABEL = re.compile(r'^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$')
POD_NAME_SUFFIX = '-abcde'      # the webhook checks a pod name with five random characters added


# -- the renderer ----------------------------------------------------------------------------------
def container(rjob: dict) -> dict:
    return rjob['template']['spec']['template']['spec']['containers'][0]


def environment_of(obj: dict, rjob: dict, index: int) -> dict[str, str]:
    """What pod `index` of a replicated job sees: the rendered values, its labels through the
    downward API as the JobSet controller sets them, and the Indexed Job's completion index."""
    labels = {'jobset.sigs.k8s.io/jobset-name': obj['metadata']['name'],
              'jobset.sigs.k8s.io/replicatedjob-name': rjob['name']}
    env = {'JOB_COMPLETION_INDEX': str(index)}
    for var in container(rjob)['env']:
        if 'value' in var:
            env[var['name']] = var['value']
        else:
            path = var['valueFrom']['fieldRef']['fieldPath']
            env[var['name']] = labels[re.fullmatch(r"metadata\.labels\['(.+)'\]", path).group(1)]
    return env


def check_jobset_rules(obj: dict) -> None:
    """What JobSet's admission webhook requires, and what the layout relies on."""
    assert obj['apiVersion'] == 'jobset.x-k8s.io/v1alpha2' and obj['kind'] == 'JobSet'
    name, spec = obj['metadata']['name'], obj['spec']
    assert DNS1035_LABEL.match(name), name          # also the headless service: the default subdomain
    names = [r['name'] for r in spec['replicatedJobs']]
    assert len(set(names)) == len(names)
    assert set(spec['successPolicy'].get('targetReplicatedJobs', [])) <= set(names)
    assert spec['network']['enableDNSHostnames'] is True
    for rjob in spec['replicatedJobs']:
        job = rjob['template']['spec']
        assert DNS1035_LABEL.match(f'{name}-{rjob["name"]}-{rjob["replicas"] - 1}')
        assert job['completionMode'] == 'Indexed' and job['completions'] == job['parallelism'] >= 1
        longest = f'{name}-{rjob["name"]}-{rjob["replicas"] - 1}-{job["completions"] - 1}'
        assert DNS1035_LABEL.match(longest + POD_NAME_SUFFIX), longest
        assert job['template']['spec']['restartPolicy'] in ('Never', 'OnFailure')


def validated(obj: dict) -> dict:
    """A rendered JobSet, checked against the CRD's schema, Kubernetes' and the trainer SDK's
    models and JobSet's own rules; returned as it is."""
    assert not schema_errors(obj), schema_errors(obj)
    check_jobset_spec(obj['spec'])
    kubernetes_round_trip(obj['metadata'], 'V1ObjectMeta')
    trainer_round_trip(obj, 'JobsetV1alpha2JobSet')
    check_jobset_rules(obj)
    return obj


def prose(text: str) -> str:
    """A rendered file's comment header as one line of text (its paragraphs are wrapped)."""
    return ' '.join(line[1:].strip() for line in text.splitlines() if line.startswith('#'))


class Args:
    """The render command's options, as argparse gives them."""
    def __init__(self, name=None, image=None, namespace=None, pvc=None):
        self.name, self.image, self.namespace, self.pvc = name, image, namespace, pvc

