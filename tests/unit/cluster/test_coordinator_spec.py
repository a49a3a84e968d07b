"""Coordinator runs (TF2 ParameterServerStrategy) on paper: the spec's chief and evaluator, the
TF_CONFIG and environment each role gets, what each task runs, and the checks before anything
starts. Pure and fast; tests/system/cluster/test_coordinator.py runs real clusters."""
from __future__ import annotations

import json
import sys

import pytest
import yaml

from cluster.checks.code import uses_keras
from cluster.coordinator import checkpoint_step
from cluster.runtime import rundir
from cluster.spec import SpecError, load_spec
from cluster.checks.code import check_user_code, user_code
from launch.planning.plan import plan_cluster

CLUSTER = {'chief': ['localhost:3001'], 'ps': ['localhost:3002'], 'worker': ['localhost:3003', 'localhost:3004'],
           'evaluator': ['localhost:3005']}


def spec_file(tmp_path, cluster=None, **train):
    settings = {'program': 'tests.harness.pss_programs:train', 'evaluator': 'tests.harness.pss_programs:evaluate', 'steps': 20,
                'train_dir': str(tmp_path / 'run'), **train}
    path = tmp_path / 'spec.yaml'
    path.write_text(yaml.safe_dump({'cluster': cluster or CLUSTER, 'train': settings}))
    return str(path)


def test_a_chief_makes_a_coordinator_run_and_is_the_chief(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    assert spec.coordinator and spec.chief.name == 'chief:0'
    assert [t.name for t in spec.tasks] == ['chief:0', 'ps:0', 'worker:0', 'worker:1', 'evaluator:0']
    assert list(spec.cluster_def()) == ['chief', 'ps', 'worker']       # the training cluster: no evaluator
    assert spec.all_jobs_def() == CLUSTER
    plain = load_spec(spec_file(tmp_path, cluster={'ps': ['localhost:3002'], 'worker': ['localhost:3003']},
                                program=None, evaluator=None))
    assert not plain.coordinator and plain.chief.name == 'worker:0'


def test_the_effective_spec_keeps_every_role(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    again = tmp_path / 'again.yaml'
    again.write_text(spec.to_yaml())
    assert load_spec(str(again)).tasks == spec.tasks
    assert yaml.safe_load(spec.to_yaml())['train']['evaluator'] == 'tests.harness.pss_programs:evaluate'


@pytest.mark.parametrize('job, index', [('chief', 0), ('ps', 0), ('worker', 1)])
def test_training_tasks_share_one_cluster_of_chief_ps_and_workers(tmp_path, job, index):
    spec = load_spec(spec_file(tmp_path))
    plans = {p.name: p for p in plan_cluster(spec)}
    config = json.loads(plans[f'{job}:{index}'].env['TF_CONFIG'])
    assert config == {'cluster': {k: v for k, v in CLUSTER.items() if k != 'evaluator'},
                      'task': {'type': job, 'index': index}}


def test_the_evaluator_tf_config_names_only_itself(tmp_path):
    """In the training cluster, an evaluator makes the coordinator wait for it (tensorflow#46169)."""
    spec = load_spec(spec_file(tmp_path))
    plans = {p.name: p for p in plan_cluster(spec)}
    assert json.loads(plans['evaluator:0'].env['TF_CONFIG']) == {
        'cluster': {'evaluator': ['localhost:3005']}, 'task': {'type': 'evaluator', 'index': 0}}


def test_every_task_fails_fast_and_gets_keras_2(tmp_path):
    """PSS tolerates a lost worker only with GRPC_FAIL_FAST=use_caller on every task, the coordinator
    included; TF_USE_LEGACY_KERAS=1 makes tf.keras the Keras that has PSS."""
    spec = load_spec(spec_file(tmp_path))
    for plan in plan_cluster(spec):
        assert plan.env['GRPC_FAIL_FAST'] == 'use_caller' and plan.env['TF_USE_LEGACY_KERAS'] == '1', plan.name
    plain = load_spec(spec_file(tmp_path, cluster={'ps': ['localhost:3002'], 'worker': ['localhost:3003']},
                                program=None, evaluator=None))
    assert all('GRPC_FAIL_FAST' not in p.env for p in plan_cluster(plain))


@pytest.mark.parametrize('name', ['GRPC_FAIL_FAST', 'TF_USE_LEGACY_KERAS'])
def test_the_launcher_variables_cannot_be_set_in_a_spec(tmp_path, name):
    path = spec_file(tmp_path)
    with pytest.raises(SpecError, match=f'env.{name}: {name} cannot be set in a spec'):
        load_spec(path, [f'env.{name}=x'])


def test_what_each_role_runs(tmp_path):
    spec = load_spec(spec_file(tmp_path))
    runs = {t.name: user_code(spec, t) for t in spec.tasks}
    assert runs == {'chief:0': ('train.program', 'tests.harness.pss_programs:train'),
                    'ps:0': ('train.program', None), 'worker:0': ('train.program', None),
                    'worker:1': ('train.program', None),
                    'evaluator:0': ('train.evaluator', 'tests.harness.pss_programs:evaluate')}
    command = load_spec(spec_file(tmp_path, program=None, command='python train.py --epochs 2',
                                  evaluator='python eval.py'))
    assert user_code(command, command.task('chief', 0)) == ('train.command', ('python', 'train.py', '--epochs', '2'))
    assert user_code(command, command.task('worker', 0)) == ('train.program', None)
    assert user_code(command, command.task('evaluator', 0)) == ('train.evaluator', ('python', 'eval.py'))


def test_a_coordinator_command_gets_no_tf1_flags(tmp_path):
    from cluster.program import command_argv
    spec = load_spec(spec_file(tmp_path, program=None, command='python train.py', evaluator=None,
                               cluster={k: v for k, v in CLUSTER.items() if k != 'evaluator'}))
    assert command_argv(spec.train.command, spec, spec.chief) == [sys.executable, 'train.py']


def test_keras_programs_are_told_apart(tmp_path, monkeypatch):
    (tmp_path / 'kprog.py').write_text('import tensorflow as tf\n\ndef train(ctx):\n    tf.keras.Sequential()\n')
    (tmp_path / 'k2prog.py').write_text('import tf_keras as keras\n\ndef train(ctx):\n    pass\n')
    (tmp_path / 'plain.py').write_text('import tensorflow as tf\n\ndef train(ctx):\n    tf.Variable(1)\n')
    where = [str(tmp_path)]
    assert uses_keras('kprog:train', where) and uses_keras('k2prog:train', where)
    assert not uses_keras('plain:train', where)


def test_a_keras_program_without_tf_keras_is_one_line_before_start(tmp_path, monkeypatch):
    (tmp_path / 'kprog.py').write_text('import tensorflow as tf\n\ndef train(ctx):\n    tf.keras.Sequential()\n')
    spec = load_spec(spec_file(tmp_path, program='kprog:train'))
    monkeypatch.setitem(sys.modules, 'tf_keras', None)      # as where it is not installed
    with pytest.raises(SpecError) as e:
        check_user_code(spec, spec.chief, cwd=str(tmp_path))
    message = str(e.value)
    assert '\n' not in message and 'spec.yaml' in message and 'train.program' in message
    assert "pip install -e '.[keras]'" in message
    check_user_code(spec, spec.task('worker', 0), cwd=str(tmp_path))     # a worker runs no user code


def test_evaluation_lines_round_trip():
    line = rundir.evaluation_line(120, {'accuracy': 0.8125, 'loss': 0.43})
    assert rundir.parse_evaluation(f'2026-11-25T10:00:00 I {line}') == (120, {'accuracy': 0.8125, 'loss': 0.43})
    assert rundir.parse_evaluation('step 10/20  loss 1.0') is None


def test_checkpoint_steps_from_paths():
    assert checkpoint_step('/r/model.ckpt-120') == 120 and checkpoint_step('') == 0
