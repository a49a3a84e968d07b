"""The stand-ins' tiny gRPC service and the measures of one link to it.

Raw bytes over a generic handler (no protobuf, no generated code): `Echo` answers its request,
`Blob` answers with as many bytes as its request asks for (bounded), `Done` takes a worker's
word that it finished (index and generation, as a real worker enqueues them on every ps, so
that the ps ends by itself once every live worker is done). A peer is reached when its
channel becomes ready within the timeout; the round trip is the median of a few echoes, the rate
one bounded blob's bytes over its time. A port that answers gRPC but not this service is no
stand-in (another process holds it): said as such.
"""
from __future__ import annotations

import statistics
import struct
import time
from collections.abc import Callable
from concurrent import futures

import grpc

from cluster.rehearsal.messages import Link

SERVICE = 'tfcluster.Rehearsal'
ECHO, BLOB, DONE = f'/{SERVICE}/Echo', f'/{SERVICE}/Blob', f'/{SERVICE}/Done'
MAX_BLOB_BYTES = 8 << 20         # the most a Blob answers: a rehearsal measures, it does not load the network
BLOB_BYTES = 1 << 20             # what a worker asks of each ps
PINGS = 5
PING_BYTES = 64
CALL_SECS = 10.0                 # one echo or blob: a peer slower than this is as good as unreachable
CHANNEL_OPTIONS = [('grpc.enable_http_proxy', 0), ('grpc.max_receive_message_length', MAX_BLOB_BYTES + 1024),
                   ('grpc.initial_reconnect_backoff_ms', 100), ('grpc.min_reconnect_backoff_ms', 100),
                   ('grpc.max_reconnect_backoff_ms', 500)]
SERVER_THREADS = 4


def _blob(request: bytes, context: grpc.ServicerContext) -> bytes:
    (size,) = struct.unpack('>Q', request[:8].rjust(8, b'\0'))
    return bytes(min(size, MAX_BLOB_BYTES))


def done_request(index: int, generation: int) -> bytes:
    return struct.pack('>qq', index, generation)


def read_done(request: bytes) -> tuple[int, int] | None:
    """(worker index, generation) of a Done request, None for a malformed one."""
    if len(request) != 16:
        return None
    index, generation = struct.unpack('>qq', request)
    return index, generation


def serve(port: int, on_done: Callable[[int, int], None] | None = None) -> grpc.Server:
    """The stand-in's server on every interface at `port`, as TensorFlow's binds (`*:port`);
    `on_done` hears the workers' Done. SO_REUSEPORT off: a second process on the port must
    fail, not share it. RuntimeError when the port cannot be bound."""
    def done(request: bytes, context: grpc.ServicerContext) -> bytes:
        said = read_done(request)
        if said is not None and on_done is not None:
            on_done(*said)
        return b''

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=SERVER_THREADS),
                         options=[('grpc.so_reuseport', 0), ('grpc.max_send_message_length', MAX_BLOB_BYTES + 1024)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        'Echo': grpc.unary_unary_rpc_method_handler(lambda request, context: request),
        'Blob': grpc.unary_unary_rpc_method_handler(_blob),
        'Done': grpc.unary_unary_rpc_method_handler(done),
    }),))
    if server.add_insecure_port(f'[::]:{port}') == 0:       # older grpcio says so by 0, newer raises
        raise RuntimeError(f'cannot bind port {port}')
    server.start()
    return server


def median_ms(seconds: list[float]) -> float:
    """The median of round trips, in milliseconds (3 decimals: a figure for people)."""
    return round(statistics.median(seconds) * 1000, 3)


def rate_mb_per_s(size: int, seconds: float) -> float:
    """A transfer's rate in MB/s (10^6 bytes), one decimal; a transfer too quick to time counts as 1 µs."""
    return round(size / max(seconds, 1e-6) / 1e6, 1)


def measure(peer: str, address: str, timeout: float, blob: bool) -> Link:
    """Reach the stand-in `peer` at `address` within `timeout` seconds, then time it: echoes
    always, a blob where `blob` (a ps). Never raises: what went wrong is the Link's error."""
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    try:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            return Link(peer, address, error=f'no connection within {timeout:g}s')
        echo = channel.unary_unary(ECHO)
        payload = b'\0' * PING_BYTES
        trips = []
        for _ in range(PINGS):
            t0 = time.perf_counter()
            echo(payload, timeout=CALL_SECS)
            trips.append(time.perf_counter() - t0)
        rate = None
        if blob:
            t0 = time.perf_counter()
            got = channel.unary_unary(BLOB)(struct.pack('>Q', BLOB_BYTES), timeout=CALL_SECS)
            rate = rate_mb_per_s(len(got), time.perf_counter() - t0)
        return Link(peer, address, median_ms(trips), rate)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, 'code') else None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return Link(peer, address, error='answers, but is no stand-in (another process holds the port?)')
        return Link(peer, address, error=f'{getattr(code, "name", "error")}: {e.details() if hasattr(e, "details") else e}')
    finally:
        channel.close()


def report_done(address: str, index: int, generation: int, timeout: float = CALL_SECS) -> str:
    """Tell the ps at `address` that worker `index` (of `generation`) is done; '' or why not."""
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    try:
        channel.unary_unary(DONE)(done_request(index, generation), timeout=timeout, wait_for_ready=True)
        return ''
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, 'code') else None
        return getattr(code, 'name', 'error')
    finally:
        channel.close()
