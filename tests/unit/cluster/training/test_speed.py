"""The speed levers that are plain logic: where variables go (bytes, not turns) and the default
learning rate; and the benchmark's quick mode, which CI runs (figures printed, no speed asserted:
these machines are shared and noisy)."""
from __future__ import annotations

import importlib.util
import json
import os

import pytest

from cluster.spec import load_spec
from tests.conftest import REPO, write_spec
from tests.harness.speed import assert_png


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


def test_the_default_learning_rate_scales_with_the_examples_per_update(tmp_path):
    from cluster.training import model
    assert model.default_learning_rate(128) == pytest.approx(0.1)      # sync, 2 workers of 64: the tutorial's
    assert model.default_learning_rate(64) == pytest.approx(0.05)      # async, one worker's batch of 64
    assert load_spec(write_spec(tmp_path)).train.learning_rate is None
    assert load_spec(write_spec(tmp_path, learning_rate=0.2)).train.learning_rate == 0.2    # kept as given


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
