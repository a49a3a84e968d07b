"""The spec's frozen types: a cluster's tasks and its train, supervise and host settings.

Everything downstream takes these, never raw dicts; they are built once, validated, by
cluster/spec/validate.py. The small pure helpers here (an address, the chief, one name per
machine) are the ones every side of the launcher and the task runtime agrees on.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
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


class Value(str, Enum):
    """How the validator reads a setting's YAML value (cluster/spec/validate.py, one rule per kind,
    with the field's bounds and choices from `setting`): a key added to a config class is parsed
    by its kind, or by a parser of its own (OWN, which validate.OWN_PARSERS must hold), never
    dropped."""
    SWITCH = 'switch'           # true or false
    COUNT = 'count'             # a whole number >= 1
    WHOLE = 'whole'             # a whole number >= 0
    INTEGER = 'integer'         # any whole number
    POSITIVE = 'positive'       # a finite number > 0, kept as a float
    NONNEGATIVE = 'nonnegative'     # a finite number >= 0, kept as a float
    PATH = 'path'               # a string that is not blank
    TEXT = 'text'               # a string
    CHOICE = 'choice'           # one of `allowed`
    OWN = 'own'                 # a parser of its own


def setting(default: Any, doc: str, value: Value, *, yaml_type: str | None = None, allowed: tuple[str, ...] = (),
            unit: str = '', nullable: bool = False) -> Any:
    """A spec key's field: its default, what the key does, in the words of the spec reference page
    (docs/reference/spec.md, made from these at build time; cluster/spec/keys.py reads them), and
    how its YAML value is checked (`value`, with `unit` in its errors, `nullable`: null gives None).
    `yaml_type` where the YAML a user writes is not the field's Python type; `allowed` where the
    key takes one of a few words (a CHOICE)."""
    return field(default=default, metadata={'doc': doc, 'yaml_type': yaml_type, 'allowed': allowed, 'value': value,
                                            'unit': unit, 'nullable': nullable})


@dataclass(frozen=True)
class HostConfig:
    """How to reach a host over SSH; None means "ask ~/.ssh/config, then the defaults". With the
    Ray backend, also which nodes may run its tasks (labels)."""
    name: str
    user: str | None = setting(None, 'The SSH user; null: as ~/.ssh/config says, else your own user name.', Value.TEXT)
    port: int | None = setting(None, 'The SSH port; null: as ~/.ssh/config says, else 22.', Value.OWN)
    key: str | None = setting(None, 'The private key file to log in with; null: as ~/.ssh/config and the SSH agent '
                                    'say.', Value.TEXT)
    python: str | None = setting(None, 'The Python that runs the tasks on this host: TensorFlow and tfcluster must '
                                       'import there (`launch check` tries); null: python3.', Value.TEXT)
    workdir: str | None = setting(None, "The directory the tasks run in on this host, where the spec's relative paths "
                                        "(train.train_dir, train.data) point; null: tfcluster, in the SSH user's home.",
                                  Value.TEXT)
    address: str | None = setting(None, 'The host name or IP address the other tasks reach this host at (TF_CONFIG), '
                                        "when it differs from the name SSH uses; null: the ssh config's HostName, "
                                        'else the name itself.', Value.OWN)
    # Pairs, not a dict: the config stays hashable; `selector` is the mapping.
    labels: tuple[tuple[str, str], ...] = setting(
        (), 'With --backend ray: Ray node labels (label: value) that place the tasks on this host on any node '
            'that has them all, e.g. {zone: b}; Ray picks among the nodes that match. Other backends refuse a '
            'host with labels (they could not honour them); null: no labels.', Value.OWN,
        yaml_type='mapping of string to string')

    @property
    def selector(self) -> dict[str, str]:
        """The labels as Ray's label_selector takes them ({} where none are given)."""
        return dict(self.labels)


HOST_SETTINGS = ('user', 'port', 'key', 'python', 'workdir', 'address', 'labels')
# What the weights and gradients are sent between the ps tasks and the workers as; the variables
# and their updates stay float32 on the ps either way (cluster/training/train.py WeightReads).
TRANSFER_DTYPES = ('float32', 'bfloat16')
RESTART_POLICIES = ('never', 'on-failure')
# none: tasks are plain local processes (their ports reachable from the network); netns: every
# task of a local cluster runs in one private network namespace nothing outside can reach.
ISOLATION_MODES = ('none', 'netns')
# What `tasks.<job>` may set for every task of that job.
JOB_SETTINGS = ('env',)


@dataclass(frozen=True)
class TrainConfig:
    """What the tasks train and how: the built-in CIFAR-10 trainer's settings, or your own program."""
    sync: bool = setting(True, 'Synchronous training: each global step aggregates one gradient from each of '
                               'train.replicas_to_aggregate workers (SyncReplicasOptimizer); false: every worker '
                               'updates the parameters on its own (asynchronous).', Value.SWITCH)
    steps: int = setting(2000, 'The global step the training runs to; a resumed run trains up to it, not that many '
                               'more.', Value.COUNT)
    batch_size: int = setting(128, 'Examples per tower in each step (a worker with N towers takes N batches a step).',
                              Value.COUNT)
    devices: Any = setting('auto', 'The towers of each worker: auto (every GPU the worker is given, else one CPU '
                                   'tower), a number of CPU towers, or a list of devices such as [gpu:0, gpu:1].',
                           Value.OWN,
                           yaml_type='auto, integer or list of cpu:N / gpu:N')
    data: str = setting('synthetic', "What to train on: synthetic (learnable images in CIFAR-10's format, written "
                                     "under the train_dir), fashion-mnist (Debian's dataset-fashion-mnist package), "
                                     "or a directory of CIFAR-10's binary batches or of the four IDX files of "
                                     'MNIST or Fashion-MNIST.', Value.PATH)
    train_dir: str = setting('runs/default', "The run's directory: checkpoints, summaries, task logs, events.jsonl, "
                                             "run.json and the launcher's state. Absolute, or relative to the working "
                                             "directory (a remote host's workdir); ~ is refused.", Value.OWN)
    learning_rate: float | None = setting(None, 'The initial learning rate, decayed x0.1 every 350 epochs; null: 0.1 '
                                                'per 128 examples one update averages (0.1 for sync 2 x 64, 0.05 for '
                                                'async 64).', Value.POSITIVE, nullable=True)
    replicas_to_aggregate: int | None = setting(None, 'Sync: the gradients one global step aggregates, 1 to the '
                                                      'number of workers; fewer than the workers makes the rest '
                                                      'backup workers. null: every worker.', Value.COUNT, nullable=True)
    backup_workers: int = setting(0, 'Sync: this many backup workers. Each global step aggregates the gradients of '
                                     'the first live workers minus this many to finish, and drops the rest as '
                                     'stale, so a slow worker no longer sets the pace (Chen et al., "Revisiting '
                                     'Distributed Synchronous SGD", 2016). The same as replicas_to_aggregate: '
                                     'workers - N, kept as the live workers change; give one of the two.',
                                  Value.WHOLE)
    checkpoint_steps: int = setting(0, 'The chief saves a checkpoint every this many global steps; 0: only by time '
                                       '(train.checkpoint_secs) and at the end.', Value.WHOLE)
    checkpoint_secs: float = setting(60.0, 'The chief saves a checkpoint at least this often, in seconds, and at the '
                                           'end.', Value.POSITIVE)
    log_every_secs: float = setting(2.0, 'How often the chief prints a progress line (step, loss, images/s), which '
                                         'the launcher follows; supervise.stall_secs must be at least 3 times this.',
                                    Value.POSITIVE)
    seed: int | None = setting(None, 'The graph-level random seed (initial weights, input order, distortions); '
                                     'null: a new one each run.', Value.INTEGER, nullable=True)
    deterministic: bool = setting(False, 'Plain record order and no distortions, worker w reading batches w, w+W, '
                                         '...: for exactness checks, not for training well.', Value.SWITCH)
    partitions: int | None = setting(None, 'The row blocks the built-in model\'s largest weights (local3: 83% of its '
                                           'bytes) are split into, for the ps tasks to share them; null: one per ps '
                                           'task. `launch plan` says which count balances the ps tasks best.',
                                     Value.COUNT, nullable=True)
    transfer_dtype: str = setting('float32', 'What weights and gradients cross between the ps tasks and the workers '
                                             'as; bfloat16 sends half the bytes (the variables and their updates stay '
                                             'float32 on the ps).', Value.CHOICE, allowed=TRANSFER_DTYPES)
    # The user's own training instead of the built-in CIFAR-10 trainer (at most one of the two):
    program: str | None = setting(None, 'Your own training instead of the built-in trainer: a '
                                        'package.module:function called in each worker (cluster/program.py), or in '
                                        'the chief of a coordinator run (cluster/coordinator.py). Excludes '
                                        'train.command.', Value.OWN, yaml_type='string (package.module:function)')
    command: tuple[str, ...] | None = setting(None, 'Your own training as a command run in every task with TF_CONFIG '
                                                    'and the TF1 flags (in a coordinator run: in the chief only, with '
                                                    'TF_CONFIG alone); a string is split into words as a POSIX shell '
                                                    'splits them, without expansion. Excludes train.program.',
                                              Value.OWN,
                                              yaml_type='string or list of strings')
    evaluator: str | tuple[str, ...] | None = setting(
        None, 'What the evaluator task runs: a package.module:function (called with an EvaluatorContext) or a '
              'command line; its TF_CONFIG names only the evaluator. Needed by, and only allowed with, a '
              'cluster.evaluator task.', Value.OWN, yaml_type='string or list of strings')


@dataclass(frozen=True)
class SuperviseConfig:
    """What the launcher does when a task is lost or the run stops making progress."""
    restart: str = setting('never', 'What a fault does: never ends the run (exit 1; a worker the training can do '
                                    'without is let go); on-failure brings the cluster back from its newest '
                                    'checkpoint, or starts a lost worker again alone.',
                           Value.CHOICE, allowed=RESTART_POLICIES)
    max_restarts: int = setting(3, 'Restarts per run, all tasks together; once they are made, the next fault ends '
                                   'the run as with never.', Value.WHOLE)
    stall_secs: float = setting(60.0, 'No new global step for this long (after the first) is a fault: the tasks '
                                      'that answer dump their Python stacks, then restart says what follows. At '
                                      'least 3 times train.log_every_secs.', Value.POSITIVE, unit='seconds')
    backoff_secs: float = setting(1.0, 'The wait before the second restart in a row that did not bring the training '
                                       'back, doubling with each one after (the first waits nothing); 0: none.', Value.NONNEGATIVE, unit='seconds')
    backoff_max_secs: float = setting(30.0, 'The longest wait before a restart.', Value.POSITIVE, unit='seconds')
    unreachable_secs: float = setting(30.0, 'A host that cannot be asked about its tasks for this long (SSH) has '
                                            'lost them.', Value.POSITIVE, unit='seconds')
    preemption_grace: float = setting(30.0, 'Seconds a task has, after a SIGTERM from outside the launcher (a node '
                                            'shutting down, a pod deleted, Slurm\'s --signal, launch preempt), to '
                                            'have its checkpoint saved and exit "preempted", which is not counted '
                                            'against max_restarts; 0: such a SIGTERM is a fault, as before.',
                                      Value.NONNEGATIVE, unit='seconds')
    standby: int = setting(1, 'Warm processes per host that have imported TensorFlow and wait to become a restarted '
                              'task (local and ssh backends; others ignore it); 0: none. Each holds memory: launch '
                              'plan says how much.', Value.WHOLE)
    sample_secs: float = setting(30.0, 'How often a `sample` event records what each running task measured of '
                                       'itself (its steps/s, CPU, memory, TCP bytes in and out); the launcher reads '
                                       'them every 5 s (or this, if less) and names a worker that stays below 0.67x '
                                       'of the others\' steps/s a straggler. 0: neither.',
                                 Value.NONNEGATIVE, unit='seconds')


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
        return self._by_job.get(job, ())

    # Made once per spec (a frozen value: dataclasses.replace makes a new one), since planning asks
    # them of every task: at 1,000 tasks, building them per task was 10^6 steps and 1.3 s.
    @functools.cached_property
    def _by_job(self) -> dict[str, tuple[TaskSpec, ...]]:
        jobs: dict[str, list[TaskSpec]] = {}
        for t in self.tasks:
            jobs.setdefault(t.job, []).append(t)
        return {job: tuple(tasks) for job, tasks in jobs.items()}

    @functools.cached_property
    def _cluster_json(self) -> str:
        return json.dumps(self.cluster_def(), sort_keys=True, allow_nan=False)

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
    def partitions(self) -> int:
        """The blocks the built-in model's local3 weights are split into (train.partitions)."""
        return self.train.partitions or self.num_ps

    @property
    def replicas_to_aggregate(self) -> int:
        return self.train.replicas_to_aggregate or max(1, self.live_workers - self.train.backup_workers)

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
        if task.job == 'evaluator':
            return json.dumps({'cluster': {'evaluator': [task.address]}, 'task': {'type': task.job, 'index': task.index}},
                              sort_keys=True, allow_nan=False)
        # json.dumps(sort_keys=True) of {'cluster': ..., 'task': ...}, the cluster's part made once
        which = json.dumps({'index': task.index, 'type': task.job}, allow_nan=False)
        return f'{{"cluster": {self._cluster_json}, "task": {which}}}'

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
        hosts = {name: {k: v for k, v in {**dataclasses.asdict(h), 'labels': h.selector or None}.items()
                        if k != 'name' and v is not None} for name, h in self.hosts.items()}
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
