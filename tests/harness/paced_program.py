"""A `train.program` whose steps are paced (PACE_SECS each in every worker), so that a run of N
steps lasts at least N * PACE_SECS / workers seconds however fast the machine: for the tests that
act on a run midway (tests/system/launch/backends/test_standby_local.py)."""
import time

import tensorflow as tf

v1 = tf.compat.v1
PACE_SECS = 0.1


def train(ctx):
    """Asynchronous SGD of one weight, one paced step after another."""
    with tf.Graph().as_default():
        with v1.device(ctx.device_setter):
            step = v1.train.get_or_create_global_step()
            w = v1.get_variable('w', [], initializer=v1.zeros_initializer())
            x = v1.random.uniform([4], -1.0, 1.0)
            loss = tf.reduce_mean(tf.square(w * x - x))
            train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        with ctx.session() as sess:
            while not ctx.should_stop():
                _, n, value = sess.run([train_op, step, loss])
                ctx.report(n, value, examples=4)
                time.sleep(PACE_SECS)
