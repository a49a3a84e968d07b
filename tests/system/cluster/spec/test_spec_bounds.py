"""Inputs that cannot work are refused up front, in one line (issue 19): a spec file too big to be
one (or a device that never ends), YAML aliases that expand without bound, bytes that are not
UTF-8, a batch no memory here can hold, and a `train.program` that is not a function of a context.
The fast tests call the pure parts; the slow ones run the real `launch up` (memory-capped, so the
old behaviour fails the test instead of eating the machine) and a worker started by hand."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from tests.conftest import REPO, launch, project_processes
from tests.harness.spec_bounds import _laughs, _valid, _write


# ---------------------------------------------------------------------------------------------
# Through the real command lines

def _capped():
    """The launcher's address space capped at 2 GiB: the old reader of a billion laughs grew by
    ~160 MB/s until killed; capped, it fails at once instead of eating the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _refused(tmp_path, argv, expected, code=2, timeout=60):
    before = set(os.listdir(tmp_path))
    result = launch(*argv, cwd=str(tmp_path), timeout=timeout, preexec_fn=_capped)
    lines = result.stderr.splitlines()
    assert result.returncode == code, result.stdout + result.stderr
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert set(os.listdir(tmp_path)) == before, 'a refused command wrote files'
    assert not project_processes()
    return lines[0]


@pytest.mark.slow
def test_launch_up_refuses_a_billion_laughs(tmp_path):
    spec = _write(tmp_path, _laughs(9))
    line = _refused(tmp_path, ['up', spec], 'once its YAML aliases (*name) are expanded')
    assert line.startswith(f'launch: error: {spec}:6: f: holds 597,871 values')


@pytest.mark.slow
def test_launch_up_refuses_dev_zero(tmp_path):
    _refused(tmp_path, ['up', '/dev/zero'], '/dev/zero: more than 1,048,576 bytes (1 MiB) to read')


@pytest.mark.slow
def test_launch_up_refuses_a_batch_no_memory_here_holds(tmp_path):
    spec = _valid(tmp_path, batch_size=10_000_000)
    line = next(i for i, text in enumerate(open(spec), 1) if 'batch_size' in text)
    _refused(tmp_path, ['up', spec], f'{spec}:{line}: train.batch_size: a batch of 10,000,000 needs at least')
    assert not os.path.exists(tmp_path / 'run')


@pytest.mark.slow
def test_launch_up_refuses_a_builtin_as_the_program(tmp_path):
    spec = _valid(tmp_path, program='os:system')
    _refused(tmp_path, ['up', spec], "train.program: module 'os' has no Python source (frozen)")


@pytest.mark.slow
def test_a_worker_refuses_a_batch_its_host_cannot_hold(tmp_path):
    """On its own host (no launcher checked it): one line and exit 3, no restart can help."""
    spec = _valid(tmp_path, batch_size=10_000_000)
    result = subprocess.run([sys.executable, '-m', 'cluster.task', '--spec', spec, '--job', 'worker', '--index', '0'],
                            cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 3, output
    errors = [line for line in output.splitlines() if 'train.batch_size' in line]
    assert len(errors) == 1 and "worker:0's host" in errors[0] and 'a batch of 10,000,000 needs' in errors[0], output
    assert 'Traceback' not in output and not os.path.exists(tmp_path / 'run' / 'checkpoint')


@pytest.mark.slow
def test_a_worker_refuses_an_imported_builtin_before_calling_it(tmp_path):
    (tmp_path / 'mytrain.py').write_text('from os import system as train\n')
    spec = _valid(tmp_path, program='mytrain:train')
    result = subprocess.run([sys.executable, '-m', 'cluster.task', '--spec', spec, '--job', 'worker', '--index', '0'],
                            cwd=str(tmp_path), capture_output=True, text=True, timeout=180,
                            env=dict(os.environ, PYTHONPATH=REPO))
    assert result.returncode == 2, result.stdout + result.stderr
    assert 'cluster.task: error: ' in result.stderr and 'Traceback' not in result.stderr
    assert 'train.program: mytrain.train is a built-in function, not a Python def' in result.stderr

