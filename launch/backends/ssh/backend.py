"""The SSH backend: tasks on remote hosts, started detached over one connection per host
(connections.py) by the shell scripts of scripts.py, which also describes the files a task has there.

The record names the task's own process (the pid its log prints): a task is running while that
process lives, whatever became of its wrapper, and a new start of a task first makes sure its
earlier copy is gone, so its port is free. Status comes from a watcher per host that writes when
a task ends (watch.py); while it cannot say, all tasks of a host are asked in one command, cached
for a fraction of a second. A stop is one command per host. Logs are read with SFTP from an
offset (logs.py), so following them leaves no process on the host.
"""
from __future__ import annotations

import json
import logging
import posixpath
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TypeVar

import fabric
import invoke
import paramiko

from cluster.runtime import rundir, runjson
from cluster.runtime.rundir import LEASE_ENV
from cluster.runtime.standby import standby_dir
from cluster.spec import ClusterSpec
from cluster.rehearsal.argv import task_module
from launch.backends import marks
from launch.backends.base import (ENDED, RUNNING, STOP_GRACE_SECS, UNKNOWN, Backend, HostCheck,
                                  Observation, busy_port, TaskRecord, decode_exit, handle_of, planned_record)
from launch.backends.probes import GPU_COUNT_SH, parse_gpu_count
from launch.backends.procstat import STATE, start_time, stat_fields
from launch.backends.ssh import logs, starting
from launch.backends.ssh.standby import SSHStandbys
from launch.backends.ssh.watch import Watches
from launch.backends.ssh.starting import _start_script
from launch.backends.ssh.connections import COMMAND_TIMEOUT, Connections, SSHError, parallel, ssh_target
from launch.backends.ssh.scripts import (Seen, Started, TaskFiles, TaskProcess, Watched, lease_script,
                                         parse_signalled, parse_snapshot, prepare_script,
                                         probe_script, remote_dir, signal_script, snapshot_script, stop_script, workdir_script)
from launch.planning.plan import DEFAULT_REMOTE_PYTHON, TaskPlan

log = logging.getLogger(__name__)

# A task gone while its wrapper lives: how long the wrapper has to write its rc. It first scans
# /proc and kills what the task left in its session, waiting up to 5 s for that (scripts.py
# END_SESSION): a grace shorter than that read a task that ended well, on a busy host, as killed
# hard (CI saw a worker that left a scale-down counted as lost to SIGKILL after 2 s).
WRAPPER_GRACE_SECS = 10.0
SNAPSHOT_TTL = 0.3            # seconds a host's status snapshot answers status()
LEASE_RENEW_SECS = 5.0        # how often the tasks' lease files on a host are touched
POLL_TIMEOUT = 10             # seconds a status command may take before the host counts as unreachable

T = TypeVar('T')
R = TypeVar('R')


class RemoteState(str, Enum):
    """A task as its host's status snapshot sees it: running, ended with an exit code, or gone
    without one (its whole group killed hard)."""
    RUNNING = 'running'
    ENDED = 'ended'
    GONE = 'gone'


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


def _process(record: TaskRecord) -> TaskProcess:
    """The task's processes as its record names them (a record from before the task's own pid was
    kept names the wrapper, which leads the group)."""
    h = handle_of(record, SSHHandle)
    group, group_ident = (h.group, h.group_ident) if h.group else (int(record.pid), record.ident)
    return TaskProcess(int(record.pid), record.ident, group, group_ident)


def _watched(record: TaskRecord) -> Watched:
    return Watched(record.name, record.pid, handle_of(record, SSHHandle).rcfile, _process(record).group)


def _is_process(stat: str, ident: str) -> bool:
    """Whether a /proc/PID/stat line is of a live (not zombie) process started at `ident`."""
    started = start_time(stat_fields(stat))
    return started is not None and (not ident or started == ident)


def _by_host(items: Iterable[T], host_of: Callable[[T], str]) -> dict[str, list[T]]:
    out: dict[str, list[T]] = {}
    for item in items:
        out.setdefault(host_of(item), []).append(item)
    return out


# The start script's size is checked before anything starts (launch/planning/limits.py), when the
# workdir's absolute path is not known yet: a long stand-in for it, and for an earlier copy's pids.
_LONG_HOME = '/home/' + 'u' * 64
_LONG_PROCESS = TaskProcess(4194304, '9' * 20, 4194304, '9' * 20)


def start_script_size_text(plan: TaskPlan) -> str:
    """The start script of `plan`'s task as it will be at most: what the remote shell gets as one
    string (a command over SSH is one argument of `sh -c`, within Linux's MAX_ARG_STRLEN)."""
    workdir = plan.cwd if plan.cwd.startswith('/') else posixpath.join(_LONG_HOME, remote_dir(plan.cwd))
    return _start_script(plan, workdir, _LONG_PROCESS)


@dataclass
class _Tasks:
    """What the backend knows of one host's tasks: resolved workdirs, records and status snapshot."""
    workdirs: dict[str, str] = field(default_factory=dict)     # plan.cwd -> absolute remote path
    records: dict[str, TaskRecord] = field(default_factory=dict)
    snapshot: dict[str, tuple[RemoteState, int | None]] = field(default_factory=dict)
    snapshot_at: float = 0.0
    snapshot_error: SSHError | None = None
    states: dict[str, str] = field(default_factory=dict)        # task -> /proc state letter
    # a start of a task (name, pid) gone, its wrapper not yet: since when. Keyed by the start, not the
    # name: an earlier start's wait (a stop mid-way) must not cut a later one's grace short (CI saw a
    # worker that finished read as killed hard, 14 s after its earlier start was stopped).
    ending: dict[tuple[str, int], float] = field(default_factory=dict)
    renewed_at: float = 0.0
    lease_text: str | None = None    # what the lease files on this host hold (the live workers)
    pace: threading.BoundedSemaphore = field(default_factory=logs.pace)    # its logs read fast now
    watched: dict[str, Watched] | None = None     # what its watcher is to watch (None: made anew)
    snapshot_lock: threading.Lock = field(default_factory=threading.Lock)


class SSHBackend(Backend):
    name = 'ssh'
    records_channel = True      # the channel: read over SFTP, as the log and the pulse are
    _parallel = staticmethod(parallel)

    def __init__(self, spec: ClusterSpec, ssh_config: str | None = None, check_host_keys: bool = True) -> None:
        self.spec = spec
        self.ssh_config = ssh_config
        self.check_host_keys = check_host_keys
        self._pool = Connections(spec.hosts, ssh_config, check_host_keys)
        self._hosts: dict[str, _Tasks] = {}
        self._lock = threading.Lock()
        self._standbys = SSHStandbys(self)
        self._watches = Watches(self._python_of, lambda name: self._connect(name).client.get_transport())

    # -- connections: every remote command goes through _run (tests wrap it to watch or cut them)
    def _host(self, name: str) -> _Tasks:
        with self._lock:
            return self._hosts.setdefault(name, _Tasks())

    def _connect(self, name: str) -> fabric.Connection:
        return self._pool.connect(name)

    def _python_of(self, name: str) -> str:
        """The Python the host's tasks run with (the task watcher's, too)."""
        host = self.spec.hosts.get(name)
        return (host and host.python) or DEFAULT_REMOTE_PYTHON

    def _run(self, name: str, script: str, timeout: float = COMMAND_TIMEOUT) -> invoke.Result:
        """Run a POSIX sh script on the host; the result never raises for a non-zero exit."""
        return self._pool.run(name, script, timeout=timeout)

    def _sftp_call(self, name: str, fn: Callable[[paramiko.SFTPClient], R]) -> R:
        return self._pool.sftp_call(name, fn)

    def _drop(self, name: str) -> None:
        self._pool.drop(name)

    def close(self) -> None:
        self._standbys.close()
        self._watches.close()
        self._pool.close()

    # -- warm standbys (ssh/standby.py) ------------------------------------------------------
    def tend(self, plans: list[TaskPlan], per_host: int) -> None:
        self._standbys.tend(plans, per_host)

    def standby_views(self) -> list[tuple[str, int, str]]:
        return self._standbys.views()

    def _warm_starts(self, name: str, plans: list[TaskPlan]) -> tuple[list[TaskRecord], list[TaskPlan]]:
        return self._standbys.become(name, plans)

    # -- check ----------------------------------------------------------------------------
    def check(self, plans: list[TaskPlan], imports: bool = False) -> list[HostCheck]:
        groups = _by_host(plans, lambda p: p.task.host)
        return self._parallel(lambda item: self._check_host(*item, imports), groups.items())

    def _check_host(self, name: str, plans: list[TaskPlan], imports: bool) -> HostCheck:
        python = plans[0].argv[0]
        script = probe_script(plans[0].cwd, python, [p.task.port for p in plans], imports, task_module(plans[0].argv))
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
        busy = [busy_port(names.get(port, '?'), port, name) for port in found['busy']]
        problems += busy
        try:
            self._sftp_call(name, lambda sftp: sftp.normalize('.'))
        except SSHError as e:
            problems.append(e.cause)
        if problems:
            return HostCheck(name, False, '; '.join(problems), refusal=busy[0] if busy == problems else '')
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
        groups = _by_host(plans, lambda p: p.task.host)
        self._parallel(lambda item: self._prepare_host(*item, spec_yaml), groups.items())

    def _prepare_host(self, name: str, plans: list[TaskPlan], spec_yaml: str) -> None:
        for cwd in {p.cwd for p in plans}:
            mine = [p for p in plans if p.cwd == cwd]
            dirs = sorted({posixpath.dirname(path) for p in mine for path in (p.log_path, p.spec_path)})
            result = self._run(name, prepare_script(cwd, dirs))
            if result.exited != 0:
                last = (result.stderr.strip().splitlines() or [''])[-1]
                raise SSHError(name, f'cannot create the workdir {cwd}: {last}')
            workdir = result.stdout.strip().splitlines()[-1]
            self._host(name).workdirs[cwd] = workdir
            self._standbys.kill_left(name, {standby_dir(posixpath.join(workdir, posixpath.dirname(p.spec_path)), name)
                                            for p in mine})
            for spec_path in {p.spec_path for p in mine}:
                target = posixpath.join(workdir, spec_path)
                # _sftp_call runs the lambda before it returns: `target` is this turn's (B023 fears a later call)
                self._sftp_call(name, lambda sftp: self._upload(sftp, spec_yaml, target))  # noqa: B023

    @staticmethod
    def _upload(sftp: paramiko.SFTPClient, text: str, target: str) -> None:
        """Write `text` to `target` whole: under another name first, then renamed into place;
        readable by its owner alone (rundir.PRIVATE) before it holds a byte. The other name is this
        upload's own: hosts sharing a filesystem (an NFS home) upload the same file at once, and a
        shared `.tmp` was renamed away under all but the first."""
        temporary = f'{target}.{uuid.uuid4().hex[:12]}.tmp'
        with sftp.open(temporary, 'wb') as f:
            f.chmod(rundir.PRIVATE)
            f.write(text.encode())
        sftp.posix_rename(temporary, target)

    def _workdir(self, name: str, cwd: str) -> str:
        h = self._host(name)
        if cwd not in h.workdirs:
            result = self._run(name, workdir_script(cwd))
            if result.exited != 0:
                raise SSHError(name, f'workdir {cwd} does not exist')
            h.workdirs[cwd] = result.stdout.strip().splitlines()[-1]
        return h.workdirs[cwd]

    def start(self, plan: TaskPlan) -> TaskRecord:
        return next(self.start_many([plan], threading.Event()))

    def start_many(self, plans: list[TaskPlan], stop: threading.Event) -> Iterator[TaskRecord]:
        """A script per host starting all of its tasks, hosts in parallel (starting.py)."""
        return starting.start_many(self, plans, stop)

    def _earlier(self, plan: TaskPlan) -> TaskProcess | None:
        """The processes of the task's copy started before on this host (its end comes first)."""
        h = self._host(plan.task.host)
        with h.snapshot_lock:
            earlier = h.records.get(plan.name)
        return None if earlier is None else _process(earlier)

    def _note_started(self, record: TaskRecord) -> None:
        h = self._host(record.host)
        with h.snapshot_lock:
            h.records[record.name], h.watched = record, None
            h.snapshot.pop(record.name, None)   # the earlier copy's end is not this one's
        self._watches.enabled = True            # this launcher runs tasks: it watches their hosts

    def _started_record(self, plan: TaskPlan, started: Started, workdir: str, log_file: str,
                        files: TaskFiles) -> TaskRecord:
        t, p = plan.task, started.process
        return TaskRecord(name=t.name, job=t.job, index=t.index, host=t.host, port=t.port, backend=self.name,
                          pid=p.pid, log=log_file, ident=p.ident, cwd=workdir, log_offset=started.offset,
                          address='' if plan.address in ('', t.host) else plan.address,
                          handle=SSHHandle(files.pidfile, files.rcfile, ssh_target(plan, self.ssh_config),
                                           p.group, p.group_ident))

    # -- status ---------------------------------------------------------------------------
    def _status(self, record: TaskRecord) -> tuple[RemoteState, int | None]:
        """The task's state and exit code (ENDED only), from the host's snapshot."""
        h = self._host(record.host)
        with h.snapshot_lock:
            if record.name not in h.records:
                h.records[record.name], h.watched = record, None
            if h.watched is None:
                h.watched = {r.name: _watched(r) for r in h.records.values()}
            watched = h.watched
        seen = self._watches.seen(record.host, watched, record.name, record.pid)
        with h.snapshot_lock:
            if seen is not None:
                return self._judge(h, record, seen)
            fresh = time.monotonic() - h.snapshot_at < SNAPSHOT_TTL
            if fresh and h.snapshot_error is not None:
                raise h.snapshot_error
            if not fresh or record.name not in h.snapshot:
                try:
                    h.snapshot = self._take_snapshot(record.host, list(h.records.values()))
                    h.snapshot_error = None
                except SSHError as e:
                    h.snapshot_error = e
                    raise
                finally:
                    h.snapshot_at = time.monotonic()
            return h.snapshot[record.name]

    def _take_snapshot(self, name: str, records: list[TaskRecord]) -> dict[str, tuple[RemoteState, int | None]]:
        seen = parse_snapshot(self._run(name, snapshot_script(map(_watched, records)), timeout=POLL_TIMEOUT).stdout)
        if seen is None:
            # A cut-short answer must not read as "every task gone" (which means killed hard).
            self._drop(name)
            raise SSHError(name, 'lost the SSH connection: a status query was answered only in part')
        h = self._host(name)
        return {r.name: self._judge(h, r, seen.get(r.name, Seen('', '', ''))) for r in records}

    @staticmethod
    def _judge(h: _Tasks, record: TaskRecord, seen: Seen) -> tuple[RemoteState, int | None]:
        """The task's state from what the snapshot saw of it; notes its /proc state letter."""
        start = (record.name, int(record.pid))
        if seen.rc.strip().lstrip('-').isdigit():
            h.ending.pop(start, None)
            return RemoteState.ENDED, decode_exit(int(seen.rc))
        running = _is_process(seen.stat, record.ident)
        h.states[record.name] = stat_fields(seen.stat)[STATE] if running else ''
        if running:
            return RemoteState.RUNNING, None
        # The task is gone and no exit code is written: its wrapper is writing it now, or the
        # whole group was killed hard (then no one ever will).
        p = _process(record)
        if p.group != record.pid and _is_process(seen.wrapper, p.group_ident):
            first = h.ending.setdefault(start, time.monotonic())
            if time.monotonic() - first < WRAPPER_GRACE_SECS:
                return RemoteState.RUNNING, None
        h.ending.pop(start, None)
        return RemoteState.GONE, None

    def renew(self, plans: list[TaskPlan], text: str | None = None) -> None:
        groups = _by_host(plans, lambda p: p.task.host)
        self._parallel(lambda item: self._renew_host(*item, text), groups.items())

    def _renew_host(self, name: str, plans: list[TaskPlan], text: str | None) -> None:
        """Touch the host's lease files every LEASE_RENEW_SECS; write them at once when `text` changed."""
        h = self._host(name)
        changed = text is not None and text != h.lease_text
        if not changed and time.monotonic() - h.renewed_at < LEASE_RENEW_SECS:
            return
        try:
            paths = {posixpath.join(self._workdir(name, p.cwd), p.env[LEASE_ENV])
                     for p in plans if LEASE_ENV in p.env}
            self._run(name, lease_script(paths, text if changed else None), timeout=POLL_TIMEOUT)
            h.renewed_at = time.monotonic()
            if changed:
                h.lease_text = text
        except SSHError as e:
            log.debug('lease renewal on %s failed: %s', name, e)

    def _invalidate(self, name: str) -> None:
        self._host(name).snapshot_at = 0.0
        self._watches.invalidate(name)

    def status(self, record: TaskRecord) -> Observation:
        try:
            state, code = self._status(record)
        except SSHError as e:
            return Observation(UNKNOWN, error=str(e))
        if state == RemoteState.ENDED:
            return Observation(ENDED, code)
        if state != RemoteState.RUNNING:
            return Observation(ENDED, -signal.SIGKILL)      # gone without an exit code: killed hard
        # The recorded pid is the task's own process: stopped, it shows as state T.
        stopped = self._host(record.host).states.get(record.name, '') in ('T', 't')
        return Observation(RUNNING, stopped='is stopped (SIGSTOP, or a debugger)' if stopped else None)

    # -- stop -----------------------------------------------------------------------------
    def stop(self, records: list[TaskRecord], grace: float = STOP_GRACE_SECS) -> None:
        groups = _by_host(records, lambda r: r.host)
        self._parallel(lambda item: self._stop_host(*item, grace), groups.items())

    def _stop_host(self, name: str, records: list[TaskRecord], grace: float) -> None:
        """One command (stop_script) for every task of the host."""
        script = stop_script([_process(r) for r in records], grace, [marks.of_record(r) for r in records])
        try:
            result = self._run(name, script, timeout=grace + COMMAND_TIMEOUT)
            if result.stdout.strip():
                log.info('%s: %s after %.0fs', name, result.stdout.strip(), grace)
        except SSHError as e:
            log.error('%s; run `launch down` again once the host is reachable', e)
        finally:
            self._invalidate(name)

    def send_signal(self, records: list[TaskRecord], signum: int) -> dict[str, str | None]:
        """One command per host (signal_script), every host at once."""
        name = signal.Signals(signum).name[len('SIG'):]

        def host(item: tuple[str, list[TaskRecord]]) -> dict[str, str | None]:
            host_name, group = item
            try:
                result = self._run(host_name, signal_script([(r.name, _process(r)) for r in group], name),
                                   timeout=POLL_TIMEOUT)
            except SSHError as e:
                return {r.name: f'cannot be signalled ({e.cause})' for r in group}
            sent = parse_signalled(result.stdout)
            return {r.name: None if r.name in sent else 'has ended' for r in group}
        out: dict[str, str | None] = {}
        for found in self._parallel(host, _by_host(records, lambda r: r.host).items()):
            out.update(found)
        return out

    # -- logs -----------------------------------------------------------------------------
    def read_file(self, record: TaskRecord, path: str) -> str | None:
        def read(sftp: paramiko.SFTPClient) -> str | None:
            with sftp.open(posixpath.join(record.cwd, path)) as f:
                data = runjson.read_bytes(f)        # a small file: never more than MAX_BYTES of it
            return None if data is None else data.decode('utf-8', 'replace')
        try:
            return self._sftp_call(record.host, read)
        except (SSHError, OSError):
            return None

    def log_record(self, plan: TaskPlan) -> TaskRecord:
        cwd = self._host(plan.task.host).workdirs.get(plan.cwd, remote_dir(plan.cwd))
        return planned_record(plan, posixpath.join(cwd, plan.log_path), cwd, self.name)

    def read_log(self, record: TaskRecord, follow: bool = False,
                 stop: threading.Event | None = None, offset: int = 0) -> Iterator[str]:
        return self._read_log(record.host, record.log, stop if follow else None, offset)

    def _read_log(self, name: str, path: str, stop: threading.Event | None, offset: int = 0) -> Iterator[str]:
        return logs.read_lines(lambda fn: self._sftp_call(name, fn), path, stop, offset, self._host(name).pace)
