"""Every key of every config class (train:, supervise:, hosts.NAME:) reaches its field from YAML:
each is parsed by its `setting` metadata (cluster/spec/model.py Value) or by a parser of its own
(cluster/spec/validate.py OWN_PARSERS). A field added without either fails here, not silently
in a user's run."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from cluster.spec import SpecError, load_spec
from cluster.spec.errors import Origins
from cluster.spec.model import HostConfig, SuperviseConfig, TrainConfig, Value
from cluster.spec.validate import OWN_PARSERS, parse_setting

CLUSTER = {'ps': ['localhost:2222'], 'worker': ['localhost:2223', 'localhost:2224']}
CONFIGS = {'train': TrainConfig, 'supervise': SuperviseConfig, 'hosts.node1': HostConfig}

# What each generic rule is given, and what it makes of it: a value unlike every default.
GENERIC: dict[Value, tuple[Any, Any]] = {
    Value.COUNT: (2, 2), Value.WHOLE: (5, 5), Value.INTEGER: (11, 11), Value.POSITIVE: (7, 7.0),
    Value.NONNEGATIVE: (0, 0.0), Value.PATH: ('elsewhere', 'elsewhere'), Value.TEXT: ('someone', 'someone'),
}
# The keys with parsers of their own: (YAML value, the field's value, other sections the key needs).
OWN: dict[str, tuple[Any, Any, dict]] = {
    'train.devices': (['cpu:0', 'CPU:1'], ('cpu:0', 'cpu:1'), {}),
    'train.train_dir': ('runs/other', 'runs/other', {}),
    'train.program': ('examples.linear_program:train', 'examples.linear_program:train', {}),
    'train.command': ('python train.py --steps 3', ('python', 'train.py', '--steps', '3'), {}),
    'train.evaluator': ('python eval.py', ('python', 'eval.py'),
                        {'cluster': {**CLUSTER, 'chief': ['localhost:2221'], 'evaluator': ['localhost:2225']},
                         'train': {'program': 'examples.linear_program:train'}}),
    'hosts.node1.port': (2200, 2200, {}),
    'hosts.node1.address': ('10.0.0.5', '10.0.0.5', {}),
    'hosts.node1.labels': ({'zone': 'b'}, (('zone', 'b'),), {}),
}

# Generic keys whose generic sample the spec refuses (a bound set by another part of the spec).
BOUNDED: dict[str, tuple[Any, Any, dict]] = {
    'train.backup_workers': (1, 1, {}),     # fewer than the 2 workers of CLUSTER
}


def _settings() -> list[tuple[str, type, dataclasses.Field]]:
    """(section, class, field) for every spec key of every config class."""
    return [(section, cls, f) for section, cls in CONFIGS.items() for f in dataclasses.fields(cls) if f.metadata]


def _sample(section: str, field: dataclasses.Field) -> tuple[Any, Any, dict]:
    key = f'{section}.{field.name}'
    kind = field.metadata['value']
    if key in BOUNDED:
        return BOUNDED[key]
    if kind is Value.OWN:
        assert key in OWN, f'{key} has a parser of its own: give it a sample here'
        return OWN[key]
    if kind is Value.SWITCH:
        return (not field.default, not field.default, {})
    if kind is Value.CHOICE:
        other = next(a for a in field.metadata['allowed'] if a != field.default)
        return other, other, {}
    return (*GENERIC[kind], {})


def _spec_setting(tmp_path, section: str, name: str, value: Any, context: dict):
    raw: dict = {'cluster': CLUSTER, **{k: dict(v) if isinstance(v, dict) else v for k, v in context.items()}}
    if section.startswith('hosts.'):
        raw['hosts'] = {section.split('.', 1)[1]: {name: value}}
    else:
        raw.setdefault(section, {})[name] = value
    path = tmp_path / 'spec.yaml'
    path.write_text(yaml.safe_dump(raw))
    return load_spec(str(path))


def test_every_setting_says_how_its_yaml_is_read():
    """A Value for each, and a parser for each OWN one: else a new key would have no reader."""
    for section, cls, f in _settings():
        assert isinstance(f.metadata.get('value'), Value), f'{section}.{f.name}: setting(..., Value.X)'
        if f.metadata['value'] is Value.OWN:
            assert (cls, f.name) in OWN_PARSERS, f'{section}.{f.name}: Value.OWN without a parser'
        if f.metadata['value'] is Value.CHOICE:
            assert f.default in f.metadata['allowed'], f'{section}.{f.name}: its default is no choice'
    assert set(OWN) == {f'{s}.{f.name}' for s, _, f in _settings() if f.metadata['value'] is Value.OWN}


@pytest.mark.parametrize('section, cls, field', _settings(), ids=lambda x: getattr(x, 'name', None))
def test_every_key_reaches_its_field(tmp_path, section, cls, field):
    """Set alone in a spec, each key ends up in its dataclass, with the value it parses to."""
    value, expected, context = _sample(section, field)
    assert expected != field.default
    spec = _spec_setting(tmp_path, section, field.name, value, context)
    config = {'train': spec.train, 'supervise': spec.supervise}.get(section) or spec.hosts['node1']
    assert getattr(config, field.name) == expected


def test_a_field_of_its_own_without_a_parser_is_refused_not_dropped():
    """What a key added as Value.OWN and forgotten in OWN_PARSERS does: it raises."""
    field = dataclasses.field(default=None, metadata={'value': Value.OWN})
    field.name = 'forgotten'
    with pytest.raises(LookupError, match='forgotten'):
        parse_setting(TrainConfig, field, 3, 'train.forgotten', Origins('spec.yaml'))


@pytest.mark.parametrize('key, value, line', [
    ('train.steps', 0, 'expected a positive whole number, got 0'),
    ('train.seed', 'x', "expected an integer, got 'x'"),
    ('train.learning_rate', float('inf'), 'expected a positive number, got inf'),
    ('supervise.backoff_secs', -1, 'expected a number of seconds >= 0, got -1'),
    ('supervise.stall_secs', True, 'expected a positive number of seconds, got True'),
    ('supervise.restart', False, "expected one of never, on-failure, got False"),
    ('hosts.node1.user', None, 'expected a string, got None'),
])
def test_the_generic_rules_say_what_was_expected(tmp_path, key, value, line):
    section, name = key.rsplit('.', 1)
    with pytest.raises(SpecError) as caught:
        _spec_setting(tmp_path, section, name, value, {})
    assert key in str(caught.value) and line in str(caught.value)
