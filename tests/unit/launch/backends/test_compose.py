"""The compose backend: the rendered file (pure, fast) and real compose clusters on a real Docker
engine (tests/harness/dockerd.py starts one if none runs; the image is built once, cached by its inputs).

Every engine test checks afterwards that no container, network or volume of its compose project
is left (by the project's label), on top of conftest's check that no task process survives.
"""
from __future__ import annotations

import json
import os

import yaml

from tests.conftest import write_spec
from tests.harness.compose import COMPOSE_LOCAL2, rendered


def test_one_service_per_task_named_for_it_on_the_spec_ports_and_an_internal_network_only():
    doc = yaml.safe_load(open(COMPOSE_LOCAL2))
    services = doc['services']
    assert list(services) == ['ps-0', 'worker-0', 'worker-1']
    assert doc['networks'] == {'tasks': {'internal': True}}
    for name, port in (('ps-0', 2222), ('worker-0', 2223), ('worker-1', 2224)):
        s = services[name]
        assert 'ports' not in s and s['expose'] == [str(port)]      # nothing published on the host
        assert s['networks'] == ['tasks'] and s['hostname'] == name and s['init'] is True
        cluster = json.loads(s['environment']['TF_CONFIG'])['cluster']
        assert cluster == {'ps': ['ps-0:2222'], 'worker': ['worker-0:2223', 'worker-1:2224']}
        assert yaml.safe_load(s['environment']['TFCLUSTER_SPEC'])['cluster'] == cluster
        assert s['volumes'] == ['./runs/local2:/tfcluster/runs/local2']    # relative to --project-directory
        test = s['healthcheck']['test']
        assert test[:3] == ['CMD', 'python', '-c'] and f"'localhost', {port}" in test[3]
    # The planner's command line, with the container's Python, and its log on the train_dir mount.
    assert services['worker-1']['command'] == ['python', '-m', 'cluster.task', '--spec', 'runs/local2/spec.yaml',
                                               '--job', 'worker', '--index', '1']
    assert services['worker-1']['entrypoint'][3:] == ['runs/local2/logs/worker-1.log', 'runs/local2/spec.yaml']


def test_dollars_in_the_spec_reach_the_task_unexpanded(tmp_path):
    spec = write_spec(tmp_path, train_dir=str(tmp_path / 'run$HOME'))
    env = rendered(spec)['services']['ps-0']['environment']
    # compose reads $$ as one $: the text as compose hands it on is the spec's own
    assert yaml.safe_load(env['TFCLUSTER_SPEC'].replace('$$', '$'))['train']['train_dir'] == str(tmp_path / 'run$HOME')


def test_the_backend_finds_the_build_script_of_this_checkout():
    """The script's path is computed from the backend module's place in the tree."""
    from launch.backends import compose
    assert os.path.isfile(compose.BUILD_SCRIPT), compose.BUILD_SCRIPT

