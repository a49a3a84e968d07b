"""A task's telemetry (cluster/runtime/telemetry.py): its sample in the pulse and back, the kernel's
byte counts of real TCP connections (TCP_INFO at the offsets Linux gives them), and the rates a
sampler takes between two looks."""
from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from cluster.runtime import pulse, telemetry
from cluster.runtime.telemetry import Sample


def test_a_sample_goes_into_the_pulse_and_comes_back(tmp_path):
    beat = pulse.Pulse()
    assert beat.open(str(tmp_path / 'worker-0.pulse'))
    beat.beat(40, 100)
    sample = Sample(1795943716.25, 12, 3.5, 224.0, 0.97, 712_000_000, 1.5e6, 2.5e6, 0.875, 10_737_418_240)
    beat.sample(sample)
    text = (tmp_path / 'worker-0.pulse').read_text()
    assert len(text) == pulse.PULSE_BYTES
    read = pulse.parse(text)
    assert read is not None and (read.step, read.total, read.refused) == (40, 100, None)
    assert read.sample == sample
    assert read.sample.facts() == {'steps': 12, 'steps_per_sec': 3.5, 'images_per_sec': 224.0, 'cpu': 0.97,
                                   'rss': 712_000_000, 'in_per_sec': 1.5e6, 'out_per_sec': 2.5e6, 'gpu': 0.875,
                                   'gpu_memory': 10_737_418_240}


def test_a_long_refusal_keeps_the_pulse_whole_and_drops_the_sample(tmp_path):
    beat = pulse.Pulse()
    assert beat.open(str(tmp_path / 'worker-0.pulse'))
    beat.sample(Sample(1.0, 1, 1.0, 1.0, 1.0, 1, 1.0, 1.0))
    why = 'cannot write /' + 'x' * 400 + ': No space left on device (ENOSPC)'
    beat.refuse(why)
    read = pulse.parse((tmp_path / 'worker-0.pulse').read_text())
    assert read is not None and read.refused == why and read.sample is None


@pytest.mark.parametrize('data', [None, [], {'t': 'now'}, {'t': float('nan')}, {}])
def test_what_is_no_sample_reads_as_none(data):
    assert Sample.from_json(data) is None


def test_figures_that_are_not_numbers_are_left_out():
    read = Sample.from_json({'t': 5, 'n': -1, 'sps': 'fast', 'cpu': True, 'rss': 1.5, 'in': 10})
    assert read == Sample(5.0, None, None, None, None, None, 10.0, None)


def test_the_kernel_counts_the_bytes_of_a_real_tcp_connection():
    server = socket.create_server(('127.0.0.1', 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    payload = b'x' * 300_000
    reader = threading.Thread(target=_drain, args=(peer, 300_000))
    reader.start()
    client.sendall(payload)
    reader.join(10)
    peer.sendall(b'y' * 5_000)
    _drain(client, 5_000)
    try:
        sent = telemetry.tcp_counts(client.fileno())
        got = telemetry.tcp_counts(peer.fileno())
        assert sent is not None and got is not None
        # (received, acked); the kernel counts the connecting side's SYN as one byte acked
        assert sent == (5_000, 300_001) and got == (300_000, 5_000)
        inodes = telemetry.socket_inodes()
        assert client.fileno() in inodes and peer.fileno() in inodes
        os.fstat(client.fileno())       # the duplicate was closed, never the socket itself
    finally:
        for s in (client, peer, server):
            s.close()


def _drain(sock: socket.socket, n: int) -> None:
    got = 0
    while got < n:
        chunk = sock.recv(1 << 20)
        assert chunk
        got += len(chunk)


def test_a_socket_that_is_not_tcp_has_no_counts():
    a, b = socket.socketpair()
    try:
        assert telemetry.tcp_counts(a.fileno()) is None
    finally:
        a.close()
        b.close()


def test_bytes_of_a_closed_connection_stay_in_the_total():
    server = socket.create_server(('127.0.0.1', 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    ours = {client.fileno(), peer.fileno()}     # this test's sockets only (another test's may talk meanwhile)
    counts = telemetry.TcpBytes(lambda: {fd: i for fd, i in telemetry.socket_inodes().items() if fd in ours})
    before = counts.total()
    client.sendall(b'z' * 10_000)
    _drain(peer, 10_000)
    during = counts.total()
    client.close()
    peer.close()
    after = counts.total()
    server.close()
    assert during[0] - before[0] == 10_000 and during[1] - before[1] == 10_000    # in and out: both ends are ours
    assert after == during


class Sink:
    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def sample(self, sample: Sample) -> None:
        self.samples.append(sample)


def test_a_sampler_gives_rates_from_its_second_look():
    steps = telemetry.Steps()
    sampler = telemetry.Sampler(Sink(), steps, trainer=True)
    first = sampler.take()
    assert first.steps == 0 and first.steps_per_sec is None and first.rss and first.rss > 0
    for _ in range(10):
        steps.count(64)
    second = sampler.take()
    assert second.steps == 10 and second.steps_per_sec > 0
    assert second.images_per_sec == pytest.approx(64 * second.steps_per_sec)
    assert second.cpu is not None and second.cpu >= 0
    assert json.loads(json.dumps(second.to_json()))['n'] == 10


def test_a_ps_sampler_counts_no_steps():
    sampler = telemetry.Sampler(Sink(), telemetry.Steps(), trainer=False)
    sampler.take()
    assert sampler.take().steps is None
