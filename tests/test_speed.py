"""The speed levers that are plain logic: where variables go (bytes, not turns) and the default
learning rate; and the benchmark's quick mode, which CI runs (figures printed, no speed asserted:
these machines are shared and noisy)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from cluster.spec import load_spec
from tests.conftest import REPO, write_spec


def _ps(n: int) -> list[str]:
    return [f'cluster.ps=[{", ".join(f"localhost:{3000 + i}" for i in range(n))}]']


@pytest.mark.parametrize('ps', [2, 3])
@pytest.mark.parametrize('sync', [True, False])
def test_no_ps_task_holds_more_than_60_percent_of_the_bytes(ps, sync):
    """Round-robin put the local3 weights (83% of the model) wherever their turn fell; split into
    one block per ps and placed by bytes, every ps carries about its share."""
    from cluster.training import train
    spec = load_spec(os.path.join(REPO, 'specs/local2.yaml'), _ps(ps) + [f'train.sync={str(sync).lower()}'])
    held = train.ps_bytes(spec)
    assert len(held) == ps and max(held) / sum(held) <= 0.6, held


def test_every_worker_places_every_variable_alike():
    """Placement is decided independently in every worker: it must come out the same."""
    import tensorflow as tf
    from cluster.training import train
    spec = load_spec(os.path.join(REPO, 'specs/local2.yaml'), _ps(2) + ['train.sync=false'])
    places = []
    for index in range(spec.num_workers):
        with tf.Graph().as_default() as graph:
            train.build_graph(spec, spec.task('worker', index), data_set=None)
            places.append({v.op.name: v.device for v in graph.get_collection('variables')})
    assert places[0] == places[1]


@pytest.mark.parametrize('ps', [1, 2])
def test_every_tower_reads_each_weight_once_per_step(ps):
    """Each read of a variable that lives on a ps is one transfer: the weight decay's L2 loss
    used to read the local3 weights (3.5 MB) a second time, 43% more bytes pulled per step."""
    import tensorflow as tf
    from cluster.training import train
    spec = load_spec(os.path.join(REPO, 'specs/local2.yaml'), _ps(ps) + ['train.devices=2'])
    with tf.Graph().as_default() as graph:
        train.build_graph(spec, spec.task('worker', 0), data_set=None)
        handles = sorted(v.handle.op.name for v in graph.get_collection('trainable_variables'))
        for tower in ('tower_0', 'tower_1'):       # the reads the tower's loss is computed from
            seen, todo, reads = set(), [graph.get_tensor_by_name(f'{tower}/total_loss:0').op], []
            while todo:
                op = todo.pop()
                if op.name not in seen:
                    seen.add(op.name)
                    todo.extend(t.op for t in op.inputs)
                    if op.type == 'ReadVariableOp':
                        reads.append(op.inputs[0].op.name)
            assert sorted(reads) == handles, tower


def test_the_async_moving_averages_are_computed_on_the_ps_tasks():
    """Under the worker's device function each average's update pulled the variable and its
    average to the worker and pushed the change back: three times the model's bytes on every
    update of the chief. Each is now computed where its variable lives."""
    import tensorflow as tf
    from cluster.training import train
    spec = load_spec(os.path.join(REPO, 'specs/local2.yaml'), _ps(2) + ['train.sync=false'])
    with tf.Graph().as_default() as graph:
        train.build_graph(spec, spec.task('worker', 0), data_set=None)
        placed = {op.device for op in graph.get_operations() if '/AssignMovingAvg' in op.name} - {''}
    assert placed == {'/job:ps/task:0', '/job:ps/task:1'}


@pytest.mark.slow
def test_tasks_import_tensorflow_without_keras_and_keras_still_imports():
    """TensorFlow imports Keras at import time for Keras' sake only; the ps tasks and the
    built-in trainer skip that (about a sixth of every task's start-up), and a later
    `import keras` still works."""
    code = ('import sys; from cluster.task import import_tensorflow; tf = import_tensorflow(keras=False); '
            'assert "keras" not in sys.modules and "tf_keras" not in sys.modules, "keras imported"; '
            'tf.compat.v1.train.Server; import keras; print("ok", keras.__name__)')
    out = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ['ok', 'keras'], out.stderr[-2000:]


def test_the_default_learning_rate_scales_with_the_examples_per_update(tmp_path):
    from cluster.training import model
    assert model.default_learning_rate(128) == pytest.approx(0.1)      # sync, 2 workers of 64: the tutorial's
    assert model.default_learning_rate(64) == pytest.approx(0.05)      # async, one worker's batch of 64
    assert load_spec(write_spec(tmp_path)).train.learning_rate is None
    assert load_spec(write_spec(tmp_path, learning_rate=0.2)).train.learning_rate == 0.2    # kept as given


@pytest.mark.slow
def test_the_benchmark_quick_mode_runs_and_writes_every_figure(tmp_path):
    out, plots = tmp_path / 'figures.json', tmp_path / 'plots'
    result = subprocess.run([sys.executable, 'benchmarks/bench.py', '--quick', '--json', str(out), '--plots', str(plots)],
                            cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures['quick'] is True
    cluster = figures['cluster']
    assert cluster['tf_import_s'] > 0 and cluster['single_images_per_sec'] > 0
    for mode in ('sync', 'async'):
        assert cluster[mode]['first_step_s'] > 0 and cluster[mode]['last_step_to_gone_s'] is not None
        assert cluster[f'tf1_{mode}']['first_step_s'] > 0      # the hand-written TF1 peer ran too
        assert set(cluster['ratios'][mode]) == {'launcher_vs_one_process', 'tf1_vs_one_process', 'launcher_vs_tf1'}
    assert set(figures['scaling']) == {'sync-2ps-2w'}
    assert figures['bytes']['loopback_bytes_per_sec'] > 0 and figures['bytes']['largest_ps_share']['2'] <= 0.6
    assert set(figures['learning']) == {'sync'}      # the full mode adds async (test_async_run_learns learns)
    assert set(figures['elastic']) == {'async'} and figures['elastic']['async']['scale_s'] > 0
    pss = figures['pss']        # TF2 ParameterServerStrategy against TF1 between-graph and one process
    assert pss['one_process_images_per_sec'] > 0 and pss['pss_join10']['first_step_s'] > 0
    assert pss['tf1_async']['first_step_s'] > 0 and 'vs_tf1_between_graph' in pss['pss_join10']
    accuracy = figures['accuracy']      # skipped only where dataset-fashion-mnist is missing, never under CI
    if 'skipped' not in accuracy or os.environ.get('CI') == 'true':
        assert set(accuracy['runs']) == {'single', 'sync'}, accuracy
        assert all(0 <= run['final'] <= 1 and run['points'] for run in accuracy['runs'].values()), accuracy
    assert ' one process' in result.stdout and ' one import' in result.stdout     # n/a where a run was too short
    # --plots: a picture of every section that ran (a too-short rate is drawn as n/a, never as zero)
    expected = {'1-cluster.png', '2-startup.png', '3-scaling.png', '4-elastic.png', '5-placement.png', '7-pss.png'}
    if 'skipped' not in accuracy:
        expected.add('6-accuracy.png')
    assert set(os.listdir(plots)) == expected, sorted(os.listdir(plots))
    for name in expected:
        assert_png(plots / name, quick=True)


def assert_png(path, quick: bool = False) -> None:
    """A plot decodes, is large enough to read and small enough for the site, and carries its caption."""
    import matplotlib.image
    from PIL import Image
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] >= 250 and pixels.shape[1] >= 800, (path, pixels.shape)
    assert 10_000 < os.path.getsize(path) < 200_000, (path, os.path.getsize(path))
    with Image.open(path) as im:
        text = im.text
    assert text['Title'] and text['Source'].startswith('python benchmarks/bench.py') and text['Creation Time'], text
    assert ('Quick mode' in text['Description']) == quick, text['Description']


def test_the_plots_redraw_a_saved_run_saying_what_is_missing(tmp_path):
    """`python benchmarks/plots.py FIGURES DIR` (its redraw, here in this process) draws each section a saved run has, from the JSON
    bench.py writes: a rate too short to measure (None) is no bar, a section that did not run no
    picture; the folder keeps only this run's pictures."""
    run = {'first_step_s': 5.8, 'exit_s': 40.0, 'steady_images_per_sec': 578.0, 'last_step_to_gone_s': 1.9,
           'startup': {'tasks_started_s': 0.5, 'servers_up_s': 4.7, 'chief_session_ready_s': 5.3}}
    short = dict(run, steady_images_per_sec=None)
    figures = {'quick': False, 'cores': 2, 'command': 'python benchmarks/bench.py --only cluster --only scaling',
               'date': '2026-11-26', 'settings': {'batch': 64, 'steps': 300, 'reps': 1},
               'cluster': {'tf_import_s': 4.4, 'single_images_per_sec': 640.0, 'sync': run, 'async': short,
                           'tf1_sync': run, 'tf1_async': short,
                           'ratios': {'sync': {'launcher_vs_one_process': 0.9, 'tf1_vs_one_process': 0.9,
                                               'launcher_vs_tf1': 1.0},
                                      'async': {'launcher_vs_one_process': None, 'tf1_vs_one_process': None,
                                                'launcher_vs_tf1': None}}},
               'scaling': {'sync-1ps-1w': run, 'sync-1ps-3w': short, 'async-2ps-2w': run}}
    (tmp_path / 'figures.json').write_text(json.dumps(figures))
    out = tmp_path / 'perf'
    out.mkdir()
    (out / '8-links.png').write_bytes(b'an older run')        # not this run's: removed
    (out / 'notes.txt').write_text('kept')
    spec = importlib.util.spec_from_file_location('plots', os.path.join(REPO, 'benchmarks', 'plots.py'))
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    written = plots.redraw(str(tmp_path / 'figures.json'), str(out))
    assert [os.path.basename(p) for p in written] == ['1-cluster.png', '2-startup.png', '3-scaling.png']
    assert sorted(os.listdir(out)) == ['1-cluster.png', '2-startup.png', '3-scaling.png', 'notes.txt']
    for name in ('1-cluster.png', '2-startup.png', '3-scaling.png'):
        assert_png(out / name)
