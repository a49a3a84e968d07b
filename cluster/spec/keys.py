"""Every key a spec accepts, with its type, default and what it does: what the spec reference page
(docs/reference/spec.md) is made of at build time, so that page cannot drift from the code.

The keys of `train`, `supervise` and `hosts.<host>` are the fields of TrainConfig, SuperviseConfig
and HostConfig, documented where they are declared (`model.setting`). The other sections' keys are
no dataclass's fields, so their text is here. tests/unit/docs/test_docs.py holds the keys `spec_keys` lists
to those the validator accepts (asking it, not a list): a key added without its text fails there.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cluster.spec.environ import FROM_ENV, SECRET_WORDS
from cluster.spec.model import (HOST_SETTINGS, ISOLATION_MODES, JOBS, REQUIRED_JOBS, ClusterSpec,
                                HostConfig, SuperviseConfig, TrainConfig)
from cluster.spec.validate import LAUNCHER_ENV, SECTIONS

# In a key's name: a name of the user's, not a word of the spec.
HOST = '<host>'
JOB = '<job>'
REQUIRED = ''           # the default of a key that must be given
ABSENT = '(not set)'    # the default of a key whose absence means something of its own (no chief)


@dataclass(frozen=True)
class SpecKey:
    key: str                        # dotted, as `--set` names it: train.steps, hosts.<host>.user
    type: str                       # as the YAML spells it
    default: str                    # as the YAML spells it; REQUIRED or ABSENT for a key without one
    doc: str
    allowed: tuple[str, ...] = ()   # the words it takes, where it takes one of a few

    @property
    def section(self) -> str:
        return self.key.split('.')[0]


SECTION_DOCS = {
    'cluster': "The tasks: each job maps to a list of host:port, and a task's index is its place in the list. Two "
               'tasks never share a host:port. A chief makes the run a TF2 ParameterServerStrategy (coordinator) '
               'run; without one it is TF1 between-graph training with worker 0 as its chief.',
    'train': 'What the tasks train and how: the built-in CIFAR-10 trainer\'s settings, or your own program or '
             'command. Every key is optional.',
    'supervise': 'What the launcher does when a task is lost or the training stops making progress. Every key is '
                 'optional; without the section, a fault ends the run.',
    'hosts': f'How to reach hosts over SSH, by the name the cluster gives them ({HOST} below). A host not listed is '
             'reached as ~/.ssh/config says; localhost, 127.0.0.1 and ::1 run as local processes unless listed '
             'here. With --backend ray, which Ray nodes run their tasks (labels).',
    'isolation': 'How the tasks of a local cluster are kept from the network.',
    'env': 'Environment variables of every task.',
    'tasks': f'Settings of every task of one job ({JOB}: {", ".join(JOBS)}).',
    'gpus': 'How many GPUs each host has, for the plan.',
}

_ENV_VALUES = (f'A value is a string, a number (kept as text), or {{{FROM_ENV}: NAME}}: the value of the '
               "launcher's $NAME, which never enters the spec. A value whose name holds "
               f'{", ".join(SECRET_WORDS)}, or that comes by reference, is never shown nor written (plan, report, '
               'the spec copy in the train_dir). null drops a name (--set env.NAME=null undoes the file\'s). The '
               f'variables the launcher sets itself are refused: {", ".join(LAUNCHER_ENV)}.')
_ENV_TYPE = f'mapping of NAME to string, number or {{{FROM_ENV}: NAME}}'

# The keys that are no dataclass's fields: cluster's jobs and the sections that are one key each.
OTHER_KEYS = {
    'cluster.chief': "At most one: the coordinator of a TF2 ParameterServerStrategy run, which runs train.program "
                     'or train.command; the workers and ps tasks then only serve.',
    'cluster.ps': 'The parameter servers, which hold the variables and apply the updates. At least one.',
    'cluster.worker': 'The workers, which compute the gradients; worker 0 is the chief of a TF1 run (it '
                      'initialises, restores and saves). At least one; `launch up --workers N` starts the first N '
                      '(the list is a pool).',
    'cluster.evaluator': 'At most one, beside a chief: runs train.evaluator on the checkpoints. Never in the '
                         "training cluster's TF_CONFIG.",
    'isolation': 'none: the tasks are plain local processes, their ports reachable from the network; netns: every '
                 'task of a local cluster runs in one private network namespace nothing outside can reach (not '
                 'for tasks on SSH hosts).',
    'env': _ENV_VALUES,
    f'tasks.{JOB}.env': 'Environment variables of every task of one job, over those of env; the same values as '
                        'env takes.',
    'gpus': f'{HOST}: its number of GPUs, so that `launch plan` (which asks no host) shows the GPUs each worker '
            'gets; `launch up` and `launch check` compare it with what the host has.',
}
_OTHER_TYPES = {
    'cluster': 'list of host:port',
    'isolation': 'string',
    'env': _ENV_TYPE,
    'tasks': _ENV_TYPE,
    'gpus': f'mapping of {HOST} to integer',
}


def spec_keys() -> list[SpecKey]:
    """Every documented key, section by section in the spec's order, each section's keys in the
    order the code declares them."""
    keys: list[SpecKey] = []
    for section in SECTIONS:
        if section == 'train':
            keys += [_field_key('train', f) for f in dataclasses.fields(TrainConfig) if 'doc' in f.metadata]
        elif section == 'supervise':
            keys += [_field_key('supervise', f) for f in dataclasses.fields(SuperviseConfig) if 'doc' in f.metadata]
        elif section == 'hosts':
            fields = {f.name: f for f in dataclasses.fields(HostConfig)}
            keys += [_field_key(f'hosts.{HOST}', fields[name]) for name in HOST_SETTINGS
                     if name in fields and 'doc' in fields[name].metadata]
        else:
            keys += [_other_key(key) for key in OTHER_KEYS if key.split('.')[0] == section]
    return keys


def _other_key(key: str) -> SpecKey:
    section = key.split('.')[0]
    if section == 'cluster':
        job = key.split('.')[1]
        default = REQUIRED if job in REQUIRED_JOBS else ABSENT
        return SpecKey(key, _OTHER_TYPES[section], default, OTHER_KEYS[key])
    if section == 'isolation':
        return SpecKey(key, 'string', _default(ClusterSpec, 'isolation'), OTHER_KEYS[key], ISOLATION_MODES)
    return SpecKey(key, _OTHER_TYPES[section], '{}', OTHER_KEYS[key])


def _default(cls: type, name: str) -> str:
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    return yaml_value(field.default)


def _field_key(prefix: str, field: dataclasses.Field) -> SpecKey:
    meta = field.metadata
    type_ = meta['yaml_type'] or yaml_type(str(field.type), field.name)
    # A mapping kept as pairs (hosts.<host>.labels) has no default to show but the empty mapping.
    default = '{}' if type_.startswith('mapping') and not field.default else yaml_value(field.default)
    return SpecKey(f'{prefix}.{field.name}', type_, default, meta['doc'], tuple(meta['allowed']))


_YAML_TYPES = {'bool': 'boolean', 'int': 'integer', 'float': 'number', 'str': 'string'}


def yaml_type(annotation: str, name: str) -> str:
    """'int | None' -> 'integer or null': a field's type as the YAML spells it. A type this does not
    know needs `setting(yaml_type=...)`: ValueError, naming the field."""
    parts = [p.strip() for p in annotation.split('|')]
    unknown = [p for p in parts if p != 'None' and p not in _YAML_TYPES]
    if unknown:
        raise ValueError(f'{name}: say how YAML spells {annotation!r}: setting(..., yaml_type=...)')
    return ' or '.join([_YAML_TYPES[p] for p in parts if p != 'None'] + (['null'] if 'None' in parts else []))


def yaml_value(value: Any) -> str:
    """A default as the YAML spells it: true, null, 60, runs/default."""
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if value is None:
        return 'null'
    if isinstance(value, float):
        return f'{value:g}'
    return str(value)
