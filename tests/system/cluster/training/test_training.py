"""Proofs that the distributed training computes what it claims, on real clusters."""
from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from cluster.runtime import rundir
from tests.conftest import REPO, launch, launch_bg, need_fashion_mnist, read_until, write_spec
from tests.harness.training import results, summaries_in

# The tests that train on real clusters are marked slow one by one; those of the TensorBoard figures'
# builders and of the log line format run in-process, in the fast tier.

EXACT = {'deterministic': True, 'seed': 7, 'steps': 4}


def variables(train_dir: str) -> dict[str, np.ndarray]:
    import tensorflow as tf
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def checkpoints(train_dir: str) -> list[int]:
    return [int(re.search(r'ckpt-(\d+)', p).group(1)) for p in glob.glob(f'{train_dir}/model.ckpt-*.index')]


def latest_checkpoint_step(train_dir: str) -> int:
    """The step of the checkpoint a restart resumes from: the one the `checkpoint` file names (its
    .index file is written a moment before, so the newest .index may be one a stop cut short)."""
    with open(os.path.join(train_dir, 'checkpoint')) as f:
        return int(re.search(r'^model_checkpoint_path: ".*ckpt-(\d+)"', f.read(), re.M).group(1))


def run_ok(*args, **kw):
    result = launch(*args, **kw)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    return result


def assert_same_variables(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=2e-4, atol=2e-5, err_msg=name)


@pytest.mark.slow
def test_two_workers_or_two_towers_of_b_equal_one_of_2b(tmp_path):
    """Sync SGD is large-batch SGD: the same variables, step for step, however the batch is split."""
    runs = {'2 workers x b': dict(workers=2, batch_size=8),
            '1 worker x 2b': dict(workers=1, batch_size=16),
            '1 worker x 2 towers x b': dict(workers=1, batch_size=8, devices=2),
            '2 workers x 2 towers x half b, bfloat16': dict(workers=2, batch_size=4, devices=2, transfer_dtype='bfloat16')}
    found = {}
    for label, settings in runs.items():
        path = tmp_path / label.replace(' ', '').replace(',', '-')
        path.mkdir()
        workers = settings.pop('workers')
        run_ok('up', write_spec(path, workers=workers, **EXACT, **settings))
        found[label] = variables(str(path / 'run'))
        assert found[label]['global_step'] == EXACT['steps']
    start = found['1 worker x 2b']
    assert_same_variables(found['2 workers x b'], start)
    assert_same_variables(found['1 worker x 2 towers x b'], start)
    # ...and training did move the weights (the comparison is not between two initialisations).
    assert not np.allclose(start['cifar10/local3/weights'], start['cifar10/local3/weights/ExponentialMovingAverage'])
    # Weights and gradients sent as bfloat16 (8 bits of mantissa, a relative rounding of at most
    # 2**-9 per value) land near float32 large-batch SGD, not on it: the casts did happen, and the
    # error stays within what rounding each step's inputs can explain (the variables stay float32).
    half = found['2 workers x 2 towers x half b, bfloat16']
    assert sorted(half) == sorted(start)
    for name in start:
        moved = np.abs(start[name] - half[name]).max()
        np.testing.assert_allclose(half[name], start[name], rtol=1e-2, atol=1e-3, err_msg=name)
        assert name == 'global_step' or moved < 1e-2, (name, moved)
    assert any(np.abs(start[n] - half[n]).max() > 1e-7 for n in start if n.startswith('cifar10/'))


@pytest.mark.slow
def test_sync_is_large_batch_sgd_on_fashion_mnist_too(tmp_path):
    """The same proof on the real 28x28x1 images: one-channel conv1, a 7x7x64 local3."""
    need_fashion_mnist()
    found = {}
    for label, workers, batch_size in (('2 workers x b', 2, 8), ('1 worker x 2b', 1, 16)):
        path = tmp_path / label.replace(' ', '')
        path.mkdir()
        run_ok('up', write_spec(path, workers=workers, batch_size=batch_size, data='fashion-mnist', **EXACT))
        found[label] = variables(str(path / 'run'))
    start = found['1 worker x 2b']
    assert start['cifar10/conv1/weights'].shape == (5, 5, 1, 64) and start['global_step'] == EXACT['steps']
    assert_same_variables(found['2 workers x b'], start)
    assert not np.allclose(start['cifar10/local3/weights'], start['cifar10/local3/weights/ExponentialMovingAverage'])


# A short real run: one process reached 0.823 test precision@1 in these steps (batch 2 x 32, its
# rate 0.05; the cluster 0.818), and 0.805 / 0.802 in 300 (benchmarks/accuracy.py's trainer).
FASHION_STEPS, FASHION_BATCH, FASHION_FLOOR = 400, 32, 0.80


@pytest.mark.slow
def test_a_cluster_learns_fashion_mnist_as_one_process_does(tmp_path):
    """1 ps + 2 workers, sync, on the real Fashion-MNIST: `launch eval` reports precision@1 on the
    10,000 real test images, at least what one process reaches in the same steps."""
    need_fashion_mnist()
    spec = write_spec(tmp_path, data='fashion-mnist', steps=FASHION_STEPS, batch_size=FASHION_BATCH, log_every_secs=5)
    up = run_ok('up', spec)
    assert f'global step {FASHION_STEPS}' in up.stdout.splitlines()[-1], up.stdout[-2000:]
    evaluation = run_ok('eval', spec)
    found = re.search(r'precision @ 1 = ([\d.]+) \((\d+)/(\d+)\) at global step (\d+)', evaluation.stdout)
    assert found and found.group(3) == '10000' and found.group(4) == str(FASHION_STEPS), evaluation.stdout
    assert float(found.group(1)) >= FASHION_FLOOR, evaluation.stdout


@pytest.mark.slow
def test_backup_workers_each_step_takes_distinct_workers(tmp_path):
    """3 workers, 2 gradients a step: no worker ever contributes twice to one step, every step got
    at least 2 contributions, and the run ends at the requested step."""
    steps = 15
    run_ok('up', write_spec(tmp_path, workers=3, steps=steps, replicas_to_aggregate=2))
    per_step = {s: 0 for s in range(steps)}
    for r in results(str(tmp_path / 'run'), 3):
        assert r['global_step'] == steps
        applied = [s for lo, hi in r['applied_at'] for s in range(lo, hi + 1)]
        assert applied == sorted(set(applied)), f'{r["task"]} contributed twice to a step: {r["applied_at"]}'
        for s in applied:
            per_step[s] += 1
    assert all(n >= 2 for n in per_step.values()), per_step


@pytest.mark.slow
def test_interrupted_run_resumes_from_its_checkpoint_and_learns(tmp_path):
    spec = write_spec(tmp_path, steps=100000, batch_size=64, checkpoint_steps=10)
    train_dir = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    try:
        while not checkpoints(train_dir):       # stop it mid-run, once a checkpoint is written
            read_until(proc, 'step', timeout=240)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    saved = latest_checkpoint_step(train_dir)
    assert saved >= 10
    target = max(150, saved + 20)
    cause = 'restart 1/3: ps:0 was killed by SIGKILL'     # as the launcher sets it on a restart
    run_ok('up', spec, '--set', f'train.steps={target}', env={**os.environ, rundir.RESTART_ENV: cause})
    for r in results(train_dir, 2):
        assert r['first_global_step'] == saved      # continued, did not start over
        assert r['global_step'] == target
    assert summaries_in(train_dir)['restarts'] == [(saved, cause)]     # once, at the step restored
    evaluation = run_ok('eval', spec)
    precision = float(re.search(r'precision @ 1 = ([\d.]+)', evaluation.stdout).group(1))
    assert precision >= 0.9, evaluation.stdout
    assert f'global step {target}' in evaluation.stdout


@pytest.mark.slow
def test_async_run_learns(tmp_path):
    # The model's own rate for its batch (0.025): twice that is where stale async gradients turn
    # unstable (cluster/training/model.py), and a fresh-clone run once ended such a run at 0.81.
    spec = write_spec(tmp_path, steps=300, batch_size=32, sync=False)
    train_dir = str(tmp_path / 'run')
    up = run_ok('up', spec)
    evaluation = run_ok('eval', spec)
    precision = float(re.search(r'precision @ 1 = ([\d.]+)', evaluation.stdout).group(1))
    assert precision >= 0.9, evaluation.stdout
    # TensorBoard: the chief's figures in train_dir, each worker's steps under worker-N, and the
    # evaluation under eval at the checkpoint's global step; no restart, so no restart note.
    chief = summaries_in(train_dir)
    assert {'loss', 'learning_rate', 'images_per_sec'} <= set(chief) and 'restarts' not in chief, sorted(chief)
    rates = chief['images_per_sec']
    assert [s for s, _ in rates] == sorted(s for s, _ in rates) and rates[-1][0] >= 300, rates
    assert all(v > 0 for _, v in rates), rates
    for r in results(train_dir, 2):
        index = int(r['task'].split(':')[1])
        steps = summaries_in(os.path.join(train_dir, f'worker-{index}'))['worker_steps']
        assert steps[-1][0] >= 300 and steps[-1][1] == r['local_steps'], (r, steps)     # its last, at the end
        assert [v for _, v in steps] == sorted(v for _, v in steps) and steps[0][1] == 1, steps
    # the console shows the tasks' lines with their full time (ISO-8601, milliseconds, UTC offset)
    assert re.search(r'\] +\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d I step \d+/300 ', up.stdout), \
        up.stdout[-2000:]
    # `python -m cluster.eval`, as eval.py's docstring has it, evaluates the same checkpoint alike:
    # its main block once ran before the module had defined what evaluating a checkpoint calls.
    direct = subprocess.run([sys.executable, '-m', 'cluster.eval', '--spec', spec], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert direct.returncode == 0, direct.stdout + direct.stderr[-3000:]
    assert direct.stdout.strip() == evaluation.stdout.strip(), (direct.stdout, evaluation.stdout)
    # both evaluations went to TensorBoard, each at the checkpoint's global step
    evals = summaries_in(os.path.join(train_dir, 'eval'))['precision_at_1']
    step = int(re.search(r'at global step (\d+)', evaluation.stdout).group(1))     # async: 300 or a step past it
    assert [s for s, _ in evals] == [step, step] and all(abs(v - precision) < 1e-3 for _, v in evals), evals


@pytest.mark.slow
def test_eval_without_a_checkpoint_is_a_clear_error(tmp_path):
    result = launch('eval', write_spec(tmp_path), timeout=120)
    assert result.returncode == 2
    assert 'no checkpoint to evaluate' in result.stderr and result.stderr.strip().count('\n') == 0


REPORT_TO_A_GONE_PS = '''
import logging, os, signal, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
import tensorflow as tf
from cluster.runtime import session
from cluster.training import train
from cluster.spec import load_spec
v1 = tf.compat.v1
v1.disable_eager_execution()
spec = load_spec(sys.argv[1])
server = train.make_server(spec, spec.task('worker', 0))
session.DONE_TIMEOUT_MS = 3000
with tf.Graph().as_default():
    queue = session.done_queue(0, 1)
    done_ops = [queue.enqueue(0)]
    sess = v1.Session(server.target, config=v1.ConfigProto(device_filters=['/job:ps', '/job:worker/task:0']))
    sess.run(queue.size())                  # the session is up and the ps serves it
    os.kill(int(sys.argv[2]), signal.SIGKILL)
    time.sleep(1)
    t = time.monotonic()
    session.report_done(sess, done_ops)
    print(f'returned after {time.monotonic() - t:.1f}s', flush=True)
os._exit(0)
'''


@pytest.mark.slow
def test_a_worker_whose_ps_has_left_still_finishes(tmp_path):
    """The reply to the last "done" report can be lost when its ps exits right after taking it: the
    worker has finished training by then, so it warns and ends well instead of failing the run.
    Here the ps is killed outright once the worker's session is up."""
    spec = write_spec(tmp_path, workers=1)
    ps = subprocess.Popen([sys.executable, '-m', 'cluster.task', '--spec', spec, '--job', 'ps', '--index', '0'],
                          cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result = subprocess.run([sys.executable, '-c', REPORT_TO_A_GONE_PS, spec, str(ps.pid)], cwd=REPO,
                                capture_output=True, text=True, timeout=120)
    finally:
        ps.kill()
        ps.wait()
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'ps:0 did not acknowledge that this worker is done' in result.stdout, result.stdout
    assert float(re.search(r'returned after ([\d.]+)s', result.stdout).group(1)) < 10, result.stdout
