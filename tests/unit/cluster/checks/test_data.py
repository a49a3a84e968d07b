"""Tests for cluster.checks.data.py: real files, real tf.data graphs, small sizes."""

import os

import numpy as np
import pytest
import tensorflow as tf

from cluster.checks import data
from cluster.training import inputs
from cluster.checks.data import DataError
from tests.harness.data import RECORDS_PER_FILE, TEST_RECORDS, central_standardized, read_records, run_batches

tf.compat.v1.disable_eager_execution()


def train_records(directory):
    return np.concatenate([read_records(os.path.join(directory, f)) for f in data.TRAIN_FILES])


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
