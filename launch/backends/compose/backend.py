"""Compose backend: every task in its own container of one compose project, on this machine's engine.

`prepare` writes the compose file (launch/render/compose.py) to `<train_dir>/compose.yaml` and creates
the project's network and containers (`up --no-start`); `start` starts one task's container and
returns a record whose host is the container's address on the project's internal network, which
the launcher (on the host) reaches directly, so it waits for the gRPC servers as for any backend.
Exit codes come from `docker inspect` (137 after `docker kill` is reported as SIGKILL). `stop` is
`down`: SIGTERM through docker-init, one shared grace period, SIGKILL, then every container and
network of the project is removed. Logs and the workers' figures are files in the bind-mounted
train_dir, read on the host.

Docker and Compose are command-line tools here (the `docker` client negotiates the API version
with older engines; Compose v2 as `docker compose`, else `docker-compose` 1.29), always started in
their own session so a Ctrl-C meant for the launcher never cuts one off halfway.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from cluster.runtime import rundir
from cluster.runtime.rundir import PRIVATE, read_text, write_atomically
from cluster.spec import ClusterSpec
from launch import system
from launch.render import compose as compose_file
from launch.backends import marks
from launch.backends.tail import FileTail, follow_file
from launch.backends.base import (ENDED, RUNNING, STOP_GRACE_SECS, Backend, BackendError, HostCheck, Observation, TaskRecord,
                            decode_exit, handle_of, link_attempt_log, local_disk_full, planned_record,
                            touch_leases)
from launch.planning.plan import TaskPlan, compose_spec, effective_spec_path, service_name

log = logging.getLogger(__name__)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))     # above launch/backends/compose/
BUILD_SCRIPT = os.path.join(REPO, 'docker', 'build-offline.sh')
PROJECT_LABEL = 'com.docker.compose.project'      # set by Compose v1 and v2 alike
SERVICE_LABEL = 'com.docker.compose.service'
SNAPSHOT_TTL = 0.5         # seconds one `docker inspect` of the project answers status()
COMMAND_TIMEOUT = 120      # seconds for any one docker or compose command (a stop adds its grace)
INSTALL_DOCKER = 'install it (Debian: apt-get install docker.io) and start dockerd'
INSTALL_COMPOSE = ('install Compose (Debian: apt-get install docker-compose; or the Compose v2 plugin, '
                   'which gives `docker compose`)')


class ComposeError(BackendError):
    """The engine, the compose tool or the image is missing or failed: one line saying which."""


def project_name(spec: ClusterSpec) -> str:
    """Stable for a train_dir (one cluster per train_dir, as the state file is there), short, and
    unique on this machine: `tfc-<spec name>-<hash of the absolute train_dir>`."""
    stem = re.sub(r'[^a-z0-9]+', '', os.path.splitext(os.path.basename(spec.path))[0].lower())[:16] or 'spec'
    digest = hashlib.sha256(os.path.abspath(spec.train.train_dir).encode()).hexdigest()[:8]
    return f'tfc-{stem}-{digest}'


def compose_path(spec: ClusterSpec) -> str:
    return rundir.compose_path(spec.train.train_dir)


def _run(argv: list[str], timeout: float = COMMAND_TIMEOUT, env: dict | None = None,
         capture: bool = True) -> subprocess.CompletedProcess:
    """Run a docker/compose command in its own session; a missing program is a ComposeError."""
    try:
        return system.run(argv, timeout=timeout, env=env, capture=capture)
    except system.CommandError as e:
        if e.missing:
            raise ComposeError(f'{argv[0]} not found: {INSTALL_DOCKER}') from None
        if e.timeout is None:
            raise ComposeError(f'cannot run {argv[0]}: {e.cause}') from None
        raise ComposeError(f'`{" ".join(argv[:3])} ...` did not answer within {timeout:.0f}s; '
                           'is the Docker engine overloaded or stuck?') from None


def _last_line(text: str) -> str:
    """The last non-blank line of a command's output: where docker and compose put the error."""
    lines = [line.strip() for line in (text or '').splitlines() if line.strip()]
    return lines[-1] if lines else ''


def find_compose() -> list[str] | None:
    """The compose command installed here: Compose v2 (`docker compose`) first, else docker-compose."""
    docker = shutil.which('docker')
    if docker and _run([docker, 'compose', 'version'], timeout=30).returncode == 0:
        return [docker, 'compose']
    legacy = shutil.which('docker-compose')
    if legacy and _run([legacy, 'version'], timeout=30).returncode == 0:
        return [legacy]
    return None


def engine_error() -> str | None:
    """Why the Docker engine cannot be used (one line), or None when it answers."""
    if shutil.which('docker') is None:
        return f'no docker command on PATH: {INSTALL_DOCKER}'
    where = os.environ.get('DOCKER_HOST') or 'unix:///var/run/docker.sock'
    out = _run(['docker', 'version', '--format', '{{.Server.Version}}'], timeout=30)
    if out.returncode != 0 or not out.stdout.strip():
        why = _last_line(out.stderr) or f'exit {out.returncode}'
        return (f'the Docker engine at {where} is not reachable ({why}): start it (dockerd, or systemctl '
                'start docker), or point DOCKER_HOST at a running one')
    return None


def image_name() -> tuple[str, bool]:
    """(the image tasks run, whether this checkout can build it). TFCLUSTER_IMAGE names one built
    elsewhere (say from a registry); else the build script's tag for this tree's inputs."""
    if os.environ.get(compose_file.IMAGE_VARIABLE):
        return os.environ[compose_file.IMAGE_VARIABLE], False
    if os.path.isfile(BUILD_SCRIPT):
        out = _run(['bash', BUILD_SCRIPT, '--tag'], timeout=60)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[-1], True
    return compose_file.DEFAULT_IMAGE, False


def have_image(image: str) -> bool:
    return _run(['docker', 'image', 'inspect', '--format', '{{.Id}}', image], timeout=30).returncode == 0


def build_image() -> str:
    """Build the image with docker/build-offline.sh (its progress goes to stderr); returns its name."""
    # In a session of its own, so an interrupt reaches all of it (mmdebstrap, docker build) at once,
    # through the launcher; the script then cleans up after itself.
    proc = subprocess.Popen(['bash', BUILD_SCRIPT], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate()
    except KeyboardInterrupt:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise ComposeError('the image build was interrupted; nothing was started') from None
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout)
    if out.returncode != 0:
        raise ComposeError(f'building the image with {os.path.relpath(BUILD_SCRIPT)} failed (exit '
                           f'{out.returncode}; its messages are above): fix that, or build it elsewhere and '
                           f'set {compose_file.IMAGE_VARIABLE}')
    return out.stdout.strip().splitlines()[-1]


@dataclass
class ComposeHandle:
    """A task's container: its project, service, container id and compose file."""
    project: str = ''
    service: str = ''
    container: str = ''
    compose_file: str = ''


class ComposeBackend(Backend):
    name = 'compose'

    def __init__(self, spec: ClusterSpec, project_dir: str | None = None) -> None:
        self.spec = spec
        self.mapped = compose_spec(spec)
        self.project = project_name(spec)
        self.project_dir = os.path.abspath(project_dir or os.getcwd())
        self.file = os.path.join(self.project_dir, compose_path(spec))
        self._compose: list[str] | None = None
        self._image: str | None = None
        self._created = False
        self._lock = threading.Lock()
        self._snapshot: dict[str, dict] = {}
        self._snapshot_at = 0.0
        self._last: dict[str, tuple[str, int]] = {}     # container -> last state seen, exit code

    # -- tools ----------------------------------------------------------------------------
    def _tool(self) -> list[str]:
        """The Compose tool's argv (`docker compose` or `docker-compose`), looked for once."""
        if self._compose is None:
            self._compose = find_compose()
            if self._compose is None:
                raise ComposeError(f'no Compose tool (neither `docker compose` nor docker-compose): {INSTALL_COMPOSE}')
        return self._compose

    def _compose_cmd(self, *args: str) -> list[str]:
        return [*self._tool(), '-f', self.file, '-p', self.project, '--project-directory', self.project_dir, *args]

    def _env(self) -> dict:
        return {**os.environ, compose_file.IMAGE_VARIABLE: self._image or image_name()[0],
                compose_file.USER_VARIABLE: f'{os.getuid()}:{os.getgid()}'}

    def _containers(self) -> list[str]:
        out = _run(['docker', 'ps', '-aq', '--no-trunc', '--filter', f'label={PROJECT_LABEL}={self.project}'])
        return out.stdout.split() if out.returncode == 0 else []

    def _networks(self) -> list[str]:
        out = _run(['docker', 'network', 'ls', '-q', '--filter', f'label={PROJECT_LABEL}={self.project}'])
        return out.stdout.split() if out.returncode == 0 else []

    # -- pre-flight -----------------------------------------------------------------------
    def gpu_counts(self, plans: list[TaskPlan]) -> dict[str, int]:
        """Every container runs on this machine (the docker engine's)."""
        from launch.backends.local.backend import gpu_count
        return {'localhost': gpu_count()} if plans else {}

    def check(self, plans: list[TaskPlan], imports: bool = False) -> list[HostCheck]:
        """The engine answers, a compose tool is installed, no container of this project is left
        over, and the image exists: `launch up` (imports=False) builds it when missing, `launch
        check` (imports=True) imports TensorFlow and this package in it instead."""
        if not plans:
            return []
        where = 'docker'
        try:
            problem = engine_error()
            if problem:
                return [HostCheck(where, False, problem)]
            tool = self._tool()
            if self._containers():
                return [HostCheck(where, False, f'containers of compose project {self.project} are left from an '
                                                f'earlier run: remove them with `launch down {self.spec.path}`')]
            if self.spec.train.data != 'synthetic' and not os.path.isdir(self.spec.train.data):
                return [HostCheck(where, False, f'train.data {self.spec.train.data}: no such directory here '
                                                '(it is mounted into the workers read-only)')]
            image, buildable = image_name()
            if not have_image(image):
                if not buildable:
                    return [HostCheck(where, False, f'image {image} not found: build it (docker/build-offline.sh, '
                                                    f'or docker build -f docker/Dockerfile -t {image} .)')]
                if imports:
                    return [HostCheck(where, False, f'image {image} is not built yet: `launch up` builds it, '
                                                    'or run docker/build-offline.sh')]
                image = build_image()
            self._image = image
            detail = f'engine {self._server_version()}, {" ".join(tool)}, image {image}'
            if imports:
                detail += self._probe_image(image)
            return [HostCheck(where, True, f'{detail}, {len(plans)} container(s), project {self.project}')]
        except ComposeError as e:
            return [HostCheck(where, False, str(e))]

    @staticmethod
    def _server_version() -> str:
        return _run(['docker', 'version', '--format', '{{.Server.Version}}']).stdout.strip()

    @staticmethod
    def _probe_image(image: str) -> str:
        from launch.backends.probes import HOST_PROBE
        out = _run(['docker', 'run', '--rm', '--network', 'none', '--entrypoint', 'python', image,
                    '-c', HOST_PROBE, '--import'], timeout=180)
        try:
            found = json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise ComposeError(f'image {image}: the import probe failed: {_last_line(out.stderr)}') from None
        if found['missing']:
            raise ComposeError(f'image {image} cannot import {" nor ".join(found["missing"])}')
        return f' (Python {found["python"]}, tensorflow {found["tensorflow"]})'

    # -- start ----------------------------------------------------------------------------
    def prepare(self, plans: list[TaskPlan], spec_yaml: str) -> None:
        """Write the effective spec, the log folder and the compose file; create the project's
        network and containers, started one by one by `start`."""
        if not plans:
            return
        if self._image is None:
            self._image = image_name()[0]
        train_dir = os.path.join(self.project_dir, self.spec.train.train_dir)
        os.makedirs(rundir.logs_dir(train_dir), exist_ok=True)
        # The containers read the spec with their hosts as services.
        write_atomically(os.path.join(self.project_dir, effective_spec_path(self.spec)), self.mapped.to_yaml(),
                         PRIVATE)
        write_atomically(self.file, compose_file.render(self.mapped, plans, self.spec.path), PRIVATE)
        self._create()

    def _create(self) -> None:
        self._created = True
        out = _run(self._compose_cmd('up', '--no-start'), env=self._env())
        if out.returncode != 0:
            raise ComposeError(f'compose project {self.project}: creating its containers failed: '
                               f'{_last_line(out.stderr)}')

    def _container(self, service: str) -> str:
        out = _run(['docker', 'ps', '-aq', '--no-trunc', '--filter', f'label={PROJECT_LABEL}={self.project}',
                    '--filter', f'label={SERVICE_LABEL}={service}'])
        ids = out.stdout.split()
        if not ids:
            raise ComposeError(f'compose project {self.project} has no container for service {service}')
        return ids[0]

    def start(self, plan: TaskPlan) -> TaskRecord:
        service = service_name(plan.task)
        try:
            container = self._container(service)
        except ComposeError:        # removed by a stop of the whole cluster: a restart creates it anew
            self._create()
            container = self._container(service)
        with self._lock:                # `docker start` keeps the id: forget its last (dead) state
            self._last[container] = ('running', 0)
            self._snapshot_at = 0.0
        # The container appends to log_path, which leads to this attempt's file (a restarted task
        # keeps its earlier output; an earlier attempt's is never touched).
        log_file = link_attempt_log(self.project_dir, plan)
        offset = os.path.getsize(log_file) if os.path.exists(log_file) else 0
        marks.clear(marks.of_plan(plan, self.project_dir))      # the bind-mounted train_dir, seen from here
        out = _run(['docker', 'start', container])
        if out.returncode != 0:
            raise ComposeError(f'{plan.name}: docker start of {service} failed: {_last_line(out.stderr)}')
        info = self._inspect([container]).get(container, {})
        networks = (info.get('NetworkSettings') or {}).get('Networks') or {}
        address = next((n.get('IPAddress') for n in networks.values() if n.get('IPAddress')), '')
        t = plan.task
        return TaskRecord(name=t.name, job=t.job, index=t.index, host=address or service, port=t.port,
                          backend=self.name, pid=int((info.get('State') or {}).get('Pid') or 0),
                          log=log_file, ident=container, cwd=self.project_dir, log_offset=offset,
                          handle=ComposeHandle(self.project, service, container, self.file))

    # -- watch ----------------------------------------------------------------------------
    @staticmethod
    def _inspect(containers: list[str]) -> dict[str, dict]:
        if not containers:
            return {}
        out = _run(['docker', 'inspect', '--type', 'container', *containers])
        try:
            found = json.loads(out.stdout or '[]')
        except ValueError:
            found = []
        return {c['Id']: c for c in found}

    def _state(self, record: TaskRecord) -> tuple[str, int] | None:
        """(status, exit code) of the record's container from a snapshot of all containers this
        backend knows, refreshed at most every SNAPSHOT_TTL seconds; None once it is removed."""
        container = handle_of(record, ComposeHandle).container or record.ident
        with self._lock:
            self._last.setdefault(container, ('running', 0))
            if time.monotonic() - self._snapshot_at > SNAPSHOT_TTL or container not in self._snapshot:
                self._snapshot = self._inspect(list(self._last))
                self._snapshot_at = time.monotonic()
            info = self._snapshot.get(container)
            if info is None:
                return None
            state = info.get('State') or {}
            seen = (state.get('Status', ''), int(state.get('ExitCode') or 0))
            self._last[container] = seen
            return seen

    def status(self, record: TaskRecord) -> Observation:
        found = self._state(record)
        if found is None:       # removed behind our back (docker rm -f kills with SIGKILL)
            status, code = self._last.get(handle_of(record, ComposeHandle).container or record.ident, ('running', 0))
            return Observation(ENDED, decode_exit(code) if status == 'exited' else -signal.SIGKILL)
        status, code = found
        if status in ('exited', 'dead'):
            return Observation(ENDED, decode_exit(code))
        return Observation(RUNNING, stopped='is paused (docker pause)' if status == 'paused' else None)

    # -- stop -----------------------------------------------------------------------------
    def stop(self, records: list[TaskRecord], grace: float = STOP_GRACE_SECS) -> None:
        """SIGTERM the records' containers at once, SIGKILL after one shared grace period. While
        other containers of the project still run (the chief is stopped first so that it
        checkpoints while the ps holds the variables; ps tasks left waiting for a lost worker),
        only these stop and stay, to be started again; else every container and the network of
        the project are removed."""
        marks.write(marks.of_record(r) for r in records)    # docker-init passes the SIGTERM on: a stop, not a notice
        mine = {handle_of(r, ComposeHandle).container or r.ident for r in records}
        out = _run(['docker', 'ps', '-q', '--no-trunc', '--filter', f'label={PROJECT_LABEL}={self.project}'])
        running = set(out.stdout.split()) if out.returncode == 0 else set()
        if running - mine:
            _run(['docker', 'stop', '--time', str(int(grace + 0.999)), *sorted(mine)],
                 timeout=COMMAND_TIMEOUT + grace)
            with self._lock:
                self._snapshot_at = 0.0
            return
        self._down(grace)

    def send_signal(self, records: list[TaskRecord], signum: int) -> dict[str, str | None]:
        """`docker kill --signal`: the container's init (docker-init) passes it on to the task."""
        out: dict[str, str | None] = {}
        for r in records:
            container = handle_of(r, ComposeHandle).container or r.ident
            done = _run(['docker', 'kill', '--signal', signal.Signals(signum).name, container])
            out[r.name] = None if done.returncode == 0 else f'cannot be signalled ({_last_line(done.stderr)})'
        return out

    def renew(self, plans: list[TaskPlan], text: str | None = None) -> None:
        touch_leases(plans, self.project_dir, text)      # the bind-mounted train_dir, seen from the host

    def _down(self, grace: float = STOP_GRACE_SECS) -> None:
        problems = []
        if os.path.isfile(self.file):
            try:
                out = _run(self._compose_cmd('down', '--timeout', str(int(grace + 0.999)), '--volumes',
                                             '--remove-orphans'), timeout=COMMAND_TIMEOUT + grace, env=self._env())
                if out.returncode != 0:
                    problems.append(_last_line(out.stderr))
            except ComposeError as e:
                problems.append(str(e))
        # Whatever compose could not remove (or without the file): by the project's label.
        left = self._containers()
        if left:
            _run(['docker', 'rm', '--force', '--volumes', *left])
        nets = self._networks()
        if nets:
            _run(['docker', 'network', 'rm', *nets])
        with self._lock:
            self._snapshot_at = 0.0
        if problems and (self._containers() or self._networks()):
            raise ComposeError(f'compose project {self.project}: could not remove everything: {problems[0]}')
        self._created = False

    def close(self) -> None:
        """A launcher that created the project and never stopped it (stopped between `prepare` and
        the first `start`) still leaves nothing behind."""
        if self._created:
            try:
                self._down()
            except BackendError as e:
                log.warning('%s', e)

    # -- files ----------------------------------------------------------------------------
    def locate(self, record: TaskRecord) -> dict:
        return {'pid': record.pid or None, 'container': handle_of(record, ComposeHandle).container or record.ident}

    def log_record(self, plan: TaskPlan) -> TaskRecord:
        return planned_record(plan, os.path.join(self.project_dir, plan.log_path), self.project_dir, self.name)

    def read_log(self, record: TaskRecord, follow: bool = False, stop: threading.Event | None = None,
                 offset: int = 0) -> Iterator[str]:
        return follow_file(record.log, stop if follow else None, offset=offset)

    def log_tail(self, record: TaskRecord, offset: int = 0) -> FileTail:
        """The log is a file here: read at each poll, no thread and no open file of its own."""
        return FileTail(record.log, offset, written_here=True)

    def read_file(self, record: TaskRecord, path: str) -> str | None:
        return read_text(os.path.join(record.cwd, path))

    def disk_full(self, record: TaskRecord) -> str | None:
        return local_disk_full(record)      # the log is a file here (the bind-mounted train_dir)

