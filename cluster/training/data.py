"""CIFAR-10 binary data: validation, learnable synthetic batches and tf.data input pipelines.

The pipelines are TF1-style graph-mode tensors (``tf.compat.v1``; the caller has disabled eager
execution).  TensorFlow is imported inside the functions that build graphs, so the launcher can
import this module to validate a spec without paying TensorFlow's import time.

The file format is the CIFAR-10 binary one: fixed 3073-byte records, one label byte (0-9) then a
32x32x3 image stored channel-major (1024 red bytes, 1024 green, 1024 blue, each row-major).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cluster.runtime import rundir

if TYPE_CHECKING:
    import numpy as np
    import tensorflow as tf

    from cluster.spec import ClusterSpec

    Batch = tuple[tf.Tensor, tf.Tensor]         # images, labels
    Templates = tuple[np.ndarray, np.ndarray, np.ndarray]     # colours, stripe orientations, frequencies

log = logging.getLogger(__name__)

IMAGE_SIZE = 24
RAW_SIZE = 32
NUM_CLASSES = 10
RECORD_BYTES = 1 + RAW_SIZE * RAW_SIZE * 3
TRAIN_FILES = ['data_batch_%d.bin' % i for i in range(1, 6)]
TEST_FILE = 'test_batch.bin'
SYNTHETIC_SUBDIR = 'synthetic-data'
CIFAR10_RECORDS_PER_FILE = 10000     # every file of the real data set, train and test alike
# Written by write_synthetic next to its files: how many records each holds. Without it a data
# directory must have the real data set's sizes, so a copy cut to whole records is not trained on.
SYNTHETIC_MANIFEST = 'tfcluster-synthetic.json'

# Explicit small parallelism: AUTOTUNE would need tf.data autotuning, which we switch off because
# it can make Session.close() hang for ~10 s.
_PARALLEL_CALLS = 2
_PREFETCH_BATCHES = 2
_SHUFFLE_BUFFER = 10000


class DataError(ValueError):
    """A data directory or file the user named is unusable; the message is one line for the user."""


# --------------------------------------------------------------------------- validation

def _split_files(split: str) -> list[str]:
    if split == 'train':
        return list(TRAIN_FILES)
    if split == 'test':
        return [TEST_FILE]
    raise ValueError("split must be 'train' or 'test', not %r" % (split,))


def check_data_dir(directory: str, split: str = 'train') -> list[str]:
    """Check that `directory` holds the CIFAR-10 binary files of `split`; return their paths.

    Runs before any server starts so that a wrong path is one clear line, not a tf.data error in
    the middle of training on some remote worker.
    """
    names = _split_files(split)
    directory = os.path.expanduser(str(directory))
    if not os.path.exists(directory):
        raise DataError('data directory %s does not exist' % directory)
    if not os.path.isdir(directory):
        raise DataError('data directory %s is not a directory' % directory)
    paths = [os.path.join(directory, name) for name in names]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        hint = ''
        nested = os.path.join(directory, 'cifar-10-batches-bin')
        if os.path.isdir(nested):
            hint = ' (did you mean %s?)' % nested
        raise DataError('CIFAR-10 file %s not found (%s split needs %s)%s'
                        % (missing[0], split, ', '.join(names), hint))
    for path in paths:
        if not os.path.isfile(path):
            raise DataError('CIFAR-10 file %s is not a regular file' % path)
        size = os.path.getsize(path)
        if size == 0:
            raise DataError('CIFAR-10 file %s is empty' % path)
        if size % RECORD_BYTES:
            raise DataError('CIFAR-10 file %s has %d bytes, not a multiple of the %d-byte record '
                            '(truncated, or not the binary version of CIFAR-10)'
                            % (path, size, RECORD_BYTES))
        expected, source = _expected_records(directory, split)
        if size // RECORD_BYTES != expected:
            raise DataError('CIFAR-10 file %s has %d records where %s has %d (cut short, or a partial copy)'
                            % (path, size // RECORD_BYTES, source, expected))
    return paths


def _expected_records(directory: str, split: str) -> tuple[int, str]:
    """(records each file of `split` must hold, what says so)."""
    manifest = os.path.join(directory, SYNTHETIC_MANIFEST)
    try:
        with open(manifest) as f:
            counts = json.load(f)
        key = 'records_per_file' if split == 'train' else 'test_records'
        value = counts[key]
        if not isinstance(value, int) or value < 1:
            raise ValueError(key)
        return value, 'its %s' % SYNTHETIC_MANIFEST
    except FileNotFoundError:
        return CIFAR10_RECORDS_PER_FILE, 'the real CIFAR-10'
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError('%s is unreadable (%s): write the data again' % (manifest, e)) from None


def check_data_set(directory: str) -> list[str]:
    """Check that `directory` holds both splits: what synthetic data and a download must leave."""
    return check_data_dir(directory, 'train') + check_data_dir(directory, 'test')


# --------------------------------------------------------------------------- synthetic data

def _class_templates(seed: int) -> Templates:
    """Per-class colour offsets and stripe parameters, derived from the seed.

    Colour: each class gets its own direction in the plane orthogonal to grey (1,1,1), so the
    channel balance survives brightness shifts, contrast scaling and per-image standardisation.
    Stripes: vertical or horizontal (both unchanged by a left-right flip) with a class-specific
    period; each image gets a random phase, so nothing depends on where the crop lands.
    """
    import numpy as np     # only where records are made: the launcher validates specs without it
    rng = np.random.default_rng([seed, 0xC1FA])
    u = np.array([1.0, -1.0, 0.0]) / np.sqrt(2.0)
    v = np.array([1.0, 1.0, -2.0]) / np.sqrt(6.0)
    angles = (rng.permutation(NUM_CLASSES) + rng.uniform(-0.15, 0.15)) * (2 * np.pi / NUM_CLASSES)
    colours = 50.0 * (np.cos(angles)[:, None] * u + np.sin(angles)[:, None] * v)
    combos = [(orient, period) for orient in (0, 1) for period in (3.0, 4.0, 6.0, 8.0, 12.0)]
    order = rng.permutation(len(combos))
    orients = np.array([combos[i][0] for i in order])
    freqs = np.array([1.0 / combos[i][1] for i in order])
    return colours.astype(np.float32), orients, freqs.astype(np.float32)


def _synthetic_records(num: int, templates: Templates, rng: np.random.Generator) -> bytes:
    """`num` CIFAR-10 records (bytes) of class template + per-image brightness + pixel noise."""
    import numpy as np     # only where records are made: the launcher validates specs without it
    colours, orients, freqs = templates
    labels = rng.permutation(np.arange(num) % NUM_CLASSES).astype(np.uint8)
    grid = np.arange(RAW_SIZE, dtype=np.float32)
    xx = np.broadcast_to(grid[None, :], (RAW_SIZE, RAW_SIZE))
    yy = np.broadcast_to(grid[:, None], (RAW_SIZE, RAW_SIZE))
    coords = np.where(orients[labels][:, None, None] == 1, yy, xx)           # [n, 32, 32]
    phase = rng.uniform(0, 2 * np.pi, size=(num, 1, 1)).astype(np.float32)
    stripes = np.sin(2 * np.pi * freqs[labels][:, None, None] * coords + phase)
    base = rng.uniform(90, 165, size=(num, 1, 1, 1)).astype(np.float32)
    signal = base + colours[labels][:, :, None, None] + 35.0 * stripes[:, None]   # [n, 3, 32, 32]
    # Uniform pixel noise in [-32, 31] (std ~18.5): random bytes are ~10x cheaper than normals.
    noise = (rng.integers(0, 256, size=signal.shape, dtype=np.uint8) >> 2).astype(np.int16) - 32
    pixels = np.clip(np.rint(signal).astype(np.int16) + noise, 0, 255).astype(np.uint8)
    pixels = pixels.reshape(num, -1)
    return np.concatenate([labels[:, None], pixels], axis=1).tobytes()


def _write_atomic(path: str, payload: bytes) -> None:
    """Write via a temp file in the same directory and os.replace, so readers never see half a file.

    A failure leaves no temp file and raises an OSError naming `path` (a failed write names no
    file, and mkstemp's names the temp file's random one)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path),
                                   prefix='.%s.' % os.path.basename(path), suffix='.tmp')
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from e
    try:
        with os.fdopen(fd, 'wb') as handle:
            handle.write(payload)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise OSError(e.errno, e.strerror, path) from e
        raise


def write_synthetic(directory: str, records_per_file: int = 1000, test_records: int = 1000, seed: int = 0) -> str:
    """Write the six CIFAR-10 binary files with learnable synthetic images; return `directory`.

    Deterministic for a seed: file i is generated from its own stream, so the content does not
    depend on the order or the number of files written.
    """
    import numpy as np     # only where records are made: the launcher validates specs without it
    if records_per_file < 1 or test_records < 1:
        raise ValueError('records_per_file and test_records must be positive')
    directory = os.path.expanduser(str(directory))
    os.makedirs(directory, exist_ok=True)
    templates = _class_templates(seed)
    sizes = [(name, records_per_file) for name in TRAIN_FILES] + [(TEST_FILE, test_records)]
    for index, (name, num) in enumerate(sizes):
        rng = np.random.default_rng([seed, index + 1])
        _write_atomic(os.path.join(directory, name), _synthetic_records(num, templates, rng))
    manifest = {'records_per_file': records_per_file, 'test_records': test_records, 'seed': seed}
    _write_atomic(os.path.join(directory, SYNTHETIC_MANIFEST), json.dumps(manifest).encode())
    log.info('wrote synthetic CIFAR-10 data to %s (%d train, %d test records, seed %d)',
             directory, records_per_file * len(TRAIN_FILES), test_records, seed)
    return directory


def resolve_spec_data(spec: ClusterSpec) -> str:
    """resolve_data for a ClusterSpec, its failures as the spec's errors (a SpecError naming
    train.data, or train.train_dir where the synthetic set cannot be written)."""
    try:
        return resolve_data(spec.train.data, spec.train.train_dir)
    except DataError as e:
        raise spec.error('train.data', str(e)) from None
    except OSError as e:
        raise spec.error('train.train_dir', _write_error(e, spec.train.train_dir)) from None


def _write_error(error: OSError, where: str) -> str:
    """`cannot write PATH: No space left on device (ENOSPC)`: the file or folder refused (or
    `where` if the error names none) and the cause."""
    return f'cannot write {error.filename or where}: {rundir.os_cause(error) or error}'


def resolve_data(data: str, train_dir: str) -> str:
    """Turn the spec's `data` value into a checked directory of CIFAR-10 binary files.

    'synthetic' means `<train_dir>/synthetic-data`, generated on first use.  Several tasks may race
    to generate it; the writes are atomic and deterministic, so the loser rewrites identical bytes.
    """
    if data == 'synthetic':
        directory = os.path.join(os.path.expanduser(str(train_dir)), SYNTHETIC_SUBDIR)
        try:
            check_data_set(directory)
            log.debug('reusing synthetic data in %s', directory)
        except DataError:
            write_synthetic(directory)
        return directory
    directory = os.path.expanduser(str(data))
    check_data_dir(directory, 'train')
    return directory


# --------------------------------------------------------------------------- tf.data pipelines

def _options() -> tf.data.Options:
    import tensorflow as tf
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def _decode(record: tf.Tensor) -> Batch:
    """Raw record -> (float32 [32,32,3] image in 0..255, int32 label)."""
    import tensorflow as tf
    raw = tf.io.decode_raw(record, tf.uint8)
    label = tf.cast(raw[0], tf.int32)
    chw = tf.reshape(raw[1:RECORD_BYTES], [3, RAW_SIZE, RAW_SIZE])
    image = tf.cast(tf.transpose(chw, [1, 2, 0]), tf.float32)
    return image, label


def _central(record: tf.Tensor) -> Batch:
    import tensorflow as tf
    image, label = _decode(record)
    image = tf.image.resize_with_crop_or_pad(image, IMAGE_SIZE, IMAGE_SIZE)
    image = tf.image.per_image_standardization(image)
    image.set_shape([IMAGE_SIZE, IMAGE_SIZE, 3])
    return image, label


def _distorted(element_seed: tf.Tensor, record: tf.Tensor) -> Batch:
    """The tutorial's training distortions, made with stateless ops from a per-element seed.

    Stateless ops keep a seeded pipeline deterministic although the map runs in parallel.
    """
    import tensorflow as tf
    image, label = _decode(record)
    seeds = tf.random.experimental.stateless_split(element_seed, num=4)
    image = tf.image.stateless_random_crop(image, [IMAGE_SIZE, IMAGE_SIZE, 3], seed=seeds[0])
    image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    image = tf.image.stateless_random_brightness(image, max_delta=63, seed=seeds[2])
    image = tf.image.stateless_random_contrast(image, lower=0.2, upper=1.8, seed=seeds[3])
    image = tf.image.per_image_standardization(image)
    image.set_shape([IMAGE_SIZE, IMAGE_SIZE, 3])
    return image, label


def _plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn for Dataset.map as it is: these functions have no Python control flow for AutoGraph to
    convert, and converting them was a third of a worker's graph building (0.4 s of its start-up)."""
    import tensorflow as tf
    return tf.autograph.experimental.do_not_convert(fn)


def _get_next(dataset: tf.data.Dataset) -> Batch:
    import tensorflow as tf
    dataset = dataset.prefetch(_PREFETCH_BATCHES).with_options(_options())
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def train_inputs(data_dir: str, batch_size: int, shard_index: int = 0, num_shards: int = 1, seed: int | None = None,
                 reshardable: bool = False) -> Batch | tuple[Batch, Callable[[tf.compat.v1.Session, int, int], None]]:
    """Endless shuffled, distorted training batches for worker `shard_index` of `num_shards`.

    Sharding is by record (record r goes to shard r % num_shards), so any number of shards works
    whatever the number of files.  With `seed` the stream (shuffle and distortions) is
    reproducible; without one every call draws a fresh seed.

    With `reshardable`, the shard is chosen when the returned `initialize(sess, index, count)` is
    run (again whenever the workers that share the records change): returns (batch, initialize).
    """
    import tensorflow as tf
    if reshardable:
        index_ph = tf.compat.v1.placeholder_with_default(tf.constant(0, tf.int64), [], name='shard_index')
        count_ph = tf.compat.v1.placeholder_with_default(tf.constant(1, tf.int64), [], name='num_shards')
        ds = _train_dataset(data_dir, batch_size, index_ph, count_ph, seed)
        iterator = tf.compat.v1.data.make_initializable_iterator(
            ds.prefetch(_PREFETCH_BATCHES).with_options(_options()))

        def initialize(sess: tf.compat.v1.Session, index: int, count: int) -> None:
            sess.run(iterator.initializer, feed_dict={index_ph: index, count_ph: count})
        return iterator.get_next(), initialize
    if not 0 <= shard_index < num_shards:
        raise ValueError('shard_index %r is not in [0, %r)' % (shard_index, num_shards))
    return _get_next(_train_dataset(data_dir, batch_size, shard_index, num_shards, seed))


def _train_dataset(data_dir: str, batch_size: int, shard_index: int | tf.Tensor, num_shards: int | tf.Tensor,
                   seed: int | None) -> tf.data.Dataset:
    import tensorflow as tf
    files = check_data_dir(data_dir, 'train')
    if seed is None:
        seed = int.from_bytes(os.urandom(4), 'little') & 0x7FFFFFFF
    with tf.compat.v1.device('/cpu:0'):
        ds = tf.data.FixedLengthRecordDataset(files, RECORD_BYTES)
        ds = ds.shard(tf.cast(num_shards, tf.int64), tf.cast(shard_index, tf.int64))
        ds = ds.shuffle(_SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True).repeat()
        # Element k of shard s gets the stateless seed (seed, k * num_shards + s): unique per record
        # visit across epochs and across workers.
        ds = ds.enumerate().map(
            _plain(lambda k, rec: _distorted(
                tf.stack([tf.constant(seed, tf.int64),
                          k * tf.cast(num_shards, tf.int64) + tf.cast(shard_index, tf.int64)]), rec)),
            num_parallel_calls=_PARALLEL_CALLS)
        return ds.batch(batch_size, drop_remainder=True)


def eval_inputs(data_dir: str, batch_size: int) -> Batch:
    """One pass over the test split in file order, centrally cropped; the last batch may be short."""
    import tensorflow as tf
    files = check_data_dir(data_dir, 'test')
    with tf.compat.v1.device('/cpu:0'):
        ds = tf.data.FixedLengthRecordDataset(files, RECORD_BYTES)
        ds = ds.map(_plain(_central), num_parallel_calls=_PARALLEL_CALLS)
        ds = ds.batch(batch_size, drop_remainder=False)
        return _get_next(ds)


def deterministic_inputs(data_dir: str, batch_size: int, offset: int = 0, stride: int | None = None) -> Batch:
    """Undistorted, unshuffled training batches in plain record order, for exactness tests.

    Number the N training records 0..N-1 in file order (data_batch_1.bin first, record order
    within each file).  Batch k (k = 0, 1, ...) holds, in this order, the records

        (offset + k * stride + j) mod N      for j = 0 .. batch_size - 1

    with `stride` defaulting to `batch_size` (consecutive batches, wrapping around forever).
    So W workers of batch b using offset=w*b and stride=W*b together see, step by step, exactly
    the records that one worker of batch W*b (offset=0) sees.  Images are the central 24x24 crop,
    per-image standardised.
    """
    import tensorflow as tf
    stride = batch_size if stride is None else stride
    if stride < batch_size:
        raise ValueError('stride %r is smaller than batch_size %r' % (stride, batch_size))
    if offset < 0:
        raise ValueError('offset must be >= 0, not %r' % (offset,))
    files = check_data_dir(data_dir, 'train')
    with tf.compat.v1.device('/cpu:0'):
        ds = tf.data.FixedLengthRecordDataset(files, RECORD_BYTES).repeat().skip(offset)
        ds = ds.map(_plain(_central), num_parallel_calls=_PARALLEL_CALLS)
        ds = ds.batch(stride, drop_remainder=True)
        if stride != batch_size:
            ds = ds.map(_plain(lambda images, labels: (images[:batch_size], labels[:batch_size])))
        return _get_next(ds)
