"""A TF2 ParameterServerStrategy `model.fit` program: the CIFAR-10 tutorial CNN in Keras layers.

Run it with `launch up specs/pss-keras.yaml`. The chief calls `train(ctx)`: the model and its
optimizer are made under `strategy.scope()` (their variables live on the ps task) and `model.fit`
sends executions of PSS_STEPS_PER_EXECUTION steps (default 10) to whichever worker is free. The
evaluator task calls `evaluate(ctx)`, Keras' SidecarEvaluator over the chief's checkpoints.

Keras under PSS is Keras 2: this imports `tf_keras` (pip install tf-keras), which is also what
`tf.keras` is with TF_USE_LEGACY_KERAS=1, as the launcher sets for every task of a coordinator run.

The data are examples/pss_loop.py's: synthetic, learnable (class templates plus noise).
cluster/keras_callbacks.py holds the glue between fit and the launcher: progress lines,
checkpoints model.ckpt-<step> in train_dir (the launcher reads the resume step from their names,
SidecarEvaluator the step to stop at), a graceful stop, BackupAndRestore.
"""
from __future__ import annotations

import os

import tensorflow as tf
import tf_keras as keras

from cluster import keras_callbacks
from examples.pss_loop import CHANNELS, IMAGE_SIZE, NUM_CLASSES, test_set, train_dataset

STEPS_PER_EXECUTION = int(os.environ.get('PSS_STEPS_PER_EXECUTION', '10'))
STEPS_PER_EPOCH = int(os.environ.get('PSS_STEPS_PER_EPOCH', '50'))     # BackupAndRestore backs up per epoch
EVAL_BATCH = 250
L2 = 0.002          # keras' l2(x) is x * sum(w^2): the tutorial's 0.004 * l2_loss (sum(w^2) / 2)


def local_response_norm(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.lrn(x, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)


def build_model(learning_rate: float, steps_per_execution: int = 1) -> keras.Model:
    """conv1 -> pool -> LRN -> conv2 -> LRN -> pool -> dense 384 -> dense 192 -> dense 10 (logits),
    compiled with plain SGD: the tutorial's network, as examples/pss_loop.py's CifarCNN."""
    seed = keras.initializers.TruncatedNormal
    layers = keras.layers
    model = keras.Sequential([
        keras.Input([IMAGE_SIZE, IMAGE_SIZE, CHANNELS]),
        layers.Conv2D(64, 5, padding='same', activation='relu', kernel_initializer=seed(stddev=5e-2, seed=1)),
        layers.MaxPool2D(3, 2, padding='same'),
        layers.Lambda(local_response_norm),
        layers.Conv2D(64, 5, padding='same', activation='relu', kernel_initializer=seed(stddev=5e-2, seed=2),
                      bias_initializer=keras.initializers.Constant(0.1)),
        layers.Lambda(local_response_norm),
        layers.MaxPool2D(3, 2, padding='same'),
        layers.Flatten(),
        layers.Dense(384, activation='relu', kernel_initializer=seed(stddev=0.04, seed=3),
                     bias_initializer=keras.initializers.Constant(0.1), kernel_regularizer=keras.regularizers.l2(L2)),
        layers.Dense(192, activation='relu', kernel_initializer=seed(stddev=0.04, seed=4),
                     bias_initializer=keras.initializers.Constant(0.1), kernel_regularizer=keras.regularizers.l2(L2)),
        layers.Dense(NUM_CLASSES, kernel_initializer=seed(stddev=1 / 192.0, seed=5)),
    ], name='cifar10')
    model.compile(optimizer=keras.optimizers.SGD(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=['accuracy'], steps_per_execution=steps_per_execution)
    return model


def learning_rate(ctx) -> float:
    """train.learning_rate, else the repository's default: 0.1 per 128 examples in a batch."""
    return ctx.train.learning_rate or 0.1 * ctx.train.batch_size / 128


def train(ctx) -> None:
    strategy = tf.distribute.ParameterServerStrategy(ctx.cluster_resolver)
    with strategy.scope():
        model = build_model(learning_rate(ctx), STEPS_PER_EXECUTION)
        model.optimizer.build(model.trainable_variables)    # its variables exist before the restore
    ctx.checkpoint(model.optimizer.iterations, model=model, optimizer=model.optimizer)
    plan = keras_callbacks.fit_epochs(ctx, STEPS_PER_EXECUTION, STEPS_PER_EPOCH)
    if int(model.optimizer.iterations.numpy()) >= ctx.train.steps:
        return          # a finished run started again: nothing left to train
    batch = ctx.train.batch_size
    data = keras.utils.experimental.DatasetCreator(lambda _: train_dataset(batch))
    model.fit(data, verbose=0, **plan,
              callbacks=[keras_callbacks.backup_and_restore(ctx), keras_callbacks.progress(ctx)])


def evaluate(ctx) -> None:
    """Keras' SidecarEvaluator on a fixed synthetic test set, each newest checkpoint in train_dir."""
    model = build_model(0.0)
    images, labels = test_set()
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(EVAL_BATCH)
    keras_callbacks.sidecar_evaluate(ctx, model, data)
