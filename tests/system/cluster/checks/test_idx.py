"""Fashion-MNIST and IDX data sets (cluster/checks/idx.py, data.py, inputs.py): the reader on the
Debian package's real files, one-line errors for missing and damaged files (small IDX files written
here), the model and the memory estimate on 28x28x1 images, and the tf.data pipelines on them."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from cluster.checks import data, idx
from cluster.training import inputs
from tests.conftest import need_fashion_mnist
from tests.harness.idx import PACKAGE

tf.compat.v1.disable_eager_execution()


@pytest.mark.slow      # TensorFlow sessions over the real 70,000 images
def test_the_real_test_split_is_read_once_and_training_batches_are_flipped_at_most():
    need_fashion_mnist()
    fashion = data.resolve_data('fashion-mnist', 'unused')
    test_labels = idx.read(idx.find(PACKAGE, 't10k-labels-idx1-ubyte'))
    train_images = idx.read(idx.find(PACKAGE, 'train-images-idx3-ubyte')).astype(np.float32)
    with tf.Graph().as_default():
        images, labels = inputs.eval_inputs(fashion, 1000)
        seen = []
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.OutOfRangeError):
                while True:
                    seen.append(sess.run(labels))
    np.testing.assert_array_equal(np.concatenate(seen), test_labels)
    with tf.Graph().as_default():
        batch_images, batch_labels = inputs.train_inputs(fashion, 64, seed=1)
        with tf.compat.v1.Session() as sess:
            x, y = sess.run((batch_images, batch_labels))
    assert x.shape == (64, 28, 28, 1) and set(y) <= set(range(10))
    np.testing.assert_allclose(x.reshape(64, -1).mean(axis=1), 0, atol=1e-3)
    # every training image is a record of the train split, as it is or mirrored left-right
    standardised = (train_images - train_images.mean(axis=(1, 2), keepdims=True)) / \
        np.maximum(train_images.std(axis=(1, 2), keepdims=True), 1 / 28)
    for image in x[:8, :, :, 0]:
        distance = np.minimum(np.abs(standardised - image).max(axis=(1, 2)),
                              np.abs(standardised[:, :, ::-1] - image).max(axis=(1, 2)))
        assert distance.min() < 1e-3

