"""A real OpenSSH server on loopback addresses, for tests of the SSH backend.

``SSHHosts`` starts ``/usr/sbin/sshd`` as a child with its own keys, config,
``known_hosts`` and ``ssh_config`` in a temporary directory, listening on one
port shared by several loopback addresses (127.0.0.2, 127.0.0.3, ... route on
Linux without configuration), so that tests see several "hosts" with strict
host key checking and key-only authentication as root.

Why the care in ``stop()``: every connection sshd accepts runs in a new session
(``setsid``), so killing sshd's process group does not reach the shells and
commands of open sessions, and a task started detached over SSH (``setsid
nohup ... &``) is orphaned when its session ends.  sshd is therefore made a
*child subreaper* (``PR_SET_CHILD_SUBREAPER``): orphans of its sessions are
re-parented to sshd rather than to PID 1, stay its descendants, are reaped by
it, and ``stop()`` can find and kill every one of them before sshd itself.
(On a real host a detached task's parent is PID 1; here it is the sshd
listener.  Do not rely on either in production code.)
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.harness.procs import _alive, _descendants, _signal, _wait_gone, process_table  # noqa: F401 (process_table: for the tests)

log = logging.getLogger(__name__)

SSHD = "/usr/sbin/sshd"
SSH = "ssh"
SSH_KEYGEN = "ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")
DEFAULT_ADDRESSES = ("127.0.0.2", "127.0.0.3")

# Run in a fresh interpreter between fork and exec of sshd: preexec_fn is
# unsafe once threads exist (paramiko starts one per open connection).
# argv: PARENT_PID SSHD ARGS...; PARENT_PID != 0 also asks for SIGTERM when the
# parent dies (PR_SET_PDEATHSIG), so a killed pytest leaves no listening sshd.
_SSHD_WRAPPER = (
    "import ctypes, os, signal, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def prctl(option, arg):\n"
    "    if libc.prctl(option, arg, 0, 0, 0) != 0:\n"
    "        sys.exit('prctl(%d): errno %d' % (option, ctypes.get_errno()))\n"
    "prctl(36, 1)  # PR_SET_CHILD_SUBREAPER\n"
    "parent = int(sys.argv[1])\n"
    "if parent:\n"
    "    prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "    if os.getppid() != parent:\n"
    "        sys.exit('parent exited before sshd started')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class SSHDError(RuntimeError):
    """sshd could not be started or stopped cleanly."""


class _PortTaken(SSHDError):
    """The chosen port was grabbed by someone else before sshd bound it."""


def _run(argv, **kwargs):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


def generate_key(path: Path, comment: str = "tfcluster-test") -> Path:
    """Create an unencrypted ed25519 key pair at ``path`` / ``path.pub``."""
    path = Path(path)
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    _run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path


def _pubkey(path: Path) -> str:
    """``ssh-ed25519 AAAA...`` (type and base64, without the comment)."""
    kind, blob = Path(str(path) + ".pub").read_text().split()[:2]
    return f"{kind} {blob}"


def _free_port(addresses) -> int:
    """A port that is free on every address right now (sshd binds it soon after)."""
    for _ in range(20):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = s.getsockname()[1]
        try:
            for address in addresses[1:]:
                with socket.socket() as s:
                    s.bind((address, port))
        except OSError:
            continue
        return port
    raise SSHDError(f"no port free on all of {addresses}")


@functools.cache
def _sshd_version() -> tuple[int, int]:
    out = subprocess.run([SSHD, "-V"], capture_output=True, text=True).stderr
    match = re.search(r"OpenSSH_(\d+)\.(\d+)", out)
    return (int(match[1]), int(match[2])) if match else (0, 0)


# -- the server -------------------------------------------------------------

class SSHHosts:
    """sshd on ``addresses`` (one shared port), root login by key only.

    Use as a context manager, or call ``start()`` and ``stop()``.  Remote
    commands do not source ``~/.bashrc`` unless ``source_bashrc`` (see
    ``_write_sshd_config``), as on hosts whose .bashrc returns early when not
    interactive: the SSH backend must not depend on it.  ``sftp=False`` leaves
    out the ``Subsystem sftp`` line, as on hosts that offer no SFTP.  Files in
    ``dir``: ``host_key``, ``client_key`` (``key_path``), ``authorized_keys``,
    ``sshd_config``, ``sshd.log`` (``log_path``), ``sshd.pid``,
    ``known_hosts``, ``ssh_config`` (for ``ssh -F``).
    """

    user = "root"

    def __init__(self, tmp_path, addresses=DEFAULT_ADDRESSES, start_timeout: float = 10.0,
                 source_bashrc: bool = False, sftp: bool = True, port: int | None = None, wrap=()):
        self.fixed_port, self.wrap = port, tuple(wrap)     # wrap: argv before sshd's (`ip netns exec NS`)
        self.dir = Path(tmp_path).resolve()
        self.source_bashrc = source_bashrc
        self.sftp = sftp
        self.addresses = tuple(addresses)
        if not self.addresses:
            raise ValueError("at least one address is needed")
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.host_key_path = self.dir / "host_key"
        self.key_path = self.dir / "client_key"
        self.authorized_keys = self.dir / "authorized_keys"
        self.config_path = self.dir / "sshd_config"
        self.pid_path = self.dir / "sshd.pid"
        self.log_path = self.dir / "sshd.log"
        self.known_hosts = self.dir / "known_hosts"
        self.ssh_config = self.dir / "ssh_config"
        self.host_pubkey: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log_file = None
        self.startup_seconds: float | None = None

    # context manager
    def __enter__(self) -> SSHHosts:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SSHHosts({', '.join(self.addresses)} port {self.port}, dir={self.dir})"

    @property
    def pid(self) -> int | None:
        """Pid of the sshd listener while it runs."""
        return self._proc.pid if self._proc else None

    def hostport(self, address: str) -> str:
        return f"{address}:{self.port}"

    # -- start --------------------------------------------------------------

    def start(self) -> SSHHosts:
        if self._proc is not None:
            return self
        began = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        generate_key(self.host_key_path, "tfcluster-test-host")
        generate_key(self.key_path, "tfcluster-test-client")
        self.host_pubkey = _pubkey(self.host_key_path)
        self.authorized_keys.write_text(_pubkey(self.key_path) + "\n")
        for attempt in range(1, 4):
            self.port = self.fixed_port or _free_port(self.addresses)
            self._write_sshd_config()
            self._spawn()
            try:
                self._wait_ready(time.monotonic() + self.start_timeout)
                break
            except _PortTaken:
                log.warning("port %d taken before sshd bound it (attempt %d)", self.port, attempt)
                self.stop()
                if attempt == 3:
                    raise
            except BaseException:
                self.stop()
                raise
        self.known_hosts.write_text(self.known_hosts_text(self.host_pubkey))
        self._write_ssh_config()
        self.startup_seconds = time.monotonic() - began
        log.info("%r started in %.3f s", self, self.startup_seconds)
        return self

    def _write_sshd_config(self) -> None:
        lines = [f"ListenAddress {a}:{self.port}" for a in self.addresses] + [
            f"PidFile {self.pid_path}",
            f"HostKey {self.host_key_path}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "AddressFamily inet",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "AuthenticationMethods publickey",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitUserEnvironment no",
            # No AcceptEnv line: sshd accepts no environment from clients.
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "X11Forwarding no",
            "LoginGraceTime 30",
            "LogLevel VERBOSE",
            "MaxStartups 100:30:200",
            "MaxSessions 50",
            "MaxAuthTries 10",
        ]
        if self.sftp:     # without: a server that runs commands but refuses SFTP sessions
            lines.append("Subsystem sftp internal-sftp")
        if not self.source_bashrc:
            # Debian's bash sources ~/.bashrc when started by sshd (SSH_CLIENT set)
            # as a top-level shell (SHLVL < 2).  Here root's .bashrc runs pyenv init,
            # which costs ~1-3 s per command; SHLVL=1 makes bash a level-2 shell.
            lines.append("SetEnv SHLVL=1")
        if _sshd_version() >= (9, 8):
            # Newer sshd throttles clients whose auth fails (our wrong-key tests).
            lines.append("PerSourcePenalties no")
        self.config_path.write_text("\n".join(lines) + "\n")

    def _spawn(self) -> None:
        self.log_path.unlink(missing_ok=True)
        self._log_file = open(self.log_path, "ab")
        # PDEATHSIG fires when the forking *thread* ends: only ask from the main thread.
        parent = os.getpid() if threading.current_thread() is threading.main_thread() else 0
        argv = [*self.wrap, sys.executable, "-I", "-S", "-c", _SSHD_WRAPPER, str(parent),
                SSHD, "-D", "-e", "-f", str(self.config_path)]
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=self._log_file,
            start_new_session=True, cwd=self.dir, close_fds=True,
        )
        _live.add(self)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no sshd log)"
        return "\n".join(text.splitlines()[-lines:]) or "(sshd log is empty)"

    def _wait_ready(self, deadline: float) -> None:
        """Until every address answers with an SSH banner, sshd dies, or deadline."""
        pending = list(self.addresses)
        while True:
            code = self._proc.poll()
            log_text = self.log_path.read_text(errors="replace")
            if "Address already in use" in log_text:
                raise _PortTaken(f"port {self.port} is in use:\n{self.log_tail()}")
            if code is not None:
                raise SSHDError(
                    f"sshd exited with status {code} before listening on port "
                    f"{self.port}; log {self.log_path}:\n{self.log_tail()}")
            pending = [a for a in pending if not _answers_ssh(a, self.port)]
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise SSHDError(
                    f"sshd did not answer on {', '.join(pending)} port {self.port} within "
                    f"{self.start_timeout:g} s; log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.01)

    # -- client files -------------------------------------------------------

    def known_hosts_text(self, pubkey: str) -> str:
        return "".join(f"{a if self.port == 22 else f'[{a}]:{self.port}'} {pubkey}\n" for a in self.addresses)

    def _write_ssh_config(self) -> None:
        blocks = []
        for a in self.addresses:
            blocks.append("\n".join([
                f"Host {a}",
                f"    HostName {a}",
                f"    Port {self.port}",
                f"    User {self.user}",
                f"    IdentityFile {self.key_path}",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {self.known_hosts}",
                "    GlobalKnownHostsFile /dev/null",
                "    StrictHostKeyChecking yes",
                "    UpdateHostKeys no",
                "    BatchMode yes",
                "    ConnectTimeout 10",
                # The default post-quantum KEX (sntrup761) costs ~0.35 s a connection here.
                "    KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org",
                "    ControlMaster no",
                "    ControlPath none",
                "    ForwardAgent no",
                "    LogLevel ERROR",
            ]))
        self.ssh_config.write_text("\n\n".join(blocks) + "\n")

    def wrong_key(self, tmp_path) -> Path:
        """Private key path of a fresh key pair that sshd does not authorise."""
        return generate_key(Path(tmp_path) / "wrong_key", "tfcluster-test-unauthorised")

    def other_host_key_known_hosts(self, path) -> Path:
        """Write at ``path`` a known_hosts giving these addresses a *different* host key."""
        path = Path(path)
        key = generate_key(path.with_name(path.name + ".other_host_key"), "tfcluster-test-other-host")
        path.write_text(self.known_hosts_text(_pubkey(key)))
        return path

    # -- clients ------------------------------------------------------------

    def ssh(self, address: str, command, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run ``command`` (a shell string, or argv list quoted for you) with the real ssh client."""
        if address not in self.addresses:
            raise ValueError(f"{address!r} is not one of {self.addresses}")
        if not isinstance(command, str):
            command = shlex.join(command)
        return subprocess.run(
            [SSH, "-F", str(self.ssh_config), address, command],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
        )

    def connect_kwargs(self, key_path=None) -> dict:
        """``connect_kwargs`` for ``fabric.Connection``: this key only, no agent."""
        return {"key_filename": str(key_path or self.key_path),
                "look_for_keys": False, "allow_agent": False}

    def connection(self, address: str, known_hosts=None, key_path=None, **kwargs):
        """An unopened ``fabric.Connection`` that rejects unknown or changed host keys.

        Fabric alone trusts any host key (``AutoAddPolicy``, no known_hosts loaded).
        ``run`` does not forward our stdin (invoke's default reads it, which fails
        under pytest's capture).
        """
        import fabric
        import paramiko

        kwargs.setdefault("config", fabric.Config(overrides={"run": {"in_stream": False}}))
        conn = fabric.Connection(address, port=self.port, user=self.user,
                                 connect_kwargs=self.connect_kwargs(key_path), **kwargs)
        conn.client.load_host_keys(str(known_hosts or self.known_hosts))
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        return conn

    # -- stop ---------------------------------------------------------------

    def session_processes(self) -> dict[int, int]:
        """{pid: starttime} of every process under sshd: sessions and their orphans."""
        return _descendants(self._proc.pid) if self._proc else {}

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sshd accepting, kill every session process (SIGTERM, SIGKILL at the deadline), then sshd.

        Idempotent.  Raises SSHDError if anything survives SIGKILL.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        _live.discard(self)
        deadline = time.monotonic() + timeout
        survivors: dict[int, int] = {}
        # A host that goes away accepts nothing new: the listener is stopped first, so a connection
        # made while the sessions die waits unanswered (then is reset), as to a host that is gone.
        # Else a launcher that saw its task end could start it again on the dying host in between.
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            # Sessions first, while sshd is alive to reap them (it is their subreaper).
            # Fresh snapshot each round: a dying session may still have forked.
            sig = signal.SIGTERM
            for _ in range(50):
                procs = _descendants(proc.pid) if proc.poll() is None else {}
                if not procs:
                    break
                _signal(procs, sig)
                left = _wait_gone(procs, deadline if sig == signal.SIGTERM
                                  else time.monotonic() + 2)
                if left and sig == signal.SIGKILL:
                    survivors = left
                    break
                if left:
                    log.warning("sshd sessions %s ignored SIGTERM; killing them", sorted(left))
                    sig = signal.SIGKILL
            # Stopped, it would not act on SIGTERM (and once continued could still take a waiting
            # connection): SIGKILL, now that no session is left for it to reap.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        finally:
            if self._log_file:
                self._log_file.close()
                self._log_file = None
        survivors = {p: s for p, s in survivors.items() if _alive(p, s)}
        if survivors:
            raise SSHDError(f"processes under sshd survived SIGKILL: {sorted(survivors)}")


def _answers_ssh(address: str, port: int) -> bool:
    """True if ``address:port`` accepts TCP and sends an SSH-2.0 banner."""
    try:
        with socket.create_connection((address, port), timeout=1) as s:
            s.settimeout(1)
            data = b""
            while b"\n" not in data and len(data) < 256:
                chunk = s.recv(256)
                if not chunk:
                    break
                data += chunk
            return data.startswith(b"SSH-2.0-")
    except OSError:
        return False


_live: set[SSHHosts] = set()


@atexit.register
def _stop_all() -> None:
    for hosts in list(_live):
        with contextlib.suppress(Exception):
            hosts.stop()


@pytest.fixture
def ssh_hosts(tmp_path_factory):
    """A started ``SSHHosts`` on 127.0.0.2 and 127.0.0.3; everything under it killed after."""
    with SSHHosts(tmp_path_factory.mktemp("sshd")) as hosts:
        yield hosts
