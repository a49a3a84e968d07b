"""From a spec file, `--set` overrides and TF_CONFIG to one validated ClusterSpec.

The raw settings are merged first (file, then TF_CONFIG's cluster, then each override in turn),
with where each key came from recorded, and validated once at the end (cluster/spec/validate.py).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from cluster.spec.environ import FROM_ENV, mask_raw
from cluster.spec.errors import Origins, SpecError
from cluster.spec.model import HOST_SETTINGS, JOBS, ClusterSpec
from cluster.spec.reader import YAMLSyntaxError, parse_yaml, read_spec_text
from cluster.spec.validate import build_spec

TF_CONFIG_ENV = 'TF_CONFIG'


def load_spec(path: str | None, overrides: list[str] | tuple[str, ...] = (),
              cluster: dict | None = None, cluster_source: str | None = None,
              environ: Mapping[str, str] | None = None) -> ClusterSpec:
    """Read, override and validate a spec file. Raises SpecError (one line) on any user error.
    `cluster` (from TF_CONFIG, or `cluster_source` if named) replaces the file's cluster section;
    with it, `path` may be None: the train settings are then the defaults and the overrides.
    `{from_env: NAME}` values are read from `environ` (default: this process's environment); one
    it lacks is an error only where the value is needed (ClusterSpec.check_references)."""
    source = cluster_source or TF_CONFIG_ENV
    environ = os.environ if environ is None else environ
    if path is None:
        origins = Origins(source)
        raw: dict = {'cluster': cluster}
        origins.record_value('cluster', source)
        for text_override in overrides:
            _apply_override(raw, text_override, origins)
        return build_spec(raw, origins, environ)
    origins = Origins(path)
    node, raw = parse_yaml(read_spec_text(path), path, line_numbers=True)
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
    return build_spec(raw, origins, environ)


EVALUATOR_PLACEHOLDER = 'localhost:1'     # an evaluator TF_CONFIG does not place (it serves no port)


def read_tf_config(text: str) -> tuple[dict, str, int]:
    """TF_CONFIG (as Kubeflow's TFJob, SageMaker and Vertex set it) -> (cluster, job, index).
    Raises SpecError, one line, for text that is not JSON or a task that is not in its cluster."""
    try:
        config = json.loads(text)
    except ValueError as e:
        raise SpecError(f'{TF_CONFIG_ENV}: not JSON ({e}): {text[:60]!r}') from None
    except RecursionError:      # an environment is anyone's to set: never a traceback
        raise SpecError(f'{TF_CONFIG_ENV}: nested too deeply to read: {text[:60]!r}') from None
    if not isinstance(config, dict) or not isinstance(config.get('cluster'), dict):
        raise SpecError(f'{TF_CONFIG_ENV}: expected {{"cluster": {{"ps": [...], "worker": [...]}}, '
                        f'"task": {{"type": ..., "index": ...}}}}, got {text[:60]!r}')
    cluster = config['cluster']
    other = [job for job in cluster if job not in JOBS]
    if other:
        raise SpecError(f'{TF_CONFIG_ENV}: job {other[0]!r} is not one tfcluster runs: its clusters have ps, '
                        'worker, chief and evaluator jobs')
    task = config.get('task')
    if not isinstance(task, dict) or 'type' not in task:
        raise SpecError(f'{TF_CONFIG_ENV}: no "task": {{"type": ..., "index": ...}} names this process\'s task')
    job, index = task.get('type'), task.get('index', 0)
    if isinstance(index, bool) or not isinstance(index, int):
        raise SpecError(f'{TF_CONFIG_ENV}: task index must be a whole number, got {index!r}')
    if job == 'evaluator' and index == 0 and 'evaluator' not in cluster and 'chief' in cluster:
        # Kubeflow's TFJob leaves the evaluator out of every TF_CONFIG, its own included (in the
        # training cluster it would make the coordinator wait): it serves nothing, so any address
        # of its own will do.
        cluster = {**cluster, 'evaluator': [EVALUATOR_PLACEHOLDER]}
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
    labels = _labels_at(parts)      # a label's name may hold a / (tfcluster.io/host)
    if not sep or not all(re.fullmatch(r'[A-Za-z0-9_/-]+' if labels and i > labels else r'[A-Za-z0-9_-]+', p)
                          for i, p in enumerate(parts)):
        raise SpecError(f'--set {text}: expected dotted.key=value, e.g. --set train.steps=50')
    try:
        parsed = parse_yaml(value, f'--set {_shorten(text)}', line_numbers=False)[1]
    except YAMLSyntaxError:
        raise SpecError(f'--set {text}: the value is not valid YAML') from None
    if not value.strip():
        raise SpecError(f'--set {text}: missing value after "=" (write null to clear a key)')
    return parts, parsed


def take_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without its `--set KEY=VALUE` and `--set=KEY=VALUE` options, their values in order),
    in one pass, up to a `--`. argparse finds each option by scanning every later one, so 50,000
    options cost minutes there; the rest (an abbreviation, a missing value) is left to it."""
    rest: list[str] = []
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == '--':
            rest += argv[i:]
            break
        if arg == '--set' and i + 1 < len(argv):
            overrides.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith('--set='):
            overrides.append(arg[len('--set='):])
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


def recorded_override(text: str) -> str:
    """A `--set` option as a run records it (events.jsonl, which `launch status RUN` replays): one
    that gives a secret-looking env name a value becomes a reference to the variable of that name,
    `env.API_TOKEN={"from_env": "API_TOKEN"}`, so the record never holds the value. An option
    that is not one of env's (or that load_spec refused) is kept as given."""
    if text.partition('=')[0].strip().split('.')[0] not in ('env', 'tasks'):
        return text
    try:
        parts, value = parse_override(text)
    except SpecError:
        return text
    nested: Any = value
    for part in reversed(parts):
        nested = {part: nested}
    hidden = mask_raw(nested, lambda name: {FROM_ENV: name})
    if hidden == nested:
        return text
    for part in parts:
        hidden = hidden[part]
    return f'{".".join(parts)}={json.dumps(hidden, allow_nan=False)}'


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + '...'


def _apply_override(raw: dict, text: str, origins: Origins) -> None:
    parts, value = parse_override(text)
    parts = _override_key(parts, value, raw)
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


def _override_key(parts: list[str], value: Any, raw: dict) -> list[str]:
    """The path an override's dotted key names, where a host name holds dots of its own."""
    if parts[0] == 'gpus' and len(parts) > 2:      # gpus.10.0.0.5=4: the rest is one host name
        return ['gpus', '.'.join(parts[1:])]
    labels = _labels_at(parts)
    if labels:      # hosts.10.0.0.5.labels.tfcluster.io/host: host 10.0.0.5, label tfcluster.io/host
        return ['hosts', '.'.join(parts[1:labels]), 'labels', '.'.join(parts[labels + 1:])]
    if parts[0] == 'hosts' and len(parts) > 2:
        # Host names have dots of their own: hosts.10.0.0.5.user is host 10.0.0.5, setting user.
        # The whole rest names a host only when it is given a section (or null) and its last part
        # is neither a setting nor under a host the spec has: hosts.node1.usr=x stays a bad key.
        known: dict = raw['hosts'] if isinstance(raw.get('hosts'), dict) else {}
        whole = (isinstance(value, dict) or value is None) and parts[-1] not in HOST_SETTINGS \
            and '.'.join(parts[1:-1]) not in known
        name = parts[1:] if whole else parts[1:-1]
        return ['hosts', '.'.join(name)] + parts[1 + len(name):]
    return parts


def _labels_at(parts: list[str]) -> int | None:
    """Where `labels` is in an override's key that names one label of a host
    (hosts.HOST.labels.NAME, the host's name and the label's may hold dots), else None."""
    if parts[0] != 'hosts':
        return None
    return next((i for i in range(2, len(parts) - 1) if parts[i] == 'labels'), None)
