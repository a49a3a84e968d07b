"""Fashion-MNIST and IDX data sets (cluster/checks/idx.py, data.py, inputs.py): the reader on the
Debian package's real files, one-line errors for missing and damaged files (small IDX files written
here), the model and the memory estimate on 28x28x1 images, and the tf.data pipelines on them."""
from __future__ import annotations

import errno
import gzip
import os
import pwd
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

from cluster.spec import SpecError, load_spec
from cluster.checks import data, idx
from cluster.checks import memory
from cluster.training import inputs, model
from cluster.checks.data import DataError
from tests.conftest import idx_bytes, need_fashion_mnist, write_idx_set, write_spec
from tests.harness.idx import PACKAGE

tf.compat.v1.disable_eager_execution()
TRAIN_LABELS_START = [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]     # the data set's own first labels (ankle boot, T-shirt, ...)
TEST_LABELS_START = [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]


def one_line(error: BaseException) -> str:
    text = str(error)
    assert '\n' not in text, text
    return text


# --------------------------------------------------------------------------- the package's real files

def test_the_package_files_read_as_fashion_mnist():
    need_fashion_mnist()
    found = {}
    for split, count in (('train', 60000), ('test', 10000)):
        images_name, labels_name = idx.base_names(split)
        images = idx.read(idx.find(PACKAGE, images_name))
        labels = idx.read(idx.find(PACKAGE, labels_name))
        assert images.shape == (count, 28, 28) and images.dtype == np.uint8
        assert labels.shape == (count,)
        assert (images.min(), images.max()) == (0, 255)
        assert np.bincount(labels).tolist() == [count // 10] * 10      # balanced: 6,000 / 1,000 a class
        found[split] = labels
    assert found['train'][:10].tolist() == TRAIN_LABELS_START
    assert found['test'][:10].tolist() == TEST_LABELS_START


def test_fashion_mnist_in_the_spec_is_the_package_checked():
    need_fashion_mnist()
    fashion = data.resolve_data('fashion-mnist', 'unused')
    assert (fashion.name, fashion.directory, fashion.layout) == ('Fashion-MNIST', PACKAGE, data.Layout.IDX)
    assert (fashion.image_shape, fashion.train_examples, fashion.test_examples, fashion.num_classes) == \
        ((28, 28, 1), 60000, 10000, 10)
    assert fashion.epoch_examples == 60000 and fashion.augment is data.Augment.FLIP
    assert [os.path.basename(p) for p in data.check_split(fashion, 'test')] == \
        ['t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz']


# --------------------------------------------------------------------------- missing and damaged files

def test_a_missing_package_is_one_line_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(data, 'FASHION_MNIST_DIR', str(tmp_path / 'datasets' / 'fashion-mnist'))
    with pytest.raises(DataError) as caught:
        data.resolve_data('fashion-mnist', str(tmp_path))
    assert one_line(caught.value) == (
        f"fashion-mnist: Debian's package dataset-fashion-mnist is not installed (no {tmp_path}/datasets/"
        "fashion-mnist): install it with `apt-get install dataset-fashion-mnist`")
    spec = load_spec(write_spec(tmp_path, data='fashion-mnist'))
    with pytest.raises(SpecError) as caught:
        data.resolve_spec_data(spec)
    line = next(i for i, text in enumerate(open(spec.path), 1) if 'fashion-mnist' in text)
    assert one_line(caught.value).startswith(f'{spec.path}:{line}: train.data: fashion-mnist: ')


def damage(directory: str, how: str) -> str:
    """Damage one file of the IDX set in `directory` as `how` says; the path of the damaged file."""
    images = os.path.join(directory, 'train-images-idx3-ubyte.gz')
    labels = os.path.join(directory, 'train-labels-idx1-ubyte.gz')
    if how == 'gzip cut short':
        size = os.path.getsize(images)
        with open(images, 'r+b') as f:
            f.truncate(size - 100)
        return images
    if how == 'not gzip':
        with open(images, 'wb') as f:
            f.write(b'<html>404</html>')
        return images
    if how == 'labels gone':
        os.remove(labels)
        return labels[:-len('.gz')]
    payload = {'fewer records': idx_bytes(np.zeros((11, 28, 28))), 'not IDX': b'\x89PNG\r\n\x1a\n....',
               'too few bytes': idx_bytes(np.zeros((12, 28, 28)))[:-5],
               'label 10': idx_bytes(np.arange(12) % 10 + 1)}[how]
    target = labels if how == 'label 10' else images
    with gzip.open(target, 'wb') as f:
        f.write(payload)
    return target


DAMAGE = {
    'gzip cut short': r'is damaged \(Compressed file ended before the end-of-stream marker was reached, after',
    'not gzip': r'is damaged \(Not a gzipped file',
    'labels gone': r'train-labels-idx1-ubyte\[\.gz\] not found \(train split\)',
    'fewer records': 'holds 11 images but .*train-labels-idx1-ubyte.gz 12 labels: the files are of different sets',
    'not IDX': 'is not an IDX file',
    'too few bytes': 'has 9,419 bytes where its header \\(12x28x28\\) means 9,424: cut short',
    'label 10': 'holds label 10, but the model has 10 classes',
}


@pytest.mark.parametrize('how', DAMAGE)
def test_a_damaged_idx_file_is_one_line_naming_it(tmp_path, how):
    directory = write_idx_set(tmp_path / 'set')
    path = damage(directory, how)
    with pytest.raises(DataError) as caught:
        data.resolve_data(directory, 'unused')
    line = one_line(caught.value)
    assert line.startswith(f'IDX data set: {path}'), line
    assert re.search(DAMAGE[how], line), line
    assert line.endswith(': copy the data set there again'), line


def test_a_file_the_os_refuses_is_named_unreadable_not_damaged():
    """What open(2) of a mode-000 file raises for a user who may not read it (the suite runs as
    root, which reads it anyway: tests/system/launch/test_bad_input.py runs it for real without root's reads).
    The line names the file and the fix, and it is an Unreadable, which gets no re-copy advice;
    any other OSError is still damage."""
    path = '/data/mnist/train-images-idx3-ubyte.gz'
    for number in (errno.EACCES, errno.EPERM):
        refused = idx._read_error(path, PermissionError(number, os.strerror(number), path))
        assert isinstance(refused, idx.Unreadable)
        user = pwd.getpwuid(os.geteuid()).pw_name
        assert one_line(refused) == (f'cannot read {path}: permission denied; the user running the task ({user}) '
                                     'needs read access to it')
    failing = idx._read_error(path, OSError(errno.EIO, os.strerror(errno.EIO), path), ', after 0 bytes of 9')
    assert not isinstance(failing, idx.Unreadable) and one_line(failing).startswith(f'{path} is damaged (')
    assert idx.unreadable(path, FileNotFoundError(errno.ENOENT, 'gone', path)) is None


def test_a_damaged_package_file_says_reinstall_it(tmp_path, monkeypatch):
    package = write_idx_set(tmp_path / 'fashion-mnist')
    monkeypatch.setattr(data, 'FASHION_MNIST_DIR', package)
    assert data.resolve_data('fashion-mnist', 'unused').train_examples == 12
    path = damage(package, 'gzip cut short')
    with pytest.raises(DataError) as caught:
        data.resolve_data('fashion-mnist', 'unused')
    line = one_line(caught.value)
    assert line.startswith(f'Fashion-MNIST: {path} is damaged (')
    assert line.endswith(': reinstall it with `apt-get install --reinstall dataset-fashion-mnist`'), line


def test_a_test_split_of_another_shape_is_refused(tmp_path):
    directory = write_idx_set(tmp_path / 'set')
    write_idx_set(tmp_path / 'other', side=20)
    for name in idx.base_names('test'):
        shutil.copy(os.path.join(tmp_path / 'other', name + '.gz'), directory)
    data_set = data.resolve_data(directory, 'unused')      # the train split is fine
    with pytest.raises(DataError, match=r't10k-images-idx3-ubyte.gz holds 20x20x1 images, the train split 28x28x1'):
        data.check_split(data_set, 'test')


def test_a_directory_of_neither_layout_says_what_it_should_hold(tmp_path):
    (tmp_path / 'empty').mkdir()
    with pytest.raises(DataError) as caught:
        data.resolve_data(str(tmp_path / 'empty'), 'unused')
    assert "holds neither CIFAR-10's binary batches (data_batch_1.bin ... test_batch.bin) nor the IDX files of " \
        'MNIST or Fashion-MNIST (train-images-idx3-ubyte[.gz] ...)' in one_line(caught.value)


# --------------------------------------------------------------------------- the model on 28x28x1

def test_the_model_follows_the_images_shape():
    """conv1 takes one channel and local3 the 7x7 pooled maps of 28x28 images; the estimate
    counts the layers of that graph."""
    with tf.Graph().as_default() as graph:
        images = tf.zeros([1, 28, 28, 1])
        logits, _ = model.inference(images)
        shapes = {v.op.name: v.shape.as_list() for v in tf.compat.v1.global_variables()}
        kept = [images, logits] + [op.outputs[0] for op in graph.get_operations() if op.type in ('Relu', 'MaxPool', 'LRN')]
        floats = sum(t.shape.num_elements() for t in kept)
    assert shapes['cifar10/conv1/weights'] == [5, 5, 1, 64]
    assert shapes['cifar10/local3/weights'] == [7 * 7 * 64, 384]
    assert logits.shape.as_list() == [1, 10]
    assert floats == memory.activation_floats_per_example((28, 28, 1)) == 104_858
    assert memory.bytes_per_example((28, 28, 1)) == 419_432


def test_the_memory_estimate_uses_the_spec_data_set(tmp_path, monkeypatch):
    """The launcher's estimate takes the data set's image shape from its description (the
    package's headers, or MNIST's 28x28 where they cannot be read)."""
    monkeypatch.setattr(memory, 'host_memory_bytes', lambda meminfo=None: 8 << 30)
    monkeypatch.setattr(memory, 'gpus_here', lambda: 0)
    spec = load_spec(write_spec(tmp_path, data='fashion-mnist', batch_size=10_000_000))
    with pytest.raises(SpecError) as caught:
        memory.check_batch_memory(spec, spec.tasks)
    assert 'needs at least 3906.8 GiB' in one_line(caught.value)
    assert '419 KB of activations per 28x28x1 example' in str(caught.value)


def test_a_worker_graph_of_a_fashion_spec_has_its_shapes_without_reading_it(tmp_path, monkeypatch):
    """ps_bytes and placement build the graph from the data set's description alone."""
    from cluster.training import train
    monkeypatch.setattr(data, 'FASHION_MNIST_DIR', write_idx_set(tmp_path / 'fashion-mnist'))
    spec = load_spec(write_spec(tmp_path, data='fashion-mnist'))
    with tf.Graph().as_default() as graph:
        train.build_graph(spec, spec.task('worker', 0), data_set=None)
        shapes = {v.op.name: v.shape.as_list() for v in graph.get_collection('variables')}
    assert shapes['cifar10/conv1/weights'] == [5, 5, 1, 64]
    weights = (5 * 5 * 1 * 64 + 64) + (5 * 5 * 64 * 64 + 64) + (7 * 7 * 64 * 384 + 384) + (384 * 192 + 192) + \
        (192 * 10 + 10)
    assert sum(train.ps_bytes(spec)) == 2 * 4 * weights + 8     # the weights, their moving averages, the step


# --------------------------------------------------------------------------- the pipelines on IDX files

@pytest.mark.parametrize('gz', [True, False])
def test_idx_inputs_in_plain_order_are_the_files_standardised(tmp_path, gz):
    directory = write_idx_set(tmp_path / 'set', train=12, gz=gz)
    images = idx.read(idx.find(directory, 'train-images-idx3-ubyte')).astype(np.float64).reshape(12, -1)
    labels = idx.read(idx.find(directory, 'train-labels-idx1-ubyte'))
    mean = images.mean(axis=1, keepdims=True)
    std = np.maximum(images.std(axis=1, keepdims=True), 1 / np.sqrt(28 * 28))
    expected = ((images - mean) / std).reshape(12, 28, 28, 1)
    with tf.Graph().as_default():
        batch = inputs.deterministic_inputs(data.resolve_data(directory, 'unused'), 5, offset=3)
        with tf.compat.v1.Session() as sess:
            got = [sess.run(batch) for _ in range(3)]
    for k, (x, y) in enumerate(got):
        index = (3 + 5 * k + np.arange(5)) % 12
        assert x.shape == (5, 28, 28, 1)
        np.testing.assert_array_equal(y, labels[index])
        np.testing.assert_allclose(x, expected[index], atol=1e-4)


def test_the_fashion_spec_trains_the_package_in_sync_on_its_own_ports():
    """specs/fashion2.yaml, named in docs/getting-started.md beside specs/local2.yaml: 1 ps + 2 workers, sync,
    6.4 epochs of 2 x 64 images (0.90 came after 4.5 in docs/performance.md's accuracy table)."""
    from tests.conftest import REPO
    fashion, local2 = (load_spec(os.path.join(REPO, 'specs', name)) for name in ('fashion2.yaml', 'local2.yaml'))
    assert (fashion.num_ps, fashion.num_workers, fashion.train.sync) == (1, 2, True)
    assert fashion.train.data == 'fashion-mnist' and fashion.train.learning_rate is None
    assert fashion.train.steps * fashion.train.batch_size * 2 / 60000 >= 6
    assert not {t.port for t in fashion.tasks} & {t.port for t in local2.tasks}
