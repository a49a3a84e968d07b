"""The spec's frozen types: a cluster's tasks and its train, supervise and host settings.

Everything downstream takes these, never raw dicts; they are built once, validated, by
cluster/spec/validate.py. The small pure helpers here (an address, the chief, one name per
machine) are the ones every side of the launcher and the task runtime agrees on.
"""
from __future__ import annotations

import dataclasses
import json
import os
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import yaml

from cluster.spec import environ
from cluster.spec.errors import Origins, SpecError

JOBS = ('chief', 'ps', 'worker', 'evaluator')      # in the order a spec's tasks are listed and started
REQUIRED_JOBS = ('ps', 'worker')
SINGLE_JOBS = ('chief', 'evaluator')               # at most one task each
# The jobs of the training cluster (TF_CONFIG's `cluster`): an evaluator is never in it, or
# ParameterServerStrategy's coordinator would wait for it (tensorflow#46169).
TRAINING_JOBS = ('chief', 'ps', 'worker')
DEFAULT_SPEC = os.path.join('specs', 'local2.yaml')
LOOPBACK_NAMES = ('localhost', '127.0.0.1', '::1')


def address(host: str, port: int) -> str:
    """'host:port', with an IPv6 host in brackets, as gRPC and TF_CONFIG want it."""
    return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


def is_chief(job: str, index: int) -> bool:
    """The task that initialises, restores and saves: the `chief` of a coordinator run, else worker 0
    (in a coordinator run worker 0 only serves; code that must tell the two apart asks
    ClusterSpec.chief or the run's `coordinator` flag)."""
    return job == 'chief' or (job == 'worker' and index == 0)


def same_machine_key(host: str) -> str:
    """One name per machine for the names a spec may give it: every loopback name is localhost."""
    return 'localhost' if host in LOOPBACK_NAMES else host


@dataclass(frozen=True)
class TaskSpec:
    job: str
    index: int
    host: str
    port: int

    @property
    def name(self) -> str:
        return f'{self.job}:{self.index}'

    @property
    def address(self) -> str:
        return address(self.host, self.port)

    @property
    def is_chief(self) -> bool:
        return is_chief(self.job, self.index)


@dataclass(frozen=True)
class HostConfig:
    """How to reach a host over SSH; None means "ask ~/.ssh/config, then the defaults"."""
    name: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    python: str | None = None
    workdir: str | None = None
    address: str | None = None       # what tasks reach the host at (None: the ssh config's HostName)


HOST_SETTINGS = ('user', 'port', 'key', 'python', 'workdir', 'address')


@dataclass(frozen=True)
class TrainConfig:
    sync: bool = True
    steps: int = 2000
    batch_size: int = 128
    devices: Any = 'auto'            # 'auto' | int (CPU towers) | tuple of 'gpu:N' / 'cpu:N'
    data: str = 'synthetic'
    train_dir: str = 'runs/default'
    learning_rate: float | None = None   # None: 0.1 per 128 examples an update averages (model.BASE_*)
    replicas_to_aggregate: int | None = None   # None: every worker (no backup workers)
    checkpoint_steps: int = 0        # 0: only by time and at the end
    checkpoint_secs: float = 60.0
    log_every_secs: float = 2.0
    seed: int | None = None
    deterministic: bool = False      # plain record order, no distortions: for exactness checks
    transfer_dtype: str = 'float32'  # bfloat16: weights and gradients cross between tasks in half the bytes
    # The user's own training instead of the built-in CIFAR-10 trainer (at most one of the two):
    program: str | None = None       # 'package.module:function', called in each worker (cluster/program.py),
                                     # or in the chief of a coordinator run (cluster/coordinator.py)
    command: tuple[str, ...] | None = None   # argv run in every task with TF_CONFIG and the TF1 flags
                                             # (in a coordinator run: in the chief only, TF_CONFIG alone)
    # What the evaluator task runs: 'package.module:function' (called with an EvaluatorContext) or a
    # command line (TF_CONFIG names only the evaluator); only with an `evaluator` task.
    evaluator: str | tuple[str, ...] | None = None


# What the weights and gradients are sent between the ps tasks and the workers as; the variables
# and their updates stay float32 on the ps either way (cluster/training/train.py WeightReads).
TRANSFER_DTYPES = ('float32', 'bfloat16')
RESTART_POLICIES = ('never', 'on-failure')
# none: tasks are plain local processes (their ports reachable from the network); netns: every
# task of a local cluster runs in one private network namespace nothing outside can reach.
ISOLATION_MODES = ('none', 'netns')


@dataclass(frozen=True)
class SuperviseConfig:
    """What the launcher does when a task is lost or the run stops making progress."""
    restart: str = 'never'           # never | on-failure: bring the cluster back from its checkpoint
    max_restarts: int = 3            # per run, all tasks together
    stall_secs: float = 60.0         # no new global step for this long (after the first) is a fault
    backoff_secs: float = 1.0        # the wait before a restart: this, doubling with each restart in a
    backoff_max_secs: float = 30.0   # row that did not bring the training back, up to this
    unreachable_secs: float = 30.0   # a host that cannot be asked for this long has lost its tasks


def _empty() -> Mapping:
    return types.MappingProxyType({})


K = TypeVar('K')
V = TypeVar('V')


def emptied(mapping: Mapping[K, V]) -> Mapping[K, V]:
    """An empty mapping of `mapping`'s own type: a spec's hosts or GPUs where they mean nothing.

    The same type rather than always a read-only proxy: a spec built in code may hold plain dicts,
    and the copy compares and hashes as the original's kind does."""
    new = cast('Callable[[dict[K, V]], Mapping[K, V]]', type(mapping))    # Mapping's own type takes no argument
    return new({})


@dataclass(frozen=True)
class ClusterSpec:
    path: str
    tasks: tuple[TaskSpec, ...]
    train: TrainConfig
    hosts: Mapping[str, HostConfig] = field(default_factory=_empty)
    supervise: SuperviseConfig = SuperviseConfig()
    isolation: str = 'none'          # one of ISOLATION_MODES
    env: Mapping[str, str] = field(default_factory=_empty)      # every task's
    job_env: Mapping[str, Mapping[str, str]] = field(default_factory=_empty)
    gpus: Mapping[str, int] = field(default_factory=_empty)     # host -> GPU count
    # `{from_env: NAME}` values: variable -> the launcher's variable it takes its value from
    # (cluster/spec/environ.py); one the launcher's environment lacks has no value in env/job_env.
    env_from: Mapping[str, str] = field(default_factory=_empty)
    job_env_from: Mapping[str, Mapping[str, str]] = field(default_factory=_empty)
    live: int | None = None          # workers that run now, of the pool (None: every one; never in YAML)
    origins: Origins | None = field(default=None, compare=False, repr=False)   # where each key was given

    def error(self, key: str, message: str) -> SpecError:
        """A SpecError about `key` that names where it was given (file:line or --set), found only
        now that the spec is used (a train_dir that is a file, a data set of the wrong size)."""
        if self.origins is None:
            return SpecError(f'{self.path}: {key}: {message}')
        return self.origins.error(key, message)

    def job_tasks(self, job: str) -> tuple[TaskSpec, ...]:
        return tuple(t for t in self.tasks if t.job == job)

    @property
    def num_workers(self) -> int:
        return len(self.job_tasks('worker'))

    @property
    def coordinator(self) -> bool:
        """A TF2 ParameterServerStrategy run: the chief runs the user's program, workers and ps
        tasks only serve (cluster/coordinator.py)."""
        return bool(self.job_tasks('chief'))

    @property
    def chief(self) -> TaskSpec:
        """The task that initialises, restores and saves: the chief, else worker 0."""
        return (self.job_tasks('chief') or self.job_tasks('worker'))[0]

    @property
    def num_ps(self) -> int:
        return len(self.job_tasks('ps'))

    @property
    def live_workers(self) -> int:
        """The workers that train now: the whole pool unless `launch up --workers` or `launch
        scale` run fewer (cluster/runtime/membership.py)."""
        return self.live or self.num_workers

    @property
    def replicas_to_aggregate(self) -> int:
        return self.train.replicas_to_aggregate or self.live_workers

    def cluster_def(self) -> dict[str, list[str]]:
        """job -> addresses of the training cluster (no evaluator), the shape tf.train.ClusterSpec and
        TF_CONFIG take."""
        return {job: [t.address for t in self.job_tasks(job)] for job in TRAINING_JOBS if self.job_tasks(job)}

    def all_jobs_def(self) -> dict[str, list[str]]:
        """job -> addresses of every task, the evaluator included: the spec file's `cluster`."""
        return {job: [t.address for t in self.job_tasks(job)] for job in JOBS if self.job_tasks(job)}

    def tf_config(self, task: TaskSpec) -> str:
        """TF_CONFIG for `task`: the cluster and the task, as TensorFlow's resolvers read it. An
        evaluator's names only itself: in the training cluster it would make the coordinator wait."""
        cluster = {'evaluator': [task.address]} if task.job == 'evaluator' else self.cluster_def()
        return json.dumps({'cluster': cluster, 'task': {'type': task.job, 'index': task.index}}, sort_keys=True,
                          allow_nan=False)

    def task_env(self, job: str) -> dict[str, str]:
        """The environment the spec gives a task of `job`: `env`, then `tasks.<job>.env` over it."""
        return {**self.env, **self.job_env.get(job, {})}

    def hides(self, job: str, name: str) -> bool:
        """Whether the value of `name` in a task of `job` is never shown nor written (plan, spec
        copy, report): a secret-looking name, or a value taken from the launcher's environment."""
        return environ.looks_secret(name) or name in self.env_from or name in self.job_env_from.get(job, {})

    @property
    def has_hidden_env(self) -> bool:
        """Whether any task gets a value `hides` keeps from view: a file that carries the tasks'
        environment for a scheduler (a compose file, a batch script) is then its owner's alone."""
        return any(self.hides(job, name) for job in JOBS for name in self.task_env(job)) or \
            bool(self.env_from or self.job_env_from)

    def check_references(self) -> None:
        """SpecError, naming the key, for the first `{from_env: NAME}` whose NAME the environment
        the spec was read in lacks: where the values are needed (a run, a plan, a rendered file).
        A task reading its spec copy, or `launch status`, needs none of them."""
        scopes = [('env', self.env_from, self.env)] + \
            [(f'tasks.{job}.env', refs, self.job_env.get(job, {})) for job, refs in self.job_env_from.items()]
        for key, refs, values in scopes:
            for name, source in refs.items():
                if name not in values:
                    raise self.error(f'{key}.{name}', f"{environ.FROM_ENV}: {source} is not set in the launcher's "
                                                      f'environment (export {source}=... before running launch)')

    def task(self, job: str, index: int) -> TaskSpec:
        if job not in JOBS:
            raise SpecError(f'{self.path}: unknown job {job!r}; expected one of {", ".join(JOBS)}')
        tasks = self.job_tasks(job)
        if not tasks:
            raise SpecError(f'{self.path}: task {job}:{index} does not exist: the cluster has no {job} task')
        if not 0 <= index < len(tasks):
            raise SpecError(f'{self.path}: task {job}:{index} does not exist; job {job!r} has '
                            f'{len(tasks)} task(s), indices 0..{len(tasks) - 1}')
        return tasks[index]

    def to_dict(self) -> dict:
        """The effective spec (overrides applied) in the file format, for tasks to read back. No
        hidden value is written (see hides): each is `{from_env: NAME}`, its own name, which the
        launcher sets in every task's environment, so a task reading this copy finds the value
        there, and the copy is safe to keep and to upload."""
        out: dict[str, Any] = {'cluster': self.all_jobs_def(), 'train': _train_dict(self.train),
               'supervise': dataclasses.asdict(self.supervise)}
        hosts = {name: {k: v for k, v in dataclasses.asdict(h).items() if k != 'name' and v is not None}
                 for name, h in self.hosts.items()}
        if hosts:
            out['hosts'] = hosts
        if self.isolation != 'none':
            out['isolation'] = self.isolation
        if self.env or self.env_from:
            out['env'] = _env_dict(self.env, self.env_from)
        if self.job_env or self.job_env_from:
            out['tasks'] = {job: {'env': _env_dict(self.job_env.get(job, {}), self.job_env_from.get(job, {}))}
                            for job in {**self.job_env, **self.job_env_from}}
        if self.gpus:
            out['gpus'] = dict(self.gpus)
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def _env_dict(values: Mapping[str, str], references: Mapping[str, str]) -> dict[str, Any]:
    """One env section as the file spells it, a hidden value as a reference to its own name."""
    names = list(values) + [n for n in references if n not in values]
    return {name: {environ.FROM_ENV: name} if name in references or environ.looks_secret(name) else values[name]
            for name in names}


def _train_dict(train: TrainConfig) -> dict:
    """The train section as the file spells it: lists for tuples, no line for the built-in trainer."""
    out: dict[str, Any] = dataclasses.asdict(train)
    for name in ('devices', 'command', 'evaluator'):
        if isinstance(out[name], tuple):
            out[name] = list(out[name])
    for name in ('program', 'command', 'evaluator'):     # the built-in trainer: not worth a line each
        if out[name] is None:
            del out[name]
    return out
