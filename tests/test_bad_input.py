"""Every bad input a new user can give, through the real command lines: exit code 2 (bad input),
exactly one line on stderr naming the file and line, the key, the task or the host, and nothing
started or written (no task process, no train_dir). Each line is the one docs/errors.yaml documents
for it, with its cause and fix: the troubleshooting page is made from that file, and a case without
its entry, a changed message or an entry no test produces fails here."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, free_ports, launch, project_processes, write_idx_set, write_spec
from tests.harness.documented import check_documented, documented_entries, strip_prefix
from tests.test_spec import BAD_SPECS, OVERRIDE_ERRORS


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


def _port_busy(tmp_path, holder):
    spec = _spec(tmp_path)
    port = int(yaml.safe_load(open(spec))['cluster']['worker'][0].split(':')[1])
    holder.bind(('', port))
    holder.listen()
    return spec, port


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
    'evaluator without a chief': (lambda t: ['up', _coordinator(t, chiefs=0, evaluator='tests.pss_programs:evaluate')],
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


def _run(argv, cwd):
    if argv[0] == 'task':       # ['task', {env}, args...] or ['task', args...]
        env = dict(os.environ, **argv.pop(1)) if len(argv) > 1 and isinstance(argv[1], dict) else None
        return subprocess.run([sys.executable, '-m', 'cluster.task', *argv[1:]], cwd=cwd, capture_output=True,
                              text=True, timeout=120, env=env)
    return launch(*argv, cwd=cwd, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(CASES))
def test_bad_input_is_one_line_exit_2_and_nothing_started(tmp_path, case):
    setup, entry = CASES[case][:2]
    argv = setup(tmp_path)
    before = set(os.listdir(tmp_path))
    result = _run(argv, cwd=str(tmp_path))
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stdout + result.stderr
    if entry == 'task-unknown-job':         # argparse: usage, then the error
        assert lines[-1].startswith('python -m cluster.task: error: ') and 'Traceback' not in result.stderr
    else:
        assert len(lines) == 1, result.stderr
        assert any(where in lines[0] for where in ('spec.yaml', '--set', str(tmp_path), 'TF_CONFIG', '--name', '--pvc',
                                                   '$TFCLUSTER_JOBSET_', '$JOB_COMPLETION_INDEX')), lines[0]
    check_documented(entry, strip_prefix(lines[-1]))
    assert set(os.listdir(tmp_path)) == before, 'a failed command wrote files'
    assert not project_processes()


def _no_root_reads() -> None:
    """In the child before exec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its bounding
    set, so the program it runs (as root, as the suite does) is refused a file of mode 000 as any
    other user would be, while reading its own root-owned files as before."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):      # linux/capability.h: CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:       # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), 'prctl(PR_CAPBSET_DROP)')


def _unreadable_idx(tmp_path) -> tuple[str, str]:
    directory = write_idx_set(tmp_path / 'mnist')
    images = os.path.join(directory, 'train-images-idx3-ubyte.gz')
    os.chmod(images, 0)
    return _spec(tmp_path, train={'data': directory}), images


def _unreadable_cifar(tmp_path) -> tuple[str, str]:
    from cluster.checks import data
    directory = tmp_path / 'cifar'
    data.write_synthetic(str(directory), records_per_file=4, test_records=4)
    batch = str(directory / data.TRAIN_FILES[2])
    os.chmod(batch, 0)
    return _spec(tmp_path, train={'data': str(directory)}), batch


@pytest.mark.slow
@pytest.mark.parametrize('command, setup', [('up', _unreadable_idx), ('task', _unreadable_idx),
                                            ('up', _unreadable_cifar)])
def test_a_data_file_the_user_may_not_read_is_named_so_not_called_damaged(tmp_path, command, setup):
    """A data file of mode 000 is refused by the OS, not damaged: the line says so and what fixes
    it (read access for the tasks' user), not that the data set must be copied again."""
    spec, path = setup(tmp_path)
    argv = ['up', spec] if command == 'up' else ['task', '--spec', spec, '--job', 'worker', '--index', '0']
    before = set(os.listdir(tmp_path))
    if argv[0] == 'task':
        result = subprocess.run([sys.executable, '-m', 'cluster.task', *argv[1:]], cwd=tmp_path, capture_output=True,
                                text=True, timeout=120, preexec_fn=_no_root_reads)
    else:
        result = launch(*argv, cwd=str(tmp_path), timeout=120, preexec_fn=_no_root_reads)
    lines = result.stderr.splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stdout + result.stderr
    assert f'cannot read {path}: permission denied' in lines[0] and 'damaged' not in lines[0], lines[0]
    check_documented('data-file-unreadable', strip_prefix(lines[0]))
    assert set(os.listdir(tmp_path)) == before and not project_processes()


def test_the_table_is_long_enough():
    assert len(CASES) >= 40


# The errors checked against their entry by a test of their own in this file, beside CASES and the
# spec tables of tests/test_spec.py: entry id -> that test.
ALSO_DOCUMENTED = {
    'port-in-use': 'test_local_port_in_use_names_the_task',
    'port-taken-at-start': 'tests/test_task_group.py::test_two_runs_whose_ports_collide',
    'train-dir-held': 'test_a_held_train_dir_names_its_launcher',
    'data-file-unreadable': 'test_a_data_file_the_user_may_not_read_is_named_so_not_called_damaged',
    'run-gone': 'tests/test_run_index.py::test_a_run_whose_train_dir_is_gone_is_one_line',
    'compose-user-code': 'test_compose_plan_and_up_refuse_code_the_image_lacks_with_one_line',
    'eval-coordinator-run': 'test_eval_of_a_coordinator_run_says_what_its_checkpoints_hold',
}


def _entries_produced() -> set[str]:
    return ({case[1] for case in CASES.values()} | {row[-1] for row in BAD_SPECS + OVERRIDE_ERRORS}
            | set(ALSO_DOCUMENTED))


def test_every_case_names_a_documented_error():
    """A bad input added to a table without its entry in docs/errors.yaml (line, cause, fix) fails
    here at once, in the fast tier; the slow test then checks the line itself."""
    missing = sorted(_entries_produced() - set(documented_entries()))
    assert not missing, f'not documented in docs/errors.yaml: {missing}'


def test_every_documented_error_is_produced_by_a_test():
    """The troubleshooting page lists no error that no test produces: an entry of docs/errors.yaml
    whose message went away, or that was never checked, fails here."""
    unused = sorted(set(documented_entries()) - _entries_produced())
    assert not unused, f'docs/errors.yaml documents errors no test produces: {unused}'


def test_a_line_must_match_its_entry_exactly_but_for_placeholders():
    """The check the tests rely on: placeholders stand for the variable parts, the rest is exact."""
    check_documented('port-in-use', 'specs/local2.yaml: worker:1: port 2224 on localhost is already in use')
    check_documented('not-positive-whole-number',
                     "--set train.steps=abc: train.steps: expected a positive whole number, got 'abc'")
    for wrong in ('specs/local2.yaml: worker:1: port 2224 on localhost is in use',       # changed words
                  'specs/local2.yaml: worker:1: port abc on localhost is already in use',  # a port is digits
                  'launch: error: specs/local2.yaml: worker:1: port 2224 on localhost is already in use'):
        with pytest.raises(AssertionError):
            check_documented('port-in-use', wrong)
    with pytest.raises(AssertionError, match='not documented'):
        check_documented('no-such-entry', 'anything')


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
    check_documented('port-in-use', strip_prefix(result.stderr.strip()))
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
    check_documented('train-dir-held', strip_prefix(result.stderr.strip()))
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


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    """`launch ARGV` in this process (no process started): exit code, stdout, stderr."""
    from launch.cli import main
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize('train, missing', [
    ({'command': 'python my_train.py --steps 5'}, 'my_train.py'),
    ({'command': f'python {REPO}/examples/tf1_distributed.py'}, f'{REPO}/examples/tf1_distributed.py'),
    ({'command': 'python -m mytrain'}, 'the module mytrain'),
    ({'command': './train.sh'}, './train.sh'),
    ({'program': 'mytrain:train'}, 'the module mytrain'),
])
def test_compose_plan_and_up_refuse_code_the_image_lacks_with_one_line(tmp_path, capsys, train, missing):
    """The one decision (launch/run/registry.py check_user_code_place): `launch compose`, `plan
    --backend compose` and `up --backend compose` refuse code outside the image's examples/ with
    the same line, naming what is missing, exit 2, nothing written."""
    spec = _spec(tmp_path, train=train)
    before = set(os.listdir(tmp_path))
    said = set()
    for argv in (['compose', spec, '-o', str(tmp_path / 'compose.yaml')], ['plan', spec, '--backend', 'compose'],
                 ['up', spec, '--backend', 'compose']):
        code, out, err = _main(capsys, *argv)
        assert code == 2 and out == '' and len(err.splitlines()) == 1, (argv, code, out, err)
        said.add(err)
    line = strip_prefix(said.pop().rstrip('\n'))
    assert not said, 'the three commands said different things'
    check_documented('compose-user-code', line)
    assert f'only, not {missing}:' in line, line
    assert set(os.listdir(tmp_path)) == before


def test_compose_plan_and_up_accept_what_the_image_holds(tmp_path, capsys):
    """The image holds examples/: a command running a script there (examples/tf1-command.yaml)
    and the PSS examples are accepted by all three (`up` as far as the decision goes: it would
    start containers)."""
    from cluster.spec import load_spec
    from launch.run import launching
    (tmp_path / 'pss').mkdir()
    (tmp_path / 'inline').mkdir()
    specs = (os.path.join(REPO, 'examples', 'tf1-command.yaml'),
             _coordinator(tmp_path / 'pss', program='examples.pss_loop:train', evaluator='examples.pss_loop:evaluate'),
             _spec(tmp_path / 'inline', train={'command': 'python -c "print(1)"'}))
    for spec in specs:
        for argv in (['compose', spec, '-o', str(tmp_path / 'compose.yaml')], ['plan', spec, '--backend', 'compose']):
            code, out, err = _main(capsys, *argv)
            assert code == 0 and err == '', (argv, err)
        launching.check_user_code_place(load_spec(spec), 'up', 'compose')


def test_eval_of_a_coordinator_run_says_what_its_checkpoints_hold(tmp_path, capsys):
    """`launch eval` scores the built-in CIFAR-10 model; a coordinator run's checkpoints hold the
    user's own: one line that says so and where to evaluate them instead, before anything is read
    or written (no "trained on another data set?" guess)."""
    spec = _coordinator(tmp_path)
    before = set(os.listdir(tmp_path))
    code, out, err = _main(capsys, 'eval', spec)
    assert code == 2 and out == '' and len(err.splitlines()) == 1, (code, out, err)
    line = strip_prefix(err.rstrip('\n'))
    check_documented('eval-coordinator-run', line)
    assert 'train.program mytrain:train' in line and 'another data set' not in line, line
    assert set(os.listdir(tmp_path)) == before
