"""The SSH connection layer: one Fabric connection and one SFTP client per host, opened on first
use and opened anew after a failure; every failure becomes one SSHError naming the host and the cause.

Host keys are checked against known_hosts (the ssh config's UserKnownHostsFile, else
~/.ssh/known_hosts) unless the user turns that off; Fabric alone would trust any key.
"""
from __future__ import annotations

import getpass
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import fabric
import invoke
import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from cluster.spec import ClusterSpec, HostConfig
from launch.backends.base import BackendError
from launch.backends.ssh.scripts import q
from launch.planning.plan import TaskPlan, is_local

HOSTS_AT_ONCE = 16            # hosts a fan-out (parallel) talks to at once
CONNECT_TIMEOUT = 10          # seconds, unless the ssh config says ConnectTimeout
COMMAND_TIMEOUT = 60          # seconds for any one remote command (a stop adds its grace)
DEFAULT_KNOWN_HOSTS = ('~/.ssh/known_hosts', '~/.ssh/known_hosts2')
DEFAULT_GLOBAL_KNOWN_HOSTS = ('/etc/ssh/ssh_known_hosts', '/etc/ssh/ssh_known_hosts2')

T = TypeVar('T')
R = TypeVar('R')


class SSHError(BackendError):
    """Something about one host went wrong: the message names the host, then the cause."""

    def __init__(self, host: str, cause: str) -> None:
        super().__init__(f'{host}: {cause}')
        self.host, self.cause = host, cause


def load_ssh_config(path: str | None) -> paramiko.SSHConfig:
    """The ssh config at `path`, else ~/.ssh/config if there is one, else an empty one."""
    if path is not None:
        return paramiko.SSHConfig.from_path(path)
    default = os.path.expanduser('~/.ssh/config')
    return paramiko.SSHConfig.from_path(default) if os.path.isfile(default) else paramiko.SSHConfig()


def ssh_target(plan: TaskPlan, ssh_config: str | None = None) -> str:
    """`user@host:port` a plan's task is reached at over SSH, `host` as the spec names it (an ssh
    config alias stays the alias): the spec's `hosts` entry first, then the ssh config, then the
    defaults (as Fabric resolves them)."""
    host = plan.host or HostConfig(name=plan.task.host)
    found = load_ssh_config(ssh_config).lookup(host.name)
    user = host.user or found.get('user') or getpass.getuser()
    port = host.port or int(found.get('port', 22))
    return f'{user}@{host.name}:{port}'


def host_addresses(spec: ClusterSpec, ssh_config: str | None = None) -> dict[str, str]:
    """Spec host -> the address its tasks are reached at, for every host reached over SSH: the
    spec's `hosts.X.address`, else the ssh config's HostName for X, else X itself. The spec names
    the host one ssh's to; TF_CONFIG and the launcher's gRPC probes need what that name means."""
    remote = sorted({t.host for t in spec.tasks if not is_local(spec, t.host)})
    if not remote:
        return {}
    config = load_ssh_config(ssh_config)
    out = {}
    for name in remote:
        settings = spec.hosts.get(name)
        out[name] = (settings and settings.address) or config.lookup(name).get('hostname') or name
    return out


def parallel(fn: Callable[[T], R], items: Iterable[T], at_once: int = HOSTS_AT_ONCE) -> list[R]:
    """fn(item) for every item, `at_once` at a time (one thread per host); results in order. Every item
    runs to its end even when another fails: one SSHError then names every host that failed
    (Fabric's GroupResult keeps each host's outcome the same way)."""
    items = list(items)
    if len(items) <= 1:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(at_once, len(items))) as pool:
        futures = [pool.submit(fn, i) for i in items]
    failed = [e for e in (f.exception() for f in futures) if e is not None]
    if not failed:
        return [f.result() for f in futures]
    errors = [e for e in failed if isinstance(e, SSHError)]
    if len(failed) == 1 or len(errors) < len(failed):
        raise failed[0]
    raise SSHError(errors[0].host, '; '.join([errors[0].cause] + [str(e) for e in errors[1:]]))


@dataclass
class _Host:
    """One remote host's connection, its SFTP client and the known_hosts files its key was checked against."""
    name: str
    conn: fabric.Connection | None = None
    sftp: paramiko.SFTPClient | None = None
    known_hosts: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)           # connection
    sftp_lock: threading.Lock = field(default_factory=threading.Lock)      # SFTP is not thread-safe


class Connections:
    """The connection pool of one backend: a host's connection is made on first use, shared by every
    thread, and dropped (to be made anew) once a command finds it broken."""

    def __init__(self, hosts: Mapping[str, HostConfig], ssh_config: str | None = None,
                 check_host_keys: bool = True) -> None:
        self.hosts = hosts
        self.ssh_config = ssh_config
        self.check_host_keys = check_host_keys
        self._hosts: dict[str, _Host] = {}
        self._lock = threading.Lock()
        # Every failure becomes one SSHError line; paramiko's own tracebacks would only repeat it.
        logging.getLogger('paramiko').setLevel(logging.CRITICAL)

    def _host(self, name: str) -> _Host:
        with self._lock:
            if name not in self._hosts:
                self._hosts[name] = _Host(name)
            return self._hosts[name]

    def _new_connection(self, h: _Host) -> fabric.Connection:
        settings = self.hosts.get(h.name) or HostConfig(name=h.name)
        overrides = {'run': {'in_stream': False, 'hide': True, 'warn': True},
                     'timeouts': {'connect': CONNECT_TIMEOUT}}
        config = fabric.Config(runtime_ssh_path=self.ssh_config, overrides=overrides)
        conn = fabric.Connection(h.name, user=settings.user, port=settings.port, config=config)
        kwargs = dict(conn.connect_kwargs)
        if settings.key:      # the spec's key replaces the ssh config's IdentityFile (like `ssh -i` alone)
            kwargs['key_filename'] = [os.path.expanduser(settings.key)]
        if settings.key or conn.ssh_config.get('identitiesonly', '').lower() == 'yes':
            kwargs.update(look_for_keys=False, allow_agent=False)
        conn.connect_kwargs = kwargs
        if self.check_host_keys:
            h.known_hosts = _load_known_hosts(conn)
            conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            conn.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())   # nothing loaded, nothing saved
        return conn

    def connect(self, name: str) -> fabric.Connection:
        """The host's open connection, opened now if it is not."""
        h = self._host(name)
        with h.lock:
            if h.conn is None:
                h.conn = self._new_connection(h)
            conn = h.conn
            if not conn.is_connected:
                try:
                    conn.open()
                except Exception as e:       # every cause is named by _connect_error, or re-raised
                    conn.close()
                    h.conn = None
                    raise _connect_error(h, conn, e) from None
            return conn

    def run(self, name: str, script: str, timeout: float = COMMAND_TIMEOUT) -> invoke.Result:
        """Run a POSIX sh script on the host; the result never raises for a non-zero exit."""
        conn = self.connect(name)
        try:
            result = conn.run('sh -c ' + q(script), hide=True, warn=True, in_stream=False, timeout=timeout)
        except invoke.CommandTimedOut:
            self.drop(name)        # a half-open connection would make the next command wait as long
            raise SSHError(name, f'a remote command did not finish within {timeout:.0f}s') from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.drop(name)
            raise SSHError(name, f'lost the SSH connection: {e}') from None
        if result.exited == -1:     # paramiko's "no exit status": the channel closed under the command
            self.drop(name)
            raise SSHError(name, 'lost the SSH connection: the remote command ended without an exit status')
        return result

    def sftp_call(self, name: str, fn: Callable[[paramiko.SFTPClient], R]) -> R:
        """fn(sftp) with the host's one SFTP client, serialised: paramiko's client is not thread-safe."""
        conn = self.connect(name)
        h = self._host(name)
        with h.sftp_lock:
            try:
                if h.sftp is None:
                    h.sftp = _open_sftp(name, conn)
                return fn(h.sftp)
            except (paramiko.SSHException, EOFError, ConnectionError) as e:
                h.sftp = None
                raise SSHError(name, f'SFTP failed: {e}') from None
            except OSError as e:       # a file the remote side refused, or the channel is gone
                h.sftp = None          # reopening a session is cheap; a dead one never answers again
                transport = conn.client.get_transport()
                if transport is None or not transport.is_active():
                    self.drop(name)    # the next call connects anew
                raise SSHError(name, f'SFTP failed: {e}') from None

    def drop(self, name: str) -> None:
        """Close the host's connection: the next command connects anew."""
        h = self._host(name)
        with h.lock:
            if h.conn is not None:
                h.conn.close()
                h.conn = None
            h.sftp = None

    def close(self) -> None:
        """Close every SFTP client and connection."""
        for h in list(self._hosts.values()):
            with h.sftp_lock:
                if h.sftp is not None:
                    try:
                        h.sftp.close()
                    except Exception:       # already gone with its transport
                        pass
                    h.sftp = None
            with h.lock:
                if h.conn is not None:
                    h.conn.close()
                    h.conn = None


def _load_known_hosts(conn: fabric.Connection) -> list[str]:
    """Load the user's and the global known_hosts files the ssh config names (Fabric ignores
    UserKnownHostsFile); returns the user files, for error messages."""
    user = (conn.ssh_config.get('userknownhostsfile') or ' '.join(DEFAULT_KNOWN_HOSTS)).split()
    system = (conn.ssh_config.get('globalknownhostsfile') or ' '.join(DEFAULT_GLOBAL_KNOWN_HOSTS)).split()
    user = [os.path.expanduser(p) for p in user]
    for path in user + [os.path.expanduser(p) for p in system]:
        if os.path.isfile(path):
            conn.client.load_system_host_keys(path)      # read only: never written back
    return [p for p in user if p != '/dev/null'] or user


def _open_sftp(name: str, conn: fabric.Connection) -> paramiko.SFTPClient:
    try:
        return conn.client.open_sftp()
    except (paramiko.SSHException, EOFError):
        transport = conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise      # the connection itself died: reported (and dropped) as any SFTP failure
        # The session opened, then closed at once: sshd has no `Subsystem sftp` (its log says
        # "subsystem request for sftp failed, subsystem not found").
        raise SSHError(name, f'the SSH server at {conn.user}@{conn.host}:{conn.port} offers no SFTP '
                             f'subsystem; tfcluster needs it to upload the spec and read logs: '
                             'add `Subsystem sftp` to its sshd_config') from None


def _connect_error(h: _Host, conn: fabric.Connection, e: Exception) -> SSHError:
    """One line that says why `conn` could not be opened and what to do; an exception of no known
    kind is a bug and raised as it is."""
    where = f'{conn.user}@{conn.host}:{conn.port}'
    files = ', '.join(h.known_hosts) or 'no known_hosts file'
    first = h.known_hosts[0] if h.known_hosts else '~/.ssh/known_hosts'
    entry = conn.host if conn.port == 22 else f'[{conn.host}]:{conn.port}'
    if isinstance(e, paramiko.BadHostKeyException):
        cause = (f'host key changed: {where} offered a {e.key.get_name()} key that does not match '
                 f'the one for {entry} in {files}; someone may be impersonating the host, or it was '
                 f'reinstalled (then remove the old key: ssh-keygen -R {q(entry)} -f {q(first)})')
    elif isinstance(e, paramiko.AuthenticationException):
        keys = ', '.join(conn.connect_kwargs.get('key_filename') or []) or 'the default keys and ssh-agent'
        cause = f'authentication refused for {where} (tried {keys}); check hosts.{h.name}.key and user'
    elif isinstance(e, paramiko.SSHException) and 'known_hosts' in str(e):
        cause = (f'host key unknown: {entry} is not in {files}; verify the key and add it '
                 f'(ssh-keyscan -p {conn.port} {conn.host} >> {first}), '
                 f'or pass --insecure-accept-any-host-key')
    elif isinstance(e, NoValidConnectionsError):       # every address of the host refused, or no route
        reasons = sorted({(err.strerror or str(err)).lower() for err in e.errors.values()})
        cause = f'unreachable: {" / ".join(reasons) or "connection refused"} at {where}'
    elif isinstance(e, socket.gaierror):
        cause = f'unreachable: cannot resolve host name {conn.host!r}'
    elif isinstance(e, (TimeoutError, socket.timeout)):
        cause = (f'unreachable: no answer from {where} within {conn.connect_timeout or CONNECT_TIMEOUT}s '
                 f'(a slow network: raise ConnectTimeout in the ssh config)')
    elif isinstance(e, OSError):
        cause = f'unreachable: {where}: {e.strerror or e}'
    elif isinstance(e, (paramiko.SSHException, EOFError)):
        cause = f'SSH failed at {where}: {e}'
    else:
        raise e
    return SSHError(h.name, cause)
