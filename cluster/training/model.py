"""The CIFAR-10 tutorial CNN, written with `tf.nn` ops and `get_variable` (Keras 3 removed
`tf.compat.v1.layers`).

conv1 (5x5x64) -> max-pool -> LRN -> conv2 (5x5x64) -> LRN -> max-pool -> local3 (384) ->
local4 (192) -> softmax_linear (10), with L2 weight decay on the two fully connected layers and the
tutorial's staircase learning-rate decay. Callers build it under a device function; variables are
created once and reused by every tower.

The network follows its images' shape (CIFAR-10's 24x24x3 crops, Fashion-MNIST's 28x28x1): conv1
takes their channels and local3 the pooled size, so the layers and their widths stay the
tutorial's whatever the data set (cluster/checks/data.py: DataSet.image_shape).

TensorFlow is imported by the functions that build the graph, not by this module. The layers' widths
live in cluster/checks/memory.py, which the launcher reads for the memory a batch needs without
importing the model.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cluster.checks import data
from cluster.checks.data import NUM_CLASSES
from cluster.checks.memory import CONV_FILTERS, LOCAL3, LOCAL4, pooled

if TYPE_CHECKING:
    import tensorflow as tf


    Read = Callable[[Any], tf.Tensor]       # a variable, or a partitioned one, to the value its towers use

NUM_EXAMPLES_PER_EPOCH = data.CIFAR10_TRAIN_EXAMPLES      # the schedule's epoch for CIFAR-10
NUM_EPOCHS_PER_DECAY = 350.0
LEARNING_RATE_DECAY_FACTOR = 0.1
MOVING_AVERAGE_DECAY = 0.9999
WEIGHT_DECAY = 0.004




def _weight(name: str, shape: list[int], stddev: float, seed: int | None, partitions: int = 1,
            read: Read | None = None) -> tf.Tensor:
    """The weights' value, read once: every use of a variable reads it anew, and where the
    variable lives on a ps task every read is one more transfer of it (the weight decay's
    L2 loss would pull the local3 weights a second time each step). `read(variable)`, if given,
    makes that one read (a cluster worker shares it between its towers)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    var = v1.get_variable(name, shape, dtype=tf.float32,
                          initializer=v1.truncated_normal_initializer(stddev=stddev, seed=seed),
                          partitioner=v1.fixed_size_partitioner(partitions) if partitions > 1 else None)
    return read(var) if read else tf.identity(var, name=f'{name}_value')


def _bias(name: str, size: int, value: float, read: Read | None = None) -> tf.Tensor:
    import tensorflow as tf
    v1 = tf.compat.v1
    var = v1.get_variable(name, [size], dtype=tf.float32, initializer=v1.constant_initializer(value))
    return read(var) if read else var


def _lrn(x: tf.Tensor, name: str) -> tf.Tensor:
    import tensorflow as tf
    return tf.nn.lrn(x, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, name=name)


def inference(images: tf.Tensor, seed: int | None = None, partitions: int = 1,
              read: Read | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """images [batch, height, width, channels] -> (logits [batch, 10], weight-decay loss of this
    tower). The images' static shape sets conv1's input channels and local3's input width
    (CIFAR-10's [batch, 24, 24, 3] gives the tutorial's network).

    Variables live under the `cifar10` scope with AUTO_REUSE, so the first tower creates them
    and the others share them. `partitions` > 1 splits the local3 weights (83% of the model's
    bytes) into that many row blocks, so a byte-balancing placement can spread them over the ps
    tasks; a checkpoint holds them whole either way. `read(variable)`, if given, is how every
    variable's value is read (see _weight).
    """
    import tensorflow as tf
    v1 = tf.compat.v1

    def s(k: int) -> int | None:
        return None if seed is None else seed * 10 + k

    height, width, channels = images.shape[1:]
    # The scope keeps the tutorial's name on every data set: checkpoints and eval find it there.
    with v1.variable_scope('cifar10', reuse=v1.AUTO_REUSE):
        with v1.variable_scope('conv1'):
            w = _weight('weights', [5, 5, channels, CONV_FILTERS], 5e-2, s(1), read=read)
            x = tf.nn.relu(tf.nn.conv2d(images, w, [1, 1, 1, 1], 'SAME') + _bias('biases', CONV_FILTERS, 0.0, read))
        x = tf.nn.max_pool2d(x, 3, 2, 'SAME', name='pool1')
        x = _lrn(x, 'norm1')
        with v1.variable_scope('conv2'):
            w = _weight('weights', [5, 5, CONV_FILTERS, CONV_FILTERS], 5e-2, s(2), read=read)
            x = tf.nn.relu(tf.nn.conv2d(x, w, [1, 1, 1, 1], 'SAME') + _bias('biases', CONV_FILTERS, 0.1, read))
        x = _lrn(x, 'norm2')
        x = tf.nn.max_pool2d(x, 3, 2, 'SAME', name='pool2')
        flat = pooled(pooled(height)) * pooled(pooled(width)) * CONV_FILTERS     # CIFAR-10: 6 x 6 x 64
        x = tf.reshape(x, [-1, flat])
        with v1.variable_scope('local3'):
            w3 = _weight('weights', [flat, LOCAL3], 0.04, s(3), partitions, read)
            x = tf.nn.relu(tf.matmul(x, w3) + _bias('biases', LOCAL3, 0.1, read))
        with v1.variable_scope('local4'):
            w4 = _weight('weights', [LOCAL3, LOCAL4], 0.04, s(4), read=read)
            x = tf.nn.relu(tf.matmul(x, w4) + _bias('biases', LOCAL4, 0.1, read))
        with v1.variable_scope('softmax_linear'):
            w = _weight('weights', [LOCAL4, NUM_CLASSES], 1 / float(LOCAL4), s(5), read=read)
            logits = tf.matmul(x, w) + _bias('biases', NUM_CLASSES, 0.0, read)
    decay = tf.add(tf.nn.l2_loss(w3) * WEIGHT_DECAY, tf.nn.l2_loss(w4) * WEIGHT_DECAY, name='weight_decay')
    return logits, decay


def loss(logits: tf.Tensor, labels: tf.Tensor, decay: tf.Tensor) -> tf.Tensor:
    """Mean cross-entropy of the batch plus the weight decay: the tutorial's total loss."""
    import tensorflow as tf
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


def learning_rate(global_step: tf.Tensor, initial: float, examples_per_step: int,
                  epoch_examples: int = NUM_EXAMPLES_PER_EPOCH) -> tf.Tensor:
    """The tutorial's schedule: x0.1 every 350 epochs (of 50,000 examples for CIFAR-10, the data
    set's `epoch_examples` otherwise), as a staircase."""
    import tensorflow as tf
    v1 = tf.compat.v1
    decay_steps = max(1, int(epoch_examples / examples_per_step * NUM_EPOCHS_PER_DECAY))
    return v1.train.exponential_decay(initial, global_step, decay_steps, LEARNING_RATE_DECAY_FACTOR,
                                      staircase=True, name='learning_rate')


def precision_at_1(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """How many of the batch's top-1 predictions are right (a count, summed by the caller)."""
    import tensorflow as tf
    return tf.reduce_sum(tf.cast(tf.nn.in_top_k(predictions=logits, targets=tf.cast(labels, tf.int32), k=1),
                                 tf.int32))
