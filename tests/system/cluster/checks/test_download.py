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

from cluster.checks import data
from cluster.checks.download import ARCHIVE_DIR, WANTED
from tests.conftest import launch

pytestmark = pytest.mark.slow     # every test runs `launch download`


def make_archive(tmp_path, leave_out: str | None = None, truncate: str | None = None) -> bytes:
    source = tmp_path / 'source'
    data.write_synthetic(str(source), records_per_file=20, test_records=20)
    (source / 'batches.meta.txt').write_text('airplane\nautomobile\n')
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode='w:gz') as tar:
        for name in WANTED + ['batches.meta.txt', data.SYNTHETIC_MANIFEST]:
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
    Range header (None when absent). Misbehaviours on demand: `whole_as_206` answers a range request
    with the whole file as a 206, `drop_after` closes the connection after that many bytes."""

    def __init__(self, payload: bytes):
        self.payload, self.ranges = payload, []
        self.whole_as_206, self.drop_after = False, None
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
                    start = 0 if outer.whole_as_206 else int(asked.split('=')[1].rstrip('-'))
                    body, status = outer.payload[start:], 206
                self.send_response(status)
                self.send_header('Content-Length', str(len(body)))
                if status == 206:
                    self.send_header('Content-Range', f'bytes {len(outer.payload) - len(body)}-'
                                                      f'{len(outer.payload) - 1}/{len(outer.payload)}')
                self.end_headers()
                if outer.drop_after is not None:
                    self.wfile.write(body[:outer.drop_after])
                    self.close_connection = True
                    return
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
    (dict(leave_out='test_batch.bin'), f'the archive has no file {ARCHIVE_DIR}/test_batch.bin'),
    (dict(truncate='data_batch_3.bin'),
     f'CIFAR-10 file {ARCHIVE_DIR}/data_batch_3.bin has 61455 bytes, not a multiple of the 3073-byte record'),
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


def test_a_dropped_connection_keeps_what_arrived_and_the_next_run_resumes(tmp_path, serve):
    server = serve(make_archive(tmp_path))
    server.drop_after = 1000
    dest = tmp_path / 'data'
    cut = download(dest, server)
    assert cut.returncode == 1 and cut.stderr.count('\n') == 1, cut.stderr
    assert 'run the command again to resume' in cut.stderr, cut.stderr
    assert (dest / 'cifar-10-binary.tar.gz.part').read_bytes() == server.payload[:1000]
    server.drop_after = None
    again = download(dest, server)
    assert again.returncode == 0, again.stderr
    assert server.ranges == [None, 'bytes=1000-']


def test_a_range_answered_from_the_start_is_not_appended(tmp_path, serve):
    server = serve(make_archive(tmp_path))
    server.whole_as_206 = True
    dest = tmp_path / 'data'
    dest.mkdir()
    (dest / 'cifar-10-binary.tar.gz.part').write_bytes(server.payload[:500])
    result = download(dest, server)
    assert result.returncode == 0, result.stderr
    assert 'cannot resume at byte 500; starting over' in result.stderr
    assert (dest / 'cifar-10-binary.tar.gz').read_bytes() == server.payload


@pytest.mark.parametrize('args, message', [
    (['--md5', 'c32a1d4ab5d03f1284b67883e8d8753'], '--md5 c32a1d4ab5d03f1284b67883e8d8753: expected 32 hexadecimal'),
    (['--url', 'www.example.org/cifar.tgz'], '--url www.example.org/cifar.tgz: expected an http'),
])
def test_a_mistyped_checksum_or_url_is_refused_before_downloading(tmp_path, args, message):
    result = launch('download', str(tmp_path / 'data'), *args, timeout=60)
    assert result.returncode == 2 and result.stderr == f'launch: error: {message}' + result.stderr.split(message)[1]
    assert result.stderr.count('\n') == 1 and not (tmp_path / 'data').exists()
