"""Every bad input a new user can give, through the real command lines: exit code 2 (bad input),
exactly one line on stderr naming the file and line, the key, the task or the host, and nothing
started or written (no task process, no train_dir)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, free_ports, launch, project_processes, write_idx_set, write_spec


def _spec(tmp_path, cluster=None, train=None, top=None, raw=None) -> str:
    """A spec file: `raw` text as is, else a valid 1 ps + 1 worker spec with the given changes."""
    file = tmp_path / 'spec.yaml'
    if raw is not None:
        file.write_bytes(raw if isinstance(raw, bytes) else raw.encode())
        return str(file)
    ps, worker = free_ports(2)
    spec = {'cluster': cluster or {'ps': [f'localhost:{ps}'], 'worker': [f'localhost:{worker}']},
            'train': {'steps': 5, 'batch_size': 8, 'train_dir': str(tmp_path / 'run'), **(train or {})}}
    spec.update(top or {})
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(file)


def _coordinator(tmp_path, chiefs=1, ps=1, workers=2, evaluators=1, program='mytrain:train',
                 evaluator='mytrain:evaluate') -> str:
    """A coordinator spec (chief, ps, workers, evaluator) with the given counts and programs; its
    program module, mytrain.py, is written beside it."""
    (tmp_path / 'mytrain.py').write_text('def train(ctx):\n    pass\n\n\ndef evaluate(ctx):\n    pass\n')
    counts = {'chief': chiefs, 'ps': ps, 'worker': workers, 'evaluator': evaluators}
    ports = iter(free_ports(sum(counts.values())))
    cluster = {job: [f'localhost:{next(ports)}' for _ in range(n)] for job, n in counts.items() if n}
    train = {k: v for k, v in (('program', program), ('evaluator', evaluator)) if v is not None}
    return _spec(tmp_path, cluster=cluster, train=train)


def _state(tmp_path, text: str) -> str:
    spec = _spec(tmp_path)
    os.makedirs(tmp_path / 'run')
    (tmp_path / 'run' / 'launch-state.json').write_text(text)
    return spec


def _cut_data(tmp_path) -> str:
    from cluster.training import data
    directory = tmp_path / 'cifar'
    data.write_synthetic(str(directory), records_per_file=4, test_records=4)
    os.remove(directory / data.SYNTHETIC_MANIFEST)        # as a copy of the real data set would be
    return _spec(tmp_path, train={'data': str(directory)})


def _damaged_idx(tmp_path) -> str:
    """A spec whose data is a directory of IDX files, the train images' gzip cut short (a download
    that stopped early)."""
    directory = write_idx_set(tmp_path / 'mnist')
    images = os.path.join(directory, 'train-images-idx3-ubyte.gz')
    with open(images, 'r+b') as f:
        f.truncate(os.path.getsize(images) - 100)
    return _spec(tmp_path, train={'data': directory})


def _port_busy(tmp_path, holder):
    spec = _spec(tmp_path)
    port = int(yaml.safe_load(open(spec))['cluster']['worker'][0].split(':')[1])
    holder.bind(('', port))
    holder.listen()
    return spec, port


# name -> (setup(tmp_path) -> argv after `launch` (or ['task', ...]), text the one line must hold)
# Every spec-file error names `spec.yaml:<line>`; the exit code is 2 unless given as a third item.
CASES = {
    # -- the spec file itself
    'missing spec file': (lambda t: ['up', str(t / 'nope.yaml')], 'nope.yaml: spec file not found'),
    'spec is a directory': (lambda t: ['up', str(t)], 'is a directory, not a spec file'),
    'binary garbage': (lambda t: ['up', _spec(t, raw=b'\x00\xff\xfe\x80garbage')], 'not a YAML spec: byte 1'),
    'yaml syntax': (lambda t: ['up', _spec(t, raw='cluster:\n  ps: [localhost:2222\n')], 'YAML syntax error'),
    'not a mapping': (lambda t: ['up', _spec(t, raw='- a\n- b\n')], 'spec.yaml:1: the spec must be a mapping'),
    'duplicate key': (lambda t: ['up', _spec(t, raw='cluster:\n  ps: [localhost:1]\ncluster:\n  ps: [a:2]\n')],
                      'spec.yaml:3: cluster: duplicate key (first given on line 1)'),
    'unknown top key': (lambda t: ['up', _spec(t, top={'trian': {}})], 'trian: unknown key'),
    'unknown train key': (lambda t: ['up', _spec(t, train={'stesp': 5})], 'train.stesp: unknown key'),
    # -- cluster
    'no cluster': (lambda t: ['up', _spec(t, raw='train:\n  steps: 5\n')], 'cluster: missing section'),
    'no worker job': (lambda t: ['up', _spec(t, raw='cluster:\n  ps: [localhost:1]\n')],
                      "cluster.worker: missing job 'worker'"),
    'unknown job': (lambda t: ['up', _spec(t, cluster={'ps': ['a:1'], 'worker': ['a:2'], 'master': ['a:3']})],
                    'cluster.master: unknown key'),
    'malformed address': (lambda t: ['up', _spec(t, cluster={'ps': ['localhost:1'], 'worker': ['localhost']})],
                          'spec.yaml:5: cluster.worker[0]: expected "host:port"'),
    'port out of range': (lambda t: ['up', _spec(t, cluster={'ps': ['a:1'], 'worker': ['a:70000']})],
                          'port must be between 1 and 65535'),
    'port zero': (lambda t: ['up', _spec(t, cluster={'ps': ['a:0'], 'worker': ['a:2']})],
                  'port must be between 1 and 65535'),
    'same address twice': (lambda t: ['up', _spec(t, cluster={'ps': ['a:2001'], 'worker': ['a:2001']})],
                           'is used twice'),
    # -- train
    'steps zero': (lambda t: ['up', _spec(t, train={'steps': 0})], 'train.steps: expected a positive whole number'),
    'steps text': (lambda t: ['up', _spec(t, train={'steps': 'many'})], 'train.steps: expected a positive'),
    'sync not a bool': (lambda t: ['up', _spec(t, train={'sync': 'maybe'})], 'train.sync: expected true or false'),
    'transfer dtype unknown': (lambda t: ['up', _spec(t, train={'transfer_dtype': 'float16'})],
                               "train.transfer_dtype: expected one of float32, bfloat16, got 'float16'"),
    'negative learning rate': (lambda t: ['up', _spec(t, train={'learning_rate': -0.1})],
                               'train.learning_rate: expected a positive number'),
    'unknown device': (lambda t: ['up', _spec(t, train={'devices': ['tpu:0']})],
                       'train.devices[0]: expected a device like gpu:0'),
    'device twice': (lambda t: ['up', _spec(t, train={'devices': ['cpu:0', 'cpu:0']})], 'train.devices'),
    'gpu the machine lacks': (lambda t: ['up', _spec(t, train={'devices': ['gpu:0']})],
                              'train.devices: localhost (worker:0): names gpu:0 but the host has no GPU'),
    'too many replicas': (lambda t: ['up', _spec(t, train={'replicas_to_aggregate': 3})],
                          'train.replicas_to_aggregate: must be between 1 and the number of workers'),
    'train_dir with ~': (lambda t: ['up', _spec(t, train={'train_dir': '~/run'})], 'train.train_dir:'),
    'train_dir is a file': (lambda t: ((t / 'afile').write_text('x'),
                                       ['up', _spec(t, train={'train_dir': str(t / 'afile')})])[1],
                            'train.train_dir: ' ),
    'train_dir under a file': (lambda t: ((t / 'afile').write_text('x'),
                                          ['up', _spec(t, train={'train_dir': str(t / 'afile' / 'run')})])[1],
                               'is not a directory'),
    'data dir missing': (lambda t: ['up', _spec(t, train={'data': str(t / 'no-such-data')})],
                         'train.data: data directory'),
    'data file cut to whole records': (lambda t: ['up', _cut_data(t)],
                                       'data_batch_1.bin has 4 records where the real CIFAR-10 has 10000'),
    'IDX file cut short': (lambda t: ['up', _damaged_idx(t)], 'mnist/train-images-idx3-ubyte.gz is damaged '
                           '(Compressed file ended before the end-of-stream marker was reached'),
    'task with a damaged IDX file': (lambda t: ['task', '--spec', _damaged_idx(t), '--job', 'worker', '--index', '0'],
                                     'train.data: IDX data set: '),
    # -- supervise and hosts
    'bad restart policy': (lambda t: ['up', _spec(t, top={'supervise': {'restart': 'always'}})],
                           'supervise.restart: expected one of never, on-failure'),
    'stall limit too short': (lambda t: ['up', _spec(t, top={'supervise': {'stall_secs': 1}})],
                              'supervise.stall_secs: the stall limit'),
    'unreachable limit of 0': (lambda t: ['up', _spec(t, top={'supervise': {'unreachable_secs': 0}})],
                               'supervise.unreachable_secs: expected a positive number of seconds, got 0'),
    'negative max_restarts': (lambda t: ['up', _spec(t, top={'supervise': {'max_restarts': -1}})],
                              'supervise.max_restarts: expected a whole number >= 0'),
    'unknown host key': (lambda t: ['up', _spec(t, top={'hosts': {'localhost': {'usr': 'me'}}})],
                         'hosts.localhost.usr: unknown key'),
    # -- the command line
    '--set without =': (lambda t: ['up', _spec(t), '--set', 'train.steps'], 'expected dotted.key=value'),
    '--set without value': (lambda t: ['up', _spec(t), '--set', 'train.steps='], 'missing value'),
    '--set bad value': (lambda t: ['up', _spec(t), '--set', 'train.steps=abc'],
                        '--set train.steps=abc: train.steps: expected a positive whole number'),
    '--set unknown key': (lambda t: ['up', _spec(t), '--set', 'train.stpes=5'], 'train.stpes: unknown key'),
    '--ssh-config missing': (lambda t: ['up', _spec(t), '--ssh-config', str(t / 'none')], 'file not found'),
    'logs of an unknown task': (lambda t: ['logs', _spec(t), 'worker:7'], "no task 'worker:7'"),
    'logs of a spec never started': (lambda t: ['logs', _spec(t)], 'this spec was never started here'),
    'logs -f of a spec never started': (lambda t: ['logs', '-f', _spec(t)], 'this spec was never started here'),
    'eval before any training': (lambda t: ['eval', _spec(t)], 'no checkpoint to evaluate'),
    'corrupt state file': (lambda t: ['status', _state(t, '{"tasks": [')], 'not a state file tfcluster can read'),
    'older state file': (lambda t: ['down', _state(t, json.dumps({'spec': 's', 'launcher_pid': 1, 'tasks': [
        {'pid': 4242}]}))], 'state file of another tfcluster version (format none'),
    # -- a task started by hand
    'task of an unknown job': (lambda t: ['task', '--spec', _spec(t), '--job', 'master', '--index', '0'],
                               "argument --job: invalid choice: 'master'"),
    'task of a job the spec lacks': (lambda t: ['task', '--spec', _spec(t), '--job', 'chief', '--index', '0'],
                                     'task chief:0 does not exist: the cluster has no chief task'),
    'task index out of range': (lambda t: ['task', '--spec', _spec(t), '--job', 'ps', '--index', '1'],
                                'task ps:1 does not exist'),
    'task with a binary spec': (lambda t: ['task', '--spec', _spec(t, raw=b'\xff\xfe'), '--job', 'ps',
                                           '--index', '0'], 'not a YAML spec'),
    'task without its data': (lambda t: ['task', '--spec', _spec(t, train={'data': str(t / 'gone')}), '--job',
                                         'worker', '--index', '0'], 'train.data: data directory'),
    # -- the user's own program or command (run from the spec's directory: nothing of REPO is found)
    'program not module:function': (lambda t: ['up', _spec(t, train={'program': 'train.py'})],
                                     'train.program: expected package.module:function'),
    'unknown program module': (lambda t: ['up', _spec(t, train={'program': 'nosuchmodule:train'})],
                               "train.program: no module named 'nosuchmodule'"),
    'unknown program function': (lambda t: ((t / 'mytrain.py').write_text('def train(ctx):\n    pass\n'),
                                            ['up', _spec(t, train={'program': 'mytrain:main'})])[1],
                                 "defines no function 'main'"),
    'program and command': (lambda t: ['up', _spec(t, train={'program': 'a:b', 'command': 'python a.py'})],
                            'train.command: train.program and train.command exclude each other'),
    'command not found': (lambda t: ['up', _spec(t, train={'command': 'no-such-trainer --x 1'})],
                          'train.command: no-such-trainer: command not found on PATH'),
    'command script missing': (lambda t: ['up', _spec(t, train={'command': 'python gone.py'})],
                               'train.command: gone.py: no such file'),
    'command with an open quote': (lambda t: ['up', _spec(t, train={'command': 'python "a.py'})],
                                   'train.command: cannot split'),
    'task of an unknown program': (lambda t: ['task', '--spec', _spec(t, train={'program': 'nosuch:f'}), '--job',
                                              'worker', '--index', '0'], "train.program: no module named 'nosuch'"),
    # -- TF_CONFIG, as schedulers set it (no --job/--index: the task comes from it)
    'TF_CONFIG not JSON': (lambda t: ['task', {'TF_CONFIG': '{cluster: oops'}], 'TF_CONFIG: not JSON'),
    'TF_CONFIG task not in its cluster': (lambda t: ['task', {'TF_CONFIG': json.dumps(
        {'cluster': {'ps': ['localhost:1'], 'worker': ['localhost:2']}, 'task': {'type': 'worker', 'index': 2}})}],
        'TF_CONFIG: task worker:2 is not in its cluster'),
    'TF_CONFIG with a master job': (lambda t: ['task', {'TF_CONFIG': json.dumps(
        {'cluster': {'master': ['localhost:1'], 'worker': ['localhost:2']}, 'task': {'type': 'master'}})}],
        "TF_CONFIG: job 'master' is not one tfcluster runs"),
    # -- coordinator runs (TF2 ParameterServerStrategy): chief and evaluator
    'chief with the built-in trainer': (lambda t: ['up', _coordinator(t, program=None)],
                                        'cluster.chief: a chief runs your TF2 ParameterServerStrategy program'),
    'two chiefs': (lambda t: ['up', _coordinator(t, chiefs=2)], 'cluster.chief: at most one chief task, got 2'),
    'chief without a worker': (lambda t: ['up', _coordinator(t, workers=0)], "cluster.worker: missing job 'worker'"),
    'chief without a ps': (lambda t: ['up', _coordinator(t, ps=0)], "cluster.ps: missing job 'ps'"),
    'evaluator without a program': (lambda t: ['up', _coordinator(t, evaluator=None)],
                                    'cluster.evaluator: an evaluator needs something to run: set train.evaluator'),
    'evaluator without a chief': (lambda t: ['up', _coordinator(t, chiefs=0, evaluator='tests.pss_programs:evaluate')],
                                  'cluster.evaluator: an evaluator runs beside the chief of a coordinator run'),
    'train.evaluator without an evaluator': (lambda t: ['up', _coordinator(t, evaluators=0)],
                                             'train.evaluator: train.evaluator is set but the cluster has no '
                                             'evaluator task'),
    'two evaluators': (lambda t: ['up', _coordinator(t, evaluators=2)], 'cluster.evaluator: at most one evaluator'),
    'unknown evaluator function': (lambda t: ((t / 'myeval.py').write_text('def other(ctx):\n    pass\n'),
                                              ['up', _coordinator(t, evaluator='myeval:evaluate')])[1],
                                   "train.evaluator: module 'myeval'"),
    'scale a coordinator run': (lambda t: ['scale', _coordinator(t), '--workers', '1'],
                                'is a coordinator run (it has a chief): ParameterServerStrategy fixes the '
                                'worker count'),
    'workers of a coordinator run': (lambda t: ['up', _coordinator(t), '--workers', '1'],
                                     'is a coordinator run (it has a chief): ParameterServerStrategy fixes the '
                                     'worker count'),
    'TF_CONFIG with a bad address': (lambda t: ['task', {'TF_CONFIG': json.dumps(
        {'cluster': {'ps': ['localhost:1'], 'worker': ['localhost']}, 'task': {'type': 'ps', 'index': 0}})}],
        'TF_CONFIG: cluster.worker[0]: expected "host:port"'),
    # -- Kubernetes: the rendered files' names and claims, a JobSet pod's environment
    'jobset name no DNS label': (lambda t: ['render', _spec(t), '--format', 'jobset', '--name', 'Run_1'],
                                 "--name 'Run_1': a JobSet name must be a DNS-1035 label"),
    'trainjob name too long': (lambda t: ['render', _spec(t), '--format', 'trainjob', '--name', 'r' * 50],
                               'at most 48 characters here (JobSet names its pods NAME-node-0-0-xxxxx'),
    'jobset claim no DNS name': (lambda t: ['render', _spec(t), '--format', 'jobset', '--pvc', 'My_Claim'],
                                 "--pvc 'My_Claim': a PersistentVolumeClaim name is a DNS-1123 subdomain"),
    'tfjob claim no DNS name': (lambda t: ['render', _spec(t), '--format', 'tfjob', '--pvc', 'claim-'],
                                "--pvc 'claim-': a PersistentVolumeClaim name is a DNS-1123 subdomain"),
    'env value over the OS limit': (lambda t: ['plan', _spec(t, top={'env': {'BIG': 'x' * 200_000}})],
                                    'env.BIG: a value of 200,000 bytes exceeds the OS limit of 131,072 bytes for one '
                                    'environment string'),
    'env from a variable not set': (lambda t: ['up', _spec(t, top={'env': {'API_TOKEN': {
                                        'from_env': 'TFC_TEST_NEVER_SET'}}})],
                                    "env.API_TOKEN: from_env: TFC_TEST_NEVER_SET is not set in the launcher's "
                                    'environment'),
    'jobset variable in env:': (lambda t: ['render', _spec(t, top={'env': {'JOB_COMPLETION_INDEX': 1}}), '--format',
                                           'jobset'], 'env.JOB_COMPLETION_INDEX: JOB_COMPLETION_INDEX cannot be set'),
    'task --jobset outside a pod': (lambda t: ['task', '--jobset'], '$TFCLUSTER_JOBSET_NAME is not set'),
    'task --jobset index too high': (lambda t: ['task', {
        'TFCLUSTER_JOBSET_NAME': 'run', 'TFCLUSTER_JOBSET_REPLICATED_JOB': 'worker', 'JOB_COMPLETION_INDEX': '2',
        'TFCLUSTER_JOBSET_PS_JOB': 'ps', 'TFCLUSTER_JOBSET_NUM_PS': '1', 'TFCLUSTER_JOBSET_WORKER_JOB': 'worker',
        'TFCLUSTER_JOBSET_NUM_WORKERS': '2', 'TFCLUSTER_JOBSET_PORT': '2222'}, '--jobset'],
        "$JOB_COMPLETION_INDEX='2': expected a whole number 0..1"),
}


def _run(argv, cwd):
    if argv[0] == 'task':       # ['task', {env}, args...] or ['task', args...]
        env = dict(os.environ, **argv.pop(1)) if len(argv) > 1 and isinstance(argv[1], dict) else None
        return subprocess.run([sys.executable, '-m', 'cluster.task', *argv[1:]], cwd=cwd, capture_output=True,
                              text=True, timeout=120, env=env)
    return launch(*argv, cwd=cwd, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(CASES))
def test_bad_input_is_one_line_exit_2_and_nothing_started(tmp_path, case):
    setup, expected = CASES[case][:2]
    argv = setup(tmp_path)
    before = set(os.listdir(tmp_path))
    result = _run(argv, cwd=str(tmp_path))
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stdout + result.stderr
    if argv[0] == 'task' and 'invalid choice' in expected:      # argparse: usage, then the error
        assert lines[-1].endswith(expected + " (choose from 'chief', 'ps', 'worker', 'evaluator')") \
            and 'Traceback' not in result.stderr
    else:
        assert len(lines) == 1 and expected in lines[0], result.stderr
        assert any(where in lines[0] for where in ('spec.yaml', '--set', str(tmp_path), 'TF_CONFIG', '--name', '--pvc',
                                                   '$TFCLUSTER_JOBSET_', '$JOB_COMPLETION_INDEX')), lines[0]
    assert set(os.listdir(tmp_path)) == before, 'a failed command wrote files'
    assert not project_processes()


def test_the_table_is_long_enough():
    assert len(CASES) >= 40


@pytest.mark.slow
def test_spec_file_errors_point_at_their_line(tmp_path):
    """train_dir and data errors found only when the spec is used still name the line they are on."""
    (tmp_path / 'afile').write_text('x')
    spec = _spec(tmp_path, train={'train_dir': str(tmp_path / 'afile')})
    line = next(i for i, text in enumerate(open(spec), 1) if 'train_dir' in text)
    result = launch('up', spec, cwd=str(tmp_path), timeout=120)
    assert result.returncode == 2 and f'spec.yaml:{line}: train.train_dir: ' in result.stderr, result.stderr


@pytest.mark.slow
def test_local_port_in_use_names_the_task(tmp_path):
    with socket.socket() as s:
        spec, port = _port_busy(tmp_path, s)
        result = launch('up', spec, timeout=60)
    assert result.returncode == 2
    assert f'worker:0: port {port} on localhost is already in use' in result.stderr
    assert not os.path.exists(tmp_path / 'run')


@pytest.mark.slow
def test_plan_prints_every_task_and_writes_nothing(tmp_path):
    spec = write_spec(tmp_path)
    result = launch('plan', spec, timeout=60)
    assert result.returncode == 0
    for name in ('ps:0', 'worker:0', 'worker:1'):
        assert name in result.stdout
    assert 'TF_CONFIG=' in result.stdout and '-m cluster.task' in result.stdout
    assert 'nothing is written now' in result.stdout
    assert not os.path.exists(tmp_path / 'run')


@pytest.mark.slow
def test_a_held_train_dir_names_its_launcher(tmp_path):
    """A second launcher of the same train_dir is refused at once, saying who holds it, and
    neither touches the holder's files."""
    from launch.records.lock import TrainDirLock
    spec = _spec(tmp_path)
    os.makedirs(tmp_path / 'run')
    lock = TrainDirLock(str(tmp_path / 'run'))
    lock.acquire('launcher pid 4242, `launch up other.yaml` since 10:00:00')
    try:
        result = launch('up', spec, cwd=str(tmp_path), timeout=120)
    finally:
        lock.release()
    assert result.returncode == 2, result.stderr
    assert result.stderr.count('\n') == 1
    assert 'train_dir' in result.stderr and 'launcher pid 4242, `launch up other.yaml`' in result.stderr
    assert os.listdir(tmp_path / 'run') == ['launch.lock']


def test_port_probe_survives_a_host_without_ipv6(monkeypatch):
    """A host with IPv6 disabled refuses AF_INET6 sockets; the port check falls back to IPv4."""
    from cluster import task
    real = socket.socket

    def no_ipv6(family=socket.AF_INET, *a, **kw):
        if family == socket.AF_INET6:
            raise OSError(97, 'Address family not supported by protocol')
        return real(family, *a, **kw)
    monkeypatch.setattr(socket, 'socket', no_ipv6)
    with real() as s:
        s.bind(('', 0))
        s.listen()
        assert task.port_in_use(s.getsockname()[1])
    assert not task.port_in_use(free_ports(1)[0])


@pytest.mark.slow
def test_task_help_is_not_a_traceback():
    result = subprocess.run([sys.executable, '-m', 'cluster.task', '--help'], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and 'usage:' in result.stdout and not result.stderr
