"""variables.json, where a coordinator run's program put its variables (cluster/runtime/placed.py),
and the ps load `launch plan --from-run` makes of it (launch/planning/ps_load.py run_load)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from cluster.runtime import placed, rundir
from cluster.spec import load_spec
from launch.planning import ps_load


def variable(name: str, shape: tuple, device: str, dtype: str = 'float32', trainable: bool = True):
    """What the recorder reads of a TensorFlow variable: its name, shape, dtype, device, trainable."""
    return SimpleNamespace(name=name, shape=shape, dtype=SimpleNamespace(name=dtype), device=device,
                           trainable=trainable)


@pytest.mark.parametrize('device, ps', [('/job:ps/replica:0/task:1/device:CPU:0', 1), ('/job:ps/task:0', 0),
                                        ('/job:chief/replica:0/task:0/device:CPU:0', None), ('', None)])
def test_the_ps_task_of_a_device(device, ps):
    assert placed.ps_of(device) == ps


def test_recorded_variables_come_back_in_creation_order(tmp_path):
    recorder = placed.Recorder(str(tmp_path))
    recorder.note(variable('dense/kernel:0', (784, 128), '/job:ps/replica:0/task:0/device:CPU:0'))
    recorder.note(variable('dense/bias:0', (128,), '/job:ps/replica:0/task:1/device:CPU:0'))
    recorder.note(variable('iterations:0', (), '/job:ps/replica:0/task:0/device:CPU:0', 'int64', False))
    recorder.note(object())     # not a variable: left out
    recorder.write()
    got = placed.read(str(tmp_path))
    assert got is not None
    assert [(v.name, v.shape, v.dtype, v.trainable, v.ps) for v in got] == [
        ('dense/kernel:0', (784, 128), 'float32', True, 0), ('dense/bias:0', (128,), 'float32', True, 1),
        ('iterations:0', (), 'int64', False, 0)]


def test_a_run_without_the_file_has_none(tmp_path):
    assert placed.read(str(tmp_path)) is None
    placed.Recorder(str(tmp_path)).write()       # nothing created: nothing written
    assert placed.read(str(tmp_path)) is None


@pytest.mark.parametrize('text, says', [('{', 'not readable as JSON'), ('{"version": 9, "variables": []}', 'version 9'),
                                        ('{"version": 1, "variables": [{"name": "x"}]}', 'not a variables record'),
                                        ('[]', 'not a variables record')])
def test_a_damaged_file_is_named(tmp_path, text, says):
    with open(rundir.variables_path(str(tmp_path)), 'w') as f:
        f.write(text)
    with pytest.raises(ValueError, match=rf'^{tmp_path}/variables.json: .*{says}'):
        placed.read(str(tmp_path))


def test_the_load_of_a_recorded_run(tmp_path):
    """Two ps: the kernel (401,408 B) on ps:0, the bias and the int64 counter on ps:1, a chief-side
    variable left out; no moving averages and no accumulators (a coordinator run has neither);
    each worker step reads and sends every trainable variable once."""
    path = tmp_path / 'spec.yaml'
    path.write_text(yaml.safe_dump({'cluster': {'chief': ['a:1'], 'ps': ['a:2', 'b:2'], 'worker': ['c:1', 'd:1']},
                                    'train': {'program': 'mytrain:train', 'train_dir': str(tmp_path / 'run')}}))
    (tmp_path / 'mytrain.py').write_text('def train(ctx):\n    pass\n')
    spec = load_spec(str(path))
    recorded = [placed.PlacedVariable('kernel:0', (784, 128), 'float32', True, '/job:ps/task:0', 0),
                placed.PlacedVariable('bias:0', (128,), 'float32', True, '/job:ps/task:1', 1),
                placed.PlacedVariable('iterations:0', (), 'int64', False, '/job:ps/task:1', 1),
                placed.PlacedVariable('local:0', (10,), 'float32', True, '/job:chief/task:0', None),
                placed.PlacedVariable('names:0', (3,), 'string', False, '/job:ps/task:0', 0)]
    load = ps_load.run_load(spec, recorded, 'r-1')
    assert load is not None and not load.sync and load.placement == 'as that run did'
    assert [(p.task, p.bytes, p.weights_bytes, p.accumulator_bytes, p.in_per_step) for p in load.ps] == [
        ('ps:0', 401_408, 401_408, 0, 401_408), ('ps:1', 520, 512, 0, 512)]
    assert load.weights_bytes == 401_920 and load.wire_bytes == 401_920
    assert load.imbalance == pytest.approx(401_408 / (401_920 / 2))
    assert load.hot == ('kernel:0',)
    assert "as run r-1 placed them" in load.model
    assert json.loads(json.dumps(load.to_json()))['ps'][0]['task'] == 'ps:0'


def test_a_tf1_programs_meta_graph_gives_each_variable_its_ps_task(tmp_path):
    """A real TF1 graph, built as a train.program builds one (replica_device_setter over 2 ps
    tasks: round robin in creation order), exported as a Saver exports it beside a checkpoint."""
    import tensorflow as tf
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        with v1.device(v1.train.replica_device_setter(ps_tasks=2, worker_device='/job:worker/task:0')):
            step = v1.train.get_or_create_global_step()
            w = v1.get_variable('dense/kernel', [784, 128])
            b = v1.get_variable('dense/bias', [128])
            v1.get_variable('counts', [10], dtype=tf.int64, trainable=False)
            v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(w) + tf.reduce_sum(b), global_step=step)
        v1.train.export_meta_graph(str(tmp_path / 'model.ckpt-7.meta'))
    (tmp_path / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-7"\n')
    assert placed.newest_meta(str(tmp_path)) == str(tmp_path / 'model.ckpt-7.meta')
    got = placed.read_meta(str(tmp_path / 'model.ckpt-7.meta'))
    assert [(v.name, v.shape, v.dtype, v.trainable, v.ps) for v in got] == [
        ('global_step', (), 'int64', False, 0), ('dense/kernel', (784, 128), 'float32', True, 1),
        ('dense/bias', (128,), 'float32', True, 0), ('counts', (10,), 'int64', False, 1)]


def test_a_file_that_is_no_meta_graph_is_named(tmp_path):
    (tmp_path / 'model.ckpt-7.meta').write_bytes(b'\xff\x00 not a protobuf \x81\x82')
    with pytest.raises(ValueError, match=rf'^{tmp_path}/model.ckpt-7.meta: not readable as a TensorFlow meta graph'):
        placed.read_meta(str(tmp_path / 'model.ckpt-7.meta'))
    assert placed.newest_meta(str(tmp_path)) is None        # no index names it
