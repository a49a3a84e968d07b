"""The launcher<->task contract (cluster/runtime/contract.py) as tables: task names and the task's
command line both ways."""
from __future__ import annotations

import pytest

from cluster.env import places
from cluster.runtime import contract, rundir
from cluster.runtime.contract import TaskArgs, TaskName, parse_task_argv, task_argv
from cluster.spec import JOBS


@pytest.mark.parametrize('job', JOBS)
@pytest.mark.parametrize('index', [0, 1, 17])
def test_task_names_round_trip(job, index):
    name = TaskName(job, index)
    assert str(name) == f'{job}:{index}' == rundir.task_name(job, index)
    assert TaskName.parse(str(name)) == name and contract.job_of(str(name)) == job
    assert rundir.parse_task_name(str(name)) == (job, index)


@pytest.mark.parametrize('bad', ['', 'ps', 'ps:', ':0', 'ps:-1', 'ps:1:2', 'ps :1', '1ps:0', 'ps:a', ' ps:0'])
def test_bad_task_names_are_refused(bad):
    with pytest.raises(ValueError, match='not a task name'):
        TaskName.parse(bad)
    assert contract.job_of(bad) is None


def test_task_names_sort_by_job_then_index():
    assert sorted([TaskName('worker', 10), TaskName('worker', 2), TaskName('ps', 3)]) == \
        [TaskName('ps', 3), TaskName('worker', 2), TaskName('worker', 10)]


@pytest.mark.parametrize('job', JOBS)
@pytest.mark.parametrize('index', [0, 3])
def test_the_argv_the_launcher_builds_is_the_one_the_task_parses(job, index):
    argv = task_argv('/usr/bin/python3', 'runs/x/spec.yaml', TaskName(job, index))
    assert argv == ('/usr/bin/python3', '-m', 'cluster.task', '--spec', 'runs/x/spec.yaml',
                    '--job', job, '--index', str(index))
    assert parse_task_argv(argv[3:], environ={}) == TaskArgs('runs/x/spec.yaml', (), TaskName(job, index), None)


@pytest.mark.parametrize('argv, args', [
    (['--job', 'ps', '--index', '0', '--set', 'train.steps=5', '--set=train.sync=false'],
     TaskArgs(None, ('train.steps=5', 'train.sync=false'), TaskName('ps', 0), None)),
    (['--slurm'], TaskArgs(None, (), None, places.SLURM)),
    (['--slurm', '--port-base', '3000'], TaskArgs(None, (), None, places.SLURM, 3000)),
    (['--place', 'slurm'], TaskArgs(None, (), None, places.SLURM)),
    (['--place', 'slurm', '--slurm'], TaskArgs(None, (), None, places.SLURM)),
    (['--jobset', '--spec', 's.yaml'], TaskArgs('s.yaml', (), None, places.JOBSET)),
    (['--place', 'jobset'], TaskArgs(None, (), None, places.JOBSET)),
    (['--place', 'tf_config', '--job', 'worker', '--index', '1'], TaskArgs(None, (), TaskName('worker', 1), None)),
])
def test_every_option_parses(argv, args):
    assert parse_task_argv(argv, environ={}) == args


def test_tf_config_places_a_task_without_job_and_index():
    environ = {'TF_CONFIG': '{}'}
    assert parse_task_argv([], environ=environ) == TaskArgs(None, (), None, None)
    assert parse_task_argv(['--place', 'tf_config'], environ=environ) == TaskArgs(None, (), None, places.TF_CONFIG)


@pytest.mark.parametrize('argv, error', [
    (['--slurm', '--jobset'], 'give --slurm or --jobset, not both'),
    (['--place', 'jobset', '--slurm'], 'give --place jobset or --slurm, not both'),
    (['--slurm', '--job', 'ps', '--index', '0'], "--slurm takes the task from Slurm's environment: drop --job and --index"),
    (['--jobset', '--index', '0'], "--jobset takes the task from the JobSet pod's environment: drop --job and --index"),
    (['--place', 'slurm', '--job', 'ps', '--index', '0'],
     "--place slurm takes the task from Slurm's environment: drop --job and --index"),
    (['--job', 'ps'], 'give --job and --index together'),
    ([], '--job and --index are required unless $TF_CONFIG names the task'),
    (['--place', 'tf_config'], '--job and --index are required unless $TF_CONFIG names the task'),
    (['--place', 'ray'], "argument --place: invalid choice: 'ray'"),
])
def test_bad_command_lines_exit_2_with_one_line(argv, error, capsys):
    with pytest.raises(SystemExit) as raised:
        parse_task_argv(argv, environ={})
    assert raised.value.code == 2
    assert error in capsys.readouterr().err


def test_place_stays_out_of_the_help(capsys):
    with pytest.raises(SystemExit):
        parse_task_argv(['--help'], environ={})
    assert '--place' not in capsys.readouterr().out


def test_every_placement_source_has_its_words():
    assert list(places.SOURCES) == [places.TF_CONFIG, places.SLURM, places.JOBSET]
    assert all(s.what and s.where and callable(s.resolve) for s in places.SOURCES.values())
