"""Tests for cluster.checks.data.py: real files, real tf.data graphs, small sizes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cluster.checks import data
from cluster.training import inputs
from tests.harness.data import TEST_RECORDS, central_standardized, read_records, run_batches
from tests.conftest import REPO

tf.compat.v1.disable_eager_execution()


def write_labelled(directory, labels_per_file):
    """CIFAR binary files whose labels are chosen by the test, images random."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, labels in zip(data.TRAIN_FILES, labels_per_file):
        pixels = rng.integers(0, 256, size=(len(labels), 3072), dtype=np.uint8)
        records = np.concatenate([np.asarray(labels, np.uint8)[:, None], pixels], axis=1)
        records.tofile(os.path.join(directory, name))
    with open(os.path.join(directory, data.SYNTHETIC_MANIFEST), 'w') as f:    # sizes other than CIFAR-10's
        json.dump({'records_per_file': len(labels_per_file[0]), 'test_records': 1}, f)
    return directory


# --------------------------------------------------------------------------- files

@pytest.mark.slow
def test_import_does_not_load_tensorflow():
    code = 'import sys, cluster.checks.data; assert "tensorflow" not in sys.modules'
    root = REPO
    subprocess.run([sys.executable, '-c', code], check=True, cwd=root)


# --------------------------------------------------------------------------- pipelines

@pytest.mark.slow      # TensorFlow sessions, seconds each
def test_train_inputs_shapes_and_standardization(synth_dir):
    with tf.compat.v1.Graph().as_default():
        images, labels = inputs.train_inputs(synth_dir, 16, seed=1)
        assert images.shape.as_list() == [16, 24, 24, 3]
        assert labels.shape.as_list() == [16]
        assert images.dtype == tf.float32 and labels.dtype == tf.int32
        batches = run_batches((images, labels), 3)
    for x, y in batches:
        assert x.shape == (16, 24, 24, 3) and y.shape == (16,)
        flat = x.reshape(16, -1)
        np.testing.assert_allclose(flat.mean(axis=1), 0.0, atol=1e-3)
        np.testing.assert_allclose(flat.std(axis=1), 1.0, atol=1e-2)
        assert y.min() >= 0 and y.max() < 10


@pytest.mark.slow
def test_train_inputs_seed_is_deterministic(synth_dir):
    def first_batches(seed):
        with tf.compat.v1.Graph().as_default():
            return run_batches(inputs.train_inputs(synth_dir, 8, seed=seed), 2)

    a, b, c = first_batches(7), first_batches(7), first_batches(8)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(a[0][0], c[0][0])


@pytest.mark.slow
@pytest.mark.parametrize('num_shards', [2, 8])
def test_train_inputs_shards_read_disjoint_records(tmp_path, num_shards):
    # Record r carries label r % num_shards, so each shard must see exactly one label.
    labels = np.arange(5 * 16).reshape(5, 16) % num_shards
    directory = write_labelled(str(tmp_path), labels)
    for shard in sorted({0, num_shards // 2, num_shards - 1}):  # a session per shard is slow
        with tf.compat.v1.Graph().as_default():
            _, batch_labels = inputs.train_inputs(directory, 4, shard_index=shard,
                                                num_shards=num_shards, seed=0)
            seen = np.concatenate(run_batches(batch_labels, 3))
        assert set(seen) == {shard}
    with pytest.raises(ValueError):
        inputs.train_inputs(directory, 4, shard_index=2, num_shards=2)


@pytest.mark.slow
def test_a_reshardable_input_reads_the_shard_of_the_live_count_it_was_last_given(tmp_path):
    """Elastic async workers: the same input, re-initialised as the live count changes (2, then
    3, then 2 again), reads only its shard of the current count, so no two live workers share a
    record. Record r carries label r % 6, and shard i of M (M divides 6) sees labels l % M == i."""
    directory = write_labelled(str(tmp_path), np.arange(5 * 12).reshape(5, 12) % 6)
    with tf.compat.v1.Graph().as_default():
        (_, batch_labels), initialize = inputs.train_inputs(directory, 4, seed=0, reshardable=True)
        with tf.compat.v1.Session() as sess:
            for index, count in ((0, 2), (1, 2), (0, 3), (2, 3), (1, 2)):
                initialize(sess, index, count)
                seen = np.concatenate([sess.run(batch_labels) for _ in range(6)])
                assert set(seen) == {label for label in range(6) if label % count == index}, (index, count, seen)


@pytest.mark.slow
def test_eval_inputs_covers_each_test_record_once(synth_dir):
    records = read_records(os.path.join(synth_dir, data.TEST_FILE))
    with tf.compat.v1.Graph().as_default():
        images, labels = inputs.eval_inputs(synth_dir, 32)
        got_images, got_labels = [], []
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.OutOfRangeError):
                while True:
                    x, y = sess.run((images, labels))
                    got_images.append(x)
                    got_labels.append(y)
    assert [len(y) for y in got_labels] == [32, 32, TEST_RECORDS - 64]
    np.testing.assert_array_equal(np.concatenate(got_labels), records[:, 0])
    np.testing.assert_allclose(np.concatenate(got_images), central_standardized(records),
                               atol=1e-4)


@pytest.mark.slow
def test_deterministic_inputs_two_workers_match_one(tmp_path):
    directory = data.write_synthetic(str(tmp_path), records_per_file=4, test_records=1)
    b, steps = 3, 5
    with tf.compat.v1.Graph().as_default():
        single = run_batches(inputs.deterministic_inputs(directory, 2 * b), steps)
    workers = []
    for w in range(2):
        with tf.compat.v1.Graph().as_default():
            workers.append(run_batches(
                inputs.deterministic_inputs(directory, b, offset=w * b, stride=2 * b), steps))
    for k in range(steps):
        joined_x = np.concatenate([workers[0][k][0], workers[1][k][0]])
        joined_y = np.concatenate([workers[0][k][1], workers[1][k][1]])
        np.testing.assert_array_equal(joined_y, single[k][1])
        np.testing.assert_array_equal(joined_x, single[k][0])

