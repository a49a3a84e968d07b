"""The CIFAR-10 tutorial CNN, written with `tf.nn` ops and `get_variable` (Keras 3 removed
`tf.compat.v1.layers`).

conv1 (5x5x64) -> max-pool -> LRN -> conv2 (5x5x64) -> LRN -> max-pool -> local3 (384) ->
local4 (192) -> softmax_linear (10), with L2 weight decay on the two fully connected layers and the
tutorial's staircase learning-rate decay. Callers build it under a device function; variables are
created once and reused by every tower.
"""
from __future__ import annotations

import tensorflow as tf

from cluster.data import NUM_CLASSES

v1 = tf.compat.v1

NUM_EXAMPLES_PER_EPOCH = 50000
NUM_EPOCHS_PER_DECAY = 350.0
LEARNING_RATE_DECAY_FACTOR = 0.1
MOVING_AVERAGE_DECAY = 0.9999
WEIGHT_DECAY = 0.004


def _weight(name, shape, stddev, seed, partitions=1):
    """The weights' value, read once: every use of a variable reads it anew, and where the
    variable lives on a ps task every read is one more transfer of it (the weight decay's
    L2 loss would pull the local3 weights a second time each step)."""
    var = v1.get_variable(name, shape, dtype=tf.float32,
                          initializer=v1.truncated_normal_initializer(stddev=stddev, seed=seed),
                          partitioner=v1.fixed_size_partitioner(partitions) if partitions > 1 else None)
    return tf.identity(var, name=f'{name}_value')


def _bias(name, size, value):
    return v1.get_variable(name, [size], dtype=tf.float32, initializer=v1.constant_initializer(value))


def _lrn(x, name):
    return tf.nn.lrn(x, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, name=name)


def inference(images, seed=None, partitions=1):
    """images [batch, 24, 24, 3] -> (logits [batch, 10], weight-decay loss of this tower).

    Variables live under the `cifar10` scope with AUTO_REUSE, so the first tower creates them
    and the others share them. `partitions` > 1 splits the local3 weights (83% of the model's
    bytes) into that many row blocks, so a byte-balancing placement can spread them over the ps
    tasks; a checkpoint holds them whole either way.
    """
    def s(k):
        return None if seed is None else seed * 10 + k

    with v1.variable_scope('cifar10', reuse=v1.AUTO_REUSE):
        with v1.variable_scope('conv1'):
            w = _weight('weights', [5, 5, 3, 64], 5e-2, s(1))
            x = tf.nn.relu(tf.nn.conv2d(images, w, [1, 1, 1, 1], 'SAME') + _bias('biases', 64, 0.0))
        x = tf.nn.max_pool2d(x, 3, 2, 'SAME', name='pool1')
        x = _lrn(x, 'norm1')
        with v1.variable_scope('conv2'):
            w = _weight('weights', [5, 5, 64, 64], 5e-2, s(2))
            x = tf.nn.relu(tf.nn.conv2d(x, w, [1, 1, 1, 1], 'SAME') + _bias('biases', 64, 0.1))
        x = _lrn(x, 'norm2')
        x = tf.nn.max_pool2d(x, 3, 2, 'SAME', name='pool2')
        x = tf.reshape(x, [-1, 6 * 6 * 64])
        with v1.variable_scope('local3'):
            w3 = _weight('weights', [6 * 6 * 64, 384], 0.04, s(3), partitions)
            x = tf.nn.relu(tf.matmul(x, w3) + _bias('biases', 384, 0.1))
        with v1.variable_scope('local4'):
            w4 = _weight('weights', [384, 192], 0.04, s(4))
            x = tf.nn.relu(tf.matmul(x, w4) + _bias('biases', 192, 0.1))
        with v1.variable_scope('softmax_linear'):
            w = _weight('weights', [192, NUM_CLASSES], 1 / 192.0, s(5))
            logits = tf.matmul(x, w) + _bias('biases', NUM_CLASSES, 0.0)
    decay = tf.add(tf.nn.l2_loss(w3) * WEIGHT_DECAY, tf.nn.l2_loss(w4) * WEIGHT_DECAY, name='weight_decay')
    return logits, decay


def loss(logits, labels, decay):
    """Mean cross-entropy of the batch plus the weight decay: the tutorial's total loss."""
    xent = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int64), logits=logits), name='cross_entropy')
    return tf.add(xent, decay, name='total_loss')


BASE_LEARNING_RATE = 0.1      # the tutorial's rate...
BASE_EXAMPLES = 128           # ...for its batch of 128 examples per update


def default_learning_rate(examples_per_update: int) -> float:
    """The linear scaling rule: the tutorial's rate, scaled by the examples one update averages
    (a sync step: every aggregated worker's batch; an async update: one worker's). So 1 ps + 2
    workers of batch 64 gets 0.1 in sync mode and 0.05 in async mode, where stale gradients made
    0.1 unstable."""
    return BASE_LEARNING_RATE * examples_per_update / BASE_EXAMPLES


def learning_rate(global_step, initial, examples_per_step):
    """The tutorial's schedule: x0.1 every 350 epochs of 50,000 examples, as a staircase."""
    decay_steps = max(1, int(NUM_EXAMPLES_PER_EPOCH / examples_per_step * NUM_EPOCHS_PER_DECAY))
    return v1.train.exponential_decay(initial, global_step, decay_steps, LEARNING_RATE_DECAY_FACTOR,
                                      staircase=True, name='learning_rate')


def precision_at_1(logits, labels):
    """How many of the batch's top-1 predictions are right (a count, summed by the caller)."""
    return tf.reduce_sum(tf.cast(tf.nn.in_top_k(predictions=logits, targets=tf.cast(labels, tf.int32), k=1),
                                 tf.int32))
