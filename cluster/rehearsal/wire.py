"""The stand-ins' port and the measures of a link to it, on plain sockets (no grpcio: importing it
cost each stand-in ~18 MB and ~0.2 s of CPU, and a thousand stand-ins did not fit one machine).

One selector loop serves the task's port (`Server`), and tells two callers apart by their first
bytes:

- a gRPC client (the launcher's readiness check, `grpc.channel_ready_future`): HTTP/2's client
  preface. gRPC calls a channel READY once the server's first SETTINGS frame came (RFC 9113
  §3.4: the server's preface is one SETTINGS frame, empty is fine), so the answer is an empty
  SETTINGS, the ACK of the client's, and a PING's ACK for each PING. No stream is served: a call
  is refused (RST_STREAM);
- a stand-in (`MAGIC`, then one command a line): `ECHO n` + n bytes comes back as `OK n` + the
  same bytes (the round trip), `BLOB n` as `OK m` + m zero bytes, m at most MAX_BLOB_BYTES (the
  rate), `DONE index generation` as `OK 0` (a TF1 worker's last word to its ps);
- anything else is closed.

`reach` times every peer at once from one selector (no thread per peer): a peer whose port takes
no connection within the timeout is unreachable, one that answers but not as a stand-in is named
so (another process holds the port), one that takes the connection but never answers is said to.
"""
from __future__ import annotations

import collections
import logging
import selectors
import socket
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass


log = logging.getLogger('cluster.rehearsal')

MAGIC = b'TFR1\n'                # a stand-in's first bytes on a peer's port
H2_PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'
H2_SETTINGS, H2_PING, H2_GOAWAY, H2_HEADERS, H2_RST = 4, 6, 7, 1, 3
ACK = 1
MAX_BLOB_BYTES = 8 << 20         # the most a BLOB answers: a rehearsal measures, it does not load the network
MAX_ECHO_BYTES = 1 << 16
BLOB_BYTES = 1 << 20             # what a worker asks of each ps
PINGS = 5
PING_BYTES = 64
CALL_SECS = 10.0                 # one echo or blob: a peer slower than this is as good as unreachable
RETRY_SECS = (0.1, 0.5)          # a refused connection is tried again after 0.1 s, doubling to 0.5 s
LINE_BYTES = 64                  # the longest command or answer line
ZEROS = memoryview(bytes(1 << 16))
NO_STAND_IN = 'answers, but is no stand-in (another process holds the port?)'


def h2_frame(kind: int, flags: int = 0, stream: int = 0, payload: bytes = b'') -> bytes:
    return len(payload).to_bytes(3, 'big') + bytes((kind, flags)) + stream.to_bytes(4, 'big') + payload


def split_address(address: str) -> tuple[str, int]:
    """('host', port) of 'host:port' or '[v6]:port'."""
    host, _, port = address.rpartition(':')
    return host.strip('[]'), int(port)


class _Conn:
    """One accepted connection: what came in, what is to go out (bytes, or a count of zeros)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.mode = sock, b''
        self.inbuf = bytearray()
        self.out: collections.deque[bytes | int] = collections.deque()
        self.closing = False


class Server:
    """The stand-in's port, served by one selector loop on a daemon thread. SO_REUSEPORT off: a
    second process on the port fails, as TensorFlow's does. RuntimeError when it cannot bind."""

    def __init__(self, port: int, on_done: Callable[[int, int], None] | None = None) -> None:
        self.on_done = on_done
        self.listener = _listen(port)
        self.port = self.listener.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self._stop = False
        self.thread = threading.Thread(target=self._loop, name='serve', daemon=True)
        self.thread.start()

    def close(self) -> None:
        self._stop = True
        self.thread.join(timeout=2)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()     # type: ignore[union-attr]
        self.selector.close()

    def _loop(self) -> None:
        while not self._stop:
            for key, mask in self.selector.select(0.2):
                if key.data is None:
                    self._accept()
                else:
                    self._serve(key.data, mask)

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:         # the peer gave up before we took it
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.selector.register(sock, selectors.EVENT_READ, _Conn(sock))

    def _serve(self, conn: _Conn, mask: int) -> None:
        try:
            if mask & selectors.EVENT_READ:
                data = conn.sock.recv(1 << 16)
                if not data:
                    conn.closing, conn.out = True, collections.deque()
                conn.inbuf += data
                self._answer(conn)
            _flush(conn)
        except OSError:
            conn.closing, conn.out = True, collections.deque()
        if conn.closing and not conn.out:
            self.selector.unregister(conn.sock)
            conn.sock.close()
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        self.selector.modify(conn.sock, events, conn)

    def _answer(self, conn: _Conn) -> None:
        if not conn.mode:
            head = bytes(conn.inbuf[:len(H2_PREFACE)])
            if H2_PREFACE.startswith(head) or MAGIC.startswith(head[:len(MAGIC)]):
                if head == H2_PREFACE:
                    conn.mode = b'h2'
                    del conn.inbuf[:len(H2_PREFACE)]
                    conn.out.append(h2_frame(H2_SETTINGS))
                elif head[:len(MAGIC)] == MAGIC:
                    conn.mode = b'tfr'
                    del conn.inbuf[:len(MAGIC)]
                else:
                    return      # not all of the first bytes yet
            else:
                conn.closing = True
                return
        if conn.mode == b'h2':
            _answer_h2(conn)
        else:
            self._answer_standin(conn)

    def _answer_standin(self, conn: _Conn) -> None:
        while not conn.closing:
            end = conn.inbuf.find(b'\n')
            if end < 0:
                conn.closing = len(conn.inbuf) > LINE_BYTES
                return
            words = bytes(conn.inbuf[:end]).split()
            try:
                command, numbers = words[0], [int(w) for w in words[1:]]
            except (IndexError, ValueError):
                conn.closing = True
                return
            if command == b'ECHO' and len(numbers) == 1 and 0 <= numbers[0] <= MAX_ECHO_BYTES:
                if len(conn.inbuf) < end + 1 + numbers[0]:
                    return
                payload = bytes(conn.inbuf[end + 1:end + 1 + numbers[0]])
                del conn.inbuf[:end + 1 + numbers[0]]
                conn.out += (b'OK %d\n' % len(payload), payload)
                continue
            del conn.inbuf[:end + 1]
            if command == b'BLOB' and len(numbers) == 1:
                size = max(0, min(numbers[0], MAX_BLOB_BYTES))
                conn.out += (b'OK %d\n' % size, size)
            elif command == b'DONE' and len(numbers) == 2:
                if self.on_done is not None:
                    self.on_done(numbers[0], numbers[1])
                conn.out.append(b'OK 0\n')
            else:
                conn.closing = True


def _answer_h2(conn: _Conn) -> None:
    """The frames a gRPC client needs to call the channel READY, and keep it so."""
    while len(conn.inbuf) >= 9:
        size = int.from_bytes(conn.inbuf[:3], 'big')
        if len(conn.inbuf) < 9 + size:
            return
        kind, flags, stream = conn.inbuf[3], conn.inbuf[4], int.from_bytes(conn.inbuf[5:9], 'big') & 0x7FFFFFFF
        payload = bytes(conn.inbuf[9:9 + size])
        del conn.inbuf[:9 + size]
        if kind == H2_SETTINGS and not flags & ACK:
            conn.out.append(h2_frame(H2_SETTINGS, ACK))
        elif kind == H2_PING and not flags & ACK:
            conn.out.append(h2_frame(H2_PING, ACK, 0, payload))
        elif kind == H2_HEADERS:        # a call: no service here
            conn.out.append(h2_frame(H2_RST, 0, stream, (7).to_bytes(4, 'big')))     # REFUSED_STREAM
        elif kind == H2_GOAWAY:
            conn.closing = True
            return


def _flush(conn: _Conn) -> None:
    """Send what the socket takes now; the rest waits for the next writable turn."""
    while conn.out:
        head = conn.out[0]
        chunk = ZEROS[:min(head, len(ZEROS))] if isinstance(head, int) else head
        try:
            sent = conn.sock.send(chunk)
        except BlockingIOError:
            return
        if isinstance(head, int):
            left: bytes | int = head - sent
        else:
            left = head[sent:]
        if left:
            conn.out[0] = left
            if sent < len(chunk):
                return
        else:
            conn.out.popleft()


def _listen(port: int) -> socket.socket:
    """A listening socket on every interface at `port` (IPv6 and IPv4, as TensorFlow's `[::]:port`)."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        where: tuple = ('::', port)
    except OSError:         # no IPv6 on this host
        sock, where = socket.socket(socket.AF_INET, socket.SOCK_STREAM), ('0.0.0.0', port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)      # as gRPC's: a restart rebinds at once
    try:
        sock.bind(where)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise RuntimeError(f'cannot bind port {port}: {e.strerror}') from None
    sock.setblocking(False)
    return sock


def serve(port: int, on_done: Callable[[int, int], None] | None = None) -> Server:
    """The stand-in's server at `port`; `on_done` hears the workers' DONE. RuntimeError when the
    port cannot be bound."""
    return Server(port, on_done)


def median_ms(seconds: list[float]) -> float:
    """The median of round trips, in milliseconds (3 decimals: a figure for people)."""
    return round(statistics.median(seconds) * 1000, 3)


def rate_mb_per_s(size: int, seconds: float) -> float:
    """A transfer's rate in MB/s (10^6 bytes), one decimal; a transfer too quick to time counts as 1 µs."""
    return round(size / max(seconds, 1e-6) / 1e6, 1)


@dataclass(frozen=True)
class Target:
    """A peer to reach: its name, host:port, and whether to time a blob from it (a ps)."""
    peer: str
    address: str
    blob: bool = False
