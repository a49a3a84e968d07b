"""The user's own training code: `train.program` (a function called in every worker with a typed
context) and `train.command` (a TF1 script run unchanged with TF_CONFIG and the classic flags).

The checks and the supervisor's rules are plain functions, tested here in milliseconds; three real
clusters run the two examples and a command whose worker fails."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from cluster.checks.code import ProgramError, check_command, check_program
from cluster.program import command_argv
from cluster.spec import SpecError, load_spec, read_tf_config
from launch.run.policy import Action, Policy, Progress, TaskState, TaskStatus, decide
from tests.conftest import REPO, write_spec


def _spec(tmp_path, **train):
    return load_spec(write_spec(tmp_path, **train))


# ---------------------------------------------------------------------------------------------
# The spec keys

def test_a_command_string_is_split_like_a_shell_and_a_list_is_kept(tmp_path):
    spec = _spec(tmp_path, command='python train.py --name "two words" --lr=0.1')
    assert spec.train.command == ('python', 'train.py', '--name', 'two words', '--lr=0.1')
    assert _spec(tmp_path, command=['python', 'train.py', '--steps', 5]).train.command == \
        ('python', 'train.py', '--steps', '5')


def test_program_and_command_survive_the_effective_spec(tmp_path):
    """The tasks read the spec the launcher writes: both keys must read back the same."""
    for train in ({'program': 'pkg.mod:fn'}, {'command': 'python t.py --a "b c"'}):
        spec = _spec(tmp_path, **train)
        copy = tmp_path / 'copy.yaml'
        copy.write_text(spec.to_yaml())
        assert load_spec(str(copy)).train == spec.train


@pytest.mark.parametrize('train, expected', [
    ({'program': 'module_only'}, 'expected package.module:function'),
    ({'program': 'a.b:c:d'}, 'expected package.module:function'),
    ({'program': 7}, 'expected package.module:function'),
    ({'command': ''}, 'the command is empty'),
    ({'command': []}, 'the command is empty'),
    ({'command': {'run': 'x'}}, 'expected a command line'),
    ({'command': 'python "open'}, 'cannot split'),
    ({'program': 'a:b', 'command': 'x'}, 'exclude each other'),
])
def test_bad_program_keys_are_one_line(tmp_path, train, expected):
    with pytest.raises(SpecError, match=expected) as e:
        _spec(tmp_path, **train)
    assert 'spec.yaml:' in str(e.value) and '\n' not in str(e.value)


# ---------------------------------------------------------------------------------------------
# Finding the program or command before anything starts

def test_a_program_is_found_without_running_any_of_its_code(tmp_path):
    (tmp_path / 'pkg').mkdir()
    (tmp_path / 'pkg' / '__init__.py').write_text('')
    (tmp_path / 'pkg' / 'trainer.py').write_text(textwrap.dedent('''\
        open(__file__ + '.ran', 'w').close()      # would show that checking imported it
        def train(ctx):
            pass
        if True:
            def guarded(ctx):
                pass
        alias = train
    '''))
    for name in ('train', 'guarded', 'alias'):
        check_program(f'pkg.trainer:{name}', [str(tmp_path)])
    assert not (tmp_path / 'pkg' / 'trainer.py.ran').exists()
    with pytest.raises(ProgramError, match="defines no function 'main'"):
        check_program('pkg.trainer:main', [str(tmp_path)])
    with pytest.raises(ProgramError, match="no module named 'pkg.nothing'"):
        check_program('pkg.nothing:train', [str(tmp_path)])
    with pytest.raises(ProgramError, match="No module named 'nopkg'"):
        check_program('nopkg.trainer:train', [str(tmp_path)])
    check_program('examples.linear_program:train', [REPO])


def test_a_command_is_found_on_path_or_relative_to_the_tasks_directory(tmp_path):
    (tmp_path / 'train.py').write_text('')
    script = tmp_path / 'run.sh'
    script.write_text('#!/bin/sh\n')
    check_command(('python', 'train.py', '--steps', '3'), str(tmp_path))
    check_command(('python3', '-u', 'train.py'), str(tmp_path))
    check_command(('ls', '-l'), str(tmp_path))
    with pytest.raises(ProgramError, match='not executable'):
        check_command(('./run.sh',), str(tmp_path))
    script.chmod(0o755)
    check_command(('./run.sh',), str(tmp_path))
    with pytest.raises(ProgramError, match='no-such-tool: command not found on PATH'):
        check_command(('no-such-tool',), str(tmp_path))
    with pytest.raises(ProgramError, match='other.py: no such file'):
        check_command(('python', 'other.py'), str(tmp_path))
    with pytest.raises(ProgramError, match='./gone.sh: no such file'):
        check_command(('./gone.sh',), str(tmp_path))


def test_a_command_gets_the_classic_flags_and_the_tasks_interpreter(tmp_path):
    spec = _spec(tmp_path, workers=2, ps=1, command='python train.py --steps 9')
    ps, w0, w1 = (t.address for t in spec.tasks)
    argv = command_argv(spec.train.command, spec, spec.task('worker', 1))
    assert argv == [sys.executable, 'train.py', '--steps', '9', '--job_name', 'worker', '--task_index', '1',
                    '--ps_hosts', ps, '--worker_hosts', f'{w0},{w1}']
    config = json.loads(spec.tf_config(spec.task('ps', 0)))
    assert config == {'cluster': {'ps': [ps], 'worker': [w0, w1]}, 'task': {'type': 'ps', 'index': 0}}


# ---------------------------------------------------------------------------------------------
# TF_CONFIG in

def test_tf_config_names_the_cluster_and_the_task(tmp_path):
    cluster = {'ps': ['ps-0.svc:2222'], 'worker': ['worker-0.svc:2222', 'worker-1.svc:2222']}
    got = read_tf_config(json.dumps({'cluster': cluster, 'task': {'type': 'worker', 'index': 1}}))
    assert got == (cluster, 'worker', 1)
    spec = load_spec(None, ['train.steps=7'], cluster=cluster)
    assert spec.task('worker', 1).address == 'worker-1.svc:2222' and spec.train.steps == 7
    # With a spec file too, its train settings are kept and TF_CONFIG's cluster replaces its own.
    with_file = load_spec(write_spec(tmp_path, steps=33), cluster=cluster)
    assert with_file.train.steps == 33 and with_file.cluster_def() == cluster


@pytest.mark.parametrize('text, expected', [
    ('', 'not JSON'),
    ('[1, 2]', 'expected {"cluster"'),
    ('{"cluster": {"ps": ["a:1"], "worker": ["b:2"]}}', 'no "task"'),
    ('{"cluster": {"ps": ["a:1"], "worker": ["b:2"]}, "task": {"type": "worker", "index": "0"}}',
     'index must be a whole number'),
    ('{"cluster": {"ps": ["a:1"], "worker": ["b:2"]}, "task": {"type": "ps", "index": 1}}',
     'task ps:1 is not in its cluster'),
    ('{"cluster": {"worker": ["b:2"], "master": ["c:3"]}, "task": {"type": "master"}}',
     "job 'master' is not one tfcluster runs"),
    pytest.param('[' * 100_000 + ']' * 100_000, 'nested too deeply', id='nested-100000-deep'),
])
def test_bad_tf_config_is_one_line(text, expected):
    with pytest.raises(SpecError, match=expected) as e:
        read_tf_config(text)
    assert str(e.value).startswith('TF_CONFIG: ') and '\n' not in str(e.value)


# ---------------------------------------------------------------------------------------------
# The supervisor's rules for a user command

def _status(name, state, code=None):
    job, index = name.split(':')
    return TaskStatus(name, job, int(index), state, exit_code=code)


def test_a_commands_ps_tasks_are_stopped_once_every_worker_exited_0():
    policy = Policy(sync=True, num_workers=2, replicas_to_aggregate=2, user_command=True)
    tasks = [_status('ps:0', TaskState.RUNNING), _status('worker:0', TaskState.SUCCEEDED),
             _status('worker:1', TaskState.SUCCEEDED)]
    decision = decide(policy, tasks, frozenset(), 0, Progress(None, 10, 0))
    assert decision.action is Action.FINISH and decision.tasks == ('ps:0',)
    tasks[2] = _status('worker:1', TaskState.RUNNING)
    assert decide(policy, tasks, frozenset(), 0, Progress(None, 10, 0)).action is Action.CONTINUE


def test_any_lost_task_of_a_command_is_fatal_even_an_async_worker():
    policy = Policy(sync=False, num_workers=3, replicas_to_aggregate=3, user_command=True)
    tasks = [_status('ps:0', TaskState.RUNNING), _status('worker:0', TaskState.RUNNING),
             _status('worker:2', TaskState.FAILED, 3)]
    assert decide(policy, tasks, frozenset(), 0, Progress(None, 10, 0)).action is Action.GIVE_UP
    builtin = Policy(sync=False, num_workers=3, replicas_to_aggregate=3)
    assert decide(builtin, tasks, frozenset(), 0, Progress(None, 10, 0)).action is Action.TOLERATE
