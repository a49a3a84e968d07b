"""The compose backend: the rendered file (pure, fast) and real compose clusters on a real Docker
engine (tests/harness/dockerd.py starts one if none runs; the image is built once, cached by its inputs).

Every engine test checks afterwards that no container, network or volume of its compose project
is left (by the project's label), on top of conftest's check that no task process survives.
"""
from __future__ import annotations

import os
import re
import subprocess
import time

import pytest
import yaml

from cluster.spec import load_spec
from launch.backends.compose import project_name
from launch.records.events import read_events
from tests.conftest import TASK_ENV, environment_words, launch, launch_bg, read_until, write_spec
from tests.harness.dockerd import docker, project_leftovers
from tests.harness.local import checkpoint_step, worker_results
from tests.harness.compose import COMPOSE_LOCAL2, rendered


# -- the file: pure, no engine -------------------------------------------------------------

@pytest.mark.slow
def test_the_kept_compose_file_is_what_launch_compose_writes(tmp_path):
    out = launch('compose', 'specs/local2.yaml', '-o', str(tmp_path / 'c.yaml'))
    assert out.returncode == 0, out.stderr
    with open(COMPOSE_LOCAL2) as kept:
        assert (tmp_path / 'c.yaml').read_text() == kept.read(), \
            'docker/compose.local2.yaml is stale: launch compose specs/local2.yaml -o docker/compose.local2.yaml'
    assert launch('compose', 'specs/local2.yaml').stdout == (tmp_path / 'c.yaml').read_text()


@pytest.mark.slow
def test_any_spec_maps_to_services_and_absolute_dirs_mount_at_the_same_path(tmp_path):
    spec = write_spec(tmp_path, workers=3, task_hosts=['node1', 'node1', 'node2', 'node3'],
                      hosts={'node1': {'user': 'u'}}, data=str(tmp_path))
    doc = rendered(spec)
    assert list(doc['services']) == ['ps-0', 'worker-0', 'worker-1', 'worker-2']
    run = str(tmp_path / 'run')
    assert doc['services']['worker-2']['volumes'] == [f'{run}:{run}', f'{tmp_path}:{tmp_path}:ro']
    assert 'hosts' not in yaml.safe_load(doc['services']['ps-0']['environment']['TFCLUSTER_SPEC'])
    out = launch('plan', spec, '--backend', 'compose')
    assert out.returncode == 0, out.stderr
    assert 'compose service worker-2, was node3:' in out.stdout and 'ssh' not in out.stdout


# -- bad input: one line, exit 2, nothing left ---------------------------------------------

def _one_error_line(out: subprocess.CompletedProcess) -> str:
    errors = [line for line in out.stderr.splitlines() if line.startswith('launch: error:')]
    assert out.returncode == 2 and len(errors) == 1, out.stdout + out.stderr
    return errors[0]


@pytest.mark.slow
def test_no_docker_client_is_one_line(tmp_path):
    spec = write_spec(tmp_path)
    out = launch('up', spec, '--backend', 'compose', env={**os.environ, 'PATH': str(tmp_path)})
    line = _one_error_line(out)
    assert 'no docker command on PATH' in line and 'apt-get install docker.io' in line
    assert not os.path.exists(tmp_path / 'run' / 'launch-state.json')


@pytest.mark.slow
def test_an_unreachable_engine_is_one_line(tmp_path):
    spec = write_spec(tmp_path)
    dead = f'unix://{tmp_path}/no-engine.sock'
    out = launch('up', spec, '--backend', 'compose', env={**os.environ, 'DOCKER_HOST': dead})
    line = _one_error_line(out)
    assert f'the Docker engine at {dead} is not reachable' in line and 'start it' in line
    assert not os.path.exists(tmp_path / 'run')


@pytest.mark.slow
def test_no_compose_tool_is_one_line(tmp_path, docker_engine):
    spec = write_spec(tmp_path)
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    os.symlink(subprocess.check_output(['sh', '-c', 'command -v docker'], text=True).strip(), bin_dir / 'docker')
    out = launch('up', spec, '--backend', 'compose', env={**os.environ, 'PATH': str(bin_dir)})
    line = _one_error_line(out)
    assert 'no Compose tool' in line and 'apt-get install docker-compose' in line
    assert not os.path.exists(tmp_path / 'run')


@pytest.mark.slow
def test_an_image_build_failure_is_one_line_and_leaves_nothing(tmp_path, docker_engine):
    spec = write_spec(tmp_path)
    repo = f'tfc-test-broken-{os.getpid()}'
    # A mirror nobody serves (on this machine), so the base image cannot be made.
    env = {**os.environ, 'TFCLUSTER_IMAGE_REPO': repo, 'DEBIAN_MIRROR': 'http://127.0.0.1:9/debian'}
    out = launch('up', spec, '--backend', 'compose', env=env, timeout=300)
    line = _one_error_line(out)
    assert 'building the image with docker/build-offline.sh failed' in line, line
    assert 'mmdebstrap failed' in out.stderr or 'debootstrap failed' in out.stderr
    assert not docker('images', '-q', '--filter', f'reference={repo}*').stdout.strip()
    assert not project_leftovers(project_name(load_spec(spec)))


# -- real compose clusters -------------------------------------------------------------------

def _ports(spec_file: str) -> list[int]:
    return [t.port for t in load_spec(spec_file).tasks]


def _container(project: str, service: str) -> str:
    out = docker('ps', '-q', '--filter', f'label=com.docker.compose.project={project}',
                 '--filter', f'label=com.docker.compose.service={service}')
    assert out.stdout.strip(), f'no running container for {service} of {project}'
    return out.stdout.split()[0]


@pytest.mark.slow
def test_a_sync_compose_cluster_trains_evaluates_and_resumes(tmp_path, compose_project):
    """... with the spec's env: in every container, as the compose file gives it."""
    spec = write_spec(tmp_path, steps=20, top=TASK_ENV)
    project = compose_project(spec)
    out = launch('up', spec, '--backend', 'compose')
    assert out.returncode == 0, out.stdout + out.stderr
    for task, job in (('ps:0', 'ps'), ('worker:1', 'worker')):
        said = next(x for x in out.stdout.splitlines() if f'{task}: environment:' in x)
        assert said.split(' environment: ')[1] == ' '.join(environment_words(job)), said
    assert '[worker:1]' in out.stdout and '[ps:0]' in out.stdout and 'step 20/20' in out.stdout
    assert 'all 3 servers are up' in out.stdout and 'serving on worker-1:' in out.stdout
    assert not project_leftovers(project)
    train_dir = str(tmp_path / 'run')
    for r in worker_results(train_dir):         # written in the containers, read on the host
        assert r['local_steps'] == 20 and r['global_step'] == 20 and r['applied_at'] == [[0, 19]]
    assert not os.path.exists(tmp_path / 'run' / 'launch-state.json')

    evaluation = launch('eval', spec)           # on the host, from the containers' checkpoint
    assert evaluation.returncode == 0, evaluation.stderr
    assert 'at global step 20' in evaluation.stdout
    logs = launch('logs', spec, 'worker:1')
    assert logs.returncode == 0 and 'done: 20 local steps' in logs.stdout

    again = launch('up', spec, '--backend', 'compose', '--set', 'train.steps=30')    # resume
    assert again.returncode == 0, again.stdout + again.stderr
    assert 'at global step 20' in again.stdout and 'step 30/30' in again.stdout
    assert checkpoint_step(train_dir) == 30
    # Both attempts' logs are kept, and the event log tells both, as for local processes.
    assert 'step 20/20' in open(os.path.join(train_dir, 'logs', 'attempt-1', 'worker-0.log')).read()
    assert 'step 30/30' in open(os.path.join(train_dir, 'logs', 'worker-0.log')).read()
    events = read_events(os.path.join(train_dir, 'events.jsonl'))
    assert [(e['attempt'], e['event']) for e in events if e['event'] in ('run_started', 'finished')] == \
        [(1, 'run_started'), (1, 'finished'), (2, 'run_started'), (2, 'finished')]
    started = [e for e in events if e['event'] == 'task_started']
    assert len(started) == 6 and all(e.get('container') for e in started), started


@pytest.mark.slow
def test_killing_the_non_chief_worker_of_an_async_cluster(tmp_path, compose_project):
    # The kill waits for the launcher's word that every server is up: training may start before it
    # says so, and a task lost while a cluster starts ends a first start (it is no steady-state fault).
    spec = write_spec(tmp_path, sync=False, steps=600, learning_rate=0.05)
    project = compose_project(spec)
    proc = launch_bg('up', spec, '--backend', 'compose')
    try:
        read_until(proc, 'servers are up')
        assert docker('kill', _container(project, 'worker-1')).returncode == 0
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert not project_leftovers(project)
    assert proc.returncode == 0, out
    assert 'worker:1 was killed by SIGKILL; training goes on with 1 worker(s)' in out
    assert 'step 600/600' in out or checkpoint_step(str(tmp_path / 'run')) >= 600, out


@pytest.mark.slow
def test_a_worker_cut_off_the_network_does_not_hang_the_launcher(tmp_path, compose_project):
    """Sync training stops when worker 1 is cut off; the stall watchdog (or worker 1 giving up on
    its peers first) ends the run with one line naming it, the chief checkpoints, nothing is left."""
    spec = write_spec(tmp_path, steps=100000, supervise={'stall_secs': 8})
    project = compose_project(spec)
    proc = launch_bg('up', spec, '--backend', 'compose')
    try:
        read_until(proc, '  loss ')
        status = launch('status', spec)       # no --backend: the state file says compose
        rows = [line.split() for line in status.stdout.splitlines() if line.startswith(('ps:', 'worker:'))]
        assert [r[1:3] + r[4:] for r in rows] == [[f'{n}:{p}', 'compose', 'yes', 'yes'] for n, p in
                                                  zip(('ps-0', 'worker-0', 'worker-1'), _ports(spec))], status.stdout
        network = docker('network', 'ls', '-q', '--filter', f'label=com.docker.compose.project={project}').stdout
        cut = docker('network', 'disconnect', network.split()[0], _container(project, 'worker-1'))
        assert cut.returncode == 0, cut.stderr
        t0 = time.monotonic()       # sync training is now stuck: the chief waits for worker 1's gradients
        out, _ = proc.communicate(timeout=180)
        stopped = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 1, out
    error = [line for line in out.splitlines() if line.startswith('[launch]   error:')]
    assert len(error) == 1 and 'worker:1' in error[0], out
    assert re.search(r'stall: .*worker:1 does not answer|worker:1 .*exited with code 1', error[0]), error
    assert stopped < 8 + 60, f'the launcher took {stopped:.0f}s to stop'
    assert not project_leftovers(project), out


@pytest.mark.slow
def test_a_killed_launcher_leaves_no_containers_or_network_for_long(tmp_path, compose_project):
    """kill -9 of `launch up`: the tasks stop by their lease, and the next `launch status` removes
    the exited containers and the project's network (idempotently), saying so."""
    spec = write_spec(tmp_path, steps=100000)
    project = compose_project(spec)
    proc = launch_bg('up', spec, '--backend', 'compose')
    try:
        read_until(proc, '  loss ')
        proc.kill()
        proc.wait()
    finally:
        proc.kill()
    deadline = time.monotonic() + 90
    while docker('ps', '-q', '--filter', f'label=com.docker.compose.project={project}').stdout.strip():
        assert time.monotonic() < deadline, 'the tasks did not stop by their lease'
        time.sleep(1)
    assert project_leftovers(project)            # exited containers and the network, until ...
    status = launch('status', spec)
    assert 'is gone; its tasks have ended, and what they left on compose is removed' in status.stdout, \
        status.stdout + status.stderr
    assert not project_leftovers(project)
    again = launch('status', spec)
    assert again.returncode in (0, 1) and 'Traceback' not in again.stdout + again.stderr
    down = launch('down', spec)
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.slow
def test_a_command_whose_script_is_in_the_image_runs_in_compose(tmp_path, compose_project):
    """examples/tf1_distributed.py is in the image (/tfcluster/examples), so the compose backend
    accepts a train.command that runs it (launch/run/registry.py check_user_code_place) and it
    trains there, in every task, as examples/tf1-command.yaml runs it locally."""
    train_dir = tmp_path / 'run'
    spec = write_spec(tmp_path, steps=30,
                      command=f'python examples/tf1_distributed.py --steps 30 --train_dir {train_dir}')
    project = compose_project(spec)
    out = launch('up', spec, '--backend', 'compose')
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'all 3 servers are up' in out.stdout and 'learned w=' in out.stdout, out.stdout
    assert not project_leftovers(project)
    assert any(name.startswith('model.ckpt-') for name in os.listdir(train_dir)), os.listdir(train_dir)
