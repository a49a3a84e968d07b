"""Preemption on a real compose cluster (#41): `docker kill --signal TERM` to the TF1 chief's container is
the notice a node drain would send (no stop mark: the launcher did not stop it). With `max_restarts: 0`
the chief saves at once and leaves "preempted" (200, read back by `docker inspect`), the cluster resumes
from that checkpoint, and the run ends done at its last step with one preemption and no failure; the
launcher's own stops (the restart's teardown, the end) are marked and say no notice."""
from __future__ import annotations

import glob
import json
import os

import pytest

from cluster.runtime import rundir
from tests.conftest import launch_bg, write_spec
from tests.harness.dockerd import docker, project_leftovers
from tests.harness.faults import finish, until_step
from tests.harness.local import checkpoint_step

pytestmark = pytest.mark.slow     # a real Docker engine, the image of this tree

NOTICE = 'preemption notice (SIGTERM from outside the launcher)'


def container(project: str, service: str) -> str:
    out = docker('ps', '-q', '--filter', f'label=com.docker.compose.project={project}',
                 '--filter', f'label=com.docker.compose.service={service}')
    assert out.stdout.strip(), f'no running container for {service} of {project}'
    return out.stdout.split()[0]


def test_a_sigterm_to_the_chiefs_container_is_a_preemption_not_a_fault(tmp_path, compose_project):
    spec = write_spec(tmp_path, steps=300, checkpoint_secs=600,
                      supervise={'restart': 'on-failure', 'max_restarts': 0, 'backoff_secs': 5})
    project = compose_project(spec)
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec, '--backend', 'compose')
    try:
        lines = until_step(proc, 20)
        killed = docker('kill', '--signal', 'TERM', container(project, 'worker-0'))
    finally:
        out = finish(proc, 400)
    out = ''.join(lines) + out
    assert killed.returncode == 0, killed.stderr
    assert not project_leftovers(project)
    assert proc.returncode == 0, out
    with open(os.path.join(run, 'run.json')) as f:
        result = json.load(f)
    assert (result['state'], result['restarts'], result['failures'], result.get('preemptions')) == \
        ('done', 0, [], 1), result
    assert checkpoint_step(run) >= 300
    with open(os.path.join(run, 'events.jsonl')) as f:
        log = [json.loads(line) for line in f]
    assert [e['task'] for e in log if e['event'] == 'preempted'] == ['worker:0'], log
    assert not [e for e in log if e['event'] == 'task_lost'], log
    chief = rundir.read_text(rundir.attempt_log_path(run, 1, 'worker', 0)) or ''
    assert NOTICE in chief and 'preemption notice received: saved a checkpoint at global step' in chief, chief
    logs = {p: rundir.read_text(p) or '' for p in glob.glob(os.path.join(run, 'logs', 'attempt-*', '*.log'))}
    assert [os.path.basename(os.path.dirname(p)) + '/' + os.path.basename(p)
            for p, text in logs.items() if NOTICE in text] == ['attempt-1/worker-0.log'], out
    recovered = [e for e in log if e['event'] == 'recovered']
    assert recovered and recovered[0].get('preempted') is True and 'save' in recovered[0]['phases'], recovered
    print('recovered:', recovered[0])
