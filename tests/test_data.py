"""Tests for cluster/checks/data.py: real files, real tf.data graphs, small sizes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cluster.checks import data
from cluster.training import inputs
from cluster.checks.data import DataError

tf.compat.v1.disable_eager_execution()

RECORDS_PER_FILE = 100
TEST_RECORDS = 70


@pytest.fixture(scope='module')
def synth_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp('synth')
    return data.write_synthetic(str(directory), records_per_file=RECORDS_PER_FILE,
                                test_records=TEST_RECORDS, seed=3)


def read_records(path):
    raw = np.fromfile(path, dtype=np.uint8)
    return raw.reshape(-1, data.RECORD_BYTES)


def train_records(directory):
    return np.concatenate([read_records(os.path.join(directory, f)) for f in data.TRAIN_FILES])


def central_standardized(records):
    """Numpy reference of the eval preprocessing: HWC image, central 24x24 crop, standardisation."""
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float64)
    crop = images[:, 4:28, 4:28, :].reshape(len(records), -1)
    mean = crop.mean(axis=1, keepdims=True)
    std = np.maximum(crop.std(axis=1, keepdims=True), 1.0 / np.sqrt(crop.shape[1]))
    return ((crop - mean) / std).reshape(-1, 24, 24, 3)


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


def run_batches(tensors, count):
    with tf.compat.v1.Session() as sess:
        return [sess.run(tensors) for _ in range(count)]


# --------------------------------------------------------------------------- files

@pytest.mark.slow
def test_import_does_not_load_tensorflow():
    code = 'import sys, cluster.checks.data; assert "tensorflow" not in sys.modules'
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, '-c', code], check=True, cwd=root)


def test_synthetic_files_are_cifar_binary(synth_dir):
    assert sorted(os.listdir(synth_dir)) == sorted(data.TRAIN_FILES + [data.TEST_FILE, data.SYNTHETIC_MANIFEST])
    for name in data.TRAIN_FILES:
        path = os.path.join(synth_dir, name)
        assert os.path.getsize(path) == RECORDS_PER_FILE * 3073
        labels = read_records(path)[:, 0]
        assert labels.max() < 10
        assert set(labels) == set(range(10))
    assert os.path.getsize(os.path.join(synth_dir, data.TEST_FILE)) == TEST_RECORDS * 3073


def test_synthetic_is_deterministic_for_a_seed(tmp_path):
    a = data.write_synthetic(str(tmp_path / 'a'), records_per_file=20, test_records=20, seed=5)
    b = data.write_synthetic(str(tmp_path / 'b'), records_per_file=20, test_records=20, seed=5)
    c = data.write_synthetic(str(tmp_path / 'c'), records_per_file=20, test_records=20, seed=6)
    for name in data.TRAIN_FILES + [data.TEST_FILE]:
        with open(os.path.join(a, name), 'rb') as fa, open(os.path.join(b, name), 'rb') as fb:
            assert fa.read() == fb.read()
    with open(os.path.join(a, data.TEST_FILE), 'rb') as fa, \
            open(os.path.join(c, data.TEST_FILE), 'rb') as fc:
        assert fa.read() != fc.read()
    assert not [f for f in os.listdir(a) if f.endswith('.tmp')]


def test_synthetic_classes_are_separable(synth_dir):
    """A nearest-class-mean classifier on the eval crops: a cheap check that the data is learnable."""
    train = train_records(synth_dir)
    test = read_records(os.path.join(synth_dir, data.TEST_FILE))
    x_train = central_standardized(train).reshape(len(train), -1)
    x_test = central_standardized(test).reshape(len(test), -1)
    means = np.stack([x_train[train[:, 0] == k].mean(axis=0) for k in range(10)])
    dists = ((x_test[:, None, :] - means[None]) ** 2).sum(axis=2)
    accuracy = (dists.argmin(axis=1) == test[:, 0]).mean()
    assert accuracy > 0.9


# --------------------------------------------------------------------------- validation

@pytest.fixture
def small_dir(tmp_path):
    return data.write_synthetic(str(tmp_path / 'cifar'), records_per_file=5, test_records=5)


def test_check_data_dir_returns_paths(small_dir):
    assert data.check_data_dir(small_dir) == [os.path.join(small_dir, f) for f in data.TRAIN_FILES]
    assert data.check_data_dir(small_dir, 'test') == [os.path.join(small_dir, data.TEST_FILE)]
    with pytest.raises(ValueError):
        data.check_data_dir(small_dir, 'validation')


def test_check_data_dir_missing_directory(tmp_path):
    missing = str(tmp_path / 'nowhere')
    with pytest.raises(DataError, match='nowhere.*does not exist'):
        data.check_data_dir(missing)


def test_check_data_dir_not_a_directory(tmp_path):
    path = tmp_path / 'file'
    path.write_bytes(b'x')
    with pytest.raises(DataError, match='not a directory') as info:
        data.check_data_dir(str(path))
    assert str(path) in str(info.value)


def test_check_data_dir_missing_file(small_dir):
    path = os.path.join(small_dir, 'data_batch_3.bin')
    os.remove(path)
    with pytest.raises(DataError, match='not found') as info:
        data.check_data_dir(small_dir)
    assert path in str(info.value)
    data.check_data_dir(small_dir, 'test')  # the test split does not need it


def test_check_data_dir_missing_test_file(small_dir):
    path = os.path.join(small_dir, data.TEST_FILE)
    os.remove(path)
    with pytest.raises(DataError) as info:
        data.check_data_dir(small_dir, 'test')
    assert path in str(info.value)


def test_check_data_dir_hints_at_extracted_subdir(tmp_path):
    data.write_synthetic(str(tmp_path / 'cifar-10-batches-bin'), records_per_file=2, test_records=2)
    with pytest.raises(DataError, match='did you mean .*cifar-10-batches-bin'):
        data.check_data_dir(str(tmp_path))


def test_check_data_dir_truncated_file(small_dir):
    path = os.path.join(small_dir, 'data_batch_2.bin')
    with open(path, 'r+b') as handle:
        handle.truncate(5 * 3073 - 7)
    with pytest.raises(DataError, match='not a multiple of the 3073-byte record') as info:
        data.check_data_dir(small_dir)
    assert path in str(info.value)
    assert '\n' not in str(info.value)


def test_check_data_dir_empty_file(small_dir):
    path = os.path.join(small_dir, 'data_batch_5.bin')
    open(path, 'wb').close()
    with pytest.raises(DataError, match='empty') as info:
        data.check_data_dir(small_dir)
    assert path in str(info.value)


# --------------------------------------------------------------------------- resolve_data

def test_resolve_data_synthetic_is_generated_once(tmp_path):
    train_dir = str(tmp_path / 'run')
    synthetic = data.resolve_data('synthetic', train_dir)
    directory = synthetic.directory
    assert directory == os.path.join(train_dir, 'synthetic-data')
    assert (synthetic.layout, synthetic.image_shape, synthetic.train_examples, synthetic.test_examples) == \
        (data.Layout.CIFAR10, (24, 24, 3), 5000, 1000)
    assert synthetic.epoch_examples == 50000      # the schedule's epoch, as for the real CIFAR-10
    data.check_data_dir(directory, 'train')
    data.check_data_dir(directory, 'test')
    names = data.TRAIN_FILES + [data.TEST_FILE]
    before = {n: os.stat(os.path.join(directory, n)).st_mtime_ns for n in names}
    assert data.resolve_data('synthetic', train_dir) == synthetic
    after = {n: os.stat(os.path.join(directory, n)).st_mtime_ns for n in names}
    assert before == after


def test_resolve_data_synthetic_repairs_a_damaged_cache(tmp_path):
    directory = data.resolve_data('synthetic', str(tmp_path)).directory
    open(os.path.join(directory, data.TEST_FILE), 'wb').close()
    data.resolve_data('synthetic', str(tmp_path))
    data.check_data_dir(directory, 'test')


def test_resolve_data_real_directory_expands_home(tmp_path, monkeypatch):
    monkeypatch.setenv('HOME', str(tmp_path))
    data.write_synthetic(str(tmp_path / 'cifar'), records_per_file=2, test_records=2)
    assert data.resolve_data('~/cifar', 'unused').directory == str(tmp_path / 'cifar')
    with pytest.raises(DataError, match='does not exist'):
        data.resolve_data('~/missing', 'unused')


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


def test_deterministic_inputs_record_order(tmp_path):
    directory = data.write_synthetic(str(tmp_path), records_per_file=3, test_records=1)
    records = train_records(directory)
    n = len(records)  # 15: a few batches are enough to wrap around
    expected = central_standardized(records)
    offset, batch = 4, 4
    with tf.compat.v1.Graph().as_default():
        batches = run_batches(inputs.deterministic_inputs(directory, batch, offset=offset), 6)
    for k, (x, y) in enumerate(batches):
        index = (offset + k * batch + np.arange(batch)) % n
        np.testing.assert_array_equal(y, records[index, 0])
        np.testing.assert_allclose(x, expected[index], atol=1e-4)


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


def test_check_data_dir_file_cut_to_whole_records(small_dir):
    path = os.path.join(small_dir, 'data_batch_3.bin')
    with open(path, 'r+b') as handle:
        handle.truncate(4 * 3073)
    with pytest.raises(DataError, match='has 4 records where its tfcluster-synthetic.json has 5') as info:
        data.check_data_dir(small_dir)
    assert path in str(info.value)


def test_check_data_dir_without_manifest_wants_the_real_sizes(small_dir):
    """A directory that is not tfcluster's synthetic set must hold CIFAR-10's 10,000 records per file."""
    os.remove(os.path.join(small_dir, data.SYNTHETIC_MANIFEST))
    with pytest.raises(DataError, match='data_batch_1.bin has 5 records where the real CIFAR-10 has 10000'):
        data.check_data_dir(small_dir)
