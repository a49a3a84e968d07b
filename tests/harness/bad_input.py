"""Helpers of the tests of bad_input, used by
tests/system/launch/test_bad_input.py, tests/unit/launch/test_bad_input.py: here, since no test module imports
another."""
from __future__ import annotations

import json
import os

import yaml

from tests.conftest import free_ports, write_idx_set


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
    from cluster.checks import data
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


# name -> (setup(tmp_path) -> argv after `launch` (or ['task', ...]), the id of its entry in docs/errors.yaml)
# Every spec-file error names `spec.yaml:<line>`; the exit code is 2 unless given as a third item.
CASES = {
    # -- the spec file itself
    'missing spec file': (lambda t: ['up', str(t / 'nope.yaml')], 'spec-not-found'),
    'spec is a directory': (lambda t: ['up', str(t)], 'spec-is-directory'),
    'binary garbage': (lambda t: ['up', _spec(t, raw=b'\x00\xff\xfe\x80garbage')], 'spec-not-utf8'),
    'yaml syntax': (lambda t: ['up', _spec(t, raw='cluster:\n  ps: [localhost:2222\n')], 'yaml-syntax'),
    'not a mapping': (lambda t: ['up', _spec(t, raw='- a\n- b\n')], 'spec-not-mapping'),
    'duplicate key': (lambda t: ['up', _spec(t, raw='cluster:\n  ps: [localhost:1]\ncluster:\n  ps: [a:2]\n')],
                      'duplicate-key'),
    'unknown top key': (lambda t: ['up', _spec(t, top={'trian': {}})], 'unknown-key'),
    'unknown train key': (lambda t: ['up', _spec(t, train={'stesp': 5})], 'unknown-key'),
    # -- cluster
    'no cluster': (lambda t: ['up', _spec(t, raw='train:\n  steps: 5\n')], 'no-cluster'),
    'no worker job': (lambda t: ['up', _spec(t, raw='cluster:\n  ps: [localhost:1]\n')], 'missing-job'),
    'unknown job': (lambda t: ['up', _spec(t, cluster={'ps': ['a:1'], 'worker': ['a:2'], 'master': ['a:3']})],
                    'unknown-job'),
    'malformed address': (lambda t: ['up', _spec(t, cluster={'ps': ['localhost:1'], 'worker': ['localhost']})],
                          'not-host-port'),
    'port out of range': (lambda t: ['up', _spec(t, cluster={'ps': ['a:1'], 'worker': ['a:70000']})],
                          'port-out-of-range'),
    'port zero': (lambda t: ['up', _spec(t, cluster={'ps': ['a:0'], 'worker': ['a:2']})], 'port-out-of-range'),
    'same address twice': (lambda t: ['up', _spec(t, cluster={'ps': ['a:2001'], 'worker': ['a:2001']})],
                           'address-used-twice'),
    # -- train
    'steps zero': (lambda t: ['up', _spec(t, train={'steps': 0})], 'not-positive-whole-number'),
    'steps text': (lambda t: ['up', _spec(t, train={'steps': 'many'})], 'not-positive-whole-number'),
    'sync not a bool': (lambda t: ['up', _spec(t, train={'sync': 'maybe'})], 'not-a-bool'),
    'transfer dtype unknown': (lambda t: ['up', _spec(t, train={'transfer_dtype': 'float16'})], 'not-one-of'),
    'negative learning rate': (lambda t: ['up', _spec(t, train={'learning_rate': -0.1})], 'not-positive-number'),
    'unknown device': (lambda t: ['up', _spec(t, train={'devices': ['tpu:0']})], 'bad-device'),
    'device twice': (lambda t: ['up', _spec(t, train={'devices': ['cpu:0', 'cpu:0']})], 'device-twice'),
    'gpu the machine lacks': (lambda t: ['up', _spec(t, train={'devices': ['gpu:0']})], 'no-gpu-on-host'),
    'too many replicas': (lambda t: ['up', _spec(t, train={'replicas_to_aggregate': 3})], 'replicas-out-of-range'),
    'backup workers async': (lambda t: ['up', _spec(t, train={'backup_workers': 1, 'sync': False})],
                             'backup-workers-async'),
    'backup workers and replicas': (lambda t: ['up', _spec(t, train={'backup_workers': 1, 'replicas_to_aggregate': 1})],
                                    'backup-workers-and-replicas'),
    'backup workers all': (lambda t: ['up', _spec(t, train={'backup_workers': 2})], 'backup-workers-too-many'),
    'train_dir with ~': (lambda t: ['up', _spec(t, train={'train_dir': '~/run'})], 'train-dir-tilde'),
    'train_dir is a file': (lambda t: ((t / 'afile').write_text('x'),
                                       ['up', _spec(t, train={'train_dir': str(t / 'afile')})])[1],
                            'train-dir-is-a-file'),
    'train_dir under a file': (lambda t: ((t / 'afile').write_text('x'),
                                          ['up', _spec(t, train={'train_dir': str(t / 'afile' / 'run')})])[1],
                               'train-dir-under-a-file'),
    'data dir missing': (lambda t: ['up', _spec(t, train={'data': str(t / 'no-such-data')})], 'data-dir-missing'),
    'data file cut to whole records': (lambda t: ['up', _cut_data(t)], 'cifar-file-short'),
    'IDX file cut short': (lambda t: ['up', _damaged_idx(t)], 'idx-file-damaged'),
    'task with a damaged IDX file': (lambda t: ['task', '--spec', _damaged_idx(t), '--job', 'worker', '--index', '0'],
                                     'idx-file-damaged'),
    # -- supervise and hosts
    'bad restart policy': (lambda t: ['up', _spec(t, top={'supervise': {'restart': 'always'}})], 'not-one-of'),
    'stall limit too short': (lambda t: ['up', _spec(t, top={'supervise': {'stall_secs': 1}})],
                              'stall-limit-too-short'),
    'unreachable limit of 0': (lambda t: ['up', _spec(t, top={'supervise': {'unreachable_secs': 0}})],
                               'not-positive-seconds'),
    'negative max_restarts': (lambda t: ['up', _spec(t, top={'supervise': {'max_restarts': -1}})],
                              'not-whole-number-or-zero'),
    'unknown host key': (lambda t: ['up', _spec(t, top={'hosts': {'localhost': {'usr': 'me'}}})], 'unknown-key'),
    # -- the command line
    '--set without =': (lambda t: ['up', _spec(t), '--set', 'train.steps'], 'set-not-key-value'),
    '--set without value': (lambda t: ['up', _spec(t), '--set', 'train.steps='], 'set-missing-value'),
    '--set bad value': (lambda t: ['up', _spec(t), '--set', 'train.steps=abc'], 'not-positive-whole-number'),
    '--set unknown key': (lambda t: ['up', _spec(t), '--set', 'train.stpes=5'], 'unknown-key'),
    '--ssh-config missing': (lambda t: ['up', _spec(t), '--ssh-config', str(t / 'none')], 'ssh-config-missing'),
    'logs of an unknown task': (lambda t: ['logs', _spec(t), 'worker:7'], 'logs-unknown-task'),
    'logs of a spec never started': (lambda t: ['logs', _spec(t)], 'never-started-here'),
    'logs -f of a spec never started': (lambda t: ['logs', '-f', _spec(t)], 'never-started-here'),
    'eval before any training': (lambda t: ['eval', _spec(t)], 'no-checkpoint'),
    'corrupt state file': (lambda t: ['status', _state(t, '{"tasks": [')], 'state-file-unreadable'),
    'older state file': (lambda t: ['down', _state(t, json.dumps({'spec': 's', 'launcher_pid': 1, 'tasks': [
        {'pid': 4242}]}))], 'state-file-other-version'),
    # -- a task started by hand
    'task of an unknown job': (lambda t: ['task', '--spec', _spec(t), '--job', 'master', '--index', '0'],
                               'task-unknown-job'),
    'task of a job the spec lacks': (lambda t: ['task', '--spec', _spec(t), '--job', 'chief', '--index', '0'],
                                     'task-job-not-in-cluster'),
    'task index out of range': (lambda t: ['task', '--spec', _spec(t), '--job', 'ps', '--index', '1'],
                                'task-index-out-of-range'),
    'task with a binary spec': (lambda t: ['task', '--spec', _spec(t, raw=b'\xff\xfe'), '--job', 'ps',
                                           '--index', '0'], 'spec-not-utf8'),
    'task without its data': (lambda t: ['task', '--spec', _spec(t, train={'data': str(t / 'gone')}), '--job',
                                         'worker', '--index', '0'], 'data-dir-missing'),
    # -- the user's own program or command (run from the spec's directory: nothing of REPO is found)
    'program not module:function': (lambda t: ['up', _spec(t, train={'program': 'train.py'})],
                                     'program-not-module-function'),
    'unknown program module': (lambda t: ['up', _spec(t, train={'program': 'nosuchmodule:train'})],
                               'program-no-module'),
    'unknown program function': (lambda t: ((t / 'mytrain.py').write_text('def train(ctx):\n    pass\n'),
                                            ['up', _spec(t, train={'program': 'mytrain:main'})])[1],
                                 'program-no-function'),
    'program and command': (lambda t: ['up', _spec(t, train={'program': 'a:b', 'command': 'python a.py'})],
                            'program-and-command'),
    'command not found': (lambda t: ['up', _spec(t, train={'command': 'no-such-trainer --x 1'})], 'command-not-found'),
    'command script missing': (lambda t: ['up', _spec(t, train={'command': 'python gone.py'})],
                               'command-script-missing'),
    'command with an open quote': (lambda t: ['up', _spec(t, train={'command': 'python "a.py'})],
                                   'command-cannot-split'),
    'task of an unknown program': (lambda t: ['task', '--spec', _spec(t, train={'program': 'nosuch:f'}), '--job',
                                              'worker', '--index', '0'], 'program-no-module'),
    # -- TF_CONFIG, as schedulers set it (no --job/--index: the task comes from it)
    'TF_CONFIG not JSON': (lambda t: ['task', {'TF_CONFIG': '{cluster: oops'}], 'tf-config-not-json'),
    'TF_CONFIG task not in its cluster': (lambda t: ['task', {'TF_CONFIG': json.dumps(
        {'cluster': {'ps': ['localhost:1'], 'worker': ['localhost:2']}, 'task': {'type': 'worker', 'index': 2}})}],
        'tf-config-task-not-in-cluster'),
    'TF_CONFIG with a master job': (lambda t: ['task', {'TF_CONFIG': json.dumps(
        {'cluster': {'master': ['localhost:1'], 'worker': ['localhost:2']}, 'task': {'type': 'master'}})}],
        'tf-config-unknown-job'),
    # -- coordinator runs (TF2 ParameterServerStrategy): chief and evaluator
    'chief with the built-in trainer': (lambda t: ['up', _coordinator(t, program=None)], 'chief-needs-program'),
    'two chiefs': (lambda t: ['up', _coordinator(t, chiefs=2)], 'two-chiefs'),
    'chief without a worker': (lambda t: ['up', _coordinator(t, workers=0)], 'missing-job'),
    'chief without a ps': (lambda t: ['up', _coordinator(t, ps=0)], 'missing-job'),
    'evaluator without a program': (lambda t: ['up', _coordinator(t, evaluator=None)], 'evaluator-needs-program'),
    'evaluator without a chief': (lambda t: ['up', _coordinator(t, chiefs=0, evaluator='tests.harness.pss_programs:evaluate')],
                                  'evaluator-needs-chief'),
    'train.evaluator without an evaluator': (lambda t: ['up', _coordinator(t, evaluators=0)],
                                             'evaluator-setting-without-task'),
    'two evaluators': (lambda t: ['up', _coordinator(t, evaluators=2)], 'two-evaluators'),
    'unknown evaluator function': (lambda t: ((t / 'myeval.py').write_text('def other(ctx):\n    pass\n'),
                                              ['up', _coordinator(t, evaluator='myeval:evaluate')])[1],
                                   'program-no-function'),
    'scale a coordinator run': (lambda t: ['scale', _coordinator(t), '--workers', '1'], 'coordinator-worker-count'),
    'workers of a coordinator run': (lambda t: ['up', _coordinator(t), '--workers', '1'], 'coordinator-worker-count'),
    'TF_CONFIG with a bad address': (lambda t: ['task', {'TF_CONFIG': json.dumps(
        {'cluster': {'ps': ['localhost:1'], 'worker': ['localhost']}, 'task': {'type': 'ps', 'index': 0}})}],
        'not-host-port'),
    # -- Kubernetes: the rendered files' names and claims, a JobSet pod's environment
    'jobset name no DNS label': (lambda t: ['render', _spec(t), '--format', 'jobset', '--name', 'Run_1'],
                                 'render-name-invalid'),
    'trainjob name too long': (lambda t: ['render', _spec(t), '--format', 'trainjob', '--name', 'r' * 50],
                               'render-name-invalid'),
    'jobset claim no DNS name': (lambda t: ['render', _spec(t), '--format', 'jobset', '--pvc', 'My_Claim'],
                                 'render-pvc-invalid'),
    'tfjob claim no DNS name': (lambda t: ['render', _spec(t), '--format', 'tfjob', '--pvc', 'claim-'],
                                'render-pvc-invalid'),
    'env value over the OS limit': (lambda t: ['plan', _spec(t, top={'env': {'BIG': 'x' * 200_000}})],
                                    'env-value-too-big'),
    'env from a variable not set': (lambda t: ['up', _spec(t, top={'env': {'API_TOKEN': {
                                        'from_env': 'TFC_TEST_NEVER_SET'}}})], 'env-from-unset'),
    'jobset variable in env:': (lambda t: ['render', _spec(t, top={'env': {'JOB_COMPLETION_INDEX': 1}}), '--format',
                                           'jobset'], 'env-jobset-variable'),
    'task --jobset outside a pod': (lambda t: ['task', '--jobset'], 'jobset-not-in-pod'),
    'task --jobset index too high': (lambda t: ['task', {
        'TFCLUSTER_JOBSET_NAME': 'run', 'TFCLUSTER_JOBSET_REPLICATED_JOB': 'worker', 'JOB_COMPLETION_INDEX': '2',
        'TFCLUSTER_JOBSET_PS_JOB': 'ps', 'TFCLUSTER_JOBSET_NUM_PS': '1', 'TFCLUSTER_JOBSET_WORKER_JOB': 'worker',
        'TFCLUSTER_JOBSET_NUM_WORKERS': '2', 'TFCLUSTER_JOBSET_PORT': '2222'}, '--jobset'],
        'jobset-index-out-of-range'),
}

