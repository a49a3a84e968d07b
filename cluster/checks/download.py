"""Fetch the real CIFAR-10, binary version, for users whose machine has network access:
download (resuming a partial file), verify the MD5 the data set's page publishes, unpack the six
batch files and check their records. `launch download` runs this; nothing else in tfcluster
touches the network, and tests serve a generated archive from loopback."""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING

from cluster.checks.data import SYNTHETIC_MANIFEST, TEST_FILE, TRAIN_FILES, DataError, check_data_set

if TYPE_CHECKING:
    import urllib.response
    from _hashlib import HASH

    Response = http.client.HTTPResponse | urllib.response.addinfourl     # urlopen's, for http(s) and file URLs

CIFAR10_URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
CIFAR10_MD5 = 'c32a1d4ab5d03f1284b67883e8d87530'
ARCHIVE_DIR = 'cifar-10-batches-bin'         # the one folder inside the archive
WANTED = TRAIN_FILES + [TEST_FILE]
OPTIONAL = ['batches.meta.txt', SYNTHETIC_MANIFEST]   # class names; a mirror's synthetic set; copied when present
CHUNK = 1 << 20
PROGRESS_SECS = 2.0
TIMEOUT_SECS = 60


class DownloadError(Exception):
    """A download, checksum or archive problem; the message is one line."""


def check_arguments(url: str, md5: str) -> None:
    """Raise ValueError (one line) for a URL or checksum that cannot be right, before anything is
    fetched: a typo in --md5 would otherwise cost a whole download, then delete it."""
    if urllib.parse.urlparse(url).scheme not in ('http', 'https', 'ftp', 'file'):
        raise ValueError(f'--url {url}: expected an http, https, ftp or file URL')
    if not re.fullmatch(r'[0-9a-fA-F]{32}', md5):
        raise ValueError(f'--md5 {md5}: expected 32 hexadecimal digits')


def download_cifar10(dest: str, url: str = CIFAR10_URL, md5: str = CIFAR10_MD5,
                    say: Callable[[str], object] | None = None) -> str:
    """Make `<dest>/cifar-10-batches-bin` hold the checked CIFAR-10 binary files; returns its path.
    Does nothing when they are there already; keeps the verified archive beside them."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    md5 = md5.lower()
    target = os.path.join(dest, ARCHIVE_DIR)
    if _complete(target):
        say(f'{target} already holds the CIFAR-10 binary files; nothing to do')
        return target
    if os.path.exists(target):      # not ours to overwrite: this function only ever moves a checked folder there
        raise DownloadError(f'{target} exists but does not hold the checked CIFAR-10 files; move it away '
                            'or choose another destination')
    os.makedirs(dest, exist_ok=True)
    name = os.path.basename(urllib.parse.urlparse(url).path) or 'cifar-10-binary.tar.gz'
    archive = os.path.join(dest, name)
    if os.path.exists(archive) and _md5_of(archive) == md5:
        say(f'reusing {archive} (MD5 verified)')
    else:
        _fetch(url, archive, md5, say)
    _unpack(archive, dest, target)
    say(f'{target}: CIFAR-10 ready (5 training batches, 1 test batch)')
    return target


def _complete(directory: str) -> bool:
    try:
        check_data_set(directory)
    except DataError:
        return False
    return True


def _md5_of(path: str, digest: HASH | None = None) -> str:
    digest = digest or hashlib.md5()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(CHUNK), b''):
            digest.update(block)
    return digest.hexdigest()


def _fetch(url: str, archive: str, md5: str, say: Callable[[str], object]) -> None:
    """Stream `url` into `archive`.part, resuming what an earlier attempt left there; only a file
    whose MD5 matches becomes `archive`."""
    part = archive + '.part'
    have = os.path.getsize(part) if os.path.exists(part) else 0
    request = urllib.request.Request(url, headers={'Range': f'bytes={have}-'} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_SECS)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:          # the part file is complete already (or longer)
            response = None
        else:
            raise DownloadError(f'{url}: HTTP {e.code} {e.reason}') from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        reason = getattr(e, 'reason', None) or f'{type(e).__name__}: {e}'
        raise DownloadError(f'{url}: cannot download: {reason}') from None
    digest = hashlib.md5()
    if response is not None:
        with response:
            resumed = bool(have) and _resumes_at(response, have)
            if have and not resumed:
                say(f'{url}: the server cannot resume at byte {have}; starting over')
            if resumed:
                _md5_of(part, digest)
            size = response.headers.get('Content-Length')
            size = int(size) if size and size.isdigit() else None
            total = (have + size if resumed else size) if size is not None else None
            _copy(response, part, 'ab' if resumed else 'wb', digest, have if resumed else 0, total, url, say)
    else:
        _md5_of(part, digest)
    got = digest.hexdigest()
    if got != md5:
        os.remove(part)
        raise DownloadError(f'{url}: MD5 mismatch: expected {md5}, got {got}; the download was removed, '
                            'run the command again')
    os.replace(part, archive)


def _resumes_at(response: Response, offset: int) -> bool:
    """Whether the reply is the rest of the file from `offset`: a 206 whose Content-Range starts
    there (a server may answer a range request with other bytes, or all of them)."""
    if response.status != 206:
        return False
    found = re.fullmatch(r'bytes (\d+)-\d+/(\d+|\*)', response.headers.get('Content-Range', '').strip())
    return found is not None and int(found.group(1)) == offset


def _copy(response: Response, part: str, mode: str, digest: HASH, done: int, total: int | None, url: str,
          say: Callable[[str], object]) -> None:
    start = last = time.monotonic()
    first = done
    try:
        with open(part, mode) as out:
            for block in iter(lambda: response.read(CHUNK), b''):
                out.write(block)
                digest.update(block)
                done += len(block)
                now = time.monotonic()
                if now - last >= PROGRESS_SECS:
                    share = f' of {total / 1e6:.1f} MB ({100 * done / total:.0f}%)' if total else ' MB'
                    say(f'downloaded {done / 1e6:.1f}{share}, {(done - first) / 1e6 / (now - start):.1f} MB/s')
                    last = now
    except (OSError, http.client.HTTPException) as e:   # a dropped connection, a full disk: what arrived is kept
        raise DownloadError(f'{url}: download interrupted after {done / 1e6:.1f} MB ({e}); run the command '
                            f'again to resume') from None
    if total is not None and done < total:
        raise DownloadError(f'{url}: the connection closed after {done} of {total} bytes; run the command '
                            f'again to resume')


def _unpack(archive: str, dest: str, target: str) -> None:
    """Copy the wanted members, chosen by name and only if they are regular files (so nothing in
    the archive can land outside `dest`), into a scratch folder, check every record, then move the folder into place."""
    scratch = tempfile.mkdtemp(prefix='.unpack-', dir=dest)
    try:
        try:
            with tarfile.open(archive, 'r:*') as tar:
                os.mkdir(os.path.join(scratch, ARCHIVE_DIR))
                for name in WANTED + OPTIONAL:
                    try:
                        member = tar.getmember(f'{ARCHIVE_DIR}/{name}')
                    except KeyError:
                        member = None
                    if member is None or not member.isfile():
                        if name in OPTIONAL:
                            continue
                        raise DownloadError(f'{archive}: the archive has no file {ARCHIVE_DIR}/{name}')
                    src = tar.extractfile(member)
                    assert src is not None      # a regular file's member always has its data
                    with src, open(os.path.join(scratch, ARCHIVE_DIR, name), 'wb') as dst:
                        shutil.copyfileobj(src, dst, CHUNK)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise DownloadError(f'{archive}: cannot unpack: {e}') from None
        unpacked = os.path.join(scratch, ARCHIVE_DIR)
        try:
            check_data_set(unpacked)
        except DataError as e:      # name the member, not the scratch folder that is about to go
            raise DownloadError(f'{archive}: {str(e).replace(scratch + os.sep, "")}') from None
        os.replace(unpacked, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
