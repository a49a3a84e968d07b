"""MNIST's IDX files (MNIST, Fashion-MNIST and any data set stored like them): their names, their
headers, a check of a split's two files and a numpy reader.

An IDX file is a 4-byte magic (two zero bytes, the element type, the number of dimensions), one
big-endian uint32 per dimension, then every element in row-major order; data sets ship them
gzip-compressed (`.gz`) or plain. Images are `idx3` (count, rows, columns) and labels `idx1`
(count), both of unsigned bytes (type 0x08), the only element type read here.

The checks use the standard library alone (numpy only where arrays are read), so the launcher
checks a data set without numpy's or TensorFlow's import time.
"""
from __future__ import annotations

import gzip
import io
import os
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

UBYTE = 0x08
PREFIXES = {'train': 'train', 'test': 't10k'}       # split -> how its files' names begin
_CHUNK = 1 << 20


class IdxError(ValueError):
    """An IDX file that is missing, not IDX, or damaged; the message is one line naming it."""


class Unreadable(IdxError):
    """An IDX file this process may not read: its bytes may be fine, so copying it again is no fix."""


def unreadable(path: str, error: OSError) -> str | None:
    """The one line for a file the OS refused to open for reading (EACCES, EPERM), with its fix;
    None for any other error (a damaged file, a failing disk). Said apart from damage because a
    file of mode 000, or one its owner alone may read, reads as a permission error, and the fix
    is the mode or the user, not a new copy."""
    if not isinstance(error, PermissionError):
        return None
    return f'cannot read {error.filename or path}: permission denied; the user running the task ({_user()}) needs ' \
        'read access to it'


def _user() -> str:
    """This process's user, by name where the system knows it."""
    import pwd
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f'uid {uid}'


def _read_error(path: str, error: BaseException, detail: str = '') -> IdxError:
    """The IdxError for a failed read of `path`: Unreadable for a permission error, else damage."""
    if isinstance(error, OSError):
        refused = unreadable(path, error)
        if refused:
            return Unreadable(refused)
    return IdxError(f'{path} is damaged ({_cause(error)}{detail})')


@dataclass(frozen=True)
class IdxFile:
    """One IDX file: where it is and what its header says."""
    path: str
    dims: tuple[int, ...]

    @property
    def header_bytes(self) -> int:
        """The bytes before the first element: the magic and one uint32 per dimension."""
        return 4 + 4 * len(self.dims)

    @property
    def elements(self) -> int:
        count = 1
        for d in self.dims:
            count *= d
        return count

    @property
    def gzipped(self) -> bool:
        return self.path.endswith('.gz')


@dataclass(frozen=True)
class IdxSplit:
    """A split's two files, checked to agree: images (count, rows, columns) and their labels."""
    images: IdxFile
    labels: IdxFile

    @property
    def count(self) -> int:
        return self.images.dims[0]

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(rows, columns, 1): one grey channel."""
        return self.images.dims[1], self.images.dims[2], 1


def base_names(split: str) -> tuple[str, str]:
    """(images, labels) file names of `split` without `.gz`: `train-images-idx3-ubyte`, ..."""
    if split not in PREFIXES:
        raise ValueError("split must be 'train' or 'test', not %r" % (split,))
    prefix = PREFIXES[split]
    return f'{prefix}-images-idx3-ubyte', f'{prefix}-labels-idx1-ubyte'


def find(directory: str, base: str) -> str | None:
    """The path of `base` in `directory`, plain or `.gz` (plain first), or None if neither is there."""
    for name in (base, base + '.gz'):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    return None


def holds_idx(directory: str) -> bool:
    """Whether `directory` holds any of the IDX files' names (then it is taken for an IDX data set)."""
    return any(find(directory, base) for split in PREFIXES for base in base_names(split))


def _open(path: str) -> gzip.GzipFile | io.BufferedReader:
    """The file's bytes, decompressed as they are read where it is gzip (`.gz`)."""
    if path.endswith('.gz'):
        return gzip.open(path, 'rb')
    return open(path, 'rb')


def read_header(path: str, ndims: int) -> IdxFile:
    """The header of the IDX file at `path`, which must hold unsigned bytes in `ndims` dimensions."""
    if not os.path.isfile(path):
        raise IdxError(f'{path} is not a regular file')
    try:
        with _open(path) as f:
            head = f.read(4 + 4 * ndims)
    except (OSError, EOFError, zlib.error) as e:     # gzip.BadGzipFile is an OSError
        raise _read_error(path, e) from None
    if len(head) < 4 or head[:2] != b'\0\0':
        raise IdxError(f'{path} is not an IDX file (it does not start with the IDX magic 00 00)')
    if head[2] != UBYTE or head[3] != ndims:
        raise IdxError(f'{path} holds {head[3]} dimension(s) of type 0x{head[2]:02x}, not {ndims} of unsigned '
                       'bytes (0x08)')
    if len(head) < 4 + 4 * ndims:
        raise IdxError(f'{path} is damaged (it ends inside its header)')
    dims = struct.unpack(f'>{ndims}I', head[4:])
    if 0 in dims:
        raise IdxError(f'{path} has a dimension of size 0 ({"x".join(map(str, dims))})')
    return IdxFile(path, tuple(dims))


def _cause(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0] if text else type(error).__name__


def check_length(file: IdxFile) -> None:
    """The whole file is there and reads back whole: exactly the header and every element (a gzip
    file is read to its end, which checks its CRC and length too)."""
    want = file.header_bytes + file.elements
    got = 0
    try:
        with _open(file.path) as f:
            while True:
                chunk = f.read(_CHUNK)
                if not chunk:
                    break
                got += len(chunk)
    except (OSError, EOFError, zlib.error) as e:
        raise _read_error(file.path, e, f', after {got:,} bytes of {want:,}') from None
    if got != want:
        short = 'cut short' if got < want else 'longer than its header says'
        raise IdxError(f'{file.path} has {got:,} bytes where its header ({"x".join(map(str, file.dims))}) '
                       f'means {want:,}: {short}')


def check_labels(file: IdxFile, num_classes: int) -> None:
    """Every label is a class the model has (0 .. num_classes-1); the labels file is small."""
    with _open(file.path) as f:
        f.read(file.header_bytes)
        labels = f.read()
    top = max(labels) if labels else 0
    if top >= num_classes:
        raise IdxError(f'{file.path} holds label {top}, but the model has {num_classes} classes (0-{num_classes - 1})')


def check_split(directory: str, split: str, num_classes: int = 10) -> IdxSplit:
    """The two IDX files of `split` in `directory`, read through and checked to agree; raises
    IdxError with one line naming the file at fault."""
    split_files = headers(directory, split)
    for file in (split_files.images, split_files.labels):
        check_length(file)
    check_labels(split_files.labels, num_classes)
    return split_files


def headers(directory: str, split: str) -> IdxSplit:
    """The split's two files from their headers alone (a missing or mismatched one is an IdxError)."""
    paths = []
    for base in base_names(split):
        path = find(directory, base)
        if path is None:
            raise IdxError(f'{os.path.join(directory, base)}[.gz] not found ({split} split)')
        paths.append(path)
    images, labels = read_header(paths[0], 3), read_header(paths[1], 1)
    if images.dims[0] != labels.dims[0]:
        raise IdxError(f'{images.path} holds {images.dims[0]:,} images but {labels.path} {labels.dims[0]:,} '
                       'labels: the files are of different sets')
    return IdxSplit(images, labels)


def peek_split(directory: str, split: str) -> IdxSplit | None:
    """The split's files from their headers, or None if they cannot be read: a description for
    shapes only (the check that training relies on is check_split)."""
    try:
        return headers(directory, split)
    except IdxError:
        return None


def read(path: str) -> np.ndarray:
    """The whole IDX file of unsigned bytes at `path` as a uint8 array of its dimensions."""
    import numpy as np
    try:
        with _open(path) as f:
            head = f.read(4)
            if len(head) < 4 or head[:2] != b'\0\0' or head[2] != UBYTE:
                raise IdxError(f'{path} is not an IDX file of unsigned bytes')
            dims = struct.unpack(f'>{head[3]}I', f.read(4 * head[3]))
            array = np.frombuffer(f.read(), dtype=np.uint8)
    except (OSError, EOFError, zlib.error, struct.error) as e:
        raise _read_error(path, e) from None
    want = 1
    for d in dims:
        want *= d
    if array.size != want:
        raise IdxError(f'{path} has {array.size:,} elements where its header means {want:,}')
    return array.reshape(dims)
