"""A spec's raw settings, merged from the file, TF_CONFIG and `--set`, checked into a ClusterSpec.

Every check raises a SpecError from `Origins.error`, so the one line it prints names the file's
line or the `--set` argument that gave the bad value, the dotted key and what was expected.
"""
from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
import shlex
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cluster.spec.model import (HOST_SETTINGS, ISOLATION_MODES, JOB_SETTINGS, JOBS, LOOPBACK_NAMES, REQUIRED_JOBS,
                                SINGLE_JOBS, ClusterSpec, HostConfig, SuperviseConfig, TaskSpec, TrainConfig, Value,
                                same_machine_key)
from cluster.spec import environ as environ_
from cluster.spec.aggregation import check_aggregation
from cluster.spec.errors import Origins
from cluster.spec.labels import parse_labels

SECTIONS = ('cluster', 'train', 'supervise', 'hosts', 'isolation', 'env', 'tasks', 'gpus')
_HOSTNAME = re.compile(r'^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*$')
_DEVICE = re.compile(r'^(cpu|gpu):(\d+)$')


def build_spec(raw: dict, origins: Origins, environ: Mapping[str, str]) -> ClusterSpec:
    """The spec `raw` (merged, not yet checked) describes, `{from_env: NAME}` values read from
    `environ`; SpecError at its first bad value."""
    _no_unknown(raw, SECTIONS, '', origins)
    tasks = _parse_cluster(raw.get('cluster'), origins)
    train = _parse_train(raw.get('train') or {}, origins)
    supervise = _parse_supervise(raw.get('supervise') or {}, origins)
    hosts = _parse_hosts(raw.get('hosts') or {}, origins)
    isolation = _parse_isolation(raw.get('isolation', 'none'), tasks, hosts, origins)
    env, env_from = _parse_env(raw.get('env'), 'env', origins, environ)
    job_env, job_env_from = _parse_job_settings(raw.get('tasks'), origins, environ)
    gpus = _parse_gpus(raw.get('gpus'), tasks, origins)
    frozen = types.MappingProxyType
    spec = ClusterSpec(path=origins.path, tasks=tasks, train=train, hosts=frozen(hosts),
                       supervise=supervise, isolation=isolation, env=frozen(env),
                       job_env=frozen({job: frozen(e) for job, e in job_env.items()}), gpus=frozen(gpus),
                       env_from=frozen(env_from),
                       job_env_from=frozen({job: frozen(r) for job, r in job_env_from.items()}), origins=origins)
    if supervise.stall_secs < 3 * train.log_every_secs:
        key = 'supervise.stall_secs' if 'stall_secs' in (raw.get('supervise') or {}) else 'train.log_every_secs'
        raise origins.error(key, f'the stall limit ({supervise.stall_secs:g}s) must be at least 3 times '
                                 f'train.log_every_secs ({train.log_every_secs:g}s): progress is read from '
                                 'the chief\'s progress lines')
    _check_roles(spec, raw.get('train') or {}, origins)
    check_aggregation(spec, origins)
    return spec


def _check_roles(spec: ClusterSpec, raw_train: dict, origins: Origins) -> None:
    """A chief and an evaluator each need what they run: the chief a TF2 program (the built-in
    trainer is TF1 between-graph code, whose chief is worker 0), the evaluator `train.evaluator`."""
    train = spec.train
    for job in spec.job_env:
        if not spec.job_tasks(job):
            raise origins.error(f'tasks.{job}', f'the cluster has no {job} task to give these settings')
    if spec.coordinator and not (train.program or train.command):
        raise origins.error('cluster.chief', 'a chief runs your TF2 ParameterServerStrategy program '
                                             '(cluster/coordinator.py): set train.program or train.command; the '
                                             'built-in trainer is TF1 between-graph code with worker 0 as its chief '
                                             '(drop the chief to run it)')
    if spec.job_tasks('evaluator') and not spec.coordinator:
        raise origins.error('cluster.evaluator', 'an evaluator runs beside the chief of a coordinator run: add a '
                                                 'chief (TF1 runs are evaluated with `launch eval`)')
    if spec.job_tasks('evaluator') and train.evaluator is None:
        raise origins.error('cluster.evaluator', 'an evaluator needs something to run: set train.evaluator to a '
                                                 'package.module:function or a command line')
    if train.evaluator is not None and not spec.job_tasks('evaluator'):
        key = 'train.evaluator' if 'evaluator' in raw_train else 'cluster'
        raise origins.error(key, 'train.evaluator is set but the cluster has no evaluator task: add '
                                 'evaluator: [host:port] to cluster')


def _no_unknown(mapping: dict, allowed: Iterable[str], prefix: str, origins: Origins) -> None:
    for key in mapping:
        if key not in allowed:
            name = str(key) if str(key).isprintable() else repr(key)
            dotted = f'{prefix}.{name}' if prefix else name
            raise origins.error(dotted, f'unknown key; expected one of {", ".join(allowed)}')


def _parse_cluster(cluster: Any, origins: Origins) -> tuple[TaskSpec, ...]:
    if cluster is None:
        raise origins.error('cluster', 'missing section; it maps ps and worker (and optionally chief and '
                                       'evaluator) to lists of host:port')
    if not isinstance(cluster, dict):
        raise origins.error('cluster', 'expected a mapping of job name to a list of host:port')
    _no_unknown(cluster, JOBS, 'cluster', origins)
    tasks = []
    seen: dict[tuple[str, int], str] = {}
    for job in JOBS:
        addresses = cluster.get(job)
        if (addresses is None or addresses == []) and job not in REQUIRED_JOBS:
            continue
        if addresses is None or addresses == []:
            raise origins.error(f'cluster.{job}', f'missing job {job!r}: give at least one host:port')
        if isinstance(addresses, str):
            addresses = [addresses]
        if not isinstance(addresses, list):
            raise origins.error(f'cluster.{job}', 'expected a list of host:port')
        if job in SINGLE_JOBS and len(addresses) > 1:
            raise origins.error(f'cluster.{job}', f'at most one {job} task, got {len(addresses)}: '
                                                  + ('ParameterServerStrategy has one coordinator' if job == 'chief'
                                                     else 'one evaluator follows the checkpoints'))
        for index, address in enumerate(addresses):
            key = f'cluster.{job}[{index}]'
            host, port = parse_address(address, functools.partial(origins.error, key))
            ident = (same_machine_key(host), port)
            if ident in seen:
                raise origins.error(key, f'{address} is used twice (also {seen[ident]}): '
                                         'every task needs its own host:port')
            seen[ident] = f'{job}:{index}'
            tasks.append(TaskSpec(job, index, host, port))
    return tuple(tasks)


def parse_address(address: Any, error: Callable[[str], Exception]) -> tuple[str, int]:
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


def _expect(value: Any, kinds: tuple[type, ...], key: str, origins: Origins, what: str) -> Any:
    """`value` if it is one of `kinds`; a bool only where `kinds` names bool (True is an int)."""
    if isinstance(value, bool) and bool not in kinds:
        raise origins.error(key, f'expected {what}, got {value!r}')
    if not isinstance(value, kinds):
        raise origins.error(key, f'expected {what}, got {value!r}')
    return value


def _parse_train(train: Any, origins: Origins) -> TrainConfig:
    if not isinstance(train, dict):
        raise origins.error('train', 'expected a mapping of training settings')
    _no_unknown(train, sorted(f.name for f in dataclasses.fields(TrainConfig)), 'train', origins)
    values = _parse_settings(TrainConfig, train, 'train', origins)
    if values.get('program') and values.get('command'):
        raise origins.error('train.command', 'train.program and train.command exclude each other: a program is '
                                             'called inside the worker task, a command replaces the task; keep one')
    return TrainConfig(**values)


def _parse_settings(cls: type, raw: dict, prefix: str, origins: Origins) -> dict[str, Any]:
    """Each of `raw`'s keys (already known to be fields of `cls`) parsed, in the order written, by
    its field's `setting` metadata: one rule per model.Value, or the field's own parser."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    return {name: parse_setting(cls, fields[name], value, f'{prefix}.{name}', origins) for name, value in raw.items()}


def parse_setting(cls: type, field: dataclasses.Field, value: Any, key: str, origins: Origins) -> Any:
    """One setting's YAML value checked and converted as its field says (model.setting): SpecError,
    naming `key`, where it does not fit. A field of kind OWN has its parser in OWN_PARSERS; one
    without is a programming error, raised, never a value dropped."""
    meta = field.metadata
    kind = meta['value']
    if kind is Value.OWN:
        parser = OWN_PARSERS.get((cls, field.name))
        if parser is None:
            raise LookupError(f'{cls.__name__}.{field.name} is Value.OWN but has no parser in OWN_PARSERS')
        return parser(value, key, origins)
    if value is None and meta['nullable']:
        return None
    if kind is Value.CHOICE:
        if value not in meta['allowed']:
            raise origins.error(key, f'expected one of {", ".join(meta["allowed"])}, got {value!r}')
        return value
    if kind in (Value.POSITIVE, Value.NONNEGATIVE):
        return _number(value, kind, meta['unit'], key, origins)
    if kind is Value.COUNT:
        return _positive_int(value, key, origins)
    if kind is Value.WHOLE:
        return _whole(value, key, origins)
    if kind is Value.PATH:
        return _path(value, key, origins)
    kinds, what = _PLAIN[kind]
    return _expect(value, kinds, key, origins, what)


_PLAIN = {Value.SWITCH: ((bool,), 'true or false'), Value.INTEGER: ((int,), 'an integer'),
          Value.TEXT: ((str,), 'a string')}


def _number(value: Any, kind: Value, unit: str, key: str, origins: Origins) -> float:
    """A finite number, > 0 (POSITIVE) or >= 0 (NONNEGATIVE), as a float."""
    of = f' of {unit}' if unit else ''
    what = f'a positive number{of}' if kind is Value.POSITIVE else f'a number{of} >= 0'
    v = _expect(value, (int, float), key, origins, what)
    if not (v > 0 if kind is Value.POSITIVE else v >= 0) or v == float('inf'):
        raise origins.error(key, f'expected {what}, got {v}')
    return float(v)


def _whole(value: Any, key: str, origins: Origins) -> int:
    v = _expect(value, (int,), key, origins, 'a whole number >= 0')
    if v < 0:
        raise origins.error(key, f'expected a whole number >= 0, got {v}')
    return v


def _path(value: Any, key: str, origins: Origins) -> str:
    v = _expect(value, (str,), key, origins, 'a path')
    if not v.strip():
        raise origins.error(key, 'must not be empty')
    return v


def _parse_train_dir(value: Any, key: str, origins: Origins) -> str:
    v = _path(value, key, origins)
    if v.startswith('~'):
        raise origins.error(key, f'{v!r}: give an absolute path or one relative to the working '
                                 'directory (~ would mean another home on each remote host)')
    return v


_PROGRAM = re.compile(r'^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$')


def _parse_program(value: Any, key: str, origins: Origins) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _PROGRAM.match(value.strip()):
        raise origins.error(key, f'expected package.module:function, e.g. examples.linear_program:train, got {value!r}')
    return value.strip()


def _parse_evaluator(value: Any, key: str, origins: Origins) -> str | tuple[str, ...] | None:
    """A 'package.module:function' (called in the evaluator task), else a command line."""
    if isinstance(value, str) and _PROGRAM.match(value.strip()):
        return value.strip()
    return _parse_command(value, key, origins)


def _parse_command(value: Any, key: str, origins: Origins) -> tuple[str, ...] | None:
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


def _parse_supervise(supervise: Any, origins: Origins) -> SuperviseConfig:
    if not isinstance(supervise, dict):
        raise origins.error('supervise', 'expected a mapping with any of ' + ', '.join(
            f.name for f in dataclasses.fields(SuperviseConfig)))
    _no_unknown(supervise, [f.name for f in dataclasses.fields(SuperviseConfig)], 'supervise', origins)
    values = _parse_settings(SuperviseConfig, supervise, 'supervise', origins)
    return SuperviseConfig(**values)


def _parse_isolation(value: Any, tasks: tuple[TaskSpec, ...], hosts: dict[str, HostConfig],
                     origins: Origins) -> str:
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
# lease and restart notes, the run's id, and unbuffered output (the launcher reads task logs as they grow).
LAUNCHER_ENV = ('TF_CONFIG', 'CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES', 'PYTHONUNBUFFERED',
                'TFCLUSTER_LEASE', 'TFCLUSTER_LEASE_SECS', 'TFCLUSTER_RESTART', 'TFCLUSTER_RUN', 'GRPC_FAIL_FAST',
                'TF_USE_LEGACY_KERAS')
_ENV_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')


def _parse_env(env: Any, key: str, origins: Origins, environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """A mapping of variable name to a string, a number (kept as text) or `{from_env: NAME}`, the
    value of NAME in `environ` (the launcher's environment; cluster/spec/environ.py); null drops a
    name (so `--set env.NAME=null` undoes the file's). Returns (values, name -> the variable each
    reference names); a reference to a variable `environ` lacks has no value (ClusterSpec.check_references)."""
    if env is None:
        return {}, {}
    if not isinstance(env, dict):
        raise origins.error(key, 'expected a mapping of variable name to value, e.g. {OMP_NUM_THREADS: 4}')
    out, references = {}, {}
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
        if environ_.is_reference_like(value):
            source = environ_.reference(value)
            if source is None or not _ENV_NAME.match(source):
                raise origins.error(dotted, f'expected {{{environ_.FROM_ENV}: NAME}}, NAME a variable of the '
                                            f"launcher's environment, got {_short(value)}")
            references[name] = source
            if source not in environ:
                continue        # no value here: an error where one is needed (check_references)
            value = environ[source]
        elif isinstance(value, bool) or not isinstance(value, (str, int, float)):
            hint = f' (quote it: "{str(value).lower()}")' if isinstance(value, bool) else ''
            if isinstance(value, dict):
                hint = f" (or {{{environ_.FROM_ENV}: NAME}}, a variable of the launcher's environment)"
            raise origins.error(dotted, f'expected a string or a number, got {_short(value)}{hint}')
        text = str(value)
        if '\0' in text:
            raise origins.error(dotted, 'a value cannot hold a NUL character')
        problem = environ_.string_problem(name, text)
        if problem:
            raise origins.error(dotted, problem)
        out[name] = text
    return out, references


def _short(value: Any, limit: int = 80) -> str:
    """repr(value), cut: a bad value may be a megabyte long, and a secret."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + '...'


def _parse_job_settings(tasks: Any, origins: Origins, environ: Mapping[str, str]
                        ) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """`tasks: {ps: {env: {...}}, worker: {env: {...}}}`: settings for every task of one job;
    (job -> values, job -> references) as _parse_env gives them."""
    if tasks is None:
        return {}, {}
    if not isinstance(tasks, dict):
        raise origins.error('tasks', 'expected a mapping of job (chief, ps, worker, evaluator) to its settings, '
                                     'e.g. {worker: {env: {OMP_NUM_THREADS: 4}}}')
    _no_unknown(tasks, JOBS, 'tasks', origins)
    out, references = {}, {}
    for job, settings in tasks.items():
        settings = settings or {}
        if not isinstance(settings, dict):
            raise origins.error(f'tasks.{job}', f'expected a mapping with {", ".join(JOB_SETTINGS)}')
        _no_unknown(settings, JOB_SETTINGS, f'tasks.{job}', origins)
        env, refs = _parse_env(settings.get('env'), f'tasks.{job}.env', origins, environ)
        if env or refs:
            out[job] = env
        if refs:
            references[job] = refs
    return out, references


def _parse_gpus(gpus: Any, tasks: tuple[TaskSpec, ...], origins: Origins) -> dict[str, int]:
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


def _positive_int(value: Any, key: str, origins: Origins) -> int:
    v = _expect(value, (int,), key, origins, 'a positive whole number')
    if v < 1:
        raise origins.error(key, f'expected a positive whole number, got {v}')
    return v


def _parse_devices(value: Any, key: str, origins: Origins) -> str | int | tuple[str, ...]:
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


def _parse_hosts(hosts: Any, origins: Origins) -> dict[str, HostConfig]:
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
        values = _parse_settings(HostConfig, settings, prefix, origins)
        out[str(name)] = HostConfig(name=str(name), **values)
    return out


def _parse_host_port(value: Any, key: str, origins: Origins) -> int:
    v = _positive_int(value, key, origins)
    if v > 65535:
        raise origins.error(key, f'port must be between 1 and 65535, got {v}')
    return v


def _parse_host_address(value: Any, key: str, origins: Origins) -> str:
    v = _expect(value, (str,), key, origins, 'a host name or IP address')
    if not _valid_host(v):
        raise origins.error(key, f'invalid host name or IP address {v!r}')
    return v


# The settings whose YAML no Value rule reads (model.Value.OWN): (config class, field) -> parser.
OWN_PARSERS: dict[tuple[type, str], Callable[[Any, str, Origins], Any]] = {
    (TrainConfig, 'devices'): _parse_devices,
    (TrainConfig, 'train_dir'): _parse_train_dir,
    (TrainConfig, 'program'): _parse_program,
    (TrainConfig, 'command'): _parse_command,
    (TrainConfig, 'evaluator'): _parse_evaluator,
    (HostConfig, 'port'): _parse_host_port,
    (HostConfig, 'address'): _parse_host_address,
    (HostConfig, 'labels'): parse_labels,
}
