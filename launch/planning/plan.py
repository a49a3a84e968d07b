"""Planning: a validated spec in, one `TaskPlan` per task out. Pure: no processes, no network,
no files, so it is tested with tables and printed as-is by `launch plan`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
from dataclasses import dataclass
from collections.abc import Mapping

from cluster.checks.code import imports_keras
from cluster.spec import LOOPBACK_NAMES, ClusterSpec, HostConfig, SpecError, TaskSpec, address
from cluster.spec.model import emptied
from cluster.runtime.tfenv import coordinator_env
from cluster.runtime import rundir
from cluster.runtime.contract import LEASE_ENV, LEASE_SECS_ENV, TaskName, task_argv
from launch.planning import gpus as gpu_slots
from launch.planning.gpus import Slot

DEFAULT_REMOTE_PYTHON = 'python3'
DEFAULT_REMOTE_WORKDIR = 'tfcluster'     # relative to the remote user's home
# How long a task outlives a launcher that stopped renewing its lease (cluster/task.py): short for
# local processes; longer over SSH, where one slow round of commands must not end a healthy run.
LEASE_SECS = {'local': 5, 'ssh': 45}
TASKS_PER_LEASE_SEC = {'local': 50}     # ... and a second more per this many tasks on one machine


def lease_secs(backend: str, tasks: int) -> int:
    """A task's lease: LEASE_SECS, and locally longer for a big run: 1,000 stand-ins starting on
    two cores starve the launcher's renewal thread for seconds (at 300, ps:0 ended itself during
    start-up with 5 s). At 1,000 tasks a launcher killed leaves its tasks 20 s, not 5."""
    base, per = LEASE_SECS.get(backend, 20), TASKS_PER_LEASE_SEC.get(backend)
    return max(base, tasks // per) if per else base
# The memory one warm standby adds (launch plan says it; supervise.standby): a Python that imported
# TensorFlow and the task runtime, Keras blocked, holds 543 MB resident while it waits, of which
# 190 MB its own (USS, /proc/PID/smaps_rollup Private_*); the rest are the library's pages, which it
# shares with the tasks of its host (TensorFlow 2.21, CPU build, 2026-11-28).
STANDBY_MB_EST = 190
COMPOSE_WORKDIR = '/tfcluster'           # a container's working directory (the image's WORKDIR)
COMPOSE_PYTHON = 'python'                # the image's virtual environment comes first on PATH


@dataclass(frozen=True)
class TaskPlan:
    task: TaskSpec
    backend: str                     # 'local', 'ssh' or 'compose'
    argv: tuple[str, ...]
    env: Mapping[str, str]           # added to the environment the task inherits
    cwd: str                         # where argv runs; relative paths below are relative to it
    spec_path: str                   # the effective spec (overrides applied) the task reads
    log_path: str
    host: HostConfig | None = None   # SSH settings (None: local, or ~/.ssh/config and defaults)
    restart: int = 0                 # 0: the first start; n: the n-th restart (its log is appended to)
    attempt: int = 1                 # the run's attempt: its log is logs/attempt-N/, log_path links to it
    address: str = ''                # the host other tasks reach this one at ('': task.host)
    netns: str | None = None         # the private network namespace a local task runs in (isolation: netns)
    slot: Slot | None = None         # its physical GPUs on its machine (launch/planning/gpus.py)
    # How its Python imports TensorFlow (cluster.checks.code imports_keras): with Keras or not;
    # None: it does not (a command), so no warm standby can become it (launch/backends/standby.py).
    keras: bool | None = None

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def attempt_log_path(self) -> str:
        """Where this attempt's output goes: beside log_path, in attempt-N/ (log_path links to it)."""
        head, name = os.path.split(self.log_path)
        return os.path.join(head, rundir.attempt_dirname(self.attempt), name)

    @property
    def endpoint(self) -> str:
        """'address:port' as TF_CONFIG names this task and the launcher probes it."""
        return address(self.address or self.task.host, self.task.port)


def is_local(spec: ClusterSpec, host: str) -> bool:
    """Loopback names are local processes unless the spec lists them under `hosts` (tests do that
    to stand up several SSH "hosts" on one machine)."""
    return host in LOOPBACK_NAMES and host not in spec.hosts


def effective_spec_path(spec: ClusterSpec) -> str:
    return rundir.spec_path(spec.train.train_dir)


def log_path(spec: ClusterSpec, task: TaskSpec) -> str:
    return rundir.log_path(spec.train.train_dir, task.job, task.index)


def state_path(spec: ClusterSpec) -> str:
    return rundir.state_path(spec.train.train_dir)


def netns_name(spec: ClusterSpec, cwd: str = '.') -> str:
    """The network namespace of a run (isolation: netns), named after its train_dir as an absolute
    path: one per run directory, the same for `up`, `status` and `down` started in the same place."""
    where = os.path.abspath(os.path.join(cwd, spec.train.train_dir))
    return 'tfcluster-' + hashlib.sha256(where.encode()).hexdigest()[:12]


def task_env(spec: ClusterSpec, task: TaskSpec, backend: str, slot: Slot) -> dict[str, str]:
    """What the launcher sets in a task's environment: the spec's `env` (and its job's), then the
    launcher's own variables, which a spec cannot name (cluster/spec/ LAUNCHER_ENV). GPUs: the
    task's slot (launch/planning/gpus.py); ps tasks and CPU towers see none; unset only for `auto` on a
    machine whose count is unknown."""
    env = {'PYTHONUNBUFFERED': '1', 'TF_CPP_MIN_LOG_LEVEL': '2', **spec.task_env(task.job),
           **(coordinator_env() if spec.coordinator else {}), 'TF_CONFIG': spec.tf_config(task),
           LEASE_ENV: rundir.lease_path(spec.train.train_dir), LEASE_SECS_ENV: str(lease_secs(backend, len(spec.tasks)))}
    if slot.gpus is not None:
        env['CUDA_VISIBLE_DEVICES'] = ','.join(map(str, slot.gpus))
    return env


def task_spec(spec: ClusterSpec, addresses: Mapping[str, str] | None = None) -> ClusterSpec:
    """The spec as the tasks read it (the effective spec uploaded to every host, and TF_CONFIG):
    each host replaced by the address tasks reach it at (`addresses`: spec host -> address, e.g.
    an ssh config alias -> its HostName), and no `hosts` section: users, keys and SSH ports are the
    launcher's business, not every host's; no `gpus` (the launcher gives them out). Raises
    SpecError when two tasks end up at one address."""
    addresses = addresses or {}
    tasks = tuple(dataclasses.replace(t, host=addresses.get(t.host, t.host)) for t in spec.tasks)
    seen: dict[tuple[str, int], TaskSpec] = {}
    for before, after in zip(spec.tasks, tasks):
        other = seen.setdefault((after.host, after.port), before)
        if other is not before:
            raise SpecError(f'{spec.path}: cluster: {before.name} ({before.address}) and {other.name} '
                            f'({other.address}) both resolve to {after.address}: every task needs its own '
                            'address:port (check HostName in the ssh config and hosts.*.address)')
    return dataclasses.replace(spec, tasks=tasks, hosts=emptied(spec.hosts), gpus=emptied(spec.gpus))


def plan_task(spec: ClusterSpec, task: TaskSpec, python: str | None = None, cwd: str = '.',
              net: ClusterSpec | None = None, *, slot: Slot) -> TaskPlan:
    """One task's plan; `net` is task_spec(spec, addresses) (default: no address differs), `slot`
    its GPUs (launch/planning/gpus.py assign)."""
    net = net or task_spec(spec)
    reach = net.task(task.job, task.index)
    local = is_local(spec, task.host)
    host: HostConfig | None = None
    if local:
        python = python or sys.executable
    else:
        host = spec.hosts.get(task.host, HostConfig(name=task.host))
        python = host.python or DEFAULT_REMOTE_PYTHON
        cwd = host.workdir or DEFAULT_REMOTE_WORKDIR
    spec_file = effective_spec_path(spec)
    argv = task_argv(python, spec_file, TaskName(task.job, task.index))
    backend = 'local' if local else 'ssh'
    netns = netns_name(spec, cwd) if local and spec.isolation == 'netns' else None
    return TaskPlan(task=task, backend=backend, argv=argv, env=task_env(net, reach, backend, slot),
                    cwd=cwd, spec_path=spec_file, log_path=log_path(spec, task), host=host, address=reach.host,
                    netns=netns, slot=slot, keras=imports_keras(spec, task))


def service_name(task: TaskSpec) -> str:
    """A task's compose service, which is also its host name on the project's network: ps-0, worker-1."""
    return f'{task.job}-{task.index}'


def compose_spec(spec: ClusterSpec) -> ClusterSpec:
    """The spec as the containers see it: each task is its own host, named for its service, on the
    port the spec gives it (whatever host the spec names: localhost, node1, ...). SSH settings,
    GPU counts (the plans hold each worker's GPUs) and network namespaces mean nothing there (the
    project's network is internal) and are dropped."""
    tasks = tuple(dataclasses.replace(t, host=service_name(t)) for t in spec.tasks)
    return dataclasses.replace(spec, tasks=tasks, hosts=emptied(spec.hosts), gpus=emptied(spec.gpus), isolation='none')


def plan_compose_task(spec: ClusterSpec, task: TaskSpec, slot: Slot) -> TaskPlan:
    """One container's task; `spec` is already mapped by compose_spec. Relative paths (spec, log,
    train_dir) are below COMPOSE_WORKDIR, where the compose backend mounts the train_dir."""
    # Inside its container a task is a local process: the same argv, environment and paths; its
    # GPUs are the devices the compose file reserves for it, which it sees as 0, 1, ...
    plan = plan_task(spec, dataclasses.replace(task, host='localhost'), COMPOSE_PYTHON, COMPOSE_WORKDIR, slot=slot)
    env = dict(plan.env)
    if slot.gpus is not None:
        env['CUDA_VISIBLE_DEVICES'] = ','.join(str(i) for i in range(len(slot.gpus)))
    return dataclasses.replace(plan, task=task, backend='compose', env=env)


def plan_compose(spec: ClusterSpec, counts: Mapping[str, int] | None = None) -> tuple[TaskPlan, ...]:
    """Every task of the spec as a container of one compose project (see compose_spec). They all
    run on the machine of the docker engine, this one: its GPUs (`counts`, else gpus.localhost)
    are shared out among all the workers, whatever hosts the spec names."""
    here = {t.host: 'localhost' for t in spec.tasks}
    slots = gpu_slots.assign(spec, here, counts)
    mapped = compose_spec(spec)
    return tuple(plan_compose_task(mapped, t, slots[t.name]) for t in mapped.tasks)


def plan_cluster(spec: ClusterSpec, python: str | None = None, cwd: str = '.',
                 addresses: Mapping[str, str] | None = None,
                 counts: Mapping[str, int] | None = None) -> tuple[TaskPlan, ...]:
    """Every task of the spec, ps tasks first (they hold the variables everyone waits for), each
    a local process or an SSH task as its host says (is_local). `addresses` maps a spec host to the
    address tasks reach it at (see task_spec); the caller resolves them (the ssh config), so
    planning reads no files. `counts`: the GPUs the hosts said they have, by spec host (or
    machine), where they were asked (launch/planning/gpus.py assign); else the spec's `gpus:` or unknown."""
    net = task_spec(spec, addresses)
    slots = gpu_slots.assign(spec, addresses, counts)
    return tuple(plan_task(spec, t, python, cwd, net, slot=slots[t.name]) for t in spec.tasks)

