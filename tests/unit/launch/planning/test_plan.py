"""Tests for launch/planning/plan.py: a spec in, one TaskPlan per task out; tables, no processes."""
import json
import os
import sys

import pytest
import yaml

from cluster.spec import HostConfig, SpecError, load_spec
from launch.planning.plan import is_local, plan_cluster, task_spec

PYTHON = '/opt/venv/bin/python3.11'


def make_spec(tmp_path, cluster, train=None, hosts=None, overrides=()):
    raw = {'cluster': cluster, 'train': {'train_dir': str(tmp_path / 'runs' / 'job'), **(train or {})}}
    if hosts is not None:
        raw['hosts'] = hosts
    path = tmp_path / 'spec.yaml'
    path.write_text(yaml.safe_dump(raw), encoding='utf-8')
    return load_spec(str(path), list(overrides))


LOCAL2 = {'ps': ['localhost:2222'], 'worker': ['localhost:2223', 'localhost:2224']}


def test_one_plan_per_task_ps_first(tmp_path):
    # workers listed first in the file; ps still planned first
    cluster = {'worker': ['localhost:2230', 'localhost:2231', 'localhost:2232'],
               'ps': ['localhost:2222', 'localhost:2223']}
    spec = make_spec(tmp_path, cluster)
    plans = plan_cluster(spec, python=PYTHON)
    assert isinstance(plans, tuple)
    assert [(p.task.job, p.task.index, p.task.port) for p in plans] == [
        ('ps', 0, 2222), ('ps', 1, 2223), ('worker', 0, 2230), ('worker', 1, 2231), ('worker', 2, 2232)]
    assert [p.task for p in plans] == list(spec.tasks)
    assert [p.name for p in plans] == ['ps:0', 'ps:1', 'worker:0', 'worker:1', 'worker:2']


def test_argv_cwd_and_paths(tmp_path):
    spec = make_spec(tmp_path, LOCAL2)
    train_dir = spec.train.train_dir
    plans = plan_cluster(spec, python=PYTHON, cwd='/srv/here')
    for plan, (job, index) in zip(plans, [('ps', 0), ('worker', 0), ('worker', 1)]):
        spec_file = os.path.join(train_dir, 'spec.yaml')
        assert plan.argv == (PYTHON, '-m', 'cluster.task', '--spec', spec_file,
                             '--job', job, '--index', str(index))
        assert all(isinstance(a, str) for a in plan.argv)
        assert plan.spec_path == spec_file
        assert plan.log_path == os.path.join(train_dir, 'logs', f'{job}-{index}.log')
        assert plan.backend == 'local'
        assert plan.host is None
        assert plan.cwd == '/srv/here'


def test_relative_train_dir_stays_relative(tmp_path):
    spec = make_spec(tmp_path, LOCAL2, train={'train_dir': 'runs/rel'})
    plan = plan_cluster(spec, python=PYTHON)[2]
    assert plan.argv[4] == plan.spec_path == os.path.join('runs/rel', 'spec.yaml')
    assert plan.log_path == os.path.join('runs/rel', 'logs', 'worker-1.log')
    assert plan.cwd == '.'


def test_local_default_python_is_sys_executable(tmp_path):
    plans = plan_cluster(make_spec(tmp_path, LOCAL2))
    assert [p.argv[0] for p in plans] == [sys.executable] * 3


@pytest.mark.parametrize('job, index', [('ps', 0), ('worker', 0), ('worker', 1)])
def test_tf_config(tmp_path, job, index):
    spec = make_spec(tmp_path, LOCAL2)
    plan = next(p for p in plan_cluster(spec) if (p.task.job, p.task.index) == (job, index))
    tf_config = json.loads(plan.env['TF_CONFIG'])
    assert tf_config == {'cluster': LOCAL2, 'task': {'type': job, 'index': index}}
    assert tf_config['cluster'] == spec.cluster_def()
    assert plan.env['PYTHONUNBUFFERED'] == '1'
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in plan.env.items())


def test_tf_config_ipv6_and_remote(tmp_path):
    cluster = {'ps': ['[::1]:2222'], 'worker': ['node1:2223', '10.0.0.5:2224']}
    plans = plan_cluster(make_spec(tmp_path, cluster))
    for plan in plans:
        assert json.loads(plan.env['TF_CONFIG'])['cluster'] == {
            'ps': ['[::1]:2222'], 'worker': ['node1:2223', '10.0.0.5:2224']}


# devices -> CUDA_VISIBLE_DEVICES of (ps, worker 0, worker 1), both workers on localhost, whose GPU
# count the plan does not know; None: not set. Each worker takes its own block of the host's GPUs.
CUDA = [
    ('auto', '', None, None),
    (2, '', '', ''),
    (['gpu:0'], '', '0', '1'),
    (['gpu:0', 'gpu:1'], '', '0,1', '2,3'),
    (['gpu:0', 'gpu:2'], '', '0,2', '3,5'),
    (['gpu:1'], '', '1', '3'),
    (['cpu:0', 'cpu:1'], '', '', ''),
    (['cpu:0', 'gpu:3'], '', '3', '7'),
]


@pytest.mark.parametrize('devices, ps_cuda, worker0, worker1', CUDA, ids=[str(c[0]) for c in CUDA])
def test_cuda_visible_devices(tmp_path, devices, ps_cuda, worker0, worker1):
    plans = plan_cluster(make_spec(tmp_path, LOCAL2, train={'devices': devices}))
    ps, workers = plans[0], plans[1:]
    assert ps.task.job == 'ps'
    assert ps.env['CUDA_VISIBLE_DEVICES'] == ps_cuda
    for plan, cuda in zip(workers, (worker0, worker1)):
        assert plan.env.get('CUDA_VISIBLE_DEVICES') == cuda
        assert ('CUDA_VISIBLE_DEVICES' in plan.env) == (cuda is not None)


# (task host, hosts section, local?)
IS_LOCAL = [
    ('localhost', None, True),
    ('127.0.0.1', None, True),
    ('::1', None, True),
    ('localhost', {'localhost': {}}, False),
    ('127.0.0.1', {'127.0.0.1': {'user': 'me'}}, False),
    ('::1', {'::1': {}}, False),
    ('127.0.0.1', {'localhost': {}}, True),       # only the name listed becomes SSH
    ('node1', None, False),
    ('node1', {'node1': {'user': 'ubuntu'}}, False),
    ('10.0.0.5', None, False),
    ('node1.example.com', {'node2': {}}, False),
]


@pytest.mark.parametrize('host, hosts, local', IS_LOCAL,
                         ids=[f'{h}-{"hosts" if s else "nohosts"}' for h, s, _ in IS_LOCAL])
def test_is_local(tmp_path, host, hosts, local):
    address = f'[{host}]:2223' if ':' in host else f'{host}:2223'
    spec = make_spec(tmp_path, {'ps': ['localhost:2222' if host != 'localhost' else '127.0.0.2:2222'],
                                'worker': [address]}, hosts=hosts)
    assert is_local(spec, host) is local
    worker = plan_cluster(spec, python=PYTHON)[1]
    assert worker.task.host == host
    assert worker.backend == ('local' if local else 'ssh')
    if local:
        assert worker.host is None and worker.argv[0] == PYTHON and worker.cwd == '.'
    else:
        assert worker.host == spec.hosts.get(host, HostConfig(name=host))


REMOTE = [
    # hosts entry for the task's host, expected (python, cwd)
    (None, ('python3', 'tfcluster')),
    ({}, ('python3', 'tfcluster')),
    ({'user': 'ubuntu', 'port': 2022}, ('python3', 'tfcluster')),
    ({'python': '/opt/venv/bin/python'}, ('/opt/venv/bin/python', 'tfcluster')),
    ({'workdir': '/srv/tfcluster'}, ('python3', '/srv/tfcluster')),
    ({'python': 'python3.11', 'workdir': 'work', 'key': '~/.ssh/id_ed25519'}, ('python3.11', 'work')),
]


@pytest.mark.parametrize('settings, expected', REMOTE, ids=[str(r[0]) for r in REMOTE])
def test_remote_plan(tmp_path, settings, expected):
    hosts = None if settings is None else {'node1': settings}
    spec = make_spec(tmp_path, {'ps': ['localhost:2222'], 'worker': ['node1:2223', '10.0.0.5:2224']},
                     hosts=hosts)
    ps, node1, other = plan_cluster(spec, python=PYTHON, cwd='/local/cwd')
    assert (ps.backend, ps.argv[0], ps.cwd, ps.host) == ('local', PYTHON, '/local/cwd', None)
    assert node1.backend == 'ssh'
    assert (node1.argv[0], node1.cwd) == expected
    assert node1.host == (HostConfig(name='node1') if settings is None else spec.hosts['node1'])
    assert node1.host.name == 'node1'
    assert node1.argv[1:] == ('-m', 'cluster.task', '--spec', os.path.join(spec.train.train_dir, 'spec.yaml'),
                              '--job', 'worker', '--index', '0')
    # a host not under `hosts` gets the defaults and an empty HostConfig (ssh config decides)
    assert (other.backend, other.argv[0], other.cwd) == ('ssh', 'python3', 'tfcluster')
    assert other.host == HostConfig(name='10.0.0.5')
    assert other.log_path == os.path.join(spec.train.train_dir, 'logs', 'worker-1.log')


def test_ssh_loopback_host_plan(tmp_path):
    """Listing localhost under hosts (how tests fake SSH hosts) makes every task on it SSH."""
    spec = make_spec(tmp_path, LOCAL2, hosts={'localhost': {'python': '/usr/bin/python3', 'workdir': '/tmp/w'}})
    plans = plan_cluster(spec, python=PYTHON)
    assert {p.backend for p in plans} == {'ssh'}
    assert {(p.argv[0], p.cwd) for p in plans} == {('/usr/bin/python3', '/tmp/w')}
    assert all(p.host is spec.hosts['localhost'] for p in plans)


@pytest.mark.parametrize('kwargs', [{}, {'python': PYTHON, 'cwd': '/x'}])
def test_planning_is_pure(tmp_path, monkeypatch, kwargs):
    monkeypatch.chdir(tmp_path)
    hosts = {'node1': {'user': 'ubuntu'}}
    cluster = {'ps': ['localhost:2222'], 'worker': ['localhost:2223', 'node1:2224']}
    for train_dir in (str(tmp_path / 'runs' / 'abs'), 'runs/rel'):
        spec = make_spec(tmp_path, cluster, train={'train_dir': train_dir, 'devices': ['gpu:0']}, hosts=hosts)
        before = sorted(os.walk(tmp_path))
        first = plan_cluster(spec, **kwargs)
        second = plan_cluster(spec, **kwargs)
        assert first == second
        assert first is not second and first[0].env is not second[0].env
        assert sorted(os.walk(tmp_path)) == before
        assert sorted(os.listdir(tmp_path)) == ['spec.yaml']


def test_overrides_reach_the_plan(tmp_path):
    spec = make_spec(tmp_path, LOCAL2, overrides=['cluster.worker=[localhost:3000]',
                                                  'train.train_dir=runs/over'])
    plans = plan_cluster(spec, python=PYTHON)
    assert [p.task.port for p in plans] == [2222, 3000]
    assert plans[1].log_path == os.path.join('runs/over', 'logs', 'worker-0.log')
    assert json.loads(plans[0].env['TF_CONFIG'])['cluster']['worker'] == ['localhost:3000']


# -- the address tasks reach a host at (an ssh config alias's HostName, or hosts.X.address) ---------

ALIASED = {'ps': ['node1:2222'], 'worker': ['node1:2223', 'node2:2223']}


def test_addresses_are_what_tasks_and_tf_config_use(tmp_path):
    spec = make_spec(tmp_path, ALIASED, hosts={'node1': {'user': 'ubuntu', 'key': '~/.ssh/k', 'port': 2022},
                                                'node2': {'user': 'root'}})
    plans = plan_cluster(spec, addresses={'node1': '10.0.0.5', 'node2': '10.0.0.6'})
    assert [p.task.host for p in plans] == ['node1', 'node1', 'node2']      # the name one ssh's to
    assert [p.endpoint for p in plans] == ['10.0.0.5:2222', '10.0.0.5:2223', '10.0.0.6:2223']
    assert [p.address for p in plans] == ['10.0.0.5', '10.0.0.5', '10.0.0.6']
    for plan in plans:
        assert json.loads(plan.env['TF_CONFIG'])['cluster'] == {'ps': ['10.0.0.5:2222'],
                                                                'worker': ['10.0.0.5:2223', '10.0.0.6:2223']}
    # without addresses, every task is reached at the host the spec names
    assert [p.endpoint for p in plan_cluster(spec)] == ['node1:2222', 'node1:2223', 'node2:2223']


def test_the_spec_tasks_read_has_addresses_and_no_ssh_settings(tmp_path):
    spec = make_spec(tmp_path, ALIASED, hosts={'node1': {'user': 'ubuntu', 'key': '~/.ssh/k', 'port': 2022,
                                                         'address': '10.0.0.5'}})
    uploaded = yaml.safe_load(task_spec(spec, {'node1': '10.0.0.5'}).to_yaml())
    assert 'hosts' not in uploaded
    assert uploaded['cluster'] == {'ps': ['10.0.0.5:2222'], 'worker': ['10.0.0.5:2223', 'node2:2223']}
    assert uploaded['train'] == yaml.safe_load(spec.to_yaml())['train']
    assert 'hosts' in spec.to_dict()                       # the launcher's own spec keeps them


def test_two_tasks_resolving_to_one_address_are_refused(tmp_path):
    spec = make_spec(tmp_path, {'ps': ['node1:2222'], 'worker': ['node2:2222']})
    with pytest.raises(SpecError) as e:
        plan_cluster(spec, addresses={'node1': '10.0.0.5', 'node2': '10.0.0.5'})
    assert str(e.value) == (f'{spec.path}: cluster: worker:0 (node2:2222) and ps:0 (node1:2222) both resolve '
                            'to 10.0.0.5:2222: every task needs its own address:port (check HostName in the '
                            'ssh config and hosts.*.address)')


def test_launch_plan_of_a_coordinator_command_says_only_what_a_pss_run_does(tmp_path, capsys):
    """A coordinator run's train.command runs on the chief alone, with TF_CONFIG and no TF1 flags,
    and the ps and workers are stopped once the chief has ended: the plan says that, and not the
    TF1 line (every task runs it with the classic flags; the ps stop once every worker exited)."""
    from launch.cli import main
    spec = tmp_path / 'spec.yaml'
    spec.write_text(yaml.safe_dump({
        'cluster': {'chief': ['localhost:2221'], 'ps': ['localhost:2222'], 'worker': ['localhost:2223']},
        'train': {'command': 'python my_pss.py --steps 300', 'train_dir': str(tmp_path / 'run')}}))
    assert main(['plan', str(spec)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith('# ')]
    assert len(notes) == 2, notes
    assert notes[1].startswith('# the chief runs `python my_pss.py --steps 300` with TF_CONFIG (no TF1 flags') \
        and 'the ps and workers only serve' in notes[1] and 'stopped once the chief has ended' in notes[1], notes
    assert not any('--job_name' in n or 'every task runs' in n or 'every worker exited' in n for n in notes), notes
