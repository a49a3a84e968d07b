"""The cluster spec: the user-facing contract, parsed and validated once at the edge.

Everything downstream takes the frozen types defined here, never raw dicts. A spec error is a
`SpecError` whose message is one line naming where the bad value came from (`file:line` or the
`--set` argument), the dotted key and what was expected.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
import select
import shlex
import stat
import time
import types
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

JOBS = ('ps', 'worker')
SECTIONS = ('cluster', 'train', 'supervise', 'hosts', 'isolation', 'env', 'tasks', 'gpus')
DEFAULT_SPEC = os.path.join('specs', 'local2.yaml')
_HOSTNAME = re.compile(r'^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*$')
_DEVICE = re.compile(r'^(cpu|gpu):(\d+)$')


def address(host: str, port: int) -> str:
    """'host:port', with an IPv6 host in brackets, as gRPC and TF_CONFIG want it."""
    return f'[{host}]:{port}' if ':' in host else f'{host}:{port}'


class SpecError(ValueError):
    """A user error in a spec or an override; the message is one line."""


def is_chief(job: str, index: int) -> bool:
    """Worker 0 is the chief (it initialises, restores and saves), wherever a task is named."""
    return job == 'worker' and index == 0


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
    program: str | None = None       # 'package.module:function', called in each worker (cluster/program.py)
    command: tuple[str, ...] | None = None   # argv run in every task with TF_CONFIG and the TF1 flags


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
    backoff_max_secs: float = 30.0   # row up to this; a run healthy for a while starts again at 1x
    unreachable_secs: float = 30.0   # a host that cannot be asked for this long has lost its tasks


@dataclass(frozen=True)
class ClusterSpec:
    path: str
    tasks: tuple[TaskSpec, ...]
    train: TrainConfig
    hosts: Mapping[str, HostConfig] = field(default_factory=lambda: types.MappingProxyType({}))
    supervise: SuperviseConfig = SuperviseConfig()
    isolation: str = 'none'          # one of ISOLATION_MODES
    env: Mapping[str, str] = field(default_factory=lambda: types.MappingProxyType({}))   # every task's
    job_env: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: types.MappingProxyType({}))
    gpus: Mapping[str, int] = field(default_factory=lambda: types.MappingProxyType({}))  # host -> GPU count
    live: int | None = None          # workers that run now, of the pool (None: every one; never in YAML)
    origins: Any = field(default=None, compare=False, repr=False)   # _Origins: where each key was given

    def error(self, key: str, message: str) -> 'SpecError':
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
        """job -> addresses, the shape tf.train.ClusterSpec and TF_CONFIG take."""
        return {job: [t.address for t in self.job_tasks(job)] for job in JOBS if self.job_tasks(job)}

    def tf_config(self, task: TaskSpec) -> str:
        """TF_CONFIG for `task`: the cluster and the task, as TensorFlow's resolvers read it."""
        return json.dumps({'cluster': self.cluster_def(), 'task': {'type': task.job, 'index': task.index}},
                          sort_keys=True)

    def task_env(self, job: str) -> dict[str, str]:
        """The environment the spec gives a task of `job`: `env`, then `tasks.<job>.env` over it."""
        return {**self.env, **self.job_env.get(job, {})}

    def task(self, job: str, index: int) -> TaskSpec:
        if job not in JOBS:
            raise SpecError(f'{self.path}: unknown job {job!r}; expected one of {", ".join(JOBS)}')
        tasks = self.job_tasks(job)
        if not 0 <= index < len(tasks):
            raise SpecError(f'{self.path}: task {job}:{index} does not exist; job {job!r} has '
                            f'{len(tasks)} task(s), indices 0..{len(tasks) - 1}')
        return tasks[index]

    def to_dict(self) -> dict:
        """The effective spec (overrides applied) in the file format, for tasks to read back."""
        train = dataclasses.asdict(self.train)
        for name in ('devices', 'command'):
            if isinstance(train[name], tuple):
                train[name] = list(train[name])
        for name in ('program', 'command'):     # the built-in trainer: not worth a line each
            if train[name] is None:
                del train[name]
        hosts = {name: {k: v for k, v in dataclasses.asdict(h).items() if k != 'name' and v is not None}
                 for name, h in self.hosts.items()}
        out = {'cluster': self.cluster_def(), 'train': train, 'supervise': dataclasses.asdict(self.supervise)}
        if hosts:
            out['hosts'] = hosts
        if self.isolation != 'none':
            out['isolation'] = self.isolation
        if self.env:
            out['env'] = dict(self.env)
        if self.job_env:
            out['tasks'] = {job: {'env': dict(env)} for job, env in self.job_env.items()}
        if self.gpus:
            out['gpus'] = dict(self.gpus)
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Loading

class _Origins:
    """Remembers where each dotted key came from, so errors can point at it."""

    def __init__(self, path: str):
        self.path = path
        self._where: dict[str, str] = {}

    def record_yaml(self, node: yaml.Node, prefix: str = '') -> None:
        self._where[prefix] = f'{self.path}:{node.start_mark.line + 1}'
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int] = {}
            for key_node, value_node in node.value:
                key = f'{prefix}.{key_node.value}' if prefix else str(key_node.value)
                line = key_node.start_mark.line + 1
                if key in first_line:       # PyYAML would keep the last one without a word
                    raise SpecError(f'{self.path}:{line}: {key}: duplicate key (first given on line '
                                    f'{first_line[key]})')
                first_line[key] = line
                self.record_yaml(value_node, key)
                self._where[key] = f'{self.path}:{key_node.start_mark.line + 1}'
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.record_yaml(item, f'{prefix}[{i}]')

    def record_value(self, key: str, where: str) -> None:
        """`key` came whole from somewhere else than the file (TF_CONFIG)."""
        for known in list(self._where):
            if known == key or known.startswith(key + '.') or known.startswith(key + '['):
                del self._where[known]
        self._where[key] = where

    def record_override(self, key: str, text: str) -> None:
        self.record_value(key, f'--set {text}')

    def error(self, key: str, message: str) -> SpecError:
        return SpecError(f'{self._locate(key)}: {key}: {message}')

    def _locate(self, key: str) -> str:
        """Where `key` came from: itself, else a --set below it, else its nearest ancestor."""
        probe = key
        while probe:
            if probe in self._where:
                return self._where[probe]
            below = [w for k, w in self._where.items() if k.startswith((probe + '.', probe + '['))]
            if below and below[0].startswith('--set'):
                return below[0]
            parent = re.sub(r'(\.[^.\[]*|\[\d+\])$', '', probe)
            probe = '' if parent == probe else parent
        return self.path


# A spec is a few hundred bytes of YAML. Anything far bigger is a mistake (a wrong file, a device,
# a "billion laughs" of nested aliases): refused in one line before it can take the machine's memory.
MAX_SPEC_BYTES = 1 << 20            # 1 MiB read at most, whatever the file is (a FIFO, /dev/zero)
MAX_SPEC_VALUES = 100_000           # values (mappings, lists, scalars) with YAML aliases expanded
SPEC_READ_SECS = 10                 # a FIFO or a terminal: the most the whole spec may take to arrive


class _YAMLSyntaxError(SpecError):
    pass


def _read_spec_text(path: str) -> str:
    """The spec file's text, read without ever reading more than MAX_SPEC_BYTES + 1 bytes (a FIFO
    or a device is read up to that too) nor waiting more than SPEC_READ_SECS for it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SpecError(f'{path}: spec file not found') from None
    except IsADirectoryError:
        raise SpecError(f'{path}: is a directory, not a spec file') from None
    except OSError as e:
        raise SpecError(f'{path}: cannot read spec file: {e.strerror}') from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise SpecError(f'{path}: is a directory, not a spec file')
        if stat.S_ISREG(info.st_mode) and info.st_size > MAX_SPEC_BYTES:
            raise SpecError(f'{path}: spec file is {info.st_size:,} bytes, over the limit of {MAX_SPEC_BYTES:,} '
                            '(1 MiB): a spec is a short YAML file')
        chunks, size = [], 0
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + SPEC_READ_SECS
        while size <= MAX_SPEC_BYTES:
            # A FIFO's writer may come later (and a FIFO that never had one is not ready, where a
            # read would say end of file); a terminal may never send anything: wait, not for ever.
            if not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
                raise SpecError(f'{path}: nothing more to read after {SPEC_READ_SECS}s ({size:,} bytes read): '
                                'a spec is a file, or a pipe whose writer ends')
            try:
                chunk = os.read(fd, MAX_SPEC_BYTES + 1 - size)
            except BlockingIOError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise SpecError(f'{path}: cannot read spec file: {e.strerror}') from None
    finally:
        os.close(fd)
    if size > MAX_SPEC_BYTES:
        raise SpecError(f'{path}: more than {MAX_SPEC_BYTES:,} bytes (1 MiB) to read, the limit for a spec: '
                        'a spec is a short YAML file')
    data = b''.join(chunks)
    try:
        return data.decode('utf-8')
    except UnicodeDecodeError as e:
        line = data.count(b'\n', 0, e.start) + 1
        column = e.start - (data.rfind(b'\n', 0, e.start) + 1) + 1
        raise SpecError(f'{path}:{line}: not a YAML spec: byte {e.start} (line {line}, column {column}) '
                        'is not UTF-8 text') from None


def _parse_yaml(text: str, where: str, line_numbers: bool) -> tuple[yaml.Node | None, Any]:
    """(node tree, data) of one YAML document, read once. SpecError, one line beginning with
    `where` (and `:LINE` with `line_numbers`), for a syntax error, a value that contains itself
    through an alias, nesting too deep to read, or more than MAX_SPEC_VALUES values once its
    aliases are expanded (the data itself shares what an alias repeats, but everything that walks
    it, down to an error message's repr, would not)."""
    def at(line: int | None) -> str:
        return f'{where}:{line}' if line_numbers and line is not None else where
    loader = None
    try:
        try:
            loader = _CountingLoader(text)      # reading starts here: it refuses control characters
            node = loader.get_single_node()
            if node is None:
                return None, None
            _check_expansion(node, lambda line, key, message: SpecError(
                f'{at(line)}: {key + ": " if key else ""}{message}'))
            return node, loader.construct_document(node)
        except yaml.reader.ReaderError as e:
            line = text.count('\n', 0, e.position) + 1 if isinstance(e.position, int) else None
            raise _YAMLSyntaxError(f'{at(line)}: YAML syntax error: {str(e).splitlines()[0]}') from None
        except yaml.YAMLError as e:
            mark = getattr(e, 'problem_mark', None)
            problem = getattr(e, 'problem', None) or str(e).splitlines()[0]
            raise _YAMLSyntaxError(f'{at(mark.line + 1 if mark else None)}: YAML syntax error: {problem}') from None
        except _TooManyValues as e:
            raise SpecError(f'{at(e.line)}: more than {MAX_SPEC_VALUES:,} values by this line; a spec holds at '
                            f'most {MAX_SPEC_VALUES:,}') from None
        except RecursionError:
            raise SpecError(f'{at(loader.get_mark().line + 1)}: YAML nested too deeply to read (a spec is a few '
                            'levels deep)') from None
    finally:
        if loader is not None:
            loader.dispose()


class _TooManyValues(Exception):
    def __init__(self, line: int):
        super().__init__(line)
        self.line = line


class _CountingLoader(yaml.SafeLoader):
    """A SafeLoader that stops composing after MAX_SPEC_VALUES nodes (a flat list of half a
    million items fits in 1 MiB, and PyYAML takes most of a minute and ~400 MB to compose it)."""
    composed = 0

    def compose_node(self, parent, index):
        if not self.check_event(yaml.AliasEvent):
            self.composed += 1
            if self.composed > MAX_SPEC_VALUES:
                raise _TooManyValues(self.peek_event().start_mark.line + 1)
        return super().compose_node(parent, index)


def _children(node: yaml.Node) -> list[tuple[str | None, yaml.Node]]:
    """(key part, child) of a node: a mapping's keys (part None) and values, a list's items."""
    if isinstance(node, yaml.MappingNode):
        out = []
        for k, v in node.value:
            out += [(None, k), (f'.{k.value}' if isinstance(k, yaml.ScalarNode) else '.?', v)]
        return out
    if isinstance(node, yaml.SequenceNode):
        return [(f'[{i}]', item) for i, item in enumerate(node.value)]
    return []


def _check_expansion(root: yaml.Node, error) -> None:
    """Raise error(line, key, message) if the node graph has a cycle or holds more than
    MAX_SPEC_VALUES values with its aliases expanded. Linear in the distinct nodes: each node's
    expanded size is computed once (an alias is the same node object as its anchor)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack = [(root, iter(_children(root)))]
    open_nodes.add(id(root))
    while stack:
        node, todo = stack[-1]
        nxt = next(todo, None)
        if nxt is None:
            stack.pop()
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(c)] for _, c in _children(node))
            continue
        child = nxt[1]
        if id(child) in open_nodes:
            raise error(child.start_mark.line + 1, '', 'a YAML alias refers to a value that contains it (*name '
                                                       'inside &name): a spec cannot be a cycle')
        if id(child) not in sizes:
            open_nodes.add(id(child))
            stack.append((child, iter(_children(child))))
    total = sizes[id(root)]
    if total <= MAX_SPEC_VALUES:
        return
    node, key = root, ''        # the innermost value that is over the limit: where the aliases multiply
    while True:
        over = next(((part, c) for part, c in _children(node) if sizes[id(c)] > MAX_SPEC_VALUES), None)
        if over is None:
            break
        key, node = key + (over[0] or ''), over[1]
    aliased = ' once its YAML aliases (*name) are expanded' if total > len(sizes) else ''
    raise error(node.start_mark.line + 1, key.lstrip('.'),
                f'holds {sizes[id(node)]:,} values{aliased}; a spec holds at most {MAX_SPEC_VALUES:,}')


def load_spec(path: str | None, overrides: list[str] | tuple[str, ...] = (),
              cluster: dict | None = None, cluster_source: str | None = None) -> ClusterSpec:
    """Read, override and validate a spec file. Raises SpecError (one line) on any user error.
    `cluster` (from TF_CONFIG, or `cluster_source` if named) replaces the file's cluster section;
    with it, `path` may be None: the train settings are then the defaults and the overrides."""
    source = cluster_source or TF_CONFIG_ENV
    if path is None:
        origins = _Origins(source)
        raw: dict = {'cluster': cluster}
        origins.record_value('cluster', source)
        for text_override in overrides:
            _apply_override(raw, text_override, origins)
        return _build(raw, origins)
    origins = _Origins(path)
    node, raw = _parse_yaml(_read_spec_text(path), path, line_numbers=True)
    if node is not None:
        origins.record_yaml(node)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SpecError(f'{path}:1: the spec must be a mapping with a "cluster" section')
    if cluster is not None:
        raw['cluster'] = cluster
        origins.record_value('cluster', source)
    for text_override in overrides:
        _apply_override(raw, text_override, origins)
    return _build(raw, origins)


TF_CONFIG_ENV = 'TF_CONFIG'


def read_tf_config(text: str) -> tuple[dict, str, int]:
    """TF_CONFIG (as Kubeflow's TFJob, SageMaker and Vertex set it) -> (cluster, job, index).
    Raises SpecError, one line, for text that is not JSON or a task that is not in its cluster."""
    try:
        config = json.loads(text)
    except ValueError as e:
        raise SpecError(f'{TF_CONFIG_ENV}: not JSON ({e}): {text[:60]!r}') from None
    if not isinstance(config, dict) or not isinstance(config.get('cluster'), dict):
        raise SpecError(f'{TF_CONFIG_ENV}: expected {{"cluster": {{"ps": [...], "worker": [...]}}, '
                        f'"task": {{"type": ..., "index": ...}}}}, got {text[:60]!r}')
    cluster = config['cluster']
    other = [job for job in cluster if job not in JOBS]
    if other:
        raise SpecError(f'{TF_CONFIG_ENV}: job {other[0]!r} is not one tfcluster runs: its clusters have ps and '
                        'worker jobs, and worker 0 is the chief (render a TFJob without Chief or Evaluator '
                        'replicas)')
    task = config.get('task')
    if not isinstance(task, dict) or 'type' not in task:
        raise SpecError(f'{TF_CONFIG_ENV}: no "task": {{"type": ..., "index": ...}} names this process\'s task')
    job, index = task.get('type'), task.get('index', 0)
    if isinstance(index, bool) or not isinstance(index, int):
        raise SpecError(f'{TF_CONFIG_ENV}: task index must be a whole number, got {index!r}')
    tasks = cluster.get(job)
    count = len(tasks) if isinstance(tasks, list) else (1 if isinstance(tasks, str) else 0)
    if job not in JOBS or not 0 <= index < count:
        raise SpecError(f'{TF_CONFIG_ENV}: task {job}:{index} is not in its cluster ('
                        + ', '.join(f'{j}: {len(v) if isinstance(v, list) else 1} task(s)' for j, v in cluster.items())
                        + ')')
    return cluster, job, index


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.steps=50' -> (['train', 'steps'], 50); the value is read as YAML."""
    key, sep, value = text.partition('=')
    parts = key.strip().split('.')
    if not sep or not all(re.fullmatch(r'[A-Za-z0-9_-]+', p) for p in parts):
        raise SpecError(f'--set {text}: expected dotted.key=value, e.g. --set train.steps=50')
    try:
        parsed = _parse_yaml(value, f'--set {_shorten(text)}', line_numbers=False)[1]
    except _YAMLSyntaxError:
        raise SpecError(f'--set {text}: the value is not valid YAML') from None
    if not value.strip():
        raise SpecError(f'--set {text}: missing value after "=" (write null to clear a key)')
    return parts, parsed


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + '...'


def _apply_override(raw: dict, text: str, origins: _Origins) -> None:
    parts, value = parse_override(text)
    if parts[0] == 'gpus' and len(parts) > 2:      # gpus.10.0.0.5=4: the rest is one host name
        parts = ['gpus', '.'.join(parts[1:])]
    if parts[0] == 'hosts' and len(parts) > 2:
        # Host names have dots of their own: hosts.10.0.0.5.user is host 10.0.0.5, setting user.
        # The whole rest names a host only when it is given a section (or null) and its last part
        # is neither a setting nor under a host the spec has: hosts.node1.usr=x stays a bad key.
        known = raw.get('hosts') if isinstance(raw.get('hosts'), dict) else {}
        whole = (isinstance(value, dict) or value is None) and parts[-1] not in HOST_SETTINGS \
            and '.'.join(parts[1:-1]) not in known
        name = parts[1:] if whole else parts[1:-1]
        parts = ['hosts', '.'.join(name)] + parts[1 + len(name):]
    target = raw
    for i, part in enumerate(parts[:-1]):
        child = target.get(part)
        if child is None:
            child = target[part] = {}
        if not isinstance(child, dict):
            raise SpecError(f'--set {text}: {".".join(parts[:i + 1])} is not a section')
        target = child
    target[parts[-1]] = value
    origins.record_override('.'.join(parts), text)


def _build(raw: dict, origins: _Origins) -> ClusterSpec:
    _no_unknown(raw, SECTIONS, '', origins)
    tasks = _parse_cluster(raw.get('cluster'), origins)
    train = _parse_train(raw.get('train') or {}, origins)
    supervise = _parse_supervise(raw.get('supervise') or {}, origins)
    hosts = _parse_hosts(raw.get('hosts') or {}, origins)
    isolation = _parse_isolation(raw.get('isolation', 'none'), tasks, hosts, origins)
    env = _parse_env(raw.get('env'), 'env', origins)
    job_env = _parse_job_settings(raw.get('tasks'), origins)
    gpus = _parse_gpus(raw.get('gpus'), tasks, origins)
    frozen = types.MappingProxyType
    spec = ClusterSpec(path=origins.path, tasks=tasks, train=train, hosts=frozen(hosts),
                       supervise=supervise, isolation=isolation, env=frozen(env),
                       job_env=frozen({job: frozen(e) for job, e in job_env.items()}), gpus=frozen(gpus),
                       origins=origins)
    if supervise.stall_secs < 3 * train.log_every_secs:
        key = 'supervise.stall_secs' if 'stall_secs' in (raw.get('supervise') or {}) else 'train.log_every_secs'
        raise origins.error(key, f'the stall limit ({supervise.stall_secs:g}s) must be at least 3 times '
                                 f'train.log_every_secs ({train.log_every_secs:g}s): progress is read from '
                                 'the chief\'s progress lines')
    r = train.replicas_to_aggregate
    if r is not None and not 1 <= r <= spec.num_workers:
        raise origins.error('train.replicas_to_aggregate',
                            f'must be between 1 and the number of workers ({spec.num_workers}), got {r}')
    return spec


def _no_unknown(mapping: dict, allowed, prefix: str, origins: _Origins) -> None:
    for key in mapping:
        if key not in allowed:
            name = str(key) if str(key).isprintable() else repr(key)
            dotted = f'{prefix}.{name}' if prefix else name
            raise origins.error(dotted, f'unknown key; expected one of {", ".join(allowed)}')


def _parse_cluster(cluster, origins: _Origins) -> tuple[TaskSpec, ...]:
    if cluster is None:
        raise origins.error('cluster', 'missing section; it maps ps and worker to lists of host:port')
    if not isinstance(cluster, dict):
        raise origins.error('cluster', 'expected a mapping of job name to a list of host:port')
    _no_unknown(cluster, JOBS, 'cluster', origins)
    tasks = []
    seen: dict[tuple[str, int], str] = {}
    for job in JOBS:
        addresses = cluster.get(job)
        if addresses is None or addresses == []:
            raise origins.error(f'cluster.{job}', f'missing job {job!r}: give at least one host:port')
        if isinstance(addresses, str):
            addresses = [addresses]
        if not isinstance(addresses, list):
            raise origins.error(f'cluster.{job}', 'expected a list of host:port')
        for index, address in enumerate(addresses):
            key = f'cluster.{job}[{index}]'
            host, port = parse_address(address, lambda msg: origins.error(key, msg))
            ident = (same_machine_key(host), port)
            if ident in seen:
                raise origins.error(key, f'{address} is used twice (also {seen[ident]}): '
                                         'every task needs its own host:port')
            seen[ident] = f'{job}:{index}'
            tasks.append(TaskSpec(job, index, host, port))
    return tuple(tasks)


def parse_address(address, error) -> tuple[str, int]:
    """'host:port' or '[v6]:port' -> (host, port); `error(msg)` builds the exception to raise."""
    if not isinstance(address, str):
        raise error(f'expected "host:port", got {address!r}')
    m = re.fullmatch(r'\[([0-9A-Fa-f:.]+)\]:(\S+)|([^:\s\[\]]+):(\S+)', address.strip())
    if not m:
        raise error(f'expected "host:port", got {address!r}')
    host, port_text = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if not re.fullmatch(r'[0-9]+', port_text):
        raise error(f'port must be a number, got {port_text!r} in {address!r}')
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise error(f'port must be between 1 and 65535, got {port} in {address!r}')
    if not _valid_host(host):
        raise error(f'invalid host name {host!r} in {address!r}')
    return host, port


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(_HOSTNAME.match(host)) and not host.replace('.', '').isdigit()


LOOPBACK_NAMES = ('localhost', '127.0.0.1', '::1')


def same_machine_key(host: str) -> str:
    """One name per machine for the names a spec may give it: every loopback name is localhost."""
    return 'localhost' if host in LOOPBACK_NAMES else host


def _expect(value, kinds, key, origins, what):
    if isinstance(value, bool) and bool not in kinds:
        raise origins.error(key, f'expected {what}, got {value!r}')
    if not isinstance(value, kinds):
        raise origins.error(key, f'expected {what}, got {value!r}')
    return value


def _parse_train(train, origins: _Origins) -> TrainConfig:
    if not isinstance(train, dict):
        raise origins.error('train', 'expected a mapping of training settings')
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    _no_unknown(train, sorted(fields), 'train', origins)
    values = {}
    for name, value in train.items():
        key = f'train.{name}'
        if name in ('sync', 'deterministic'):
            values[name] = _expect(value, (bool,), key, origins, 'true or false')
        elif name in ('steps', 'batch_size'):
            values[name] = _positive_int(value, key, origins)
        elif name in ('checkpoint_steps',):
            v = _expect(value, (int,), key, origins, 'a whole number >= 0')
            if v < 0:
                raise origins.error(key, f'expected a whole number >= 0, got {v}')
            values[name] = v
        elif name == 'learning_rate' and value is None:
            values[name] = None
        elif name in ('learning_rate', 'checkpoint_secs', 'log_every_secs'):
            v = _expect(value, (int, float), key, origins, 'a positive number')
            if not v > 0 or v == float('inf'):
                raise origins.error(key, f'expected a positive number, got {v}')
            values[name] = float(v)
        elif name == 'replicas_to_aggregate':
            values[name] = None if value is None else _positive_int(value, key, origins)
        elif name == 'seed':
            values[name] = None if value is None else _expect(value, (int,), key, origins, 'an integer')
        elif name in ('data', 'train_dir'):
            v = _expect(value, (str,), key, origins, 'a path')
            if not v.strip():
                raise origins.error(key, 'must not be empty')
            if name == 'train_dir' and v.startswith('~'):
                raise origins.error(key, f'{v!r}: give an absolute path or one relative to the working '
                                         'directory (~ would mean another home on each remote host)')
            values[name] = v
        elif name == 'devices':
            values[name] = _parse_devices(value, key, origins)
        elif name == 'transfer_dtype':
            if value not in TRANSFER_DTYPES:
                raise origins.error(key, f'expected one of {", ".join(TRANSFER_DTYPES)}, got {value!r}')
            values[name] = value
        elif name == 'program':
            values[name] = _parse_program(value, key, origins)
        elif name == 'command':
            values[name] = _parse_command(value, key, origins)
    if values.get('program') and values.get('command'):
        raise origins.error('train.command', 'train.program and train.command exclude each other: a program is '
                                             'called inside the worker task, a command replaces the task; keep one')
    return TrainConfig(**values)


_PROGRAM = re.compile(r'^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$')


def _parse_program(value, key, origins) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _PROGRAM.match(value.strip()):
        raise origins.error(key, f'expected package.module:function, e.g. examples.linear_program:train, got {value!r}')
    return value.strip()


def _parse_command(value, key, origins) -> tuple[str, ...] | None:
    """A string split the way a POSIX shell splits words (no expansion), or a list of arguments."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as e:
            raise origins.error(key, f'cannot split {value!r} into arguments: {e}') from None
    elif isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        argv = [str(v) for v in value]
    else:
        raise origins.error(key, f'expected a command line (a string, or a list of arguments), got {value!r}')
    if not argv or not argv[0].strip():
        raise origins.error(key, 'the command is empty')
    return tuple(argv)


def _parse_supervise(supervise, origins: _Origins) -> SuperviseConfig:
    if not isinstance(supervise, dict):
        raise origins.error('supervise', 'expected a mapping with any of ' + ', '.join(
            f.name for f in dataclasses.fields(SuperviseConfig)))
    fields = [f.name for f in dataclasses.fields(SuperviseConfig)]
    _no_unknown(supervise, fields, 'supervise', origins)
    values = {}
    for name, value in supervise.items():
        key = f'supervise.{name}'
        if name == 'restart':
            if value not in RESTART_POLICIES:    # YAML reads a bare `no`/`off` as false: say so
                raise origins.error(key, f'expected one of {", ".join(RESTART_POLICIES)}, got {value!r}')
            values[name] = value
        elif name == 'max_restarts':
            v = _expect(value, (int,), key, origins, 'a whole number >= 0')
            if v < 0:
                raise origins.error(key, f'expected a whole number >= 0, got {v}')
            values[name] = v
        elif name in ('stall_secs', 'backoff_max_secs', 'unreachable_secs'):
            v = _expect(value, (int, float), key, origins, 'a positive number of seconds')
            if not v > 0 or v == float('inf'):
                raise origins.error(key, f'expected a positive number of seconds, got {v}')
            values[name] = float(v)
        elif name == 'backoff_secs':
            v = _expect(value, (int, float), key, origins, 'a number of seconds >= 0')
            if not v >= 0 or v == float('inf'):
                raise origins.error(key, f'expected a number of seconds >= 0, got {v}')
            values[name] = float(v)
    return SuperviseConfig(**values)


def _parse_isolation(value, tasks, hosts, origins: _Origins) -> str:
    if value is None:
        value = 'none'
    if value not in ISOLATION_MODES:
        hint = ' (YAML reads a bare no or off as false: write none)' if value is False else ''
        raise origins.error('isolation', f'expected one of {", ".join(ISOLATION_MODES)}, got {value!r}{hint}')
    remote = [t for t in tasks if t.host not in LOOPBACK_NAMES or t.host in hosts]
    if value == 'netns' and remote:
        t = remote[0]
        raise origins.error('isolation', f'netns runs a local cluster in a private network namespace of this '
                                         f'machine, but {t.name} is on {t.host} (SSH): remote tasks cannot be '
                                         'isolated that way; put their hosts on a private network or behind a '
                                         'firewall, and drop isolation')
    return value


# The variables the launcher sets itself in every task: the cluster, the GPUs it gives out, its
# lease and restart notes, and unbuffered output (the launcher reads task logs as they grow).
LAUNCHER_ENV = ('TF_CONFIG', 'CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES', 'PYTHONUNBUFFERED',
                'TFCLUSTER_LEASE', 'TFCLUSTER_LEASE_SECS', 'TFCLUSTER_RESTART')
_ENV_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')


def _parse_env(env, key: str, origins: _Origins) -> dict[str, str]:
    """A mapping of variable name to a string or a number (kept as text); null drops a name (so
    `--set env.NAME=null` undoes the file's)."""
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise origins.error(key, 'expected a mapping of variable name to value, e.g. {OMP_NUM_THREADS: 4}')
    out = {}
    for name, value in env.items():
        dotted = f'{key}.{name}'
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            shown = name if isinstance(name, str) and name.isprintable() else repr(name)
            raise origins.error(f'{key}.{shown}', f'{name!r} is not a valid environment variable name '
                                                  '(letters, digits and _, not starting with a digit)')
        if name in LAUNCHER_ENV:
            why = ('the launcher gives each worker its own GPUs (train.devices, gpus:)'
                   if 'VISIBLE_DEVICES' in name else 'the launcher sets it for every task')
            raise origins.error(dotted, f'{name} cannot be set in a spec: {why}')
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            hint = f' (quote it: "{str(value).lower()}")' if isinstance(value, bool) else ''
            raise origins.error(dotted, f'expected a string or a number, got {value!r}{hint}')
        text = str(value)
        if '\0' in text:
            raise origins.error(dotted, 'a value cannot hold a NUL character')
        out[name] = text
    return out


def _parse_job_settings(tasks, origins: _Origins) -> dict[str, dict[str, str]]:
    """`tasks: {ps: {env: {...}}, worker: {env: {...}}}`: settings for every task of one job."""
    if tasks is None:
        return {}
    if not isinstance(tasks, dict):
        raise origins.error('tasks', 'expected a mapping of job (ps, worker) to its settings, '
                                     'e.g. {worker: {env: {OMP_NUM_THREADS: 4}}}')
    _no_unknown(tasks, JOBS, 'tasks', origins)
    out = {}
    for job, settings in tasks.items():
        settings = settings or {}
        if not isinstance(settings, dict):
            raise origins.error(f'tasks.{job}', 'expected a mapping with env')
        _no_unknown(settings, ('env',), f'tasks.{job}', origins)
        env = _parse_env(settings.get('env'), f'tasks.{job}.env', origins)
        if env:
            out[job] = env
    return out


def _parse_gpus(gpus, tasks, origins: _Origins) -> dict[str, int]:
    """`gpus: {node1: 4, localhost: 2}`: how many GPUs a host has, so that `launch plan` (which
    asks no host) shows the GPUs each worker gets; `up` and `check` compare it with the host's."""
    if gpus is None:
        return {}
    if not isinstance(gpus, dict):
        raise origins.error('gpus', 'expected a mapping of host name to its number of GPUs, e.g. {node1: 4}')
    hosts = {same_machine_key(t.host) for t in tasks}
    out: dict[str, int] = {}
    for name, count in gpus.items():
        key = f'gpus.{name}'
        if not _valid_host(str(name)):
            raise origins.error(key, f'invalid host name {name!r}')
        if count is None:       # --set gpus.HOST=null: not given
            continue
        v = _expect(count, (int,), key, origins, 'a number of GPUs (a whole number >= 0)')
        if v < 0:
            raise origins.error(key, f'expected a whole number >= 0, got {v}')
        if same_machine_key(str(name)) not in hosts:
            raise origins.error(key, f'no task runs on {name}: the hosts of the cluster are '
                                     f'{", ".join(sorted({t.host for t in tasks}))}')
        if same_machine_key(str(name)) in {same_machine_key(h) for h in out}:
            raise origins.error(key, f'{name} is the same machine as another entry of gpus')
        out[str(name)] = v
    return out


def _positive_int(value, key, origins) -> int:
    v = _expect(value, (int,), key, origins, 'a positive whole number')
    if v < 1:
        raise origins.error(key, f'expected a positive whole number, got {v}')
    return v


def _parse_devices(value, key, origins):
    if value == 'auto':
        return 'auto'
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise origins.error(key, f'expected at least 1 tower, got {value}')
        return value
    if isinstance(value, list) and value:
        devices = []
        for i, item in enumerate(value):
            m = _DEVICE.match(str(item).strip().lower())
            if str(item).strip().lower() == 'auto':
                raise origins.error(f'{key}[{i}]', 'auto cannot be mixed with a list: write devices: auto, or '
                                                   'list the towers (e.g. [gpu:0, gpu:1])')
            if not m:
                raise origins.error(f'{key}[{i}]', f'expected a device like gpu:0 or cpu:0, got {item!r}')
            devices.append(f'{m.group(1)}:{int(m.group(2))}')
        if len(set(devices)) != len(devices):
            raise origins.error(key, f'a device is listed twice in {value!r}')
        return tuple(devices)
    raise origins.error(key, f'expected auto, a number of CPU towers or a list like [gpu:0, gpu:1], got {value!r}')


def _parse_hosts(hosts, origins: _Origins) -> dict[str, HostConfig]:
    if not isinstance(hosts, dict):
        raise origins.error('hosts', 'expected a mapping of host name to SSH settings')
    out = {}
    allowed = HOST_SETTINGS
    for name, settings in hosts.items():
        prefix = f'hosts.{name}'
        if not _valid_host(str(name)):
            raise origins.error(prefix, f'invalid host name {name!r}')
        settings = settings or {}
        if not isinstance(settings, dict):
            raise origins.error(prefix, f'expected a mapping with any of {", ".join(allowed)}')
        _no_unknown(settings, allowed, prefix, origins)
        values = {}
        for k, v in settings.items():
            if k == 'port':
                v = _positive_int(v, f'{prefix}.port', origins)
                if v > 65535:
                    raise origins.error(f'{prefix}.port', f'port must be between 1 and 65535, got {v}')
            elif k == 'address':
                v = _expect(v, (str,), f'{prefix}.address', origins, 'a host name or IP address')
                if not _valid_host(v):
                    raise origins.error(f'{prefix}.address', f'invalid host name or IP address {v!r}')
            else:
                v = _expect(v, (str,), f'{prefix}.{k}', origins, 'a string')
            values[k] = v
        out[str(name)] = HostConfig(name=str(name), **values)
    return out
