"""`launch download` against a real HTTP server on loopback serving a generated archive laid out
like the real cifar-10-binary.tar.gz (no network: the published URL is never contacted)."""
from __future__ import annotations

import hashlib
import io
import os
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cluster import data
from cluster.download import ARCHIVE_DIR, WANTED
from tests.conftest import launch


def make_archive(tmp_path, leave_out: str | None = None, truncate: str | None = None) -> bytes:
    source = tmp_path / 'source'
    data.write_synthetic(str(source), records_per_file=20, test_records=20)
    (source / 'batches.meta.txt').write_text('airplane\nautomobile\n')
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode='w:gz') as tar:
        for name in WANTED + ['batches.meta.txt']:
            if name == leave_out:
                continue
            payload = (source / name).read_bytes()
            if name == truncate:
                payload = payload[:-5]
            info = tarfile.TarInfo(f'{ARCHIVE_DIR}/{name}')
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


class Server:
    """Serves `payload` at /cifar-10-binary.tar.gz, honouring Range requests; records each request's
    Range header (None when absent)."""

    def __init__(self, payload: bytes):
        self.payload, self.ranges = payload, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != '/cifar-10-binary.tar.gz':
                    self.send_error(404)
                    return
                asked = self.headers.get('Range')
                outer.ranges.append(asked)
                body, status = outer.payload, 200
                if asked:
                    start = int(asked.split('=')[1].rstrip('-'))
                    body, status = outer.payload[start:], 206
                self.send_response(status)
                self.send_header('Content-Length', str(len(body)))
                if status == 206:
                    self.send_header('Content-Range', f'bytes {len(outer.payload) - len(body)}-'
                                                      f'{len(outer.payload) - 1}/{len(outer.payload)}')
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}/cifar-10-binary.tar.gz'
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(payload: bytes) -> Server:
        servers.append(Server(payload))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def md5(payload: bytes) -> str:
    return hashlib.md5(payload).hexdigest()


def download(dest, server, *extra, checksum=None):
    return launch('download', str(dest), '--url', server.url, '--md5', checksum or md5(server.payload), *extra,
                  timeout=60)


def test_download_verifies_unpacks_and_then_has_nothing_to_do(tmp_path, serve):
    server = serve(make_archive(tmp_path))
    dest = tmp_path / 'data'
    first = download(dest, server)
    assert first.returncode == 0, first.stdout + first.stderr
    target = dest / ARCHIVE_DIR
    assert f'--set train.data={target}' in first.stdout
    assert data.check_data_dir(str(target), 'train') and data.check_data_dir(str(target), 'test')
    assert (target / 'batches.meta.txt').exists()
    assert sorted(os.listdir(dest)) == [ARCHIVE_DIR, 'cifar-10-binary.tar.gz']    # no scratch left
    assert server.ranges == [None]

    again = download(dest, server)
    assert again.returncode == 0 and 'nothing to do' in again.stderr, again.stderr
    assert server.ranges == [None]                   # not downloaded twice


def test_an_interrupted_download_resumes(tmp_path, serve):
    server = serve(make_archive(tmp_path))
    dest = tmp_path / 'data'
    dest.mkdir()
    half = len(server.payload) // 2
    (dest / 'cifar-10-binary.tar.gz.part').write_bytes(server.payload[:half])
    result = download(dest, server)
    assert result.returncode == 0, result.stdout + result.stderr
    assert server.ranges == [f'bytes={half}-']
    assert (dest / 'cifar-10-binary.tar.gz').read_bytes() == server.payload


def test_a_checksum_mismatch_keeps_nothing(tmp_path, serve):
    server = serve(make_archive(tmp_path))
    dest = tmp_path / 'data'
    result = download(dest, server, checksum='0' * 32)
    assert result.returncode == 1
    line = result.stderr.strip()
    assert '\n' not in line and line.startswith(f'launch: error: {server.url}: MD5 mismatch: expected '
                                                f'{"0" * 32}, got {md5(server.payload)}'), line
    assert os.listdir(dest) == []


@pytest.mark.parametrize('damage, message', [
    (dict(leave_out='test_batch.bin'), f'the archive has no {ARCHIVE_DIR}/test_batch.bin'),
    (dict(truncate='data_batch_3.bin'), 'not a multiple of the 3073-byte record'),
])
def test_a_bad_archive_is_named_and_nothing_is_unpacked(tmp_path, serve, damage, message):
    server = serve(make_archive(tmp_path, **damage))
    dest = tmp_path / 'data'
    result = download(dest, server)
    assert result.returncode == 1
    assert result.stderr.count('\n') == 1 and message in result.stderr, result.stderr
    assert os.listdir(dest) == ['cifar-10-binary.tar.gz']        # verified, kept; nothing unpacked


def test_unreachable_server_and_missing_file_are_one_line(tmp_path, serve):
    server = serve(b'')
    missing = launch('download', str(tmp_path / 'd1'), '--url', server.url.replace('cifar', 'nope'), timeout=60)
    assert missing.returncode == 1 and missing.stderr.count('\n') == 1 and 'HTTP 404' in missing.stderr
    server.close()
    closed = launch('download', str(tmp_path / 'd2'), '--url', server.url, timeout=60)
    assert closed.returncode == 1 and closed.stderr.count('\n') == 1, closed.stderr
    assert 'cannot download' in closed.stderr and 'refused' in closed.stderr, closed.stderr


def test_a_foreign_folder_in_the_way_is_left_alone(tmp_path, serve):
    server = serve(make_archive(tmp_path))
    target = tmp_path / 'data' / ARCHIVE_DIR
    target.mkdir(parents=True)
    (target / 'notes.txt').write_text('mine')
    result = download(tmp_path / 'data', server)
    assert result.returncode == 1 and 'exists but does not hold' in result.stderr, result.stderr
    assert os.listdir(target) == ['notes.txt'] and server.ranges == []
