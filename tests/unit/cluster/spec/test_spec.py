"""Tests for cluster/spec/: specs written to tmp_path, tables of good and bad inputs.

Error tests check the contract of DESIGN.md: every user error is a `SpecError` whose message is one
line, starts with where the bad value came from (`file:LINE:` or `--set TEXT:`) and names the dotted key.
A line in a bad spec marked with `# <-` is the line the error must point at.
"""
import contextlib
import dataclasses
import os
import signal
import time

import pytest
import yaml

from cluster.spec import (ClusterSpec, HostConfig, SpecError, TaskSpec, TrainConfig, load_spec,
                          parse_override)
from tests.harness.documented import check_documented
from tests.harness.spec import BAD_SPECS, CLUSTER, OVERRIDE_ERRORS, TRAIN
from tests.conftest import REPO

MARK = '# <-'

VALID = CLUSTER + """\
train:
  sync: true
  steps: 100
  batch_size: 32
  devices: auto
  data: synthetic
  train_dir: runs/test
"""

FULL = """\
# every section and most train keys
cluster:
  worker: [localhost:2223, node1:2224, '10.0.0.5:2225']   # listed before ps on purpose
  ps: [localhost:2222, '[::1]:2230']
train:
  sync: false
  steps: 50
  batch_size: 16
  devices: [gpu:0, GPU:2]
  data: /data/cifar-10-batches-bin
  train_dir: /tmp/runs/full
  learning_rate: 0.05
  replicas_to_aggregate: 2
  checkpoint_steps: 10
  checkpoint_secs: 30
  log_every_secs: 0.5
  seed: 7
hosts:
  node1: {user: ubuntu, port: 2022, key: ~/.ssh/id_ed25519, python: /opt/venv/bin/python, workdir: /srv/tfcluster}
  10.0.0.5: {}
"""


def write(tmp_path, text, name='spec.yaml'):
    path = tmp_path / name
    path.write_text(text, encoding='utf-8')
    return str(path)


@contextlib.contextmanager
def deadline(cpu_seconds=0.2):
    """Turn an endless loop into a TimeoutError. Loading a tiny spec takes about a millisecond of
    CPU; the timer counts CPU time, so a busy machine does not make it fire. The kernel's timer
    counts every thread of this process (an earlier test's gRPC or TensorFlow threads too), so it
    only wakes the check, which counts this thread's own time."""
    start = time.thread_time()

    def on_timer(signum, frame):
        used = time.thread_time() - start
        if used < cpu_seconds:
            signal.setitimer(signal.ITIMER_VIRTUAL, max(cpu_seconds - used, 0.01))
            return
        raise TimeoutError(f'load_spec still running after {cpu_seconds} s of CPU time')
    previous = signal.signal(signal.SIGVTALRM, on_timer)
    signal.setitimer(signal.ITIMER_VIRTUAL, cpu_seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


def spec_error(path, overrides=()):
    with deadline(), pytest.raises(SpecError) as info:
        load_spec(path, list(overrides))
    return str(info.value)


def marked_line(text):
    lines = [i for i, line in enumerate(text.splitlines(), 1) if MARK in line]
    assert len(lines) == 1, f'test bug: mark exactly one line with {MARK!r}'
    return lines[0]


def check_file_error(path, text, message, key, *fragments):
    """One line, starting `path:LINE:` (the marked line), naming `key` and each fragment."""
    assert '\n' not in message, message
    assert message.startswith(f'{path}:{marked_line(text)}: '), message
    assert f' {key}: ' in message, message
    for fragment in fragments:
        assert fragment in message, message


# ---------------------------------------------------------------------------------------------
# Valid specs

def test_valid_spec_loads_into_frozen_types(tmp_path):
    spec = load_spec(write(tmp_path, VALID))
    assert isinstance(spec, ClusterSpec)
    assert isinstance(spec.train, TrainConfig)
    assert all(isinstance(t, TaskSpec) for t in spec.tasks)
    assert isinstance(spec.tasks, tuple)
    for obj, attr, value in [(spec, 'path', 'x'), (spec, 'tasks', ()), (spec.train, 'steps', 1),
                             (spec.train, 'sync', False), (spec.tasks[0], 'port', 1),
                             (spec.tasks[1], 'host', 'evil')]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, attr, value)


def test_hosts_mapping_and_devices_are_immutable(tmp_path):
    spec = load_spec(write(tmp_path, FULL))
    with pytest.raises(TypeError):
        spec.hosts['node2'] = HostConfig(name='node2')
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.hosts['node1'].user = 'root'
    assert isinstance(spec.train.devices, tuple)


def test_valid_spec_values(tmp_path):
    path = write(tmp_path, VALID)
    spec = load_spec(path)
    assert spec.path == path
    assert spec.tasks == (TaskSpec('ps', 0, 'localhost', 2222),
                          TaskSpec('worker', 0, 'localhost', 2223),
                          TaskSpec('worker', 1, 'localhost', 2224))
    assert spec.train == TrainConfig(sync=True, steps=100, batch_size=32, devices='auto',
                                     data='synthetic', train_dir='runs/test')
    assert dict(spec.hosts) == {}
    assert spec.num_workers == 2
    assert spec.num_ps == 1
    assert spec.replicas_to_aggregate == 2          # default: every worker
    assert spec.cluster_def() == {'ps': ['localhost:2222'],
                                  'worker': ['localhost:2223', 'localhost:2224']}
    assert [t.name for t in spec.tasks] == ['ps:0', 'worker:0', 'worker:1']
    assert [t.is_chief for t in spec.tasks] == [False, True, False]


def test_defaults_when_train_section_is_missing(tmp_path):
    spec = load_spec(write(tmp_path, CLUSTER))
    assert spec.train == TrainConfig()
    assert spec.replicas_to_aggregate == spec.num_workers == 2


def test_full_spec(tmp_path):
    spec = load_spec(write(tmp_path, FULL))
    # ps first, then workers, whatever the order in the file; index = position in the job's list
    assert spec.tasks == (TaskSpec('ps', 0, 'localhost', 2222),
                          TaskSpec('ps', 1, '::1', 2230),
                          TaskSpec('worker', 0, 'localhost', 2223),
                          TaskSpec('worker', 1, 'node1', 2224),
                          TaskSpec('worker', 2, '10.0.0.5', 2225))
    assert spec.num_workers == 3 and spec.num_ps == 2
    assert spec.replicas_to_aggregate == 2
    assert spec.cluster_def() == {'ps': ['localhost:2222', '[::1]:2230'],
                                  'worker': ['localhost:2223', 'node1:2224', '10.0.0.5:2225']}
    assert spec.train == TrainConfig(sync=False, steps=50, batch_size=16, devices=('gpu:0', 'gpu:2'),
                                     data='/data/cifar-10-batches-bin', train_dir='/tmp/runs/full',
                                     learning_rate=0.05, replicas_to_aggregate=2, checkpoint_steps=10,
                                     checkpoint_secs=30.0, log_every_secs=0.5, seed=7)
    assert isinstance(spec.train.checkpoint_secs, float)
    assert dict(spec.hosts) == {
        'node1': HostConfig(name='node1', user='ubuntu', port=2022, key='~/.ssh/id_ed25519',
                            python='/opt/venv/bin/python', workdir='/srv/tfcluster'),
        '10.0.0.5': HostConfig(name='10.0.0.5'),
    }


@pytest.mark.parametrize('job, index, expected', [
    ('ps', 0, TaskSpec('ps', 0, 'localhost', 2222)),
    ('ps', 1, TaskSpec('ps', 1, '::1', 2230)),
    ('worker', 0, TaskSpec('worker', 0, 'localhost', 2223)),
    ('worker', 2, TaskSpec('worker', 2, '10.0.0.5', 2225)),
])
def test_task_lookup(tmp_path, job, index, expected):
    assert load_spec(write(tmp_path, FULL)).task(job, index) == expected


@pytest.mark.parametrize('job, index, fragment', [
    ('worker', 3, 'indices 0..2'),
    ('worker', -1, 'worker:-1 does not exist'),
    ('ps', 2, 'ps:2 does not exist'),
    ('chief', 0, 'the cluster has no chief task'),
    ('master', 0, "unknown job 'master'"),
])
def test_task_lookup_errors(tmp_path, job, index, fragment):
    path = write(tmp_path, FULL)
    spec = load_spec(path)
    with pytest.raises(SpecError) as info:
        spec.task(job, index)
    message = str(info.value)
    assert '\n' not in message and message.startswith(f'{path}: ') and fragment in message, message


@pytest.mark.parametrize('text', [VALID, FULL, CLUSTER], ids=['valid', 'full', 'defaults'])
def test_to_yaml_round_trip(tmp_path, text):
    spec = load_spec(write(tmp_path, text))
    effective = write(tmp_path, spec.to_yaml(), name='effective.yaml')
    again = load_spec(effective)
    assert again.path == effective
    assert dataclasses.replace(again, path=spec.path) == spec
    assert dict(again.hosts) == dict(spec.hosts)


def test_to_yaml_carries_overrides(tmp_path):
    spec = load_spec(write(tmp_path, VALID), ['train.steps=7', 'hosts.node1.user=ubuntu'])
    effective = yaml.safe_load(spec.to_yaml())
    assert effective['train']['steps'] == 7
    assert effective['hosts'] == {'node1': {'user': 'ubuntu'}}     # unset (None) settings left out
    assert effective['cluster'] == spec.cluster_def()


def test_ipv6_address(tmp_path):
    spec = load_spec(write(tmp_path, """\
cluster:
  ps: ['[::1]:2222']
  worker: ['[::1]:2223', '[fe80::1]:2224']
"""))
    assert [(t.host, t.port) for t in spec.tasks] == [('::1', 2222), ('::1', 2223), ('fe80::1', 2224)]
    assert spec.task('ps', 0).address == '[::1]:2222'
    assert spec.cluster_def() == {'ps': ['[::1]:2222'], 'worker': ['[::1]:2223', '[fe80::1]:2224']}


@pytest.mark.parametrize('cluster, expected', [
    ('  ps: localhost:2222\n  worker: localhost:2223\n',                       # a string: one task
     (('ps', 'localhost', 2222), ('worker', 'localhost', 2223))),
    ('  ps: [127.0.0.1:2222]\n  worker: [node-1.example.com:2223, node1:2222]\n',
     (('ps', '127.0.0.1', 2222), ('worker', 'node-1.example.com', 2223), ('worker', 'node1', 2222))),
    ('  ps: [localhost:1]\n  worker: [localhost:65535]\n',
     (('ps', 'localhost', 1), ('worker', 'localhost', 65535))),
], ids=['string', 'names', 'port-range-ends'])
def test_cluster_addresses(tmp_path, cluster, expected):
    spec = load_spec(write(tmp_path, 'cluster:\n' + cluster))
    assert tuple((t.job, t.host, t.port) for t in spec.tasks) == expected


@pytest.mark.parametrize('line, expected', [
    ('devices: 4', 4),
    ('devices: auto', 'auto'),
    ('devices: [cpu:0, cpu:1]', ('cpu:0', 'cpu:1')),
    ('devices: [GPU:1, " gpu:03 "]', ('gpu:1', 'gpu:3')),
])
def test_devices_forms(tmp_path, line, expected):
    spec = load_spec(write(tmp_path, CLUSTER + 'train:\n  ' + line + '\n'))
    assert spec.train.devices == expected


@pytest.mark.parametrize('relative, sync, train_dir', [
    ('specs/local2.yaml', True, 'runs/local2'),
    ('specs/local2-async.yaml', False, 'runs/local2-async'),
])
def test_shipped_specs_load(relative, sync, train_dir):
    spec = load_spec(os.path.join(REPO, relative))
    assert spec.num_ps == 1 and spec.num_workers == 2
    assert spec.train.sync is sync
    assert spec.train.train_dir == train_dir
    assert all(t.host == 'localhost' for t in spec.tasks)
    assert len({t.port for t in spec.tasks}) == 3


def test_hosts_section(tmp_path):
    spec = load_spec(write(tmp_path, CLUSTER + """\
hosts:
  node1: {user: ubuntu, port: 22}
  node2:
    key: /home/me/.ssh/id_rsa
    python: python3.11
    workdir: work
  node3:
"""))
    assert spec.hosts == {'node1': HostConfig('node1', user='ubuntu', port=22),
                          'node2': HostConfig('node2', key='/home/me/.ssh/id_rsa', python='python3.11',
                                              workdir='work'),
                          'node3': HostConfig('node3')}
    assert all(isinstance(h, HostConfig) for h in spec.hosts.values())


@pytest.mark.parametrize('text, key, fragments, entry', [c[1:] for c in BAD_SPECS], ids=[c[0] for c in BAD_SPECS])
def test_bad_spec(tmp_path, text, key, fragments, entry):
    path = write(tmp_path, text)
    message = spec_error(path)
    if key is None:                      # a whole-file problem: no key, but still file:LINE
        assert '\n' not in message and message.startswith(f'{path}:{marked_line(text)}: '), message
        for fragment in fragments:
            assert fragment in message, message
    else:
        check_file_error(path, text, message, key, *fragments)
    check_documented(entry, message)


def test_missing_spec_file(tmp_path):
    path = str(tmp_path / 'nope.yaml')
    message = spec_error(path)
    assert '\n' not in message
    assert message.startswith(f'{path}: ') and 'not found' in message, message


def test_spec_path_is_a_directory(tmp_path):
    message = spec_error(str(tmp_path))
    assert '\n' not in message and message.startswith(f'{tmp_path}: '), message


@pytest.mark.parametrize('text', ['train:\n  steps: 5\n', ''], ids=['no-cluster-key', 'empty-file'])
def test_missing_cluster_section(tmp_path, text):
    path = write(tmp_path, text)
    message = spec_error(path)
    assert '\n' not in message and message.startswith(f'{path}:') and 'cluster' in message, message


def test_port_with_superscript_digit(tmp_path):
    text = "cluster:\n  ps: ['localhost:\u00b2']  # <-\n  worker: [localhost:2223]\n"
    path = write(tmp_path, text)
    try:
        load_spec(path)
    except SpecError as e:
        check_file_error(path, text, str(e), 'cluster.ps[0]', 'port')
    except ValueError as e:
        raise AssertionError(f'plain ValueError, not SpecError: {e}') from None
    else:
        raise AssertionError('accepted')


def test_learning_rate_nan(tmp_path):
    text = TRAIN + '  learning_rate: .nan  # <-\n'
    path = write(tmp_path, text)
    try:
        spec = load_spec(path)
    except SpecError as e:
        check_file_error(path, text, str(e), 'train.learning_rate')
    else:
        raise AssertionError(f'accepted learning_rate={spec.train.learning_rate}')


def test_unknown_key_with_newline_gives_one_line(tmp_path):
    path = write(tmp_path, TRAIN + '"a\\nb": 1  # <-\n')
    message = spec_error(path)
    assert '\n' not in message, message


# ---------------------------------------------------------------------------------------------
# --set overrides

@pytest.mark.parametrize('overrides, check', [
    (['train.steps=50'], lambda s: s.train.steps == 50 and type(s.train.steps) is int),
    (['train.sync=false'], lambda s: s.train.sync is False),
    (['train.sync=true', 'train.sync=false'], lambda s: s.train.sync is False),   # the last one wins
    (['train.learning_rate=0.01'], lambda s: s.train.learning_rate == 0.01),
    (['train.devices=[gpu:0, gpu:1]'], lambda s: s.train.devices == ('gpu:0', 'gpu:1')),
    (['train.devices=3'], lambda s: s.train.devices == 3),
    (['train.data=/data/cifar'], lambda s: s.train.data == '/data/cifar'),
    (['cluster.worker=[localhost:3000, localhost:3001]'],
     lambda s: s.cluster_def()['worker'] == ['localhost:3000', 'localhost:3001']),
    (['cluster.worker=[localhost:3000, localhost:3001, localhost:3002]', 'train.replicas_to_aggregate=3'],
     lambda s: s.num_workers == 3 and s.replicas_to_aggregate == 3),
    (['hosts.node1.user=ubuntu'], lambda s: s.hosts == {'node1': HostConfig('node1', user='ubuntu')}),
    (['hosts.node1.user=ubuntu', 'hosts.node1.port=2022'],
     lambda s: s.hosts['node1'] == HostConfig('node1', user='ubuntu', port=2022)),
    (['train={steps: 9}'], lambda s: s.train == TrainConfig(steps=9)),
    (['hosts.10.0.0.5.user=ubuntu', 'hosts.10.0.0.5.port=2022'],
     lambda s: s.hosts == {'10.0.0.5': HostConfig('10.0.0.5', user='ubuntu', port=2022)}),
    (['hosts.gpu1.example.com={user: ml, python: /opt/py/bin/python}'],
     lambda s: s.hosts['gpu1.example.com'] == HostConfig('gpu1.example.com', user='ml', python='/opt/py/bin/python')),
    (['hosts.10.0.0.5.address=192.168.1.5'],
     lambda s: s.hosts == {'10.0.0.5': HostConfig('10.0.0.5', address='192.168.1.5')}),
], ids=['steps', 'sync', 'last-wins', 'float', 'devices-list', 'devices-int', 'string', 'worker-list',
        'workers-and-replicas', 'new-host', 'host-two-keys', 'whole-section', 'dotted-host-setting',
        'dotted-host-whole', 'dotted-host-address'])
def test_overrides(tmp_path, overrides, check):
    path = write(tmp_path, VALID)
    spec = load_spec(path, overrides)
    assert check(spec), spec
    assert spec.path == path


def test_override_does_not_touch_the_file(tmp_path):
    path = write(tmp_path, VALID)
    load_spec(path, ['train.steps=50'])
    assert open(path, encoding='utf-8').read() == VALID
    assert load_spec(path).train.steps == 100


@pytest.mark.parametrize('text, key, fragments, entry', [c[1:] for c in OVERRIDE_ERRORS],
                         ids=[c[0] for c in OVERRIDE_ERRORS])
def test_override_errors(tmp_path, text, key, fragments, entry):
    path = write(tmp_path, VALID)
    message = spec_error(path, [text])
    assert '\n' not in message, message
    assert message.startswith(f'--set {text}: '), message
    assert path not in message, message              # the --set is the origin, not the file's line
    if key is not None:
        assert f': {key}: ' in message, message
    for fragment in fragments:
        assert fragment in message, message
    check_documented(entry, message)


def test_override_unknown_top_level_section(tmp_path):
    text = 'trian.steps=5'
    message = spec_error(write(tmp_path, VALID), [text])
    assert '\n' not in message and message.startswith(f'--set {text}: trian: unknown key'), message


def test_file_errors_still_cite_the_file_with_overrides(tmp_path):
    text = TRAIN + '  batch_size: -1  # <-\n'
    path = write(tmp_path, text)
    message = spec_error(path, ['train.steps=50'])
    check_file_error(path, text, message, 'train.batch_size')


@pytest.mark.parametrize('text, parts, value', [
    ('train.steps=50', ['train', 'steps'], 50),
    ('train.sync=false', ['train', 'sync'], False),
    ('train.learning_rate=0.5', ['train', 'learning_rate'], 0.5),
    ('train.data=/data/cifar', ['train', 'data'], '/data/cifar'),
    ('cluster.worker=[localhost:3000, localhost:3001]', ['cluster', 'worker'],
     ['localhost:3000', 'localhost:3001']),
    ('hosts.node1.user=ubuntu', ['hosts', 'node1', 'user'], 'ubuntu'),
    ('hosts.node-1.key=~/.ssh/id', ['hosts', 'node-1', 'key'], '~/.ssh/id'),
    ('train.data=a=b', ['train', 'data'], 'a=b'),                  # split at the first '='
    (' train.steps = 5', ['train', 'steps'], 5),
    ('train={steps: 1}', ['train'], {'steps': 1}),
    ('train.seed=null', ['train', 'seed'], None),                  # null clears a key
])
def test_parse_override(text, parts, value):
    got_parts, got_value = parse_override(text)
    assert got_parts == parts
    assert got_value == value and type(got_value) is type(value)


@pytest.mark.parametrize('text', ['train.steps', 'train.steps=', 'train.steps= ', '=1', '.steps=1', 'train.=1', 'train steps=1',
                                  'train.st!eps=1', 'train.steps=[1', 'train.steps={a'])
def test_parse_override_errors(text):
    with pytest.raises(SpecError) as info:
        parse_override(text)
    message = str(info.value)
    assert '\n' not in message and message.startswith(f'--set {text}: '), message


@pytest.mark.parametrize('host, port, expected', [('localhost', 2222, 'localhost:2222'),
                                                  ('::1', 2222, '[::1]:2222'), ('10.0.0.5', 1, '10.0.0.5:1')])
def test_address_brackets_ipv6(host, port, expected):
    from cluster.spec import address
    assert address(host, port) == expected
