"""The client side of the stand-ins' wire (wire.py): every peer reached and timed at once from one
selector (`reach`), and a worker's DONE to a ps (`report_done`).

A probe is a small state machine per peer: connect (a refused or unresolvable peer is tried
again, 0.1 s doubling to 0.5 s, until the deadline), then its commands one after the other, each
answered by `OK n` and n bytes: PINGS echoes (the round trip is their median), then for a ps one
blob (its rate). A connection that closes or answers anything else is a port held by something
that is no stand-in; one that takes the command but stays silent for CALL_SECS is said so.
"""
from __future__ import annotations

import errno
import selectors
import socket
import time
from collections.abc import Sequence

from cluster.rehearsal.messages import Link
from cluster.rehearsal.wire import (BLOB_BYTES, CALL_SECS, LINE_BYTES, MAGIC, NO_STAND_IN, PING_BYTES, PINGS,
                                    RETRY_SECS, Target, median_ms, rate_mb_per_s, split_address)


class _Probe:
    """One peer's reach and measures (all its I/O non-blocking, driven by `reach`'s selector)."""

    def __init__(self, target: Target, started: float, timeout: float) -> None:
        self.target, self.started, self.deadline = target, started, started + timeout
        self.commands: list[bytes] = [b'ECHO %d\n' % PING_BYTES + bytes(PING_BYTES)] * PINGS
        if target.blob:
            self.commands.append(b'BLOB %d\n' % BLOB_BYTES)
        self.sock: socket.socket | None = None
        self.connected = False
        self.retry_at, self.backoff = 0.0, RETRY_SECS[0]
        self.out, self.inbuf = b'', bytearray()
        self.want: int | None = None       # the bytes the answer's line announced, still to come
        self.size = 0                      # the bytes of the answer under way
        self.sent_at = 0.0
        self.trips: list[float] = []
        self.rate: float | None = None
        self.error = ''
        self.done = False
        self.why_not = 'no connection'

    # -- the clock ---------------------------------------------------------------------------
    def wake_at(self) -> float:
        if self.done:
            return float('inf')
        if self.sock is None:
            return self.retry_at
        return self.sent_at + CALL_SECS if self.connected else self.deadline

    def tick(self, sel: selectors.BaseSelector, now: float) -> None:
        if self.done:
            return
        if self.sock is None and now >= self.retry_at:
            self._connect(sel, now)
        elif self.sock is not None and self.connected and now >= self.sent_at + CALL_SECS:
            self._finish(sel, f'connected, but no answer within {CALL_SECS:g}s')
        elif self.sock is not None and not self.connected and now >= self.deadline:
            self._finish(sel, f'no connection within {self._timeout():g}s')

    def _timeout(self) -> float:
        return round(self.deadline - self.started, 3)

    # -- connecting --------------------------------------------------------------------------
    def _connect(self, sel: selectors.BaseSelector, now: float) -> None:
        if now >= self.deadline:
            self._finish(sel, f'{self.why_not} within {self._timeout():g}s')
            return
        host, port = split_address(self.target.address)
        try:
            family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        except (OSError, UnicodeError):
            self.why_not = f'cannot resolve {host}'
            self._retry(now)
            return
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        code = sock.connect_ex(where)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self._retry(now)
            return
        self.sock = sock
        sel.register(sock, selectors.EVENT_WRITE, self)

    def _retry(self, now: float) -> None:
        self.retry_at = min(now + self.backoff, self.deadline)
        self.backoff = min(RETRY_SECS[1], self.backoff * 2)

    # -- talking -----------------------------------------------------------------------------
    def on_event(self, sel: selectors.BaseSelector, mask: int, now: float) -> None:
        assert self.sock is not None
        if not self.connected:
            if self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                sel.unregister(self.sock)
                self.sock.close()
                self.sock = None
                self.why_not = 'no connection'
                self._retry(now)
                return
            self.connected = True
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._send_next(MAGIC)
        try:
            if mask & selectors.EVENT_WRITE and self.out:
                sent = self.sock.send(self.out)
                self.out = self.out[sent:]
            if mask & selectors.EVENT_READ:
                data = self.sock.recv(1 << 16)
                if not data:
                    self._finish(sel, NO_STAND_IN)
                    return
                self._heard(sel, data)
        except BlockingIOError:
            pass
        except OSError as e:
            self._finish(sel, NO_STAND_IN if e.errno == errno.ECONNRESET else f'error: {e.strerror}')
            return
        if not self.done:
            sel.modify(self.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if self.out else 0), self)

    def _send_next(self, prefix: bytes = b'') -> None:
        self.out += prefix + self.commands[len(self.trips) + (self.rate is not None)]
        self.sent_at = time.perf_counter()

    def _heard(self, sel: selectors.BaseSelector, data: bytes) -> None:
        if self.want is None:
            self.inbuf += data
            end = self.inbuf.find(b'\n')
            if end < 0:
                if len(self.inbuf) > LINE_BYTES:
                    self._finish(sel, NO_STAND_IN)
                return
            words = bytes(self.inbuf[:end]).split()
            if len(words) != 2 or words[0] != b'OK' or not words[1].isdigit():
                self._finish(sel, NO_STAND_IN)
                return
            self.want = self.size = int(words[1])
            data = bytes(self.inbuf[end + 1:])
            self.inbuf.clear()
        self.want -= len(data)
        if self.want > 0:
            return
        self.want = None
        took = time.perf_counter() - self.sent_at
        if len(self.trips) < PINGS:
            self.trips.append(took)
        else:
            self.rate = rate_mb_per_s(self.size, took)
        if len(self.trips) + (self.rate is not None) < len(self.commands):
            self._send_next()
        else:
            self._finish(sel, '')

    def _finish(self, sel: selectors.BaseSelector, error: str) -> None:
        self.error, self.done = error, True
        if self.sock is not None:
            sel.unregister(self.sock)
            self.sock.close()
            self.sock = None

    def link(self) -> Link:
        t = self.target
        if self.error:
            return Link(t.peer, t.address, error=self.error)
        return Link(t.peer, t.address, median_ms(self.trips), self.rate)


def reach(targets: Sequence[Target], timeout: float) -> tuple[Link, ...]:
    """Every target reached within `timeout` seconds and timed, all at once from one selector, in
    the targets' order. Never raises: what went wrong is a Link's error."""
    started = time.perf_counter()
    probes = [_Probe(t, started, timeout) for t in targets]
    with selectors.DefaultSelector() as sel:
        while not all(p.done for p in probes):
            now = time.perf_counter()
            for probe in probes:
                probe.tick(sel, now)
            wake = min(p.wake_at() for p in probes)
            if wake == float('inf'):
                break
            for key, mask in sel.select(max(0.0, min(wake - time.perf_counter(), 1.0))):
                key.data.on_event(sel, mask, time.perf_counter())
    return tuple(p.link() for p in probes)


def measure(peer: str, address: str, timeout: float, blob: bool) -> Link:
    """One peer reached and timed (reach of one)."""
    return reach([Target(peer, address, blob)], timeout)[0]


def report_done(address: str, index: int, generation: int, timeout: float = CALL_SECS) -> str:
    """Tell the ps at `address` that worker `index` (of `generation`) is done, trying until
    `timeout` as a gRPC call waits for its channel; '' or why not."""
    host, port = split_address(address)
    deadline = time.monotonic() + timeout
    why, pause = 'no connection', RETRY_SECS[0]
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())) as sock:
                sock.sendall(MAGIC + b'DONE %d %d\n' % (index, generation))
                answer = sock.makefile('rb').readline(LINE_BYTES)
            return '' if answer.startswith(b'OK ') else NO_STAND_IN
        except OSError as e:
            why = f'{type(e).__name__}: {e.strerror or e}'
        if time.monotonic() + pause > deadline:
            return why
        time.sleep(pause)
        pause = min(RETRY_SECS[1], pause * 2)
