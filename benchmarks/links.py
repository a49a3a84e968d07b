"""Emulated links between hosts, on one machine: `python benchmarks/bench.py --only links`.

On one machine every task talks over loopback, where a step's bytes cost next to nothing and the
cost that matters between hosts (a step's bytes over each host's link) is invisible. Here each task
runs in a network namespace of its own, like a host with one network interface: a veth pair joins
it to a bridge in a hub namespace (the switch), and a `tbf` queue on both ends of the pair limits
what the task sends and what it receives to the link's rate. The kernel here has no `netem`, so
latency is the veth's own (measured and reported, a few tens of microseconds).

Tasks are started by hand (`ip netns exec NS python -m cluster.task --spec ... --job J --index I`,
the task runtime the launcher runs), at 10.213.0.x addresses that exist only inside the namespaces
this module creates; every namespace is removed at the end, also on Ctrl-C or SIGTERM, and any left
by a benchmark that was killed outright is removed when the next one starts.

The measurements are held against `launch plan --link`'s model (launch/planning/link_time.py),
fed with the images/s the same cluster trains at with unlimited links (the compute, measured in
the same run), and against its overlapped bound (every transfer hidden behind compute).
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time

from launch.backends import netns

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PREFIX = 'tfcl-link'            # every namespace this module makes: tfcl-link-<pid>-hub, -<pid>-<k>
SUBNET = '10.213.0'             # addresses that exist only inside those namespaces
PORT = 2222
TBF_LATENCY = '50ms'            # how long a packet may queue in tbf before it is dropped


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f'{" ".join(argv)}: {done.stderr.strip() or done.returncode}')
    return done.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def remove_stale() -> list[str]:
    """Remove the namespaces of benchmarks that no longer run (killed with SIGKILL)."""
    gone = []
    for name in sorted(os.listdir(netns.NETNS_DIR)) if os.path.isdir(netns.NETNS_DIR) else []:
        m = re.match(rf'{PREFIX}-(\d+)-', name)
        if m and not _pid_alive(int(m.group(1))):
            for pid in netns.pids(name):
                os.kill(pid, signal.SIGKILL)
            netns.delete(name)
            gone.append(name)
    return gone


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def burst_bytes(rate_mbit: float) -> int:
    """tbf's bucket: 2 ms at the rate, and never under 256 KiB (veth hands tbf segments of up to
    64 KiB at once, and a bucket smaller than a few of them caps the rate below what was asked)."""
    return max(256 << 10, int(rate_mbit * 1e6 / 8 * 0.002))


class Links:
    """`n` hosts (namespaces) on one switch, each with a link of `rate_mbit` each way (None: no
    limit). Use as a context manager; `addr(k)` is host k's address, `wrap(k, argv)` runs argv there."""

    def __init__(self, n: int, rate_mbit: float | None):
        self.n, self.rate_mbit = n, rate_mbit
        tag = f'{PREFIX}-{os.getpid()}'
        self.hub, self.hosts = f'{tag}-hub', [f'{tag}-{k}' for k in range(n)]
        self.port = PORT        # every host has an address of its own: one port for all
        self._old_handlers: dict = {}

    def addr(self, k: int) -> str:
        return f'{SUBNET}.{k + 1}'

    def wrap(self, k: int, argv: list[str]) -> list[str]:
        return netns.wrap(self.hosts[k], argv)

    def __enter__(self) -> Links:
        if threading.current_thread() is threading.main_thread():
            # SIGTERM ends the benchmark like Ctrl-C does: through __exit__, which removes everything.
            # SIGINT gets its usual meaning back too: a process started in the background by a
            # shell inherits it ignored, and a stray namespace would outlive a Ctrl-C sent to it.
            for sig, handler in ((signal.SIGTERM, _interrupt), (signal.SIGINT, signal.default_int_handler)):
                self._old_handlers[sig] = signal.signal(sig, handler)
        try:
            netns.create(self.hub)
            _run('ip', '-n', self.hub, 'link', 'add', 'br0', 'type', 'bridge')
            _run('ip', '-n', self.hub, 'link', 'set', 'br0', 'up')
            for k, host in enumerate(self.hosts):
                netns.create(host)
                _run('ip', '-n', self.hub, 'link', 'add', f'h{k}', 'type', 'veth', 'peer', 'name', 'eth0',
                     'netns', host)
                _run('ip', '-n', self.hub, 'link', 'set', f'h{k}', 'master', 'br0')
                _run('ip', '-n', self.hub, 'link', 'set', f'h{k}', 'up')
                _run('ip', '-n', host, 'addr', 'add', f'{self.addr(k)}/24', 'dev', 'eth0')
                _run('ip', '-n', host, 'link', 'set', 'eth0', 'up')
                if self.rate_mbit:
                    for ns, dev in ((host, 'eth0'), (self.hub, f'h{k}')):     # what it sends, what it gets
                        _run('ip', 'netns', 'exec', ns, 'tc', 'qdisc', 'add', 'dev', dev, 'root', 'tbf',
                             'rate', f'{self.rate_mbit:g}mbit', 'burst', str(burst_bytes(self.rate_mbit)),
                             'latency', TBF_LATENCY)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in [*self.hosts, self.hub]:
            if netns.exists(ns):
                for pid in netns.pids(ns):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                netns.delete(ns)        # the veth pairs go with their namespaces
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}

    def socket(self, k: int, kind: int = socket.SOCK_STREAM) -> socket.socket:
        return netns.socket_in(self.hosts[k], socket.AF_INET, kind)

    def measure(self, a: int = 0, b: int = 1, total: int = 64 << 20, chunk: int = 1 << 20) -> tuple[float, float]:
        """(Mbit/s one TCP connection carries from host a to host b, mean round trip in ms of one
        byte over an idle connection): what the link gives, next to what was asked."""
        server = self.socket(b)
        server.bind((self.addr(b), 0))
        server.listen(1)
        port = server.getsockname()[1]

        def sink():
            conn, _ = server.accept()
            with conn:
                while True:
                    got = conn.recv(chunk)
                    if not got:
                        break
                    if got == b'p':
                        conn.sendall(b'p')
        t = threading.Thread(target=sink, daemon=True)
        t.start()
        client = self.socket(a)
        client.connect((self.addr(b), port))
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.monotonic()
        rounds = 50
        for _ in range(rounds):
            client.sendall(b'p')
            client.recv(1)
        rtt_ms = (time.monotonic() - t0) / rounds * 1e3
        data = b'\0' * chunk
        t0 = time.monotonic()
        for _ in range(total // chunk):
            client.sendall(data)
        client.shutdown(socket.SHUT_WR)
        t.join(timeout=60)
        mbit = total * 8 / (time.monotonic() - t0) / 1e6
        client.close()
        server.close()
        return mbit, rtt_ms

