"""The interface every backend (local processes, SSH) offers the launcher, and the pieces they share.

A task always writes its output to its own log file; the launcher follows that file (locally or
over SSH) to stream it with a `[job:index]` prefix. So output survives the launcher, and
`launch logs` reads the same file.
"""
from __future__ import annotations

import abc
import contextlib
import enum
import os
import socket
import threading
from dataclasses import asdict, dataclass, fields, is_dataclass
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from cluster.spec import address as host_port, is_chief
from cluster.runtime import rundir
from cluster.runtime.masking import NO_MASK, Masker
from cluster.runtime.rundir import LEASE_ENV, read_text, write_atomically
from launch.errors import UsageError
from launch.backends.tail import LogTail, ThreadTail
from launch.planning.plan import TaskPlan

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from cluster.spec import ClusterSpec

STOP_GRACE_SECS = 5.0     # SIGTERM, then SIGKILL after this long (one deadline shared by all tasks)


@dataclass
class TaskRecord:
    """A started task as the state file remembers it: enough to find, check and stop it later."""
    name: str
    job: str
    index: int
    host: str
    port: int
    backend: str
    pid: int
    log: str
    ident: str = ''          # the process start time, so a reused pid is never mistaken for ours
    cwd: str = '.'
    handle: Any = None       # the backend's own typed record of the task (see handle_of)
    log_offset: int = 0      # where this start's output begins in the log (a restart appends)
    address: str = ''        # where other tasks reach it, when not at `host` (an ssh config alias's HostName)
    warm: bool = False       # a warm standby became it (launch/backends/standby.py): no process start, no import

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != 'handle'}
        handle = self.handle
        d['extra'] = asdict(handle) if is_dataclass(handle) and not isinstance(handle, type) else dict(handle or {})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TaskRecord:
        known = {f.name for f in fields(cls)} - {'handle'}     # a state file may come from another version
        return cls(handle=dict(d.get('extra') or {}), **{k: v for k, v in d.items() if k in known})

    @property
    def is_chief(self) -> bool:
        return is_chief(self.job, self.index)

    @property
    def endpoint(self) -> str:
        """'address:port' the task's gRPC server is reached at."""
        return host_port(self.address or self.host, self.port)


H = TypeVar('H', bound='DataclassInstance')


def handle_of(record: TaskRecord, cls: type[H]) -> H:
    """The record's handle as the backend's own type: a record read back from the state file
    holds it as a dict until its backend first looks at it."""
    if not isinstance(record.handle, cls):
        known = {f.name for f in fields(cls)}
        record.handle = cls(**{k: v for k, v in (record.handle or {}).items() if k in known})
    return record.handle


class Seen(str, enum.Enum):
    """What a backend can tell of a task's process."""
    RUNNING = 'running'
    ENDED = 'ended'
    UNKNOWN = 'unknown'         # its host cannot be asked

    def __str__(self) -> str:
        return self.value


RUNNING, ENDED, UNKNOWN = Seen.RUNNING, Seen.ENDED, Seen.UNKNOWN


@dataclass(frozen=True)
class Observation:
    """What a backend can tell of one task now: running, ended (with its exit code, negative for
    a signal), or unknown (its host cannot be asked; `error` says why). A running task that makes
    no progress says how in `stopped` (e.g. 'is stopped (SIGSTOP, or a debugger)'). An ended task
    whose process group still runs (a command it started, which may hold its port) lists those
    processes in `left`: the task is gone, but not all of it. An unknown task that `movable` was
    lost with its host, which its backend can place elsewhere (a Ray node that left; placing.py)."""
    state: Seen
    exit_code: int | None = None
    stopped: str | None = None
    error: str = ''
    left: tuple[int, ...] = ()
    movable: bool = False

    @property
    def alive(self) -> bool:
        """Running, unknown, or ended with processes of its group left: what keeps a state file
        and what a stop must reach (so `launch down` can try again later)."""
        return self.state != ENDED or bool(self.left)

    @property
    def frozen(self) -> bool:
        """Running but stopped or paused: it makes no progress until someone resumes it (a task in
        uninterruptible I/O is not counted: it goes on by itself)."""
        return self.state == RUNNING and (self.stopped or '').startswith(('is stopped', 'is paused'))


class BackendError(Exception):
    """A backend could not reach or control a host: the message is one line naming host and cause."""


@dataclass
class HostCheck:
    """The pre-flight verdict for one host: `detail` says what was found or what is wrong;
    `refusal`, where the problem has a line of its own in docs/errors.yaml (a busy port), that
    line, which `launch up` and `launch check` then end with (refusal())."""
    host: str
    ok: bool
    detail: str
    refusal: str = ''

    def line(self) -> str:
        return f'{self.host}: {"ok" if self.ok else "error"}: {self.detail}'

    def to_json(self) -> dict[str, Any]:
        """One host of `launch check --json`: `host`, `ok`, `detail`."""
        return {'host': self.host, 'ok': self.ok, 'detail': self.detail}


def busy_port(task: str, port: int, host: str) -> str:
    """A task's port something already listens on: the one wording of every backend and command."""
    return f'{task}: port {port} on {host} is already in use'


def refusal(spec: ClusterSpec, failed: list[HostCheck]) -> str:
    """The one line the pre-flight refuses failed hosts with: a problem's own line when every
    failed host has one (a busy port), else every failed host's verdict."""
    own = [c.refusal for c in failed if c.refusal]
    if own and len(own) == len(failed):
        return f'{spec.path}: {own[0]}'
    return f'{spec.path}: pre-flight failed: ' + '; '.join(c.line() for c in failed)


class Backend(abc.ABC):
    """Starts, watches and stops tasks of one kind. Methods take many tasks at once where a
    backend can do better than one at a time (one deadline for all, one SSH connection per host);
    one that talks to many hosts reports every host's outcome, never only the first failure."""

    name = ''
    masker: Masker = NO_MASK        # set by the registry: what `lines` hides
    # Its tasks write their messages' records beside their logs (it names each a channel in its
    # environment, cluster/runtime/messages.py CHANNEL_ENV, and empties it as it starts the task:
    # clear_channel), which read_log reads as it reads a log.
    records_channel = False
    # How many of its tasks a start keeps in flight at once (spawned, not yet serving): a backend
    # whose tasks share the launcher's CPUs bounds it; None spawns all at once
    # (launch/run/supervised/admission.py).
    start_window: int | None = None

    def place(self, spec: ClusterSpec, plans: list[TaskPlan], timeout: float) -> ClusterSpec | None:
        """Put the tasks where they will run before any starts, and return the spec as placed (its
        hosts and ports those the tasks got: a Ray cluster's nodes); None: they run as planned.
        Called again before each restart of the whole cluster: a task that cannot start where it
        ran (its node is gone) may be placed elsewhere (`moved` says why), or BackendError."""
        return None

    def moved(self) -> dict[str, str]:
        """The tasks the last `place` put somewhere new, and why, in one line each."""
        return {}

    def prepare(self, plans: list[TaskPlan], spec_yaml: str) -> None:     # noqa: B027 (a hook: no-op by default)
        """Put what the tasks need in place (the effective spec, log folders) before any start."""

    @abc.abstractmethod
    def check(self, plans: list[TaskPlan], imports: bool = False) -> list[HostCheck]:
        """Pre-flight of every host these tasks use (reachable, Python and TensorFlow there,
        ports free), all hosts checked even when one fails; starts nothing. With `imports`, the
        tasks' Python imports TensorFlow and this package for real (seconds per host); without,
        it only finds them."""

    def gpu_counts(self, plans: list[TaskPlan]) -> dict[str, int]:
        """How many GPUs the hosts of these tasks have: spec host -> count, a host that cannot
        be asked left out (its pre-flight says why). Called only when train.devices wants GPUs."""
        return {}

    def preflight(self, spec: ClusterSpec, plans: list[TaskPlan]) -> None:
        """What stops `launch up` before anything starts (`check` without imports, every host's
        verdict in one line): raises UsageError."""
        failed = [c for c in self.check(plans) if not c.ok] if plans else []
        if failed:
            raise UsageError(refusal(spec, failed))

    @abc.abstractmethod
    def start(self, plan: TaskPlan) -> TaskRecord:
        """Start the task detached (its own session), its output going to plan.log_path (appended
        to when plan.restart, with record.log_offset where this start's output begins)."""

    def start_many(self, plans: list[TaskPlan], stop: threading.Event) -> Iterator[TaskRecord]:
        """Start these tasks, yielding each one's record once it runs; start no more once `stop`
        is set. A backend that starts many at once (one script per host, hosts in parallel)
        overrides it, and yields every record of what it started before it raises BackendError."""
        for plan in plans:
            if stop.is_set():
                return
            yield self.start(plan)

    def tend(self, plans: list[TaskPlan], per_host: int) -> None:     # noqa: B027 (a hook: no-op by default)
        """Keep `per_host` warm standbys on each host of these tasks (launch/backends/standby.py):
        spawn the missing, kill the dead, frozen and stale (0: kill them all). Called about each
        second from the leases' thread once the run trains; a backend that keeps none ignores it."""

    def preload(self, plans: list[TaskPlan]) -> None:     # noqa: B027 (a hook: no-op by default)
        """Before these tasks first start: import TensorFlow once per host, so that their start
        forks them from that import (a start-up zygote) instead of each importing it; `unload`
        ends that once they are started. A backend that cannot ignores it: its tasks start cold."""

    def unload(self) -> None:     # noqa: B027 (a hook: no-op by default)
        """End what `preload` made (the tasks it was for are started)."""

    def standby_views(self) -> list[tuple[str, int, str]]:
        """(host, pid, state) of each standby it keeps, for the state file ('ready', 'starting')."""
        return []

    def renew(self, plans: list[TaskPlan], text: str | None = None) -> None:     # noqa: B027 (a hook: no-op by default)
        """Touch the lease file of these tasks (LEASE_ENV in their environment): a task
        whose lease goes stale stops itself, so none outlives a launcher that is gone. With
        `text`, the file holds it (the live workers, cluster/runtime/membership.py); a change is written
        at once, whatever the backend's pace of renewals."""

    @abc.abstractmethod
    def status(self, record: TaskRecord) -> Observation:
        """One observation of the task; never raises for a host it cannot ask (UNKNOWN)."""

    def status_many(self, records: Sequence[TaskRecord]) -> dict[str, Observation]:
        """One observation of each of these tasks, by name (a supervisor's round, a start-up's
        poll): an end is seen at once, while a running task's `stopped` may be up to a second
        old. A backend that can look at many at once (one scan for the ended, one snapshot per
        host) overrides it."""
        return {r.name: self.status(r) for r in records}

    def probe(self, record: TaskRecord, timeout: float, handshake: bool = True,
              channel_ready: grpc.Future | None = None) -> bool:
        """Whether the task's server can be reached: with `handshake`, its gRPC server answers
        within `timeout` (a stopped process still accepts TCP connections in the kernel, but
        never answers); without, something accepts TCP connections on its port. `channel_ready`,
        the launcher's own gRPC channel-ready future for the task's address, answers at once
        where the launcher can reach the task; a backend whose tasks it cannot reach (a private
        network namespace) probes in its own way."""
        if channel_ready is not None:
            return channel_ready.done()
        host = record.address or record.host
        return grpc_answers(host, record.port, timeout) if handshake else tcp_listening(host, record.port, timeout)

    def send_signal(self, records: list[TaskRecord], signum: int) -> dict[str, str | None]:
        """Send `signum` to each task's own process (not its group, not a wrapper): task -> None
        where it was sent, else why not ('has ended', or the backend's words). A backend that
        cannot reach its tasks' processes says so for each."""
        return {r.name: f'cannot be signalled through the {self.name} backend' for r in records}

    def locate(self, record: TaskRecord) -> dict:
        """Where a started task is, for the event log: its pid (a compose task: its container)."""
        return {'pid': record.pid or None}

    def release(self, plans: list[TaskPlan]) -> None:     # noqa: B027 (a hook: no-op by default)
        """Remove what the backend put in place for these tasks besides their processes (a network
        namespace), once they are stopped: `launch down` after a launcher that was killed."""

    @abc.abstractmethod
    def stop(self, records: list[TaskRecord], grace: float = STOP_GRACE_SECS) -> None:
        """SIGTERM every task's process group, wait up to `grace` seconds in all, then SIGKILL;
        also the group of a task that has ended while processes it started still run."""

    @abc.abstractmethod
    def log_record(self, plan: TaskPlan) -> TaskRecord:
        """A record that says where the plan's task logs, for reading the log of a task this
        launcher did not start (`launch logs` after the run)."""

    @abc.abstractmethod
    def read_log(self, record: TaskRecord, follow: bool = False,
                 stop: threading.Event | None = None, offset: int = 0) -> Iterator[str]:
        """The lines of a task's log from byte `offset`; with follow, keep yielding new lines
        until `stop` is set and the file has no more."""

    def log_tail(self, record: TaskRecord, offset: int = 0) -> LogTail:
        """The task's log from byte `offset`, read a little at each poll (launch/backends/tail.py):
        by default read_log(follow=True) in a thread of its own; a backend that can read a log
        without a thread or an open file (the local one: a file) overrides it."""
        return ThreadTail(lambda stop: self.read_log(record, follow=True, stop=stop, offset=offset), record.name)

    def lines(self, record: TaskRecord, follow: bool = False,
              stop: threading.Event | None = None, offset: int = 0) -> Iterator[str]:
        """read_log's lines as the launcher may show or keep them: each value the spec hides
        (cluster/runtime/masking.py) as `***`, wherever it came from (the user's code printed it)."""
        for line in self.read_log(record, follow=follow, stop=stop, offset=offset):
            yield self.masker.text(line)

    @abc.abstractmethod
    def read_file(self, record: TaskRecord, path: str) -> str | None:
        """The text of a small file on the task's host (`path` relative to its working directory),
        or None if it is not there."""

    def disk_full(self, record: TaskRecord) -> str | None:
        """`the disk under PATH is full: No space left on device (ENOSPC)` when the file system
        of the task's log (its train_dir) has no room left, as far as the launcher can see it
        from its own machine; None when it has room, or lies on another host (there the task
        says it in its pulse: cluster/runtime/pulse.py)."""
        return None

    def close(self) -> None:     # noqa: B027 (a hook: no-op by default)
        """Release connections, and kill the standbys it keeps."""


def local_disk_full(record: TaskRecord) -> str | None:
    """Backend.disk_full for a task whose log is a file on the launcher's machine: the train_dir
    its log lies in (`<train_dir>/logs/attempt-N/`) is named, as the user knows it."""
    where = os.path.dirname(record.log)
    if os.path.basename(os.path.dirname(where)) == rundir.LOGS_DIR:
        where = os.path.dirname(os.path.dirname(where))
    cause = rundir.no_room(where)
    return f'the disk under {where} is full: {cause}' if cause else None


def planned_record(plan: TaskPlan, log: str, cwd: str, backend: str) -> TaskRecord:
    """A record of a task not started (pid 0): where it would log."""
    t = plan.task
    return TaskRecord(name=t.name, job=t.job, index=t.index, host=t.host, port=t.port, backend=backend,
                      pid=0, log=log, cwd=cwd, address=plan.address if plan.address != t.host else '')


def grpc_answers(host: str, port: int, timeout: float) -> bool:
    """Whether a gRPC server answers the HTTP/2 handshake at host:port within `timeout`."""
    channel = grpc.insecure_channel(host_port(host, port), options=[('grpc.enable_http_proxy', 0)])
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def link_attempt_log(cwd: str, plan: TaskPlan) -> str:
    """Point the plan's log_path at this attempt's log file (created, never truncated) and return
    that file's path. A log_path that is still a plain file (written before runs had attempts) is
    kept as attempt-0's log, so no earlier output is lost."""
    link = os.path.join(cwd, plan.log_path)
    target = os.path.join(cwd, plan.attempt_log_path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.lexists(link) and not os.path.islink(link):
        legacy = os.path.join(os.path.dirname(link), rundir.attempt_dirname(0), os.path.basename(link))
        os.makedirs(os.path.dirname(legacy), exist_ok=True)
        os.replace(link, legacy)
    temporary = f'{link}.{os.getpid()}.link'
    os.symlink(os.path.relpath(target, os.path.dirname(link)), temporary)
    os.replace(temporary, link)
    return target


def decode_exit(code: int) -> int:
    """A shell (or docker-init) reports a task killed by signal N as 128+N; the launcher's
    convention is -N, as subprocess reports it."""
    return -(code - 128) if 128 < code < 128 + 65 else code


@contextlib.contextmanager
def preloaded(backends: Mapping[str, Backend], plans: list[TaskPlan], wanted: bool) -> Iterator[None]:
    """While these tasks first start: each backend's `preload` for its own (when `wanted`), its
    `unload` once they are started, whatever happened."""
    try:
        for name, backend in backends.items():
            if wanted:
                backend.preload([p for p in plans if p.backend == name])
        yield
    finally:
        for backend in backends.values():
            backend.unload()


def stop_all(records: list[TaskRecord], backends: Mapping[str, Backend], grace: float = STOP_GRACE_SECS) -> None:
    """Stop every record's task, each backend taking all of its own at once (one shared deadline)."""
    by_backend: dict[str, list[TaskRecord]] = {}
    for r in records:
        by_backend.setdefault(r.backend, []).append(r)
    for name, group in by_backend.items():
        backends[name].stop(group, grace=grace)


def status_all(records: Sequence[TaskRecord], backends: Mapping[str, Backend]) -> dict[str, Observation]:
    """Every record's observation by task name, each backend asked once for all of its own
    (Backend.status_many)."""
    by_backend: dict[str, list[TaskRecord]] = {}
    for r in records:
        by_backend.setdefault(r.backend, []).append(r)
    seen: dict[str, Observation] = {}
    for name, group in by_backend.items():
        seen.update(backends[name].status_many(group))
    return seen


def tcp_listening(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections at host:port within `timeout`."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def lease_files(plans: list[TaskPlan], root: str | None = None) -> set[str]:
    """The lease files these tasks watch, relative to `root` (default: each plan's cwd)."""
    return {os.path.join(root or p.cwd, p.env[LEASE_ENV]) for p in plans if LEASE_ENV in p.env}


def touch_leases(plans: list[TaskPlan], root: str | None = None, text: str | None = None) -> None:
    """Renew the lease files of tasks whose files are on this machine; with `text`, make it their
    content (written whole, under a temporary name first, only when it changed)."""
    for path in lease_files(plans, root):
        if text is not None and read_text(path) != text:
            os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
            write_atomically(path, text)
            continue
        try:
            os.utime(path)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
            open(path, 'a').close()


def tail(lines: Iterable[str], n: int = 15) -> list[str]:
    out: list[str] = []
    for line in lines:
        out.append(line)
        if len(out) > n:
            out.pop(0)
    return out
