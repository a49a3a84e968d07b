"""The user's index of runs (launch/records/index.py): a run `launch up` started is found by its id
from any directory, `launch list` shows the user's runs (not whatever lies under the current
directory, such as this repository's recorded test run), and a stale entry is one line. The run is
made by the real lifecycle over scripted tasks (tests/unit/launch/run/test_lifecycle.py), the commands run through
`launch.cli.main`: no process is started."""
from __future__ import annotations

import dataclasses
import io
import json
import os

import pytest

from cluster.spec import load_spec
from launch.backends.base import link_attempt_log
from launch.cli import main
from launch.planning.plan import plan_cluster
from launch.records import index
from launch.run.supervised import loop as supervised
from launch.run.console import Console
from launch.run.lifecycle import Lifecycle
from launch.run.supervised import SupervisedRun
from tests.conftest import REPO, write_spec
from tests.harness.documented import check_documented, strip_prefix
from tests.harness.lifecycle import DONE, ScriptedBackend

STORY = os.path.join(REPO, 'tests', 'data', 'story-run')


class LoggingBackend(ScriptedBackend):
    """Scripted tasks that each write a line where a local task's log goes."""

    def start(self, plan):
        with open(link_attempt_log(plan.cwd, plan), 'a') as f:
            f.write(f'{plan.name} says hello\n')
        return super().start(plan)


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(supervised, 'SUPERVISE_SECS', 0.01)


def up_elsewhere(tmp_path, monkeypatch) -> tuple[str, str]:
    """`launch up` of a spec in project/ whose train_dir is an absolute path under scratch/, run
    from project/ to the end; (the run's id, its train_dir)."""
    project = tmp_path / 'project'
    project.mkdir()
    train_dir = str(tmp_path / 'scratch' / 'deep' / 'exp' / 'run')     # deeper than a search from tmp_path
    spec = load_spec(write_spec(project, workers=2, train_dir=train_dir, steps=100))
    monkeypatch.chdir(project)
    backend = LoggingBackend({'ps:0': {'*': [(0.6, 'exit', 0)]}, 'worker:0': {'*': DONE}, 'worker:1': {'*': DONE}})
    plans = [dataclasses.replace(p, backend=backend.name) for p in plan_cluster(spec)]
    life = Lifecycle(spec, Console(stream=io.StringIO()), report=False)
    result = life.up(SupervisedRun(spec, '', plans, {backend.name: backend}, start_timeout=5, finish_timeout=5))
    assert result.exit_code == 0
    return life.run_id, train_dir


def test_a_run_started_with_its_train_dir_elsewhere_is_found_by_its_id_from_anywhere(tmp_path, monkeypatch, capsys):
    run_id, train_dir = up_elsewhere(tmp_path, monkeypatch)
    for where in (tmp_path / 'project', tmp_path / 'somewhere-else'):     # where `up` ran, and anywhere
        where.mkdir(exist_ok=True)
        monkeypatch.chdir(where)
        capsys.readouterr()
        assert main(['status', run_id]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.startswith(f'run {run_id}: done, attempt 1, global step 100 ({train_dir})')
        assert main(['logs', run_id, 'worker:1']) == 0, capsys.readouterr().err
        assert capsys.readouterr().out == 'worker:1 says hello\n'
        assert main(['debug', run_id]) == 2      # found; it is not running, so no task can be asked
        err = capsys.readouterr().err
        assert err.count('\n') == 1 and f'no run of it is running (no live launcher in {train_dir})' in err, err
        assert main(['list', '--json']) == 0
        assert [(r['id'], r['train_dir'], r['state']) for r in json.loads(capsys.readouterr().out)] == \
            [(run_id, train_dir, 'done')]


def test_up_records_each_run_once_in_the_index(tmp_path, monkeypatch):
    run_id, train_dir = up_elsewhere(tmp_path, monkeypatch)
    assert [(e.id, e.train_dir, e.spec) for e in index.entries()] == \
        [(run_id, train_dir, str(tmp_path / 'project' / 'spec.yaml'))]
    files = os.listdir(index.runs_dir())
    assert len(files) == 1 and files[0].startswith(run_id + '.') and files[0].endswith('.json'), files
    assert index.remember(run_id, train_dir, 'another.yaml') == os.path.join(index.runs_dir(), files[0])
    assert index.entries(run_id)[0].spec == str(tmp_path / 'project' / 'spec.yaml')     # kept, not rewritten


def test_list_in_a_clone_of_the_repository_shows_the_users_runs_not_the_tests_data(monkeypatch, capsys):
    """A fresh clone holds tests/data/story-run, a recorded run whose spec lies in the temporary
    directory of whoever recorded it: `launch list` there shows the user's own runs (none yet);
    only `launch list DIR` searches a directory, and finds it."""
    monkeypatch.chdir(REPO)
    assert main(['list', '--json']) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(['list']) == 0
    assert capsys.readouterr().out.startswith(f'no runs recorded in {index.runs_dir()} ')
    assert main(['list', '.', '--json']) == 0
    assert STORY in [r['train_dir'] for r in json.loads(capsys.readouterr().out)]


def test_a_run_whose_train_dir_is_gone_is_one_line(tmp_path, monkeypatch, capsys):
    run_id, train_dir = up_elsewhere(tmp_path, monkeypatch)
    os.rename(tmp_path / 'scratch', tmp_path / 'moved')
    monkeypatch.chdir(tmp_path)     # a search from here does not reach it either (4 levels deep)
    capsys.readouterr()
    assert main(['logs', run_id]) == 2
    err = capsys.readouterr().err
    assert err == (f'launch: error: run {run_id} was started in {train_dir}, which is gone (moved or removed): '
                   'name its train_dir where it is now\n'), err
    check_documented('run-gone', strip_prefix(err.strip()))
    assert main(['status', run_id]) == 3        # status: no such run
    capsys.readouterr()
    assert main(['list']) == 0
    out, err = capsys.readouterr()
    assert out.startswith('no runs recorded in ') and err.count('\n') == 1, (out, err)
    assert f'1 run(s) recorded in {index.runs_dir()} are no longer where they were started' in err
    assert main(['status', str(tmp_path / 'moved' / 'deep' / 'exp' / 'run')]) == 0      # by its train_dir, it is there


def test_an_index_entry_whose_train_dir_holds_another_run_now_is_stale(tmp_path, monkeypatch, capsys):
    run_id, train_dir = up_elsewhere(tmp_path, monkeypatch)
    index.remember('older-1', train_dir, '')
    monkeypatch.chdir(tmp_path / 'project')
    assert main(['status', 'older-1']) == 3
    assert 'which no longer holds it (moved or removed)' in capsys.readouterr().err
    assert main(['list', '--json']) == 0
    assert [r['id'] for r in json.loads(capsys.readouterr().out)] == [run_id]


def test_the_index_lies_in_the_users_state_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(index.STATE_ENV)
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    monkeypatch.delenv('XDG_STATE_HOME', raising=False)
    assert index.runs_dir() == str(tmp_path / 'home' / '.local' / 'state' / 'tfcluster' / 'runs')
    monkeypatch.setenv('XDG_STATE_HOME', str(tmp_path / 'xdg'))
    assert index.runs_dir() == str(tmp_path / 'xdg' / 'tfcluster' / 'runs')
    monkeypatch.setenv(index.STATE_ENV, str(tmp_path / 'mine'))
    assert index.runs_dir() == str(tmp_path / 'mine' / 'runs')


def test_the_tests_never_write_the_users_index():
    """conftest.py gives every test (and the launchers it starts) an index of its own."""
    home = os.path.join(os.path.expanduser('~'), '.local', 'state')
    assert not index.state_dir().startswith(home + os.sep), index.state_dir()
    assert index.entries() == []


def test_a_damaged_or_foreign_record_is_skipped():
    os.makedirs(index.runs_dir())
    for name, text in (('a.json', '{"id": "a"'), ('b.json', '[1, 2]'), ('c.json', '{"id": "c", "train_dir": "rel"}'),
                       ('d.json', '{"id": "d", "train_dir": "/x", "spec": 5}'), ('e.txt', 'not a record')):
        with open(os.path.join(index.runs_dir(), name), 'w') as f:
            f.write(text)
    assert [(e.id, e.train_dir, e.spec) for e in index.entries()] == [('d', '/x', '')]


def test_an_index_that_cannot_be_written_costs_a_warning(tmp_path, monkeypatch, caplog):
    (tmp_path / 'afile').write_text('x')
    monkeypatch.setenv(index.STATE_ENV, str(tmp_path / 'afile'))
    assert index.remember('r-1', str(tmp_path / 'run'), '') is None
    assert 'cannot record run r-1' in caplog.text and index.STATE_ENV in caplog.text
