"""Render a compose file from the planner's compose plans: one service per task, nothing else decided here.

Each service runs its plan's argv with its plan's environment (TF_CONFIG names the other services),
on one `internal: true` network, so no task port is published on the host or reaches outside
(TensorFlow's gRPC servers have no authentication). The spec's train_dir is a bind mount, so
checkpoints, logs and the workers' figures stay on the host after the containers are gone.

A container starts through a small `sh -c` entry: it writes the effective spec (carried in the
file itself, so a hand-run `docker-compose up` needs nothing else) to the plan's spec path, then
`exec`s the task with its output in the plan's log file, where `launch logs` and the launcher
read it. `init: true` puts docker-init in front, so `docker stop`'s SIGTERM reaches the task.

The output depends only on the spec: relative paths stay relative (compose resolves them against
`--project-directory`), the image and the user are `${...}` variables the launcher sets.

A coordinator run's chief and evaluator are services like the others (chief-0, evaluator-0), with
the environment their plans give them (GRPC_FAIL_FAST and TF_USE_LEGACY_KERAS in every one, the
evaluator's TF_CONFIG naming only itself). The evaluator serves nothing: it has no port to expose
or probe, so no healthcheck (one would call it unhealthy for ever).
"""
from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable

from cluster.env.slurm import counts_text
from cluster.spec import ClusterSpec
from launch.planning.plan import COMPOSE_WORKDIR, TaskPlan, service_name

IMAGE_VARIABLE = 'TFCLUSTER_IMAGE'      # the launcher sets it to the image tag of this tree
USER_VARIABLE = 'TFCLUSTER_USER'        # uid:gid the tasks run as (files in train_dir are theirs)
DEFAULT_IMAGE = 'tfcluster:latest'
NETWORK = 'tasks'
SPEC_VARIABLE = 'TFCLUSTER_SPEC'
STOP_GRACE = '5s'
TASK_LABEL = 'org.tfcluster.task'

# $0: the log file, $1: the spec file; then the task's argv. The spec is written under a name of
# its own first and renamed, so a task never reads a half-written one while another writes it.
ENTRY = ('mkdir -p "$(dirname "$0")" "$(dirname "$1")" '
         '&& printf "%s" "$TFCLUSTER_SPEC" > "$1.$HOSTNAME" && mv -f "$1.$HOSTNAME" "$1" '
         '&& shift && exec "$@" >> "$0" 2>&1')

# A Python socket probe: the image has no curl or nc, and the task's port is all there is to ask.
HEALTH = "import socket; socket.create_connection(('localhost', {port}), 2).close()"


def _scalar(value: object) -> str:
    """A YAML scalar for compose: JSON's double-quoted string is valid YAML, and `$` is doubled so
    compose does not interpolate it (only the variables this module writes are interpolated)."""
    return json.dumps(str(value), allow_nan=False).replace('$', '$$')


def _flow(items: Iterable[object]) -> str:
    return '[' + ', '.join(_scalar(i) for i in items) + ']'


def _container_path(path: str) -> str:
    return posixpath.normpath(posixpath.join(COMPOSE_WORKDIR, path))


def _host_path(path: str) -> str:
    """Relative paths are relative to the project directory (the directory `launch` runs in)."""
    return path if posixpath.isabs(path) else './' + posixpath.normpath(path)


def mounts(spec: ClusterSpec) -> list[tuple[str, str, bool]]:
    """(host path, container path, read-only) for the train_dir and a real data set."""
    out = [(_host_path(spec.train.train_dir), _container_path(spec.train.train_dir), False)]
    if spec.train.data != 'synthetic':
        out.append((_host_path(spec.train.data), _container_path(spec.train.data), True))
    return out


def _gpu_reservation(plan: TaskPlan) -> list[str]:
    """A worker's GPUs as a device request (its physical GPUs; it sees them as 0, 1, ...): the
    Compose Specification's form, which docker-compose 1.28+ and Compose v2 both read."""
    if plan.slot is None or not plan.slot.gpus:
        return []
    return ['    deploy:',
            '      resources:',
            '        reservations:',
            '          devices:',
            '            - driver: nvidia',
            f'              device_ids: {_flow(plan.slot.gpus)}',
            '              capabilities: [gpu]']


def _served(name: str, port: int) -> list[str]:
    """A serving task's port, label and healthcheck (its server answers on the port)."""
    return [
        f'    expose: [{_scalar(port)}]',
        '    labels:',
        f'      {TASK_LABEL}: {_scalar(name)}',
        '    healthcheck:',
        f'      test: {_flow(["CMD", "python", "-c", HEALTH.format(port=port)])}',
        '      interval: 3s',
        '      timeout: 3s',
        '      retries: 3',
        '      start_period: 120s',
    ]


def render(spec: ClusterSpec, plans: list[TaskPlan], source: str = '') -> str:
    """The compose file for `plans` (from plan.plan_compose(spec)); `spec` is the
    mapped spec the tasks read. `source` names the spec file in the header comment."""
    source = source or spec.path
    lines = [
        f'# Generated by `launch compose {source}`; regenerate it rather than edit it.',
        f'# {counts_text(spec)}, a container each, their servers on an internal network only.',
        f'# `launch up {source} --backend compose` runs it (and builds the image if needed); by hand, run',
        '# it from the directory its relative paths start at (the repository root):',
        f'#   {USER_VARIABLE}=$(id -u):$(id -g) docker-compose -f FILE --project-directory . up',
        "version: '2.4'",
        '',
        'x-task: &task',
        f'  image: ${{{IMAGE_VARIABLE}:-{DEFAULT_IMAGE}}}',
        '  init: true',
        f'  user: ${{{USER_VARIABLE}:-0:0}}',
        f'  working_dir: {COMPOSE_WORKDIR}',
        f'  stop_grace_period: {STOP_GRACE}',
        f'  networks: [{NETWORK}]',
        '  volumes:',
    ]
    for host, container, read_only in mounts(spec):
        lines.append(f'    - {_scalar(host + ":" + container + (":ro" if read_only else ""))}')
    lines += [
        '',
        '# The effective spec every task reads (TensorFlow addresses are the service names).',
        'x-spec: &spec |',
    ]
    lines += ['  ' + line.replace('$', '$$') for line in spec.to_yaml().splitlines()]
    lines += ['', 'services:']
    for plan in plans:
        t = plan.task
        lines += [
            f'  {service_name(t)}:',
            '    <<: *task',
            f'    hostname: {service_name(t)}',
            f'    entrypoint: {_flow(["sh", "-c", ENTRY, plan.log_path, plan.spec_path])}',
            f'    command: {_flow(plan.argv)}',
            '    environment:',
            f'      {SPEC_VARIABLE}: *spec',
        ]
        lines += [f'      {k}: {_scalar(v)}' for k, v in plan.env.items()]
        lines += _gpu_reservation(plan)
        lines += [
            '    labels:',
            f'      {TASK_LABEL}: {_scalar(t.name)}',
        ] if t.job == 'evaluator' else _served(t.name, t.port)
    lines += ['', 'networks:', f'  {NETWORK}:', '    internal: true', '']
    return '\n'.join(lines)
