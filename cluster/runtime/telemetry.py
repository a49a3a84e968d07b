"""What each task measures of itself while it runs, every SAMPLE_SECS, into its pulse
(cluster/runtime/pulse.py) where the launcher and `launch status` read it:

- its own steps: a worker of the built-in trainer counts each step it trains (`count`), so every
  worker's rate is known, not only the chief's progress line's;
- its CPU, as a share of one core over the interval (its process's user and system time), and
  its resident memory;
- on a host with NVIDIA GPUs (and the gpu extra's NVML), how busy the GPUs it may use were and
  the memory it holds on them (cluster/runtime/gpu.py);
- the bytes its TCP connections received and sent per second, measured by the kernel
  (getsockopt TCP_INFO on each of its sockets: tcpi_bytes_received and tcpi_bytes_acked). A ps
  task's bytes are its load as it is, beside the plan's prediction (launch/planning/ps_load.py).

The sample is a hint, as the pulse is: a task where /proc or TCP_INFO cannot be read leaves those
figures out and trains on. Linux only (/proc)."""
from __future__ import annotations

import os
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from cluster.runtime.gpu import Gpus

SAMPLE_SECS = 2.0
TCP_INFO_LEN = 136          # through tcpi_bytes_received (Linux >= 4.1)
BYTES_ACKED_AT = 120        # offsets of the two u64 counters in struct tcp_info
BYTES_RECEIVED_AT = 128
PAGE = os.sysconf('SC_PAGE_SIZE') if hasattr(os, 'sysconf') else 4096


@dataclass(frozen=True)
class Sample:
    """One task's figures over its last interval (None: not measured). Written compactly into the
    pulse (`to_json`'s short keys: a pulse is one 512-byte block)."""
    t: float                            # when (epoch seconds)
    steps: int | None = None            # its own steps so far (a worker's)
    steps_per_sec: float | None = None
    images_per_sec: float | None = None
    cpu: float | None = None            # share of one core
    rss: int | None = None              # bytes
    in_per_sec: float | None = None     # bytes its TCP connections received, per second
    out_per_sec: float | None = None    # ... and sent (acknowledged by the peer)
    gpu: float | None = None            # share of the time its GPUs ran a kernel (mean over them)
    gpu_memory: int | None = None       # bytes it holds on its GPUs

    KEYS: ClassVar[dict[str, str]] = {'t': 't', 'steps': 'n', 'steps_per_sec': 'sps', 'images_per_sec': 'ips', 'cpu': 'cpu',
            'rss': 'rss', 'in_per_sec': 'in', 'out_per_sec': 'out', 'gpu': 'gpu', 'gpu_memory': 'gmem'}
    WHOLE: ClassVar[frozenset[str]] = frozenset({'steps', 'rss', 'gpu_memory'})

    def to_json(self) -> dict:
        out: dict[str, Any] = {}
        for name, key in self.KEYS.items():
            value = getattr(self, name)
            if value is not None:
                out[key] = round(value, 3) if isinstance(value, float) else value
        return out

    @classmethod
    def from_json(cls, data: object) -> Sample | None:
        """The sample of a pulse's `sample` object; None for anything else (a pulse is a hint)."""
        if not isinstance(data, dict) or not _real(data.get('t')):
            return None
        values: dict[str, Any] = {}
        for name, key in cls.KEYS.items():
            value = data.get(key)
            if name in cls.WHOLE:
                values[name] = value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
            else:
                values[name] = float(value) if isinstance(value, (int, float)) and _real(value) else None
        return cls(**values)

    def facts(self) -> dict:
        """The long-named fields (status --json, events)."""
        return {name: getattr(self, name) for name in self.KEYS if name != 't'}


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float('inf')


class Steps:
    """A worker's own step count (its trainer calls `count` once a step)."""

    def __init__(self) -> None:
        self.steps = 0
        self.images = 0

    def count(self, images: int) -> None:
        self.steps += 1
        self.images += images


STEPS = Steps()


def rss_bytes() -> int | None:
    try:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


def cpu_secs() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def socket_inodes(fd_dir: str = '/proc/self/fd') -> dict[int, int]:
    """fd -> socket inode of this process's sockets."""
    found: dict[int, int] = {}
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.startswith('socket:['):
            found[int(name)] = int(target[8:-1])
    return found


def tcp_counts(fd: int) -> tuple[int, int] | None:
    """(bytes received, bytes acked) of the TCP socket at `fd`, from a duplicate of it (the
    process's own fd is never closed here); None for a socket that is not TCP."""
    try:
        sock = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    except OSError:
        return None
    finally:
        sock.close()
    if len(info) < TCP_INFO_LEN:
        return None
    (acked,) = struct.unpack_from('Q', info, BYTES_ACKED_AT)
    (received,) = struct.unpack_from('Q', info, BYTES_RECEIVED_AT)
    return received, acked      # acked: one byte more on the side that connected (its SYN)


class TcpBytes:
    """This process's TCP bytes received and sent so far, over every connection it has had: a
    connection's counts stay in the total once it has closed."""

    def __init__(self, sockets: Callable[[], dict[int, int]] = socket_inodes) -> None:
        self.sockets = sockets                          # fd -> inode of the sockets to count
        self._open: dict[int, tuple[int, int]] = {}     # inode -> its counts at the last look
        self._closed = (0, 0)

    def total(self) -> tuple[int, int]:
        now: dict[int, tuple[int, int]] = {}
        for fd, inode in self.sockets().items():
            counts = tcp_counts(fd)
            if counts is not None:
                now[inode] = counts
        gone = [c for inode, c in self._open.items() if inode not in now]
        self._closed = (self._closed[0] + sum(c[0] for c in gone), self._closed[1] + sum(c[1] for c in gone))
        self._open = now
        return (self._closed[0] + sum(c[0] for c in now.values()), self._closed[1] + sum(c[1] for c in now.values()))


class _Sink(Protocol):
    def sample(self, sample: Sample) -> None: ...


class Sampler:
    """Takes a Sample every `every` seconds into `sink` (the pulse), from a daemon thread."""

    def __init__(self, sink: _Sink, steps: Steps = STEPS, every: float = SAMPLE_SECS, trainer: bool = False,
                 gpus: Gpus | None = None) -> None:
        self.sink, self.steps, self.every, self.trainer = sink, steps, every, trainer
        self.tcp = TcpBytes()
        self.gpus = Gpus() if gpus is None else gpus
        self._last: tuple[float, float, int, int, tuple[int, int]] | None = None
        self._stop = threading.Event()

    def take(self) -> Sample:
        """The figures since the last take (the first take gives no rates)."""
        now, cpu, tcp = time.monotonic(), cpu_secs(), self.tcp.total()
        steps, images = self.steps.steps, self.steps.images
        last, self._last = self._last, (now, cpu, steps, images, tcp)
        mine = steps if self.trainer else None
        gpu = self.gpus.take()
        busy, held = (None, None) if gpu is None else (gpu.busy, gpu.memory)
        if last is None or now <= last[0]:
            return Sample(time.time(), mine, rss=rss_bytes(), gpu=busy, gpu_memory=held)
        dt = now - last[0]

        def rate(new: float, old: float) -> float:
            return (new - old) / dt
        return Sample(time.time(), mine, rate(steps, last[2]) if self.trainer else None,
                      rate(images, last[3]) if self.trainer else None, rate(cpu, last[1]), rss_bytes(),
                      rate(tcp[0], last[4][0]), rate(tcp[1], last[4][1]), busy, held)

    def start(self) -> None:
        threading.Thread(target=self._run, name='tfcluster-telemetry', daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.sink.sample(self.take())
            except Exception:       # noqa: BLE001 (a hint: never the task's end)
                pass
