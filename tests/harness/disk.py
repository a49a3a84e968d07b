"""Helpers of the tests of disk, used by tests/system/launch/run/test_disk.py,
tests/unit/launch/run/test_disk.py: here, since no test module imports another."""
from __future__ import annotations

import contextlib
import ctypes
import os

import pytest


MS_RDONLY, MS_REMOUNT, MNT_DETACH = 1, 32, 2
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(target: str, options: str | None, flags: int = 0) -> None:
    if _libc.mount(b'tmpfs', target.encode(), b'tmpfs', flags, options and options.encode()) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number), target)


@pytest.fixture
def small_fs(tmp_path):
    """small_fs(size[, name, inodes]) -> the path of a new tmpfs of that size (e.g. '2m') and at most
    that many inodes, unmounted at the end;
    small_fs.read_only(path) remounts it read-only."""
    mounted = []

    def make(size: str, name: str = 'fs', inodes: int | None = None) -> str:
        target = tmp_path / name
        target.mkdir()
        if os.geteuid() != 0:
            pytest.skip('mounting a small tmpfs needs root')
        try:
            _mount(str(target), f'size={size}' + (f',nr_inodes={inodes}' if inodes else ''))
        except OSError as e:
            pytest.skip(f'cannot mount a tmpfs here: {e.strerror}')
        mounted.append(str(target))
        return str(target)

    def read_only(target: str) -> None:
        _mount(target, None, MS_REMOUNT | MS_RDONLY)

    make.read_only = read_only
    yield make
    for target in reversed(mounted):
        if _libc.umount2(target.encode(), 0) != 0:
            _libc.umount2(target.encode(), MNT_DETACH)     # busy (an open file): gone once it closes


def fill(directory: str) -> None:
    """Take every free block of the file system that holds `directory`."""
    with contextlib.suppress(OSError), open(os.path.join(directory, 'ballast'), 'wb', buffering=0) as f:
        while True:
            f.write(b'\0' * 4096)


# -- a full disk under a running run: named first, never a deadlock, the training heard on ---------
def _free(directory: str) -> None:
    os.remove(os.path.join(directory, 'ballast'))

