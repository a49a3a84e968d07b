"""Private network namespaces for local clusters (`isolation: netns`).

TensorFlow's gRPC servers have no authentication and listen on every interface. A local cluster
whose tasks all run in one network namespace of their own (only a loopback interface, up) is out
of reach of every other process and of the network, while its tasks still reach each other at
localhost. The launcher creates the namespace before the first task starts and deletes it at the
end; tasks start under `ip netns exec`.

The launcher itself stays outside (it may talk to other hosts), so it watches the tasks from a
socket made inside the namespace: network namespaces are per thread on Linux and a socket keeps
the namespace it was created in, so a short-lived thread enters the namespace (setns), creates the
socket and ends. gRPC's own threads would not follow a setns, so the probe speaks the first bytes
of HTTP/2 itself: a gRPC server answers the client preface with a SETTINGS frame; a stopped process
(SIGSTOP) still accepts the TCP connection in the kernel, but never answers.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import socket
import threading
import time
from collections.abc import Sequence

from launch import system
from launch.backends.base import BackendError

NETNS_DIR = '/run/netns'         # where `ip netns` keeps a named namespace (a bind mount of its nsfs file)
CLONE_NEWNET = 0x40000000
CAP_SYS_ADMIN = 21               # creating and entering namespaces needs it (root has it)
# HTTP/2's client connection preface, then an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
H2_PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
H2_SETTINGS = 4

_libc = ctypes.CDLL(None, use_errno=True)


def path(ns: str) -> str:
    return os.path.join(NETNS_DIR, ns)


def exists(ns: str) -> bool:
    return os.path.exists(path(ns))


def has_cap_sys_admin(status_text: str | None = None) -> bool:
    """Whether this process may create and enter namespaces (its effective capabilities, so a root
    that has dropped them, as in many containers, counts as unable)."""
    if status_text is None:
        try:
            with open('/proc/self/status') as f:
                status_text = f.read()
        except OSError:
            return os.geteuid() == 0
    for line in status_text.splitlines():
        if line.startswith('CapEff:'):
            return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    return os.geteuid() == 0


def unavailable() -> str | None:
    """Why this process cannot run tasks in a network namespace, or None if it can."""
    if not has_cap_sys_admin():
        return ('needs root (CAP_SYS_ADMIN) to create a network namespace and start the tasks in it; '
                'run launch as root, or drop isolation and firewall the task ports')
    if shutil.which('ip') is None:
        return "needs iproute2's `ip` command (apt-get install iproute2)"
    return None


def _ip(*args: str) -> str:
    try:
        done = system.run(['ip', *args], timeout=30)
    except system.CommandError as e:
        raise BackendError(f'ip {" ".join(args)}: {e.cause}') from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f'exit {done.returncode}'])[-1]
        raise BackendError(f'ip {" ".join(args)}: {why}')
    return done.stdout


def create(ns: str) -> bool:
    """Make the namespace with its loopback interface up; True if it was made now (False: it was
    there already, left by a launcher that was killed, and is reused)."""
    made = not exists(ns)
    if made:
        _ip('netns', 'add', ns)
    try:
        _ip('-n', ns, 'link', 'set', 'lo', 'up')
    except BackendError:
        if made:
            delete(ns)
        raise
    return made


def pids(ns: str) -> list[int]:
    """The processes running in the namespace."""
    if not exists(ns):
        return []
    return [int(p) for p in _ip('netns', 'pids', ns).split()]


def delete(ns: str, wait: float = 5.0) -> None:
    """Remove the namespace once the processes in it are gone (a stopped task may still be exiting
    for a moment after it stopped looking alive). One that still holds processes after `wait`
    seconds is kept (their ports would live on, unreachable and unnamed) and named in the error."""
    if not exists(ns):
        return
    system.poll_until(lambda: not pids(ns), time.monotonic() + wait, poll=0.1)
    if left := pids(ns):
        raise BackendError(f'network namespace {ns} still holds process(es) {", ".join(map(str, left))}; '
                           'it is kept')
    _ip('netns', 'delete', ns)


def wrap(ns: str, argv: Sequence[str]) -> list[str]:
    """argv run inside the namespace (`ip` enters it and execs argv: the pid stays the task's)."""
    return ['ip', 'netns', 'exec', ns, *argv]


def socket_in(ns: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket of the namespace, made by a thread that enters it and ends (this thread stays where
    it is). Raises OSError if the namespace is gone or cannot be entered."""
    out: dict = {}

    def enter_and_make() -> None:
        try:
            fd = os.open(path(ns), os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f'setns {ns}: {os.strerror(err)}')
            finally:
                os.close(fd)
            out['socket'] = socket.socket(family, kind)
        except OSError as e:
            out['error'] = e
    t = threading.Thread(target=enter_and_make, name=f'netns-{ns}', daemon=True)
    t.start()
    t.join()
    if 'error' in out:
        raise out['error']
    return out['socket']


def connect(ns: str, host: str, port: int, timeout: float) -> socket.socket | None:
    """A TCP connection to host:port as seen from inside the namespace, or None."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None
    for family, kind, _, _, addr in infos:
        try:
            s = socket_in(ns, family, kind)
        except OSError:
            return None
        s.settimeout(timeout)
        try:
            s.connect(addr)
            return s
        except OSError:
            s.close()
    return None


def listening(ns: str, host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on host:port inside the namespace."""
    s = connect(ns, host, port, timeout)
    if s is None:
        return False
    s.close()
    return True


def answers(ns: str, host: str, port: int, timeout: float) -> bool:
    """Whether an HTTP/2 (gRPC) server answers at host:port inside the namespace within `timeout`:
    it sends its SETTINGS frame once it has read the client preface."""
    s = connect(ns, host, port, timeout)
    if s is None:
        return False
    try:
        s.sendall(H2_PREFACE)
        head = b''
        while len(head) < 9:            # a frame header: length (3), type (1), flags (1), stream (4)
            chunk = s.recv(9 - len(head))
            if not chunk:
                return False
            head += chunk
        return head[3] == H2_SETTINGS
    except OSError:                     # socket.timeout included
        return False
    finally:
        s.close()
