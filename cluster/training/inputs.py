"""tf.data input pipelines of every data set (cluster/checks/data.py describes them): endless
shuffled, distorted training batches, one pass over the test split, and plain-order batches for
exactness checks.

The pipelines are TF1-style graph-mode tensors (``tf.compat.v1``; the caller has disabled eager
execution). TensorFlow is imported inside the functions that build graphs.

What differs between data sets is where the records come from and how one becomes an image and a
label (`_records`, by the set's layout), and which distortions train on it (`_AUGMENTS`, by its
Augment). CIFAR-10's are the tutorial's, op for op as they always were.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from cluster.checks import data, idx
from cluster.checks.data import RAW_SIZE, RECORD_BYTES, Augment, DataSet, Layout

if TYPE_CHECKING:
    import tensorflow as tf

    Batch = tuple[tf.Tensor, tf.Tensor]         # images, labels

# Explicit small parallelism: AUTOTUNE would need tf.data autotuning, which we switch off because
# it can make Session.close() hang for ~10 s.
_PARALLEL_CALLS = 2
_PREFETCH_BATCHES = 2
_SHUFFLE_BUFFER = 10000


class _Reader(NamedTuple):
    """A split's records, and the two ways of turning one into (image, label)."""
    records: tf.data.Dataset
    central: Callable[..., Batch]            # a record's elements -> undistorted (image, label)
    distorted: Callable[..., Batch]          # (a [2] stateless seed, a record) -> distorted (image, label)


def _data_set(source: DataSet | str) -> DataSet:
    """A DataSet as it is; a directory (CIFAR-10's binary batches or IDX files) as `data` names it."""
    return source if isinstance(source, DataSet) else data.describe(source, '')


def _reader(data_set: DataSet, split: str) -> _Reader:
    """The split's records, read as the data set's layout says, with its distortions: records come
    as one tensor (CIFAR-10) or as (image, label) pairs (IDX), and a Dataset.map hands a pair's
    parts over as arguments of their own."""
    records, decode = _records(data_set, split)
    undistorted, distort = _AUGMENTS[data_set.augment]

    def central(*element: tf.Tensor) -> Batch:
        image, label = decode(*element)
        return undistorted(image), label

    def distorted(element_seed: tf.Tensor, record: tf.Tensor | tuple[tf.Tensor, ...]) -> Batch:
        image, label = decode(*record) if isinstance(record, tuple) else decode(record)
        return distort(element_seed, image), label
    return _Reader(records, central, distorted)


def _records(data_set: DataSet, split: str) -> tuple[tf.data.Dataset, Callable[..., Batch]]:
    """(the split's records, how one becomes a float32 image in 0..255 and an int32 label)."""
    import tensorflow as tf
    if data_set.layout is Layout.CIFAR10:
        files = data.check_data_dir(data_set.directory, split)
        return tf.data.FixedLengthRecordDataset(files, RECORD_BYTES), _decode
    return _idx_records(data_set, split)


# --------------------------------------------------------------------------- CIFAR-10

def _decode(record: tf.Tensor) -> Batch:
    """Raw record -> (float32 [32,32,3] image in 0..255, int32 label)."""
    import tensorflow as tf
    raw = tf.io.decode_raw(record, tf.uint8)
    label = tf.cast(raw[0], tf.int32)
    chw = tf.reshape(raw[1:RECORD_BYTES], [3, RAW_SIZE, RAW_SIZE])
    image = tf.cast(tf.transpose(chw, [1, 2, 0]), tf.float32)
    return image, label


def _central_crop(image: tf.Tensor) -> tf.Tensor:
    """CIFAR-10 for evaluation: the central 24x24 crop, standardised."""
    import tensorflow as tf
    image = tf.image.resize_with_crop_or_pad(image, data.IMAGE_SIZE, data.IMAGE_SIZE)
    image = tf.image.per_image_standardization(image)
    image.set_shape([data.IMAGE_SIZE, data.IMAGE_SIZE, 3])
    return image


def _tutorial_distortions(element_seed: tf.Tensor, image: tf.Tensor) -> tf.Tensor:
    """The tutorial's training distortions, made with stateless ops from a per-element seed.

    Stateless ops keep a seeded pipeline deterministic although the map runs in parallel.
    """
    import tensorflow as tf
    seeds = tf.random.experimental.stateless_split(element_seed, num=4)
    image = tf.image.stateless_random_crop(image, [data.IMAGE_SIZE, data.IMAGE_SIZE, 3], seed=seeds[0])
    image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    image = tf.image.stateless_random_brightness(image, max_delta=63, seed=seeds[2])
    image = tf.image.stateless_random_contrast(image, lower=0.2, upper=1.8, seed=seeds[3])
    image = tf.image.per_image_standardization(image)
    image.set_shape([data.IMAGE_SIZE, data.IMAGE_SIZE, 3])
    return image


# --------------------------------------------------------------------------- IDX (MNIST, Fashion-MNIST)

def _idx_records(data_set: DataSet, split: str) -> tuple[tf.data.Dataset, Callable[..., Batch]]:
    """The split's images and labels files read side by side, record by record: each file is a
    fixed-length record file behind its header, gzip or plain, so nothing is held in memory or
    put into the graph (a constant of 47 MB would travel with every session's graph)."""
    import tensorflow as tf
    found = idx.headers(data_set.directory, split)
    shape = list(data_set.stored_shape)
    files = [tf.data.FixedLengthRecordDataset(file.path, size, header_bytes=file.header_bytes,
                                              compression_type='GZIP' if file.gzipped else '')
             for file, size in ((found.images, shape[0] * shape[1] * shape[2]), (found.labels, 1))]

    def decode(image_bytes: tf.Tensor, label_byte: tf.Tensor) -> Batch:
        image = tf.cast(tf.reshape(tf.io.decode_raw(image_bytes, tf.uint8), shape), tf.float32)
        return image, tf.cast(tf.io.decode_raw(label_byte, tf.uint8)[0], tf.int32)
    return tf.data.Dataset.zip((files[0], files[1])), decode


def _standardised(image: tf.Tensor) -> tf.Tensor:
    """The whole image, standardised (zero mean, unit variance per image)."""
    import tensorflow as tf
    return tf.image.per_image_standardization(image)


def _flipped(element_seed: tf.Tensor, image: tf.Tensor) -> tf.Tensor:
    """The whole image, mirrored left-right for half of the seeds, standardised."""
    import tensorflow as tf
    return _standardised(tf.image.stateless_random_flip_left_right(image, seed=element_seed))


# Augment -> (the undistorted image: eval and exactness runs, the distorted one: training)
_AUGMENTS: dict[Augment, tuple[Callable[[tf.Tensor], tf.Tensor], Callable[[tf.Tensor, tf.Tensor], tf.Tensor]]] = {
    Augment.CIFAR10: (_central_crop, _tutorial_distortions),
    Augment.FLIP: (_standardised, _flipped),
}


# --------------------------------------------------------------------------- the pipelines

def _options() -> tf.data.Options:
    import tensorflow as tf
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def _plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn for Dataset.map as it is: these functions have no Python control flow for AutoGraph to
    convert, and converting them was a third of a worker's graph building (0.4 s of its start-up)."""
    import tensorflow as tf
    return tf.autograph.experimental.do_not_convert(fn)


def _get_next(dataset: tf.data.Dataset) -> Batch:
    import tensorflow as tf
    dataset = dataset.prefetch(_PREFETCH_BATCHES).with_options(_options())
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def train_inputs(source: DataSet | str, batch_size: int, shard_index: int = 0, num_shards: int = 1,
                 seed: int | None = None,
                 reshardable: bool = False) -> Batch | tuple[Batch, Callable[[tf.compat.v1.Session, int, int], None]]:
    """Endless shuffled, distorted training batches for worker `shard_index` of `num_shards`.

    `source` is a DataSet, or a directory as `train.data` names one. Sharding is by record
    (record r goes to shard r % num_shards), so any number of shards works whatever the number
    of files.  With `seed` the stream (shuffle and distortions) is reproducible; without one
    every call draws a fresh seed.

    With `reshardable`, the shard is chosen when the returned `initialize(sess, index, count)` is
    run (again whenever the workers that share the records change): returns (batch, initialize).
    """
    import tensorflow as tf
    data_set = _data_set(source)
    if reshardable:
        index_ph = tf.compat.v1.placeholder_with_default(tf.constant(0, tf.int64), [], name='shard_index')
        count_ph = tf.compat.v1.placeholder_with_default(tf.constant(1, tf.int64), [], name='num_shards')
        ds = _train_dataset(data_set, batch_size, index_ph, count_ph, seed)
        iterator = tf.compat.v1.data.make_initializable_iterator(
            ds.prefetch(_PREFETCH_BATCHES).with_options(_options()))

        def initialize(sess: tf.compat.v1.Session, index: int, count: int) -> None:
            sess.run(iterator.initializer, feed_dict={index_ph: index, count_ph: count})
        return iterator.get_next(), initialize
    if not 0 <= shard_index < num_shards:
        raise ValueError('shard_index %r is not in [0, %r)' % (shard_index, num_shards))
    return _get_next(_train_dataset(data_set, batch_size, shard_index, num_shards, seed))


def _train_dataset(data_set: DataSet, batch_size: int, shard_index: int | tf.Tensor, num_shards: int | tf.Tensor,
                   seed: int | None) -> tf.data.Dataset:
    import tensorflow as tf
    if seed is None:
        seed = int.from_bytes(os.urandom(4), 'little') & 0x7FFFFFFF
    with tf.compat.v1.device('/cpu:0'):
        reader = _reader(data_set, 'train')
        ds = reader.records.shard(tf.cast(num_shards, tf.int64), tf.cast(shard_index, tf.int64))
        ds = ds.shuffle(_SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True).repeat()
        # Element k of shard s gets the stateless seed (seed, k * num_shards + s): unique per record
        # visit across epochs and across workers.
        ds = ds.enumerate().map(
            _plain(lambda k, rec: reader.distorted(
                tf.stack([tf.constant(seed, tf.int64),
                          k * tf.cast(num_shards, tf.int64) + tf.cast(shard_index, tf.int64)]), rec)),
            num_parallel_calls=_PARALLEL_CALLS)
        return ds.batch(batch_size, drop_remainder=True)


def eval_inputs(source: DataSet | str, batch_size: int) -> Batch:
    """One pass over the test split in file order, undistorted (CIFAR-10: centrally cropped); the
    last batch may be short."""
    import tensorflow as tf
    with tf.compat.v1.device('/cpu:0'):
        reader = _reader(_data_set(source), 'test')
        ds = reader.records.map(_plain(reader.central), num_parallel_calls=_PARALLEL_CALLS)
        ds = ds.batch(batch_size, drop_remainder=False)
        return _get_next(ds)


def deterministic_inputs(source: DataSet | str, batch_size: int, offset: int = 0, stride: int | None = None) -> Batch:
    """Undistorted, unshuffled training batches in plain record order, for exactness tests.

    Number the N training records 0..N-1 in file order (CIFAR-10: data_batch_1.bin first, record
    order within each file).  Batch k (k = 0, 1, ...) holds, in this order, the records

        (offset + k * stride + j) mod N      for j = 0 .. batch_size - 1

    with `stride` defaulting to `batch_size` (consecutive batches, wrapping around forever).
    So W workers of batch b using offset=w*b and stride=W*b together see, step by step, exactly
    the records that one worker of batch W*b (offset=0) sees.  Images are as evaluation sees them
    (CIFAR-10: the central 24x24 crop), per-image standardised.
    """
    import tensorflow as tf
    stride = batch_size if stride is None else stride
    if stride < batch_size:
        raise ValueError('stride %r is smaller than batch_size %r' % (stride, batch_size))
    if offset < 0:
        raise ValueError('offset must be >= 0, not %r' % (offset,))
    with tf.compat.v1.device('/cpu:0'):
        reader = _reader(_data_set(source), 'train')
        ds = reader.records.repeat().skip(offset)
        ds = ds.map(_plain(reader.central), num_parallel_calls=_PARALLEL_CALLS)
        ds = ds.batch(stride, drop_remainder=True)
        if stride != batch_size:
            ds = ds.map(_plain(lambda images, labels: (images[:batch_size], labels[:batch_size])))
        return _get_next(ds)
