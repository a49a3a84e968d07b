"""Helpers of the tests of data, used by tests/system/cluster/training/test_data.py,
tests/unit/cluster/training/test_data.py: here, since no test module imports another."""


import numpy as np
import pytest
import tensorflow as tf

from cluster.checks import data

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


def central_standardized(records):
    """Numpy reference of the eval preprocessing: HWC image, central 24x24 crop, standardisation."""
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float64)
    crop = images[:, 4:28, 4:28, :].reshape(len(records), -1)
    mean = crop.mean(axis=1, keepdims=True)
    std = np.maximum(crop.std(axis=1, keepdims=True), 1.0 / np.sqrt(crop.shape[1]))
    return ((crop - mean) / std).reshape(-1, 24, 24, 3)


def run_batches(tensors, count):
    with tf.compat.v1.Session() as sess:
        return [sess.run(tensors) for _ in range(count)]

