"""The stand-ins' wire on real sockets in this process (cluster/rehearsal/wire.py, probe.py): a
gRPC client sees the port READY, a stand-in's echo and blob time the link, a DONE reaches the ps,
and a port held by something else is named as no stand-in."""
from __future__ import annotations

import socket
import threading

import grpc
import pytest

from cluster.rehearsal import probe, wire


@pytest.fixture
def server():
    heard = []
    served = wire.serve(0, lambda index, generation: heard.append((index, generation)))
    served.heard = heard
    yield served
    served.close()


def test_grpc_sees_a_served_port_ready(server):
    channel = grpc.insecure_channel(f'localhost:{server.port}', options=[('grpc.enable_http_proxy', 0)])
    try:
        grpc.channel_ready_future(channel).result(timeout=10)
        with pytest.raises(grpc.RpcError):      # a call is refused, not left hanging
            channel.unary_unary('/x.Y/Z')(b'', timeout=10)
    finally:
        channel.close()


def test_an_echo_and_a_blob_time_the_link(server):
    link = probe.measure('ps:0', f'localhost:{server.port}', 5, blob=True)
    assert link.reached, link
    assert link.rtt_ms is not None and link.rtt_ms > 0
    assert link.mb_per_s is not None and link.mb_per_s > 0


def test_many_peers_are_reached_at_once_in_their_order(server):
    other = wire.serve(0)
    try:
        targets = [wire.Target(f'ps:{i}', f'localhost:{(server.port, other.port)[i % 2]}', i % 3 == 0) for i in range(12)]
        links = probe.reach(targets, 5)
    finally:
        other.close()
    assert [x.peer for x in links] == [t.peer for t in targets]
    assert all(x.reached for x in links)
    assert [x.mb_per_s is not None for x in links] == [t.blob for t in targets]


def test_a_done_reaches_the_ps(server):
    assert probe.report_done(f'localhost:{server.port}', 3, 2, timeout=5) == ''
    assert server.heard == [(3, 2)]


def _plain_listener(answer: bytes | None):
    """A TCP port held by something that is no stand-in: it answers `answer` and closes (None: says nothing)."""
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    sock.listen(8)
    held = []

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            if answer is None:
                held.append(conn)
            else:
                conn.recv(100)
                conn.sendall(answer)
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock, held


@pytest.mark.parametrize('answer', [b'HTTP/1.1 400 Bad Request\r\n\r\n', b''])
def test_a_port_held_by_something_else_answers_but_is_no_stand_in(answer):
    sock, _ = _plain_listener(answer)
    try:
        link = probe.measure('ps:0', f'127.0.0.1:{sock.getsockname()[1]}', 5, blob=True)
    finally:
        sock.close()
    assert link.error == wire.NO_STAND_IN


def test_a_silent_port_is_said_to_take_the_connection_but_not_answer(monkeypatch):
    monkeypatch.setattr(probe, 'CALL_SECS', 0.3)
    sock, held = _plain_listener(None)
    try:
        link = probe.measure('ps:0', f'127.0.0.1:{sock.getsockname()[1]}', 5, blob=False)
    finally:
        sock.close()
        for conn in held:
            conn.close()
    assert link.error.startswith('connected, but no answer within')


def test_a_closed_port_is_unreachable_within_the_timeout():
    sock = socket.socket()
    sock.bind(('127.0.0.1', 0))
    port = sock.getsockname()[1]
    sock.close()        # nothing listens there now
    link = probe.measure('ps:1', f'127.0.0.1:{port}', 0.3, blob=True)
    assert link.error == 'no connection within 0.3s'


def test_a_second_server_on_a_port_fails(server):
    with pytest.raises(RuntimeError, match='cannot bind'):
        wire.serve(server.port)


def test_a_stranger_talking_garbage_is_closed_and_the_server_serves_on(server):
    with socket.create_connection(('localhost', server.port), timeout=5) as sock:
        sock.sendall(b'GET / HTTP/1.1\r\n\r\n')
        assert sock.recv(100) == b''
    assert probe.measure('ps:0', f'localhost:{server.port}', 5, blob=False).reached
