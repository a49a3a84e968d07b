"""What the commands say of warm standbys: `launch plan`'s line (how many, on how many hosts,
their memory; or why none), the line a backend that keeps none says once, the state file's
`standbys` (and a file of an earlier version, without them or without a record's `warm`), and
`launch status`'s `standby: N ready, M starting` (text and --json)."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from cluster.spec import load_spec
from launch.backends.base import TaskRecord
from launch.backends.procstat import process_ident
from launch.cli import main
from launch.planning.plan import STANDBY_MB_EST, plan_cluster, state_path
from launch.run import standbys
from launch.run.state import LaunchState

CLUSTER = 'cluster:\n  ps: [localhost:2222]\n  worker: [localhost:2223]\n'


def _spec(tmp_path, supervise: str = 'supervise:\n  restart: on-failure\n', more: str = ''):
    path = tmp_path / 'spec.yaml'
    path.write_text(CLUSTER + f'train:\n  train_dir: {tmp_path / "run"}\n{more}' + supervise)
    return load_spec(str(path))


@pytest.mark.parametrize('supervise, more, backend, expected', [
    ('supervise:\n  restart: on-failure\n', '', None,
     f'standby: 1 per host x 1 host(s), about {STANDBY_MB_EST} MB of its own each (supervise.standby; 0 turns it off)'),
    ('supervise:\n  restart: on-failure\n  standby: 0\n', '', None, 'standby: none (supervise.standby: 0)'),
    ('', '', None, 'standby: none (only a restart uses one, and supervise.restart is never)'),
    ('supervise:\n  restart: on-failure\n', '  command: python x.py\n', None,     # a command: no standby becomes it
     f'standby: 1 per host x 0 host(s), about {STANDBY_MB_EST} MB of its own each (supervise.standby; 0 turns it off)'),
    ('supervise:\n  restart: on-failure\n', '', 'compose', 'supervise.standby: ignored by the compose backend '
     '(a container is its task: a restart starts the container again, where no warm process can wait)'),
    ('supervise:\n  restart: on-failure\n  standby: 0\n', '', 'slurm', 'standby: none (supervise.standby: 0)'),
])
def test_the_plan_line_says_how_many_standbys_and_their_memory_or_why_none(tmp_path, supervise, more, backend,
                                                                           expected):
    spec = _spec(tmp_path, supervise, more)
    plans = plan_cluster(spec)
    assert standbys.line(spec, backend, plans) == expected
    kept = standbys.summary(spec, backend, plans)
    assert kept['per_host'] == spec.supervise.standby and kept['mb_each'] == STANDBY_MB_EST
    assert kept['hosts'] == (1 if expected.startswith('standby: 1 per host x 1') else 0)


@pytest.mark.parametrize('backend', ['compose', 'slurm', 'ray'])
def test_a_backend_that_keeps_none_says_so_and_never_refuses(tmp_path, backend):
    spec = _spec(tmp_path, 'supervise:\n  restart: on-failure\n')
    assert standbys.ignored(spec, backend).startswith(f'supervise.standby: ignored by the {backend} backend (')
    assert standbys.ignored(spec, 'local') is None and standbys.ignored(spec, None) is None
    assert standbys.ignored(_spec(tmp_path, 'supervise:\n  restart: on-failure\n  standby: 0\n'), backend) is None
    assert standbys.ignored(_spec(tmp_path, 'supervise:\n  restart: never\n'), backend) is None    # not a word


def test_the_state_file_keeps_the_standbys_and_reads_one_written_before_them(tmp_path):
    path = str(tmp_path / 'launch-state.json')
    record = TaskRecord('worker:1', 'worker', 1, 'localhost', 2223, 'local', 42, '/l', warm=True)
    state = LaunchState(spec='s.yaml', launcher_pid=1, launcher_ident='x', started=1.0, tasks=[record],
                        standbys=[{'host': 'localhost', 'pid': 7, 'state': 'ready'}])
    state.save(path)
    loaded = LaunchState.load(path)
    assert loaded.standbys == state.standbys and loaded.tasks[0].warm is True
    with open(path) as f:
        data = json.load(f)
    del data['standbys'], data['tasks'][0]['warm']        # as a launcher before standbys wrote it
    with open(path, 'w') as f:
        json.dump(data, f)
    older = LaunchState.load(path)
    assert older.standbys == [] and older.tasks[0].warm is False


def test_status_says_how_many_standbys_are_ready_and_starting(tmp_path, capsys):
    spec = _spec(tmp_path)
    os.makedirs(spec.train.train_dir)
    views = [{'host': 'localhost', 'pid': 7, 'state': 'ready'}, {'host': 'localhost', 'pid': 8, 'state': 'ready'},
             {'host': 'localhost', 'pid': 9, 'state': 'starting'}]
    alive = os.getppid()       # a live process other than this one stands for the launcher
    LaunchState(spec=spec.path, launcher_pid=alive, launcher_ident=process_ident(alive) or '',
                started=1.0, standbys=views).save(state_path(spec))
    main(['status', spec.path])
    assert 'standby: 2 ready, 1 starting' in capsys.readouterr().out.splitlines()
    main(['status', spec.path, '--json'])
    assert json.loads(capsys.readouterr().out)['standby'] == {'ready': 2, 'starting': 1}


@pytest.mark.parametrize('supervise, more, expected', [
    ('', '', f'start-up: the tasks of each host fork from one TensorFlow import, 1 host(s), about {STANDBY_MB_EST} '
             'MB each while they start (supervise.standby: 0 starts each cold)'),      # restart: never included
    ('supervise:\n  standby: 0\n', '', 'start-up: each task imports TensorFlow itself (supervise.standby: 0)'),
    ('', '  command: python x.py\n', 'start-up: each task imports TensorFlow itself (none runs cluster.task)'),
])
def test_the_plan_says_whether_the_first_start_forks_from_one_import(tmp_path, supervise, more, expected):
    spec = _spec(tmp_path, supervise, more)
    assert standbys.zygote_line(spec, None, plan_cluster(spec)) == expected


def test_a_backend_without_zygotes_says_nothing_of_them(tmp_path):
    spec = _spec(tmp_path, '')
    plans = [dataclasses.replace(p, backend='ssh') for p in plan_cluster(spec)]
    assert standbys.zygote_line(spec, 'ssh', plans) is None
