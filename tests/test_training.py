"""Proofs that the distributed training computes what it claims, on real clusters."""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, launch, launch_bg, read_until, write_spec

pytestmark = pytest.mark.slow     # real clusters train

EXACT = {'deterministic': True, 'seed': 7, 'steps': 4}


def variables(train_dir: str) -> dict[str, np.ndarray]:
    import tensorflow as tf
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def results(train_dir: str, n: int) -> list[dict]:
    out = []
    for i in range(n):
        with open(os.path.join(train_dir, f'worker-{i}.json')) as f:
            out.append(json.load(f))
    return out


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


def test_two_workers_or_two_towers_of_b_equal_one_of_2b(tmp_path):
    """Sync SGD is large-batch SGD: the same variables, step for step, however the batch is split."""
    runs = {'2 workers x b': dict(workers=2, batch_size=8),
            '1 worker x 2b': dict(workers=1, batch_size=16),
            '1 worker x 2 towers x b': dict(workers=1, batch_size=8, devices=2)}
    found = {}
    for label, settings in runs.items():
        path = tmp_path / label.replace(' ', '')
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
    run_ok('up', spec, '--set', f'train.steps={target}')
    for r in results(train_dir, 2):
        assert r['first_global_step'] == saved      # continued, did not start over
        assert r['global_step'] == target
    evaluation = run_ok('eval', spec)
    precision = float(re.search(r'precision @ 1 = ([\d.]+)', evaluation.stdout).group(1))
    assert precision >= 0.9, evaluation.stdout
    assert f'global step {target}' in evaluation.stdout


def test_async_run_learns(tmp_path):
    spec = write_spec(tmp_path, steps=300, batch_size=32, sync=False, learning_rate=0.05)
    run_ok('up', spec)
    evaluation = run_ok('eval', spec)
    precision = float(re.search(r'precision @ 1 = ([\d.]+)', evaluation.stdout).group(1))
    assert precision >= 0.9, evaluation.stdout
    # `python -m cluster.eval`, as eval.py's docstring has it, evaluates the same checkpoint alike:
    # its main block once ran before the module had defined what evaluating a checkpoint calls.
    direct = subprocess.run([sys.executable, '-m', 'cluster.eval', '--spec', spec], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert direct.returncode == 0, direct.stdout + direct.stderr[-3000:]
    assert direct.stdout.strip() == evaluation.stdout.strip(), (direct.stdout, evaluation.stdout)


def test_eval_without_a_checkpoint_is_a_clear_error(tmp_path):
    result = launch('eval', write_spec(tmp_path), timeout=120)
    assert result.returncode == 2
    assert 'no checkpoint to evaluate' in result.stderr and result.stderr.strip().count('\n') == 0


REPORT_TO_A_GONE_PS = '''
import logging, os, signal, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
import tensorflow as tf
from cluster import session, train
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
