"""The speed levers that are plain logic: where variables go (bytes, not turns) and the default
learning rate; and the benchmark's quick mode, which CI runs (figures printed, no speed asserted:
these machines are shared and noisy)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.harness.speed import assert_png


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


@pytest.mark.slow
@pytest.mark.bench          # 3.5 minutes of benchmark runs: by hand (`python -m pytest -m bench`), not in CI
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

