"""A real Docker engine for the compose tests: the one running, else a `dockerd` this session starts
(and stops at the end), else a skip that says why in one line -- a failure under CI=true, where
the engine must run.

The engine keeps its images in its usual data root, so the image built once (tagged by a hash of
its inputs, see docker/build-offline.sh) serves every later session on the same machine. The
docker client may be newer than Debian's engine (20.10, API 1.41): the client negotiates the API
version, so no DOCKER_API_VERSION is needed.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from cluster.spec import load_spec
from launch.backends.compose import project_name
from tests.harness.parts import REPO, unavailable

DOCKERD = '/usr/sbin/dockerd'
START_TIMEOUT = 60
PROJECT_LABEL = 'com.docker.compose.project'


def docker(*args: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(['docker', *args], capture_output=True, text=True, timeout=timeout, check=check,
                          stdin=subprocess.DEVNULL)


def engine_answers() -> bool:
    if shutil.which('docker') is None:
        return False
    try:
        return docker('version', '--format', '{{.Server.Version}}', timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _unavailable(why: str):
    unavailable(f'compose tests need a Docker engine: {why}', 'the engine must run here')


def _start_dockerd(log_path: str) -> subprocess.Popen:
    with open(log_path, 'wb') as log:
        proc = subprocess.Popen([DOCKERD], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if engine_answers():
            return proc
        time.sleep(0.5)
    _stop_dockerd(proc)
    with open(log_path, errors='replace') as f:
        last = [line.strip() for line in f if line.strip()][-1:] or ['(no output)']
    _unavailable(f'{DOCKERD} did not come up within {START_TIMEOUT}s: {last[0][:300]}')


def _stop_dockerd(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)       # dockerd stops its containers and its containerd
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope='session')
def docker_engine():
    """The engine the tests use; started here (and stopped at the end) when none answers."""
    if 'DOCKER_HOST' in os.environ and not engine_answers():
        _unavailable(f'DOCKER_HOST={os.environ["DOCKER_HOST"]} does not answer')
    if shutil.which('docker') is None:
        _unavailable('no docker client on PATH (apt-get install docker.io)')
    if shutil.which('docker-compose') is None and docker('compose', 'version').returncode != 0:
        _unavailable('no Compose tool (apt-get install docker-compose)')
    if engine_answers():
        yield None
        return
    if not os.path.exists(DOCKERD):
        _unavailable(f'none answers and there is no {DOCKERD} to start (apt-get install docker.io)')
    if os.geteuid() != 0:
        _unavailable(f'none answers, and {DOCKERD} needs root to start')
    with tempfile.TemporaryDirectory(prefix='dockerd-') as tmp:
        proc = _start_dockerd(os.path.join(tmp, 'dockerd.log'))
        try:
            yield proc
        finally:
            _stop_dockerd(proc)


@pytest.fixture(scope='session')
def compose_image(docker_engine, request):
    """The image of this tree, built once (the build script reuses one of the same inputs)."""
    capture = request.config.pluginmanager.getplugin('capturemanager')
    with capture.global_and_fixture_disabled():       # a cold build takes minutes: show its progress
        out = subprocess.run(['bash', os.path.join(REPO, 'docker', 'build-offline.sh')], stdout=subprocess.PIPE,
                             text=True, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        pytest.fail(f'docker/build-offline.sh failed (exit {out.returncode}); its messages are above', pytrace=False)
    return out.stdout.strip().splitlines()[-1]


def project_leftovers(project: str) -> dict[str, list[str]]:
    """Containers, networks and volumes that still carry the compose project's label."""
    label = f'label={PROJECT_LABEL}={project}'
    found = {'containers': docker('ps', '-a', '-q', '--filter', label).stdout.split(),
             'networks': docker('network', 'ls', '-q', '--filter', label).stdout.split(),
             'volumes': docker('volume', 'ls', '-q', '--filter', label).stdout.split()}
    return {kind: ids for kind, ids in found.items() if ids}


def remove_project(project: str) -> None:
    left = project_leftovers(project)
    if left.get('containers'):
        docker('rm', '-f', '-v', *left['containers'])
    if left.get('networks'):
        docker('network', 'rm', *left['networks'])
    if left.get('volumes'):
        docker('volume', 'rm', '-f', *left['volumes'])


@pytest.fixture
def compose_project(compose_image: str) -> Iterator[Callable[[str], str]]:
    """Register the spec a test runs; afterwards its compose project must have left nothing."""
    projects = []

    def register(spec_file: str) -> str:
        projects.append(project_name(load_spec(spec_file)))
        return projects[-1]

    yield register
    left = {p: project_leftovers(p) for p in projects}
    left = {p: found for p, found in left.items() if found}
    for p in left:
        remove_project(p)
    assert not left, f'compose projects left behind: {left}'
