"""`launch render --format tfjob`: checked against the published TFJob API (the Kubeflow training
SDK's models, as the API server would decode them) and the training operator's own admission rules,
and run: the rendered pods' command lines train a cluster of local processes that get nothing but
the TF_CONFIG the operator would set."""
from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from cluster.spec import load_spec
from launch.render.tfjob import render, tfjob
from tests.conftest import REPO, check_trained, free_ports, launch, run_tasks
from tests.harness.tfjob import LOCAL2


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

