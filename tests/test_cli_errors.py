"""Bad input through the real command lines: one line naming file/key/task, exit 2, nothing started."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO, launch, project_processes, write_spec

BAD_SPECS = {
    'yaml syntax': ('cluster:\n  ps: [localhost:2222\n', 'YAML syntax error'),
    'unknown key': ('cluster:\n  ps: [localhost:1]\n  worker: [localhost:2]\ntrain:\n  stesp: 5\n',
                    'spec.yaml:5: train.stesp: unknown key'),
    'no worker job': ('cluster:\n  ps: [localhost:1]\n', "cluster.worker: missing job 'worker'"),
    'malformed address': ('cluster:\n  ps: [localhost:1]\n  worker: [localhost]\n',
                          'spec.yaml:3: cluster.worker[0]: expected "host:port"'),
    'port out of range': ('cluster:\n  ps: [localhost:1]\n  worker: [localhost:70000]\n',
                          'port must be between 1 and 65535'),
    'same address twice': ('cluster:\n  ps: [localhost:2001]\n  worker: [localhost:2001]\n', 'is used twice'),
}


@pytest.mark.parametrize('case', sorted(BAD_SPECS))
def test_bad_spec_is_one_line_exit_2(tmp_path, case):
    text, expected = BAD_SPECS[case]
    spec = tmp_path / 'spec.yaml'
    spec.write_text(text)
    result = launch('up', str(spec), timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count('\n') == 1 and expected in result.stderr, result.stderr
    assert str(spec) in result.stderr
    assert os.listdir(tmp_path) == ['spec.yaml']


def test_missing_spec_file(tmp_path):
    result = launch('up', str(tmp_path / 'nope.yaml'), timeout=60)
    assert result.returncode == 2 and 'nope.yaml: spec file not found' in result.stderr


@pytest.mark.parametrize('override,expected', [
    ('train.steps', 'expected dotted.key=value'),
    ('train.steps=', 'missing value'),
    ('train.steps=abc', '--set train.steps=abc: train.steps: expected a positive whole number'),
    ('train.stpes=5', '--set train.stpes=5: train.stpes: unknown key'),
])
def test_bad_set(tmp_path, override, expected):
    spec = write_spec(tmp_path)
    result = launch('up', spec, '--set', override, timeout=60)
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert not os.path.exists(tmp_path / 'run')


def test_local_port_in_use_names_the_task(tmp_path):
    spec = write_spec(tmp_path)
    import yaml
    port = int(yaml.safe_load(open(spec))['cluster']['worker'][1].split(':')[1])
    with socket.socket() as s:
        s.bind(('', port))
        s.listen()
        result = launch('up', spec, timeout=60)
    assert result.returncode == 2
    assert f'worker:1: port {port} on localhost is already in use' in result.stderr
    assert not os.path.exists(tmp_path / 'run')
    assert not project_processes()


def test_task_index_out_of_range(tmp_path):
    spec = write_spec(tmp_path)
    result = subprocess.run([sys.executable, '-m', 'cluster.task', '--spec', spec, '--job', 'ps', '--index', '1'],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert 'task ps:1 does not exist' in result.stderr and result.stderr.count('\n') == 1


def test_missing_data_dir_is_refused_before_anything_starts(tmp_path):
    spec = write_spec(tmp_path, data=str(tmp_path / 'no-such-data'))
    result = launch('up', spec, timeout=60)
    assert result.returncode == 2 and 'train.data' in result.stderr and 'no-such-data' in result.stderr
    assert not os.path.exists(tmp_path / 'run')


def test_plan_prints_every_task_without_starting_anything(tmp_path):
    spec = write_spec(tmp_path)
    result = launch('plan', spec, timeout=60)
    assert result.returncode == 0
    for name in ('ps:0', 'worker:0', 'worker:1'):
        assert name in result.stdout
    assert 'TF_CONFIG=' in result.stdout and '-m cluster.task' in result.stdout
    assert not os.path.exists(tmp_path / 'run')
