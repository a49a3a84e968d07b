"""A TF2 ParameterServerStrategy custom training loop: the CIFAR-10 tutorial CNN on synthetic data.

Run it with `launch up specs/pss-loop.yaml`. The chief calls `train(ctx)`: its variables are made
under `strategy.scope()`, so they live on the ps task; `coordinator.schedule` sends each step to
whichever worker is free (a lost worker's steps are sent again elsewhere). The evaluator task calls
`evaluate(ctx)` on each checkpoint the chief writes.

The model is written with `tf.Variable` and `tf.nn` ops in a `tf.Module` (the shape of
cluster/training/model.py's TF1 one), so this example needs no Keras at all.

The data are synthetic but learnable: each of the 10 classes has a fixed random image (its
template) and an example is its class's template plus noise, so the loss falls within a few
hundred steps and the evaluator's accuracy climbs.

PSS_STEPS_PER_JOIN (default 20) is how many steps are scheduled between two `coordinator.join()`:
more keeps the workers busier, fewer makes progress lines and graceful stops come sooner.
"""
from __future__ import annotations

import logging
import math
import os

import tensorflow as tf

log = logging.getLogger(__name__)

STEPS_PER_JOIN = int(os.environ.get('PSS_STEPS_PER_JOIN', '20'))
IMAGE_SIZE, CHANNELS, NUM_CLASSES = 24, 3, 10      # CIFAR-10's training crops
TEMPLATE_SEED = 7            # the classes' images: the same in training and evaluation
TRAIN_SEED, TEST_SEED = 11, 13
NOISE = 2.0                  # the noise's stddev, against templates of stddev 1
TEST_EXAMPLES = 1000
WEIGHT_DECAY = 0.004


class CifarCNN(tf.Module):
    """conv1 (5x5x64) -> max-pool -> LRN -> conv2 (5x5x64) -> LRN -> max-pool -> local3 (384) ->
    local4 (192) -> linear (10): the TensorFlow CIFAR-10 tutorial's network. Initial values come
    from stateless ops of `seed`, so every build of it starts from the same weights."""

    def __init__(self, seed: int = 1, image_size: int = IMAGE_SIZE, channels: int = CHANNELS) -> None:
        super().__init__(name='cifar10')
        pooled = math.ceil(math.ceil(image_size / 2) / 2)      # two 'SAME' pools of stride 2: 24 -> 12 -> 6
        flat = pooled * pooled * 64

        def weights(name: str, shape: list[int], stddev: float, k: int) -> tf.Variable:
            return tf.Variable(tf.random.stateless_truncated_normal(shape, seed=[seed, k], stddev=stddev), name=name)

        def biases(name: str, size: int, value: float) -> tf.Variable:
            return tf.Variable(tf.fill([size], value), name=name)

        self.conv1_w, self.conv1_b = weights('conv1_w', [5, 5, channels, 64], 5e-2, 1), biases('conv1_b', 64, 0.0)
        self.conv2_w, self.conv2_b = weights('conv2_w', [5, 5, 64, 64], 5e-2, 2), biases('conv2_b', 64, 0.1)
        self.local3_w, self.local3_b = weights('local3_w', [flat, 384], 0.04, 3), biases('local3_b', 384, 0.1)
        self.local4_w, self.local4_b = weights('local4_w', [384, 192], 0.04, 4), biases('local4_b', 192, 0.1)
        self.out_w, self.out_b = weights('out_w', [192, NUM_CLASSES], 1 / 192.0, 5), biases('out_b', NUM_CLASSES, 0.0)

    def __call__(self, images: tf.Tensor) -> tf.Tensor:
        def lrn(x: tf.Tensor) -> tf.Tensor:
            return tf.nn.lrn(x, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)

        x = tf.nn.relu(tf.nn.conv2d(images, self.conv1_w, 1, 'SAME') + self.conv1_b)
        x = lrn(tf.nn.max_pool2d(x, 3, 2, 'SAME'))
        x = tf.nn.relu(tf.nn.conv2d(x, self.conv2_w, 1, 'SAME') + self.conv2_b)
        x = tf.nn.max_pool2d(lrn(x), 3, 2, 'SAME')
        x = tf.reshape(x, [tf.shape(x)[0], -1])
        x = tf.nn.relu(tf.matmul(x, self.local3_w) + self.local3_b)
        x = tf.nn.relu(tf.matmul(x, self.local4_w) + self.local4_b)
        return tf.matmul(x, self.out_w) + self.out_b

    def weight_decay(self) -> tf.Tensor:
        """The tutorial's L2 penalty on the two fully connected layers."""
        return WEIGHT_DECAY * (tf.nn.l2_loss(self.local3_w) + tf.nn.l2_loss(self.local4_w))


def synthetic_batch(batch_size: int, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """One batch of (images, labels) drawn from `seed` (a shape [2] int tensor): the classes'
    templates plus Gaussian noise."""
    templates = tf.random.stateless_normal([NUM_CLASSES, IMAGE_SIZE, IMAGE_SIZE, CHANNELS], seed=[TEMPLATE_SEED, 0])
    labels = tf.random.stateless_uniform([batch_size], seed=seed, maxval=NUM_CLASSES, dtype=tf.int32)
    noise = tf.random.stateless_normal([batch_size, IMAGE_SIZE, IMAGE_SIZE, CHANNELS], seed=seed + 1, stddev=NOISE)
    return tf.gather(templates, labels) + noise, labels


def train_dataset(batch_size: int, seed: int = TRAIN_SEED) -> tf.data.Dataset:
    """An endless stream of synthetic batches; batch i is drawn from (seed, i)."""
    def make(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return synthetic_batch(batch_size, tf.stack([tf.constant(seed, tf.int64), i]))
    return tf.data.Dataset.counter().map(make).prefetch(2)


def test_set(examples: int = TEST_EXAMPLES) -> tuple[tf.Tensor, tf.Tensor]:
    return synthetic_batch(examples, tf.constant([TEST_SEED, 0], tf.int64))


def cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def learning_rate(ctx) -> float:
    """train.learning_rate, else the repository's default: 0.1 per 128 examples in a batch."""
    return ctx.train.learning_rate or 0.1 * ctx.train.batch_size / 128


def train(ctx) -> None:
    """Plain SGD, each worker applying its own steps to the ps's variables as they come (async)."""
    strategy = tf.distribute.ParameterServerStrategy(ctx.cluster_resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    batch, rate = ctx.train.batch_size, learning_rate(ctx)
    with strategy.scope():
        model = CifarCNN()
        step = tf.Variable(0, dtype=tf.int64, name='global_step')
    ctx.checkpoint(step, model=model, step=step)        # restores the newest checkpoint, if any

    @tf.function
    def per_worker_dataset() -> tf.distribute.DistributedDataset:
        return strategy.distribute_datasets_from_function(lambda _: train_dataset(batch))

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset))

    @tf.function
    def train_step(iterator: tf.distribute.DistributedIterator) -> tf.Tensor:
        def replica_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = cross_entropy(model(images), labels) + model.weight_decay()
            for variable, gradient in zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables)):
                variable.assign_sub(rate * gradient)
            step.assign_add(1)
            return loss
        return strategy.run(replica_step, args=next(iterator))

    done = int(step.numpy())
    while not ctx.should_stop():
        group = min(STEPS_PER_JOIN, ctx.train.steps - done)
        losses = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(group)]
        coordinator.join()
        done = int(step.numpy())
        ctx.report(done, sum(float(v.fetch()) for v in losses) / group, examples=group * batch)


def evaluate(ctx) -> None:
    """Each newest checkpoint: accuracy and loss on a fixed synthetic test set (no strategy: the
    evaluator is a process of its own, outside the training cluster)."""
    model = CifarCNN()
    images, labels = test_set()
    checkpoint = tf.train.Checkpoint(model=model)

    @tf.function
    def metrics() -> tuple[tf.Tensor, tf.Tensor]:
        logits = model(images)
        hits = tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.float32)
        return tf.reduce_mean(hits), cross_entropy(logits, labels)

    for path, step in ctx.checkpoints():
        try:
            checkpoint.restore(path).expect_partial()
        except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:     # deleted by the chief's rotation
            log.warning('could not read %s (%s): skipped', path, type(e).__name__)
            continue
        accuracy, loss = metrics()
        ctx.report(step, {'accuracy': float(accuracy), 'loss': float(loss)})
