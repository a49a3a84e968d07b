"""`launch check` is `launch up`'s pre-flight (launch/run/preflight.py): whatever `up` refuses before
anything starts, `check` refuses too, with the same line and exit code 2, and writes nothing. The
train_dir cases go through `launch.cli.main` and start no process; a busy port needs the hosts'
probe, which `check` runs as a process (slow)."""
from __future__ import annotations

import os

import pytest

from launch.cli import main
from launch.records.lock import TrainDirLock
from tests.conftest import write_spec
from tests.harness.documented import check_documented, strip_prefix
from tests.harness.ownership import snapshot, someone_elses


def _a_file(tmp_path):
    (tmp_path / 'afile').write_text('x')
    return {'train_dir': str(tmp_path / 'afile')}


def _under_a_file(tmp_path):
    (tmp_path / 'afile').write_text('x')
    return {'train_dir': str(tmp_path / 'afile' / 'run')}


def _foreign(tmp_path):
    someone_elses(tmp_path / 'theirs')
    return {'train_dir': str(tmp_path / 'theirs')}


# case -> (what it sets up: train settings, the entry of docs/errors.yaml its line is)
TRAIN_DIRS = {
    'a file': (_a_file, 'train-dir-is-a-file'),
    'under a file': (_under_a_file, 'train-dir-under-a-file'),
    'someone else\'s files': (_foreign, None),
}


@pytest.mark.parametrize('case', sorted(TRAIN_DIRS))
def test_check_refuses_the_train_dir_up_refuses_with_the_same_line(tmp_path, capsys, case):
    make, entry = TRAIN_DIRS[case]
    spec = write_spec(tmp_path, workers=1, **make(tmp_path))
    before = snapshot(tmp_path)
    lines = {}
    for command in ('up', 'check'):
        assert main([command, spec]) == 2, command
        out, err = capsys.readouterr()
        assert err.count('\n') == 1 and out == '', (command, out, err)
        lines[command] = err
    assert lines['check'] == lines['up'] and 'train.train_dir: ' in lines['up'], lines
    if entry:
        check_documented(entry, strip_prefix(lines['check'].strip()))
    assert snapshot(tmp_path) == before


def test_check_refuses_a_train_dir_another_launcher_holds_as_up_does(tmp_path, capsys):
    spec = write_spec(tmp_path, workers=1)
    os.makedirs(tmp_path / 'run')
    lock = TrainDirLock(str(tmp_path / 'run'))
    lock.acquire('launcher pid 4242, `launch up other.yaml` since 10:00:00')
    lines = {}
    try:
        for command in ('up', 'check'):
            assert main([command, spec]) == 2, command
            out, err = capsys.readouterr()
            assert err.count('\n') == 1 and out == '', (command, out, err)
            lines[command] = err
    finally:
        lock.release()
    assert lines['check'] == lines['up'], lines
    check_documented('train-dir-held', strip_prefix(lines['check'].strip()))
    assert os.listdir(tmp_path / 'run') == ['launch.lock']
