"""`launch plan` of a spec that runs your own TF1 program (#42): the ps tasks' load comes from a run
of it, named by --from-run or found in the spec's own train_dir: the variables and devices of its
newest checkpoint's graph (.meta); its images/s is --link's compute. No process started."""
from __future__ import annotations

import json

import tensorflow as tf
import yaml

from cluster.runtime import rundir
from launch.cli import main

v1 = tf.compat.v1


def program_run(tmp_path, train_dir) -> str:
    """A TF1 train.program spec on 2 ps tasks (on hosts of their own), and a run of it in
    `train_dir`: its event log, run.json and the newest checkpoint's graph."""
    (tmp_path / 'mytrain.py').write_text('def train(ctx):\n    pass\n')
    spec = tmp_path / 'spec.yaml'
    spec.write_text(yaml.safe_dump({
        'cluster': {'ps': ['p0.example:2222', 'p1.example:2222'], 'worker': ['w0.example:2222', 'w1.example:2222']},
        'train': {'program': 'mytrain:train', 'train_dir': str(train_dir), 'batch_size': 32}}))
    train_dir.mkdir()
    with tf.Graph().as_default():
        with v1.device(v1.train.replica_device_setter(ps_tasks=2, worker_device='/job:worker/task:0')):
            v1.get_variable('dense/kernel', [784, 256])       # ps:0, 802,816 B
            v1.get_variable('dense/bias', [256])              # ps:1, 1,024 B
            v1.get_variable('out/kernel', [256, 10])          # ps:0, 10,240 B
        v1.train.export_meta_graph(str(train_dir / 'model.ckpt-40.meta'))
    (train_dir / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-40"\n')
    (train_dir / 'events.jsonl').write_text(json.dumps({
        'time': '2026-11-29T10:00:00.000+00:00', 'run': 'mine-1', 'attempt': 1, 'event': 'run_started',
        'spec': str(spec), 'backend': 'local', 'train_dir': str(train_dir)}) + '\n')
    (train_dir / 'run.json').write_text(json.dumps({'id': 'mine-1', 'state': 'done', 'exit_code': 0,
                                                   'global_step': 40, 'images_per_sec': 640.0}))
    return str(spec)


def test_the_load_comes_from_the_run_named(tmp_path, capsys):
    spec = program_run(tmp_path, tmp_path / 'elsewhere')
    (tmp_path / 'spec.yaml').write_text((tmp_path / 'spec.yaml').read_text().replace(
        str(tmp_path / 'elsewhere'), str(tmp_path / 'next')))
    assert main(['plan', spec, '--from-run', str(tmp_path / 'elsewhere'), '--json']) == 0
    load = json.loads(capsys.readouterr().out)['load']
    assert [(p['task'], p['bytes']) for p in load['ps']] == [('ps:0', 813_056), ('ps:1', 1_024)]
    assert load['hot'] == ['dense/kernel'] and load['placement'] == 'as that run did'
    assert 'mine-1 (model.ckpt-40.meta)' in load['model']


def test_the_spec_s_own_train_dir_tells_it_and_the_run_gives_the_compute(tmp_path, capsys):
    spec = program_run(tmp_path, tmp_path / 'run')
    assert main(['plan', spec, '--from-run', str(tmp_path / 'run'), '--link', '1gbit']) == 0
    out = capsys.readouterr().out
    assert "load: your program's 3 variables on the ps tasks, as run mine-1 (model.ckpt-40.meta) placed them" in out
    # 2 workers of 32 images at 640 images/s: 100 ms of compute; ps:0 sends 813,056 B to each.
    assert 'predicted: one update takes' in out and "from run mine-1's 640 images/s" in out, out
    assert main(['plan', spec]) == 0
    assert 'as run mine-1 (model.ckpt-40.meta) placed them' in capsys.readouterr().out     # found by itself


def test_a_run_that_left_no_graph_is_said(tmp_path, capsys):
    spec = program_run(tmp_path, tmp_path / 'run')
    (tmp_path / 'run' / rundir.CHECKPOINT_INDEX).unlink()
    assert main(['plan', spec, '--from-run', str(tmp_path / 'run')]) == 2
    assert 'left no variables.json' in capsys.readouterr().err
    assert main(['plan', spec]) == 0
    assert 'load: not known before the run' in capsys.readouterr().out
