"""Data sets: what the spec's `train.data` names, checked, and described for the model, the input
pipelines (cluster/training/inputs.py), evaluation and the memory estimate.

`data` is `synthetic` (learnable images written in CIFAR-10's binary format under the train_dir),
`fashion-mnist` (Debian's package dataset-fashion-mnist), or a directory holding either CIFAR-10's
binary batches or the four IDX files of MNIST or Fashion-MNIST (cluster/checks/idx.py). Whatever
it names becomes a `DataSet`: its image shape, split sizes, classes, how its files are laid out and
which distortions train on it, so nothing downstream needs to know which set it is.

TensorFlow is not imported here, nor numpy at import time, so the launcher checks a spec's data
without their import time.

CIFAR-10's binary format: fixed 3073-byte records, one label byte (0-9) then a 32x32x3 image stored
channel-major (1024 red bytes, 1024 green, 1024 blue, each row-major).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from cluster.runtime import rundir, runjson
from cluster.checks import idx

if TYPE_CHECKING:
    import numpy as np

    from cluster.spec import ClusterSpec

    Templates = tuple[np.ndarray, np.ndarray, np.ndarray]     # colours, stripe orientations, frequencies

log = logging.getLogger(__name__)

IMAGE_SIZE = 24          # CIFAR-10's crops: what the model sees of its 32x32 images
RAW_SIZE = 32
NUM_CLASSES = 10
RECORD_BYTES = 1 + RAW_SIZE * RAW_SIZE * 3
TRAIN_FILES = ['data_batch_%d.bin' % i for i in range(1, 6)]
TEST_FILE = 'test_batch.bin'
SYNTHETIC_SUBDIR = rundir.SYNTHETIC_DATA_DIR
CIFAR10_RECORDS_PER_FILE = 10000     # every file of the real data set, train and test alike
CIFAR10_TRAIN_EXAMPLES = CIFAR10_RECORDS_PER_FILE * len(TRAIN_FILES)
# Written by write_synthetic next to its files: how many records each holds. Without it a data
# directory must have the real data set's sizes, so a copy cut to whole records is not trained on.
SYNTHETIC_MANIFEST = 'tfcluster-synthetic.json'
SYNTHETIC_RECORDS_PER_FILE = SYNTHETIC_TEST_RECORDS = 1000     # write_synthetic's defaults

FASHION_MNIST = 'fashion-mnist'                         # the spec's name for Debian's package
FASHION_MNIST_PACKAGE = 'dataset-fashion-mnist'
FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
MNIST_SHAPE = (28, 28, 1)


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
        _readable(path)
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


def _readable(path: str) -> None:
    """A DataError naming `path` if this process may not open it: the tasks' tf.data would fail on
    it mid-training with a less telling error."""
    try:
        with open(path, 'rb'):
            pass
    except OSError as e:
        raise DataError(idx.unreadable(path, e) or f'cannot read {path}: {rundir.os_cause(e) or e}') from None


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
        refused = idx.unreadable(manifest, e) if isinstance(e, OSError) else None
        raise DataError(refused or '%s is unreadable (%s): write the data again' % (manifest, e)) from None


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
    _write_atomic(os.path.join(directory, SYNTHETIC_MANIFEST), runjson.dumps(manifest).encode())
    log.info('wrote synthetic CIFAR-10 data to %s (%d train, %d test records, seed %d)',
             directory, records_per_file * len(TRAIN_FILES), test_records, seed)
    return directory


# --------------------------------------------------------------------------- data sets

class Layout(str, Enum):
    """How a data set's files hold its records."""
    CIFAR10 = 'cifar10'     # CIFAR-10's binary batches: 3073-byte records, label then image
    IDX = 'idx'             # MNIST's IDX files: an images file and a labels file per split


class Augment(str, Enum):
    """Which distortions train on a data set (evaluation and exactness runs use none)."""
    # The tutorial's, for CIFAR-10's 32x32 photos: a random 24x24 crop, left-right flip, brightness
    # and contrast; evaluation sees the central 24x24 crop.
    CIFAR10 = 'cifar10'
    # For 28x28 centred objects (Fashion-MNIST, MNIST): the whole image, flipped left-right at random
    # (a mirrored shirt or shoe is one of the same class). A crop would cut off what fills the
    # frame, and brightness or contrast change nothing once each image is standardised.
    FLIP = 'flip'


@dataclass(frozen=True)
class DataSet:
    """What the model, the input pipelines, evaluation and the memory estimate ask of a data set.

    Described from names and headers alone (`describe`), or checked too (`resolve_data`)."""
    name: str                                  # for messages: 'CIFAR-10', 'Fashion-MNIST', ...
    directory: str
    layout: Layout
    stored_shape: tuple[int, int, int]         # (height, width, channels) as a record holds it
    image_shape: tuple[int, int, int]          # what the model sees of it
    train_examples: int
    test_examples: int
    epoch_examples: int      # an epoch of the learning-rate schedule (50,000 for every CIFAR-10 layout, as ever)
    augment: Augment
    num_classes: int = NUM_CLASSES
    remedy: str = ''         # what fixes a missing or damaged file, said after the error

    @property
    def shape_text(self) -> str:
        """`28x28x1`: the model's input, as messages give it."""
        return 'x'.join(map(str, self.image_shape))


def _cifar10(directory: str, name: str, sizes: tuple[int, int]) -> DataSet:
    return DataSet(name=name, directory=directory, layout=Layout.CIFAR10, stored_shape=(RAW_SIZE, RAW_SIZE, 3),
                   image_shape=(IMAGE_SIZE, IMAGE_SIZE, 3), train_examples=sizes[0], test_examples=sizes[1],
                   epoch_examples=CIFAR10_TRAIN_EXAMPLES, augment=Augment.CIFAR10)


def _idx(directory: str, name: str, remedy: str) -> DataSet:
    """An IDX data set as its headers say (MNIST's shape and sizes where they cannot be read: the
    check that training relies on then says why)."""
    train, test = idx.peek_split(directory, 'train'), idx.peek_split(directory, 'test')
    shape = train.image_shape if train else MNIST_SHAPE
    train_examples = train.count if train else 60000
    return DataSet(name=name, directory=directory, layout=Layout.IDX, stored_shape=shape, image_shape=shape,
                   train_examples=train_examples, test_examples=test.count if test else 10000,
                   epoch_examples=train_examples, augment=Augment.FLIP, remedy=remedy)


def _synthetic_sizes(directory: str) -> tuple[int, int]:
    """(train, test) records of the synthetic set in `directory`, from its manifest (the defaults
    before it is written)."""
    try:
        with open(os.path.join(directory, SYNTHETIC_MANIFEST)) as f:
            counts = json.load(f)
        return int(counts['records_per_file']) * len(TRAIN_FILES), int(counts['test_records'])
    except (OSError, ValueError, KeyError, TypeError):
        return SYNTHETIC_RECORDS_PER_FILE * len(TRAIN_FILES), SYNTHETIC_TEST_RECORDS


def describe(data: str, train_dir: str) -> DataSet:
    """The data set the spec's `data` names, from names and headers alone: nothing is checked or
    written (the graph's shape, the memory estimate). A directory holding IDX files is an IDX set,
    any other a CIFAR-10 one."""
    if data == 'synthetic':
        directory = os.path.join(os.path.expanduser(str(train_dir)), SYNTHETIC_SUBDIR)
        return _cifar10(directory, 'synthetic CIFAR-10', _synthetic_sizes(directory))
    if data == FASHION_MNIST:
        return _idx(FASHION_MNIST_DIR, 'Fashion-MNIST',
                    f'reinstall it with `apt-get install --reinstall {FASHION_MNIST_PACKAGE}`')
    directory = os.path.expanduser(str(data))
    if os.path.isdir(directory) and idx.holds_idx(directory):
        return _idx(directory, 'IDX data set', 'copy the data set there again')
    return _cifar10(directory, 'CIFAR-10', (CIFAR10_TRAIN_EXAMPLES, CIFAR10_RECORDS_PER_FILE))


def check_split(data_set: DataSet, split: str) -> list[str]:
    """Check the files of `split` (train or test); return their paths. A DataError says which
    file is missing or damaged and what fixes it."""
    if data_set.layout is Layout.CIFAR10:
        return check_data_dir(data_set.directory, split)
    try:
        found = idx.check_split(data_set.directory, split, data_set.num_classes)
    except idx.Unreadable as e:
        raise DataError(str(e)) from None      # the file's mode or its user, not its data set, is at fault
    except idx.IdxError as e:
        fix = f': {data_set.remedy}' if data_set.remedy else ''
        raise DataError(f'{data_set.name}: {e}{fix}') from None
    if found.image_shape != data_set.image_shape:
        raise DataError(f'{data_set.name}: {found.images.path} holds {"x".join(map(str, found.image_shape))} '
                        f'images, the train split {data_set.shape_text}')
    return [found.images.path, found.labels.path]


def resolve_spec_data(spec: ClusterSpec) -> DataSet:
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


def resolve_data(data: str, train_dir: str) -> DataSet:
    """The spec's `data` value as a data set whose train split is checked.

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
        return describe(data, train_dir)
    if data == FASHION_MNIST and not os.path.isdir(FASHION_MNIST_DIR):
        raise DataError(f'{FASHION_MNIST}: Debian\'s package {FASHION_MNIST_PACKAGE} is not installed (no '
                        f'{FASHION_MNIST_DIR}): install it with `apt-get install {FASHION_MNIST_PACKAGE}`')
    data_set = describe(data, train_dir)
    if data_set.layout is Layout.CIFAR10:
        _neither(data_set.directory)
    check_split(data_set, 'train')
    return data_set


def _neither(directory: str) -> None:
    """A DataError if `directory` exists but holds no file of either layout (no CIFAR-10 batch, no
    IDX file, no unpacked CIFAR-10 folder inside): say what it should hold."""
    if not os.path.isdir(directory) or os.path.isdir(os.path.join(directory, 'cifar-10-batches-bin')):
        return      # check_data_dir says so, or where the batches are
    if not any(os.path.exists(os.path.join(directory, name)) for name in TRAIN_FILES + [TEST_FILE]):
        raise DataError(f'data directory {directory} holds neither CIFAR-10\'s binary batches ({TRAIN_FILES[0]} ... '
                        f'{TEST_FILE}) nor the IDX files of MNIST or Fashion-MNIST ({idx.base_names("train")[0]}'
                        '[.gz] ...)')
