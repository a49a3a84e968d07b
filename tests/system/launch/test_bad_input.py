"""Every bad input a new user can give, through the real command lines: exit code 2 (bad input),
exactly one line on stderr naming the file and line, the key, the task or the host, and nothing
started or written (no task process, no train_dir). Each line is the one docs/errors.yaml documents
for it, with its cause and fix: the troubleshooting page is made from that file, and a case without
its entry, a changed message or an entry no test produces fails here."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO, launch, project_processes, write_idx_set, write_spec
from tests.harness.documented import check_documented, strip_prefix
from tests.harness.bad_input import CASES, _spec


def _port_busy(tmp_path, holder):
    spec = _spec(tmp_path)
    port = int(yaml.safe_load(open(spec))['cluster']['worker'][0].split(':')[1])
    holder.bind(('', port))
    holder.listen()
    return spec, port


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


@pytest.mark.slow
def test_task_help_is_not_a_traceback():
    result = subprocess.run([sys.executable, '-m', 'cluster.task', '--help'], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and 'usage:' in result.stdout and not result.stderr

