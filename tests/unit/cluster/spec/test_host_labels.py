"""`hosts.<host>.labels` (cluster/spec/labels.py, load.py's --set): the Ray node labels a host's
tasks are placed by. Good specs give (label, value) pairs; each bad form is one line naming the
file (or the --set option) and the key; --set reaches one label, its name holding dots and a /."""
from __future__ import annotations

import pytest

from cluster.spec import SpecError, load_spec
from cluster.spec.keys import spec_keys
from tests.harness.documented import check_documented

SPEC = """\
cluster:
  ps: [localhost:2222]
  worker: [gpu:2223, localhost:2224]
hosts:
  gpu:
    labels: {tfcluster.io/host: n3, zone: b}
"""


def _write(tmp_path, text: str = SPEC) -> str:
    path = tmp_path / 'spec.yaml'
    path.write_text(text)
    return str(path)


def _error(path: str, *overrides: str) -> str:
    with pytest.raises(SpecError) as e:
        load_spec(path, list(overrides))
    message = str(e.value)
    assert '\n' not in message
    return message


def test_labels_are_pairs_in_the_order_given_and_a_selector(tmp_path):
    host = load_spec(_write(tmp_path)).hosts['gpu']
    assert host.labels == (('tfcluster.io/host', 'n3'), ('zone', 'b'))
    assert host.selector == {'tfcluster.io/host': 'n3', 'zone': 'b'}
    assert hash(host)       # the config stays hashable


def test_a_host_without_labels_has_none_and_null_means_none(tmp_path):
    spec = load_spec(_write(tmp_path), ['hosts.gpu.labels=null', 'hosts.other.user=me'])
    assert spec.hosts['gpu'].labels == () and spec.hosts['other'].labels == ()


def test_the_effective_spec_writes_the_labels_back_as_a_mapping(tmp_path):
    spec = load_spec(_write(tmp_path))
    assert spec.to_dict()['hosts'] == {'gpu': {'labels': {'tfcluster.io/host': 'n3', 'zone': 'b'}}}
    again = tmp_path / 'again.yaml'
    again.write_text(spec.to_yaml())
    assert load_spec(str(again)).hosts['gpu'].labels == spec.hosts['gpu'].labels
    bare = load_spec(_write(tmp_path), ['hosts.gpu.labels=null'])
    assert 'labels' not in bare.to_dict()['hosts']['gpu']


@pytest.mark.parametrize('value, key, words', [
    ('[n3]', 'hosts.gpu.labels', "expected a mapping of Ray node label to value, e.g. {zone: b}, got ['n3']"),
    ('n3', 'hosts.gpu.labels', "expected a mapping of Ray node label to value, e.g. {zone: b}, got 'n3'"),
    ('{}', 'hosts.gpu.labels', 'an empty mapping would match every node'),
    ('{1: a}', 'hosts.gpu.labels', 'a label is a string, got 1'),
    ('{zone: 1}', 'hosts.gpu.labels.zone', "a label's value is a string, got 1"),
    ('{zone: yes}', 'hosts.gpu.labels.zone', "a label's value is a string, got True"),
    ('{zone: "!b"}', 'hosts.gpu.labels.zone', "invalid value '!b'"),
    ('{zone: "in(a,b)"}', 'hosts.gpu.labels.zone', "invalid value 'in(a,b)'"),
    ('{zone: ""}', 'hosts.gpu.labels.zone', "invalid value ''"),
    ('{-zone: b}', 'hosts.gpu.labels.-zone', "invalid label '-zone'"),
    ('{a..b/zone: b}', 'hosts.gpu.labels.a..b/zone', "its prefix 'a..b' must be a DNS name"),
])
def test_each_bad_form_is_one_line_naming_the_key(tmp_path, value, key, words):
    text = SPEC.replace('{tfcluster.io/host: n3, zone: b}', value + '  # <-')
    message = _error(_write(tmp_path, text))
    assert message.startswith(f'{tmp_path / "spec.yaml"}:6: {key}: '), message
    assert words in message, message


def test_a_non_mapping_is_the_documented_line(tmp_path):
    message = _error(_write(tmp_path), 'hosts.gpu.labels=[n3]')
    assert message.startswith('--set hosts.gpu.labels=[n3]: hosts.gpu.labels: '), message
    check_documented('host-labels-not-a-mapping', message)


def test_set_gives_one_label_whose_name_holds_dots_and_a_slash(tmp_path):
    path = _write(tmp_path)
    spec = load_spec(path, ['hosts.gpu.labels.tfcluster.io/host=n2', 'hosts.gpu.labels.rack=r7'])
    assert spec.hosts['gpu'].labels == (('tfcluster.io/host', 'n2'), ('zone', 'b'), ('rack', 'r7'))
    dotted = load_spec(path, ['hosts.10.0.0.5.labels.example.com/zone=c'])
    assert dotted.hosts['10.0.0.5'].labels == (('example.com/zone', 'c'),)


def test_set_of_a_label_to_null_drops_it_and_of_the_whole_key_replaces_them(tmp_path):
    path = _write(tmp_path)
    assert load_spec(path, ['hosts.gpu.labels.zone=null']).hosts['gpu'].labels == (('tfcluster.io/host', 'n3'),)
    assert load_spec(path, ['hosts.gpu.labels={rack: r1}']).hosts['gpu'].labels == (('rack', 'r1'),)


def test_set_of_a_bad_label_names_the_option_and_the_key(tmp_path):
    message = _error(_write(tmp_path), 'hosts.gpu.labels.zone=1')
    assert message.startswith("--set hosts.gpu.labels.zone=1: hosts.gpu.labels.zone: a label's value is a string")


def test_a_slash_is_taken_only_in_a_labels_name(tmp_path):
    message = _error(_write(tmp_path), 'hosts.gpu/x.user=me')
    assert 'expected dotted.key=value' in message


def test_the_spec_reference_lists_the_key_with_its_type_and_default():
    key = next(k for k in spec_keys() if k.key == 'hosts.<host>.labels')
    assert key.type == 'mapping of string to string' and key.default == '{}'
    assert '--backend ray' in key.doc
