"""Small ParameterServerStrategy programs the coordinator-run tests run (a linear model: seconds,
not minutes): `train` with checkpoints and progress, `evaluate` for the evaluator task, and
`evaluate_broken`, an evaluator that fails at every checkpoint it gets.
TFCLUSTER_TEST_STEP_SECS paces the steps so that a test can kill a task mid-run;
TFCLUSTER_TEST_BALLAST_FLOATS adds a variable of that many floats to the checkpoints (4 bytes
each), so that a test can size them against a small disk."""
from __future__ import annotations

import os
import time

import tensorflow as tf

TRUE_W = [[1.0], [2.0], [3.0], [4.0]]
SCHEDULE = 10       # steps scheduled between two reports


def _data(seed: int) -> tuple[tf.Tensor, tf.Tensor]:
    x = tf.random.stateless_normal([1024, 4], seed=[seed, 7])
    return x, tf.matmul(x, TRUE_W) + 0.5


def _model() -> tuple[tf.Variable, tf.Variable, tf.Variable]:
    return tf.Variable(tf.zeros([4, 1]), name='w'), tf.Variable(0.0, name='b'), \
        tf.Variable(0, dtype=tf.int64, name='step')


def train(ctx):
    strategy = tf.distribute.ParameterServerStrategy(ctx.cluster_resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w, b, step = _model()
        ballast = tf.Variable(tf.zeros([int(os.environ.get('TFCLUSTER_TEST_BALLAST_FLOATS') or 1)]), name='ballast')
    ctx.checkpoint(step, w=w, b=b, step=step, ballast=ballast)
    pace = float(os.environ.get('TFCLUSTER_TEST_STEP_SECS') or 0)

    def dataset_fn():
        return tf.data.Dataset.from_tensor_slices(_data(1)).repeat().batch(32)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step_fn(it):
        x, y = next(it)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        gw, gb = tape.gradient(loss, [w, b])
        w.assign_sub(0.05 * gw)
        b.assign_sub(0.05 * gb)
        step.assign_add(1)
        return loss

    while not ctx.should_stop():
        losses = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(SCHEDULE)]
        coordinator.join()
        ctx.report(int(step.numpy()), float(losses[-1].fetch()), examples=32 * SCHEDULE)
        if pace:
            time.sleep(pace)


def evaluate(ctx):
    w, b, step = _model()
    checkpoint = tf.train.Checkpoint(w=w, b=b, step=step)
    x, y = _data(2)
    for path, at in ctx.checkpoints():
        checkpoint.restore(path).expect_partial()
        loss = float(tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y)))
        ctx.report(at, {'loss': loss})


def evaluate_broken(ctx):
    """An evaluator with a bug: it raises at the first checkpoint it is given."""
    for path, _at in ctx.checkpoints():
        raise ValueError(f'this evaluator cannot read {os.path.basename(path)}')
