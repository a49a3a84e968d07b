"""SSH backend: tasks on remote hosts, started detached over one Fabric connection per host.

Remote layout, for a task whose plan says cwd W, spec S and log L (relative paths are below W,
and W itself, when relative, is below the remote user's home):

    W/S                      the effective spec, uploaded by `prepare` (SFTP, then an atomic rename)
    W/L                      the task's stdout and stderr
    W/L minus .log + .pid    the pid of the task's session leader (the wrapper below)
    W/L minus .log + .task   the pid of the task itself, written by the wrapper as it starts it
    W/L minus .log + .rc     its exit code, written by the wrapper when the task ends

A task runs as `setsid nohup sh -c 'trap : TERM; env K=V ... python -m cluster.task ... & wait ...; echo $r > RC'`
in its own session, so one `kill -TERM -PID` reaches its whole process group, and the wrapper
survives the SIGTERM long enough to write the exit code. The record names the task's own process
(the pid its log prints): a task is running while that process lives, whatever became of the
wrapper, and a new start of a task first makes sure its earlier copy is gone, so its port is free. Every remote command is a POSIX `sh -c`
script whose values are quoted with `shlex.quote` (Fabric's `env=` does not quote). Status for all
tasks of a host is one command, cached for a fraction of a second; a stop is one command per host.
Logs are read with SFTP from an offset, so following them leaves no process on the host.

Host keys are checked against known_hosts (the ssh config's UserKnownHostsFile, else
~/.ssh/known_hosts) unless the user turns that off; Fabric alone would trust any key.
"""
from __future__ import annotations

import getpass
import io
import json
import logging
import os
import posixpath
import shlex
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import fabric
import invoke
import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from cluster.runtime import rundir
from cluster.runtime.rundir import LEASE_ENV
from cluster.spec import ClusterSpec, HostConfig
from launch.backends.base import (ENDED, GPU_COUNT_SH, HOST_PROBE, RUNNING, STOP_GRACE_SECS, UNKNOWN, Backend, BackendError,
                            HostCheck, Observation, TaskRecord, decode_exit, handle_of, parse_gpu_count,
                            planned_record)
from launch.planning.plan import LEASE_SECS, TaskPlan, is_local

log = logging.getLogger(__name__)

WRAPPER_GRACE_SECS = 2.0      # a task gone while its wrapper lives: how long the wrapper has to write its rc
SNAPSHOT_TTL = 0.3            # seconds a host's status snapshot answers status()
LEASE_RENEW_SECS = 5.0        # how often the tasks' lease files on a host are touched
POLL_TIMEOUT = 10             # seconds a status command may take before the host counts as unreachable
LOG_POLL_SECS = 0.25          # how often a followed log is read again
LOG_CHUNK = 1 << 20
CONNECT_TIMEOUT = 10          # seconds, unless the ssh config says ConnectTimeout
COMMAND_TIMEOUT = 60          # seconds for any one remote command (a stop adds its grace)
DEFAULT_KNOWN_HOSTS = ('~/.ssh/known_hosts', '~/.ssh/known_hosts2')
DEFAULT_GLOBAL_KNOWN_HOSTS = ('/etc/ssh/ssh_known_hosts', '/etc/ssh/ssh_known_hosts2')

# `starttime` of a pid (field 22 of /proc/PID/stat): a pid is ours only while it matches.
_STARTTIME = "sed 's/.*) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f20"
_SNAPSHOT_END = 'tfcluster-status-end'   # last line of a status answer: a cut-short one lacks it


def _group(record: TaskRecord) -> tuple[int, str]:
    """A task's process group and the start time of its leader (a record from before the task's
    own pid was kept names the wrapper, which leads the group)."""
    h = handle_of(record, SSHHandle)
    return (h.group, h.group_ident) if h.group else (int(record.pid), record.ident)


def _fields(stat: str) -> list[str]:
    """The fields of a /proc/PID/stat line after the command name (state first), or ['']."""
    return stat[stat.rfind(')') + 2:].split() if ')' in stat else ['']


def _is_process(stat: str, ident: str) -> bool:
    """Whether a /proc/PID/stat line is of a live (not zombie) process started at `ident`."""
    fields = _fields(stat)
    return len(fields) > 19 and fields[0] not in 'ZX' and (not ident or fields[19] == ident)


def _ours(record: TaskRecord) -> str:
    """A shell command that prints the task's process group while the task, or its wrapper, is
    still the process the record names (a pid reused by another process is not ours)."""
    group, group_ident = _group(record)
    return (f'if [ "$({_STARTTIME.format(pid=int(record.pid))})" = {_q(record.ident or "-")} ] || '
            f'[ "$({_STARTTIME.format(pid=group)})" = {_q(group_ident or "-")} ]; then echo {group}; fi')


class SSHError(BackendError):
    """Something about one host went wrong: the message names the host, then the cause."""

    def __init__(self, host: str, cause: str):
        super().__init__(f'{host}: {cause}')
        self.host, self.cause = host, cause


def _q(value) -> str:
    return shlex.quote(str(value))


def _remote_dir(path: str) -> str:
    """A workdir as the remote shell should see it: `~/x` is `x` (the shell starts in $HOME)."""
    if path in ('~', '~/'):
        return '.'
    if path.startswith('~/'):
        return path[2:]
    return path


def _shell_path(path: str) -> str:
    """A quoted path for a remote shell command that still expands a leading `~/`."""
    return f'"$HOME"/{_q(path[2:])}' if path.startswith('~/') else _q(path)


def load_ssh_config(path: str | None) -> paramiko.SSHConfig:
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


@dataclass
class SSHHandle:
    """A remote task's own files: its wrapper's pid file, the exit code file the wrapper writes,
    the `ssh` target a person would use to reach its host, and the task's process group (the
    wrapper's pid, and the wrapper's start time that proves the pid is still that wrapper)."""
    pidfile: str = ''
    rcfile: str = ''
    target: str = ''
    group: int = 0
    group_ident: str = ''


@dataclass
class _Host:
    """One remote host: its connection, SFTP client, resolved workdirs and status snapshot."""
    name: str
    conn: fabric.Connection | None = None
    sftp: paramiko.SFTPClient | None = None
    known_hosts: list[str] = field(default_factory=list)
    workdirs: dict[str, str] = field(default_factory=dict)     # plan.cwd -> absolute remote path
    records: dict[str, TaskRecord] = field(default_factory=dict)
    snapshot: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    snapshot_at: float = 0.0
    snapshot_error: SSHError | None = None
    states: dict[str, str] = field(default_factory=dict)        # task -> /proc state letter
    ending: dict[str, float] = field(default_factory=dict)      # task gone, its wrapper not yet: since
    renewed_at: float = 0.0
    lease_text: str | None = None    # what the lease files on this host hold (the live workers)
    lock: threading.Lock = field(default_factory=threading.Lock)           # connection
    sftp_lock: threading.Lock = field(default_factory=threading.Lock)      # SFTP is not thread-safe
    snapshot_lock: threading.Lock = field(default_factory=threading.Lock)


class SSHBackend(Backend):
    name = 'ssh'

    def __init__(self, spec: ClusterSpec, ssh_config: str | None = None, check_host_keys: bool = True):
        self.spec = spec
        self.ssh_config = ssh_config
        self.check_host_keys = check_host_keys
        self._hosts: dict[str, _Host] = {}
        self._lock = threading.Lock()
        # Every failure becomes one SSHError line; paramiko's own tracebacks would only repeat it.
        logging.getLogger('paramiko').setLevel(logging.CRITICAL)

    # -- connections ----------------------------------------------------------------------
    def _host(self, name: str) -> _Host:
        with self._lock:
            if name not in self._hosts:
                self._hosts[name] = _Host(name)
            return self._hosts[name]

    def _new_connection(self, h: _Host) -> fabric.Connection:
        settings = self.spec.hosts.get(h.name) or HostConfig(name=h.name)
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
            h.known_hosts = self._load_known_hosts(conn)
            conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            conn.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())   # nothing loaded, nothing saved
        return conn

    @staticmethod
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

    def _connect(self, name: str) -> fabric.Connection:
        h = self._host(name)
        with h.lock:
            if h.conn is None:
                h.conn = self._new_connection(h)
            conn = h.conn
            if not conn.is_connected:
                try:
                    conn.open()
                except Exception as e:
                    conn.close()
                    h.conn = None
                    raise self._connect_error(h, conn, e) from None
            return conn

    def _connect_error(self, h: _Host, conn: fabric.Connection, e: Exception) -> SSHError:
        where = f'{conn.user}@{conn.host}:{conn.port}'
        files = ', '.join(h.known_hosts) or 'no known_hosts file'
        first = h.known_hosts[0] if h.known_hosts else '~/.ssh/known_hosts'
        entry = conn.host if conn.port == 22 else f'[{conn.host}]:{conn.port}'
        if isinstance(e, paramiko.BadHostKeyException):
            cause = (f'host key changed: {where} offered a {e.key.get_name()} key that does not match '
                     f'the one for {entry} in {files}; someone may be impersonating the host, or it was '
                     f'reinstalled (then remove the old key: ssh-keygen -R {_q(entry)} -f {_q(first)})')
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

    def _run(self, name: str, script: str, timeout: float = COMMAND_TIMEOUT) -> invoke.Result:
        """Run a POSIX sh script on the host; the result never raises for a non-zero exit."""
        conn = self._connect(name)
        try:
            result = conn.run('sh -c ' + _q(script), hide=True, warn=True, in_stream=False, timeout=timeout)
        except invoke.CommandTimedOut:
            self._drop(name)        # a half-open connection would make the next command wait as long
            raise SSHError(name, f'a remote command did not finish within {timeout:.0f}s') from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            self._drop(name)
            raise SSHError(name, f'lost the SSH connection: {e}') from None
        if result.exited == -1:     # paramiko's "no exit status": the channel closed under the command
            self._drop(name)
            raise SSHError(name, 'lost the SSH connection: the remote command ended without an exit status')
        return result

    def _sftp_call(self, name: str, fn):
        """fn(sftp) with the host's one SFTP client, serialised: paramiko's client is not thread-safe."""
        conn = self._connect(name)
        h = self._host(name)
        with h.sftp_lock:
            try:
                if h.sftp is None:
                    h.sftp = self._open_sftp(name, conn)
                return fn(h.sftp)
            except (paramiko.SSHException, EOFError, ConnectionError) as e:
                h.sftp = None
                raise SSHError(name, f'SFTP failed: {e}') from None
            except OSError as e:       # a file the remote side refused, or the channel is gone
                h.sftp = None          # reopening a session is cheap; a dead one never answers again
                transport = conn.client.get_transport()
                if transport is None or not transport.is_active():
                    self._drop(name)   # the next call connects anew
                raise SSHError(name, f'SFTP failed: {e}') from None

    def _open_sftp(self, name: str, conn: fabric.Connection) -> paramiko.SFTPClient:
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

    def _drop(self, name: str) -> None:
        h = self._host(name)
        with h.lock:
            if h.conn is not None:
                h.conn.close()
                h.conn = None
            h.sftp = None

    def close(self) -> None:
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

    @staticmethod
    def _parallel(fn, items):
        """fn(item) for every item at once (one thread per host); results in order. Every item
        runs to its end even when another fails: one SSHError then names every host that failed
        (Fabric's GroupResult keeps each host's outcome the same way)."""
        items = list(items)
        if len(items) <= 1:
            return [fn(i) for i in items]
        with ThreadPoolExecutor(max_workers=min(16, len(items))) as pool:
            futures = [pool.submit(fn, i) for i in items]
        failed = [f.exception() for f in futures if f.exception() is not None]
        if not failed:
            return [f.result() for f in futures]
        if len(failed) == 1 or not all(isinstance(e, SSHError) for e in failed):
            raise failed[0]
        raise SSHError(failed[0].host, '; '.join([failed[0].cause] + [str(e) for e in failed[1:]]))

    @staticmethod
    def _by_host(items, host_of) -> dict[str, list]:
        out: dict[str, list] = {}
        for item in items:
            out.setdefault(host_of(item), []).append(item)
        return out

    # -- check ----------------------------------------------------------------------------
    def check(self, plans: list[TaskPlan], imports: bool = False) -> list[HostCheck]:
        groups = self._by_host(plans, lambda p: p.task.host)
        return self._parallel(lambda item: self._check_host(*item, imports), groups.items())

    def _check_host(self, name: str, plans: list[TaskPlan], imports: bool) -> HostCheck:
        python = plans[0].argv[0]
        args = ' '.join(['--import'] * imports + [str(p.task.port) for p in plans])
        script = (f'cd {_q(_remote_dir(plans[0].cwd))} 2>/dev/null; '
                  f'exec {_shell_path(python)} -c {_q(HOST_PROBE)} {args}')
        try:
            conn = self._connect(name)
            result = self._run(name, script)
        except SSHError as e:
            return HostCheck(name, False, e.cause)
        where = f'{conn.user}@{conn.host}:{conn.port}'
        if result.exited in (126, 127):
            why = 'not found' if result.exited == 127 else 'not executable'
            return HostCheck(name, False, f'python {python} {why} on {where} (exit {result.exited}); '
                                          f'set hosts.{name}.python')
        try:
            found = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            last = (result.stderr.strip().splitlines() or ['no output'])[-1]
            return HostCheck(name, False, f'python {python} on {where} failed (exit {result.exited}): {last}')
        problems = []
        if found['missing']:
            problems.append(f'python {python} on {where} cannot import {" nor ".join(found["missing"])}: '
                            f'install tensorflow and tfcluster there, or set hosts.{name}.python')
        names = {p.task.port: p.name for p in plans}
        problems += [f'port {port} ({names.get(port, "?")}) already in use' for port in found['busy']]
        try:
            self._sftp_call(name, lambda sftp: sftp.normalize('.'))
        except SSHError as e:
            problems.append(e.cause)
        if problems:
            return HostCheck(name, False, '; '.join(problems))
        return HostCheck(name, True, f'{where}, Python {found["python"]}, tensorflow {found.get("tensorflow")}, '
                                     f'{len(plans)} task(s), ports {", ".join(str(p.task.port) for p in plans)} free')

    def gpu_counts(self, plans: list[TaskPlan]) -> dict[str, int]:
        """GPU_COUNT_SH on every host at once; a host that cannot be asked is left out."""
        def count(name: str) -> tuple[str, int | None]:
            try:
                return name, parse_gpu_count(self._run(name, GPU_COUNT_SH).stdout)
            except SSHError:
                return name, None
        found = self._parallel(count, sorted({p.task.host for p in plans}))
        return {name: n for name, n in found if n is not None}

    # -- prepare and start ----------------------------------------------------------------
    def prepare(self, plans: list[TaskPlan], spec_yaml: str) -> None:
        groups = self._by_host(plans, lambda p: p.task.host)
        self._parallel(lambda item: self._prepare_host(*item, spec_yaml), groups.items())

    def _prepare_host(self, name: str, plans: list[TaskPlan], spec_yaml: str) -> None:
        for cwd in {p.cwd for p in plans}:
            mine = [p for p in plans if p.cwd == cwd]
            dirs = sorted({posixpath.dirname(path) for p in mine for path in (p.log_path, p.spec_path)})
            script = (f'mkdir -p {_q(_remote_dir(cwd))} && cd {_q(_remote_dir(cwd))} && '
                      f'mkdir -p {" ".join(_q(d) for d in dirs if d)} . && pwd')
            result = self._run(name, script)
            if result.exited != 0:
                last = (result.stderr.strip().splitlines() or [''])[-1]
                raise SSHError(name, f'cannot create the workdir {cwd}: {last}')
            workdir = result.stdout.strip().splitlines()[-1]
            self._host(name).workdirs[cwd] = workdir
            for spec_path in {p.spec_path for p in mine}:
                target = posixpath.join(workdir, spec_path)
                self._sftp_call(name, lambda sftp: self._upload(sftp, spec_yaml, target))

    @staticmethod
    def _upload(sftp: paramiko.SFTPClient, text: str, target: str) -> None:
        sftp.putfo(io.BytesIO(text.encode()), target + '.tmp')
        sftp.posix_rename(target + '.tmp', target)

    def _workdir(self, name: str, cwd: str) -> str:
        h = self._host(name)
        if cwd not in h.workdirs:
            result = self._run(name, f'cd {_q(_remote_dir(cwd))} && pwd')
            if result.exited != 0:
                raise SSHError(name, f'workdir {cwd} does not exist')
            h.workdirs[cwd] = result.stdout.strip().splitlines()[-1]
        return h.workdirs[cwd]

    def start(self, plan: TaskPlan) -> TaskRecord:
        name = plan.task.host
        workdir = self._workdir(name, plan.cwd)
        link = posixpath.join(workdir, plan.log_path)
        log_file = posixpath.join(workdir, plan.attempt_log_path)
        base = link[:-len('.log')] if link.endswith('.log') else link
        pidfile, rcfile, taskfile = base + '.pid', base + '.rc', base + '.task'
        argv = list(plan.argv)
        if '--spec' in argv:        # absolute, so `ps` on the host shows which cluster a task is of
            i = argv.index('--spec') + 1
            argv[i] = posixpath.join(workdir, argv[i])
        env = ' '.join(f'{k}={_q(v)}' for k, v in plan.env.items())
        argv_text = f'{_shell_path(argv[0])} {shlex.join(argv[1:])}'
        command = f'env {env} {argv_text}' if env else argv_text     # env execs: one pid, the task's
        # The wrapper outlives a SIGTERM to the group (trap) to write the task's exit code. The task
        # runs in the background and is waited for, with the wrapper's own stderr going nowhere: a
        # foreground task killed by a signal makes dash write "Terminated" into the log. A wait cut
        # short by the trap is repeated while the task lives; one more wait fetches the status
        # of a task that died just after the trap (127: it was fetched already).
        wrapper = (f'trap : TERM; exec 3>&2 2>/dev/null; {command} 2>&3 3>&- & t=$!; '
                   f'echo $t > {_q(taskfile)}.tmp && mv {_q(taskfile)}.tmp {_q(taskfile)}; '
                   f'while :; do wait $t; r=$?; kill -0 $t || break; done; '
                   f'wait $t; s=$?; [ $s -eq 127 ] || r=$s; echo $r > {_q(rcfile)}')
        # Each attempt logs to a file of its own (a task restarted within one appends); log_path
        # leads to the newest, and a plain file left there by an older version becomes attempt-0's.
        legacy = posixpath.join(posixpath.dirname(link), rundir.attempt_dirname(0))
        h = self._host(name)
        with h.snapshot_lock:
            earlier = h.records.get(plan.name)
        script = '\n'.join([
            f'cd {_q(workdir)} || exit 1',
            self._end_earlier_copy(earlier),
            f'rm -f {_q(rcfile)} {_q(pidfile)} {_q(taskfile)}',
            f'mkdir -p {_q(posixpath.dirname(log_file))}',
            f'if [ -f {_q(link)} ] && [ ! -L {_q(link)} ]; then mkdir -p {_q(legacy)} && '
            f'mv {_q(link)} {_q(legacy)}/; fi',
            f'ln -sfn {_q(posixpath.relpath(log_file, posixpath.dirname(link)))} {_q(link)}',
            f'o=$(wc -c < {_q(log_file)} 2>/dev/null || echo 0)',
            f'setsid nohup sh -c {_q(wrapper)} >> {_q(log_file)} 2>&1 < /dev/null &',
            'p=$!',
            f'echo $p > {_q(pidfile)}',
            # The task's own pid, once the wrapper has written it (a task that ended at once: its rc).
            f'i=0; while [ ! -s {_q(taskfile)} ] && [ ! -s {_q(rcfile)} ] && [ $i -lt 100 ]; do '
            'sleep 0.05; i=$((i + 1)); done',
            f't=$(cat {_q(taskfile)} 2>/dev/null); t=${{t:-$p}}',
            f'ps_=$({_STARTTIME.format(pid="$p")}); ts_=$({_STARTTIME.format(pid="$t")})',
            'echo "tfcluster-started $o $p ${ps_:--} $t ${ts_:--}"',
        ])
        self._connect(name)         # an unreachable host fails here, before anything can start
        try:
            result = self._run(name, script)
            try:
                line = next(x for x in reversed(result.stdout.splitlines()) if x.startswith('tfcluster-started '))
                offset_text, group_text, group_ident, pid_text, ident = line.split()[1:6]
                pid, offset, group = int(pid_text), int(offset_text), int(group_text)
            except (ValueError, StopIteration):
                last = (result.stderr.strip().splitlines() or ['no output'])[-1]
                raise SSHError(name, f'could not start {plan.name} (exit {result.exited}): {last}') from None
        except SSHError as e:
            # The task may have started before the answer was lost: stop it, or the launcher would
            # leave behind a task it has no record of (not in the state file, never stopped).
            raise SSHError(name, f'{e.cause}; {self._undo_start(name, plan.name, pidfile, rcfile)}') from None
        t = plan.task
        record = TaskRecord(name=t.name, job=t.job, index=t.index, host=t.host, port=t.port, backend=self.name,
                            pid=pid, log=log_file, ident='' if ident == '-' else ident, cwd=workdir,
                            log_offset=offset, address='' if plan.address in ('', t.host) else plan.address,
                            handle=SSHHandle(pidfile, rcfile, ssh_target(plan, self.ssh_config), group,
                                             '' if group_ident == '-' else group_ident))
        with h.snapshot_lock:
            h.records[record.name] = record
            h.snapshot.pop(record.name, None)   # the earlier copy's end is not this one's
        return record

    @staticmethod
    def _end_earlier_copy(earlier: TaskRecord | None) -> str:
        """Shell lines that kill what is left of a task's earlier copy on this host (its process
        group, while its task or its wrapper is still the process the record names), and wait
        for it to be gone: a copy left running would hold the port the new one needs."""
        if earlier is None:
            return ':'
        return (f'k=$({_ours(earlier)}); if [ -n "$k" ]; then kill -KILL -$k 2>/dev/null; i=0; '
                'while kill -0 -$k 2>/dev/null && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done; fi')

    def _undo_start(self, name: str, task: str, pidfile: str, rcfile: str) -> str:
        """Stop whatever a start that failed half way launched: the process group the pidfile names,
        if its leader is this task's wrapper (its command line names the task's rc file); says
        what came of it."""
        script = (f'p=$(cat {_q(pidfile)} 2>/dev/null) || exit 0; [ -n "$p" ] || exit 0; '
                  f'tr "\\0" " " < /proc/$p/cmdline 2>/dev/null | grep -qF {_q(rcfile)} || exit 0; '
                  'kill -TERM -$p 2>/dev/null || exit 0; echo stopped; i=0; '
                  'while kill -0 -$p 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done; '
                  'kill -KILL -$p 2>/dev/null; exit 0')
        try:
            result = self._run(name, script, timeout=POLL_TIMEOUT + STOP_GRACE_SECS)
        except SSHError as e:
            return (f'{task} may be running there ({e.cause}); it stops itself within '
                    f'{LEASE_SECS["ssh"]}s, once its lease is no longer renewed')
        return f'stopped {task}, which had started' if 'stopped' in result.stdout else f'{task} did not start'

    # -- status ---------------------------------------------------------------------------
    def _status(self, record: TaskRecord) -> tuple[str, int | None]:
        """('running', None), ('ended', code) or ('gone', None), from the host's snapshot."""
        h = self._host(record.host)
        with h.snapshot_lock:
            h.records.setdefault(record.name, record)
            fresh = time.monotonic() - h.snapshot_at < SNAPSHOT_TTL
            if fresh and h.snapshot_error is not None:
                raise h.snapshot_error
            if not fresh or record.name not in h.snapshot:
                try:
                    h.snapshot = self._take_snapshot(h.name, list(h.records.values()))
                    h.snapshot_error = None
                except SSHError as e:
                    h.snapshot_error = e
                    raise
                finally:
                    h.snapshot_at = time.monotonic()
            return h.snapshot[record.name]

    def _take_snapshot(self, name: str, records: list[TaskRecord]) -> dict[str, tuple[str, int | None]]:
        # /proc first, then the rc file: a task seen gone has written its rc file already, unless
        # its wrapper (asked last) is still about to.
        lines = [f's=$(cat /proc/{int(r.pid)}/stat 2>/dev/null); r=$(cat {_q(handle_of(r, SSHHandle).rcfile or "/dev/null")} '
                 f'2>/dev/null); w=$(cat /proc/{_group(r)[0]}/stat 2>/dev/null); '
                 f'printf "%s|%s|%s|%s\\n" {_q(r.name)} "$r" "$s" "$w"' for r in records]
        result = self._run(name, '\n'.join(lines + [f'echo {_SNAPSHOT_END}']), timeout=POLL_TIMEOUT)
        if not result.stdout.rstrip().endswith(_SNAPSHOT_END):
            # A cut-short answer must not read as "every task gone" (which means killed hard).
            self._drop(name)
            raise SSHError(name, 'lost the SSH connection: a status query was answered only in part')
        out = {}
        for line in result.stdout.splitlines():
            task, rc, stat, wrapper = (line.split('|', 3) + ['', '', ''])[:4]
            out[task] = (rc, stat, wrapper)
        h = self._host(name)
        snapshot = {}
        for r in records:
            rc, stat, wrapper = out.get(r.name, ('', '', ''))
            if rc.strip().lstrip('-').isdigit():
                h.ending.pop(r.name, None)
                snapshot[r.name] = ('ended', decode_exit(int(rc)))
                continue
            running = _is_process(stat, r.ident)
            h.states[r.name] = _fields(stat)[0] if running else ''
            if running:
                snapshot[r.name] = ('running', None)
                continue
            # The task is gone and no exit code is written: its wrapper is writing it now, or the
            # whole group was killed hard (then no one ever will).
            group, group_ident = _group(r)
            if group != r.pid and _is_process(wrapper, group_ident):
                first = h.ending.setdefault(r.name, time.monotonic())
                if time.monotonic() - first < WRAPPER_GRACE_SECS:
                    snapshot[r.name] = ('running', None)
                    continue
            h.ending.pop(r.name, None)
            snapshot[r.name] = ('gone', None)
        return snapshot

    def renew(self, plans, text=None):
        groups = self._by_host(plans, lambda p: p.task.host)

        def touch(item):
            name, mine = item
            h = self._host(name)
            changed = text is not None and text != h.lease_text
            if not changed and time.monotonic() - h.renewed_at < LEASE_RENEW_SECS:
                return
            try:
                paths = {posixpath.join(self._workdir(name, p.cwd), p.env[LEASE_ENV])
                         for p in mine if LEASE_ENV in p.env}
                if changed:     # written whole under another name first: a task never reads half of it
                    script = '; '.join(f'mkdir -p {_q(posixpath.dirname(x))} && printf %s {_q(text)} > {_q(x + ".new")} '
                                       f'&& mv -f {_q(x + ".new")} {_q(x)}' for x in sorted(paths))
                else:
                    script = '; '.join(f'mkdir -p {_q(posixpath.dirname(x))}; touch {_q(x)}' for x in sorted(paths))
                self._run(name, script or 'true', timeout=POLL_TIMEOUT)
                h.renewed_at = time.monotonic()
                if changed:
                    h.lease_text = text
            except SSHError as e:
                log.debug('lease renewal on %s failed: %s', name, e)
        self._parallel(touch, groups.items())

    def _invalidate(self, name: str) -> None:
        self._host(name).snapshot_at = 0.0

    def status(self, record: TaskRecord) -> Observation:
        try:
            state, code = self._status(record)
        except SSHError as e:
            return Observation(UNKNOWN, error=str(e))
        if state == 'ended':
            return Observation(ENDED, code)
        if state != 'running':
            return Observation(ENDED, -signal.SIGKILL)      # gone without an exit code: killed hard
        # The recorded pid is the task's own process: stopped, it shows as state T.
        stopped = self._host(record.host).states.get(record.name, '') in ('T', 't')
        return Observation(RUNNING, stopped='is stopped (SIGSTOP, or a debugger)' if stopped else None)

    # -- stop -----------------------------------------------------------------------------
    def stop(self, records: list[TaskRecord], grace: float = STOP_GRACE_SECS) -> None:
        groups = self._by_host(records, lambda r: r.host)
        self._parallel(lambda item: self._stop_host(*item, grace), groups.items())

    def _stop_host(self, name: str, records: list[TaskRecord], grace: float) -> None:
        """One command: SIGTERM every task's process group that is still ours, wait up to `grace`
        for all, SIGKILL what is left, wait for that too."""
        ours = '\n'.join(f'g=$({_ours(r)}); [ -n "$g" ] && k="$k $g"' for r in records)
        rounds = max(1, int(grace / 0.1))
        script = f'''k=''
{ours}
[ -n "$k" ] || exit 0
for p in $k; do kill -TERM -$p 2>/dev/null; kill -CONT -$p 2>/dev/null; done
wait_gone() {{
  i=0
  while [ $i -lt $1 ]; do
    a=''
    for p in $k; do kill -0 -$p 2>/dev/null && a="$a $p"; done
    k=$a
    [ -n "$k" ] || return 0
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}}
wait_gone {rounds} && exit 0
for p in $k; do kill -KILL -$p 2>/dev/null; done
echo "killed $k"
wait_gone 50
'''
        try:
            result = self._run(name, script, timeout=grace + COMMAND_TIMEOUT)
            if result.stdout.strip():
                log.info('%s: %s after %.0fs', name, result.stdout.strip(), grace)
        except SSHError as e:
            log.error('%s; run `launch down` again once the host is reachable', e)
        finally:
            self._invalidate(name)

    # -- logs -----------------------------------------------------------------------------
    def read_file(self, record, path):
        def read(sftp):
            with sftp.open(posixpath.join(record.cwd, path)) as f:
                return f.read().decode('utf-8', 'replace')
        try:
            return self._sftp_call(record.host, read)
        except (SSHError, OSError):
            return None

    def log_record(self, plan):
        cwd = self._host(plan.task.host).workdirs.get(plan.cwd, _remote_dir(plan.cwd))
        return planned_record(plan, posixpath.join(cwd, plan.log_path), cwd, self.name)

    def read_log(self, record, follow=False, stop=None, offset=0):
        return self._read_log(record.host, record.log, stop if follow else None, offset)

    def _read_log(self, name: str, path: str, stop: threading.Event | None, offset: int = 0):
        """Complete lines of a remote file read with SFTP from an offset; with `stop`, keep polling
        until it is set and the file has no more. A missing file counts as empty."""
        pending = b''

        def read_more(sftp) -> bytes:
            try:
                size = sftp.stat(path).st_size
            except FileNotFoundError:
                return b''
            if size <= offset:
                return b''
            with sftp.open(path, 'rb') as f:
                f.seek(offset)
                return f.read(min(size - offset, LOG_CHUNK))

        failing_since = None
        while True:
            try:
                data = self._sftp_call(name, read_more)
                failing_since = None
            except SSHError as e:
                # Following: a dropped connection is retried (the poll decides whether the host is
                # lost); reading once: report it.
                if stop is None or stop.is_set():
                    log.error('cannot read %s: %s', path, e)
                    return
                if failing_since is None:
                    failing_since = time.monotonic()
                    log.warning('cannot read %s: %s; retrying', path, e)
                stop.wait(1.0)
                continue
            if data:
                offset += len(data)
                pending += data
                *lines, pending = pending.split(b'\n')
                for line in lines:
                    yield line.decode('utf-8', errors='replace')
                continue
            if stop is None or stop.is_set():
                if pending:
                    yield pending.decode('utf-8', errors='replace')
                return
            stop.wait(LOG_POLL_SECS)
