"""The files of a Ray run's tasks: where they lie, and how the launcher reads and renews them.

A node that sees the launcher's train_dir (a token the launcher writes there is read back by its
actor at placement) runs its tasks in the launcher's folder: their logs, channels, checkpoints and
leases are files here, read as the local backend reads them (a LocalBackend does it). A node that
does not ("private") runs them as SSH runs a host's: in a workdir of its own (the host's `workdir`,
else DEFAULT_REMOTE_WORKDIR in the node's home), where its actor writes the spec file the tasks
read and makes their log folders. Then:

- each task's log is mirrored as it is written: a RayTail keeps one outstanding `read` of the
  node's file per task (no thread of its own) and writes each chunk at the same offset of the same
  path in the launcher's train_dir, so `launch logs`, the report and the supervisor's log
  following see it here; a closed tail reads on to the end;
- `read_file` (the channel, stacks, the pulse, a checkpoint index, a worker's closing figures),
  `read_log` and `disk_full` ask the task's actor while this launcher holds it, else read here;
- the lease files are renewed on the node, by one actor per node and workdir, at SSH's pace and
  without waiting for the answer: a launcher that stops renewing (frozen) still ends its tasks;
- checkpoints stay on the chief's node: read there while the run lasts (resume, the closing
  figures), not here (`launch eval`, a new `launch up` that is already done).

TFCLUSTER_RAY_FS=private (FS_ENV) treats every node as private, so one machine tests that path.
Ray is passed in (a callable: the backend's connection), never imported here.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from cluster.spec import ClusterSpec
from launch.backends.base import LEASE_ENV, TaskRecord, link_attempt_log, touch_leases
from launch.backends.local.backend import LocalBackend
from launch.backends.ray.childenv import child_cwd
from launch.backends.tail import FileTail, Lines, LogTail
from launch.planning.plan import TaskPlan

log = logging.getLogger(__name__)

FS_ENV = 'TFCLUSTER_RAY_FS'     # 'private': every node counts as not sharing the train_dir (tests, debugging)
READ_SIZE = 1 << 20             # bytes one read of a node's log asks for
READ_SECS = 0.25                # a tail that found nothing new asks again this much later
CALL_TIMEOUT = 10.0             # a read of a node's file
RENEW_SECS = 5.0                # how often a node's lease files are renewed (SSH's pace)


def forced_private(environ: Mapping[str, str]) -> bool:
    return environ.get(FS_ENV, '').strip().lower() == 'private'


def node_path(path: str, cwd: str, node_cwd: str, train_dir: str, node_dir: str) -> str:
    """The node's path of a file the launcher names `path` (relative to its `cwd`, or absolute):
    a file of the launcher's `train_dir` is the same file of the node's `node_dir` (both
    absolute); any other relative path is relative to the node's cwd; any other absolute path is
    that path there."""
    here = os.path.normpath(os.path.join(cwd, path))
    if here == train_dir or here.startswith(train_dir.rstrip('/') + '/'):
        return node_dir + here[len(train_dir):]
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(node_cwd, path))


class Chunks(Protocol):
    """How a RayTail reads its node's file: `ask` sends a read and returns its ticket, `ready`
    says whether it came back, `take` gives its bytes (None: no file yet), or raises."""

    def ask(self, offset: int, size: int) -> Any: ...

    def ready(self, ticket: Any) -> bool: ...

    def take(self, ticket: Any) -> bytes | None: ...


class RayTail(LogTail):
    """A log on a node, mirrored to `mirror` here from byte `offset` (see the module's
    docstring). One read is outstanding at most; a poll never waits for it. Closed, it reads on
    until a read asked after the close comes back empty (or fails), then ends."""

    def __init__(self, chunks: Chunks, mirror: str, offset: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.chunks, self.mirror, self.offset, self._clock = chunks, mirror, offset, clock
        self._lines = Lines()
        self._ticket: Any = None
        self._asked_closing = False     # the outstanding read was asked after close()
        self._asked_at = -READ_SECS
        self._closing = self._ended = False

    def poll(self) -> list[str]:
        if self._ended:
            return []
        data, done = self._answer()
        if data:
            self._write(data)
            self.offset += len(data)
        if self._ticket is None and not done and (data or self._closing or
                                                  self._clock() - self._asked_at >= READ_SECS):
            done = not self._ask() and self._closing
        lines = self._lines.feed(data, final=done)
        self._ended = done
        return lines

    def _answer(self) -> tuple[bytes, bool]:
        """The bytes the outstanding read came back with (b'' while it has not), and whether the
        log is read to its end: an empty or failed read asked after close()."""
        ticket = self._ticket
        if ticket is None or not self.chunks.ready(ticket):
            return b'', False
        self._ticket = None
        try:
            data = self.chunks.take(ticket) or b''
        except Exception as e:      # noqa: BLE001 (Ray's many errors: the node or actor gone)
            log.debug('cannot read the log mirrored to %s: %s', self.mirror, e)
            return b'', self._asked_closing
        return data, self._asked_closing and not data

    def _ask(self) -> bool:
        """Send the next read; False when it cannot be sent (the actor gone: asked again later)."""
        self._asked_closing = self._closing
        self._asked_at = self._clock()
        try:
            self._ticket = self.chunks.ask(self.offset, READ_SIZE)
        except Exception as e:      # noqa: BLE001 (Ray's many errors; no actor left to ask)
            log.debug('cannot ask for the log mirrored to %s: %s', self.mirror, e)
            return False
        return True

    def _write(self, data: bytes) -> None:
        """At the node's offset: the mirror is the node's file byte for byte (a chunk read twice
        writes the same bytes again)."""
        try:
            fd = os.open(self.mirror, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, data, self.offset)
            finally:
                os.close(fd)
        except OSError as e:
            log.warning('cannot write the mirror of a log to %s: %s', self.mirror, e)

    def close(self) -> None:
        self._closing = True

    @property
    def ended(self) -> bool:
        return self._ended


@dataclasses.dataclass
class _ActorChunks:
    """Chunks read by the task's actor (the one it has now: a restart may have made another)."""
    ray: Any
    actors: Mapping[str, Any]
    name: str
    path: str

    def ask(self, offset: int, size: int) -> Any:
        return self.actors[self.name].read.remote(self.path, offset, size)

    def ready(self, ticket: Any) -> bool:
        return bool(self.ray.wait([ticket], timeout=0)[0])

    def take(self, ticket: Any) -> bytes | None:
        return self.ray.get(ticket)


@dataclasses.dataclass(frozen=True)
class NodeDirs:
    """Where a private task's files lie: its node (its id: one lease renewal per node and
    workdir; its address), its cwd there, and the train_dir there and here (both absolute). Kept
    in its record's handle (`private`), so that `launch debug` reads its stacks there too."""
    node_id: str
    address: str
    cwd: str
    node_dir: str
    train_dir: str


def dirs_of(record: TaskRecord) -> NodeDirs | None:
    """The NodeDirs a record's handle keeps (a RayHandle, or a dict read from the state file)."""
    handle = record.handle
    found = handle.get('private') if isinstance(handle, dict) else getattr(handle, 'private', None)
    try:
        return NodeDirs(**found) if found else None
    except TypeError:       # another version's
        return None


class NodeFiles:
    """The file side of RayBackend (see the module's docstring). `actors` is the backend's own
    book of actors (task -> handle), `ray` gives its connection, `find` a record's actor in
    another launcher's run (None, or why not, when it has none)."""

    def __init__(self, spec: ClusterSpec, actors: Mapping[str, Any], ray: Callable[[], Any],
                 find: Callable[[TaskRecord], Any]) -> None:
        self._spec, self._actors, self._ray, self._find = spec, actors, ray, find
        self.local = LocalBackend()
        self.nodes: dict[str, NodeDirs] = {}      # this launcher's private tasks
        self._machines: dict[str, str] = {}
        self._renewals: dict[tuple[str, str], tuple[float, str | None, Any]] = {}
        self._lock = threading.Lock()

    # -- placing and starting --------------------------------------------------------------------
    def place(self, facts: Mapping[str, dict], here: str, environ: Mapping[str, str] = os.environ) -> list[str]:
        """Note where each task's files lie from what its actor found (`here`: this machine's
        key); the addresses of the private nodes. A task placed again is noted afresh. A node of this machine whose workdir puts the
        train_dir at the launcher's own is not private, whatever FS_ENV says (the mirror would be
        the file it copies)."""
        force, cwd = forced_private(environ), os.getcwd()
        spec_dir = self._spec.train.train_dir
        train_dir = os.path.abspath(spec_dir)
        for name, f in facts.items():
            self._machines[name] = f['machine']
            self.nodes.pop(name, None)      # placed again (a new actor, maybe another node): as found now
            if f['shared'] and not force:
                continue
            job, _, index = name.partition(':')
            host = self._spec.hosts.get(self._spec.task(job, int(index)).host)
            node_cwd = child_cwd(False, cwd, host.workdir if host else None, f['home'])
            node_dir = os.path.normpath(os.path.join(node_cwd, spec_dir))
            if f['machine'] != here or node_dir != train_dir:
                self.nodes[name] = NodeDirs(f['node_id'], f['address'], node_cwd, node_dir, train_dir)
        return sorted({n.address for n in self.nodes.values()})

    def _on_node(self, plans: list[TaskPlan]) -> dict[tuple[str, str], list[TaskPlan]]:
        """The private tasks' plans, with their node's cwd, by node and cwd."""
        out: dict[tuple[str, str], list[TaskPlan]] = {}
        for p in plans:
            node = self.nodes.get(p.name)
            if node is not None:
                out.setdefault((node.node_id, node.cwd), []).append(dataclasses.replace(p, cwd=node.cwd))
        return out

    def prepare(self, plans: list[TaskPlan], spec_yaml: str) -> None:
        """The spec and the log folders here (for private tasks, the mirror's), and on each
        private node, by one of its actors."""
        self.local.prepare(plans, spec_yaml)
        groups = self._on_node(plans)
        if groups:
            self._ray().get([self._actors[group[0].name].prepare.remote(group, spec_yaml)
                             for group in groups.values()], timeout=CALL_TIMEOUT)

    def to_start(self, plan: TaskPlan) -> TaskPlan:
        """The plan as its node starts it: a private task in its node's cwd, its --spec made
        absolute there (so `ps` on the node shows which run a task is of, as over SSH)."""
        node = self.nodes.get(plan.name)
        if node is None:
            return plan
        argv = list(plan.argv)
        if '--spec' in argv[:-1]:
            i = argv.index('--spec') + 1
            argv[i] = os.path.join(node.cwd, argv[i])
        return dataclasses.replace(plan, cwd=node.cwd, argv=tuple(argv))

    def started(self, record: TaskRecord, plan: TaskPlan) -> TaskRecord:
        """A private task's record as the launcher keeps it: its log the mirror here (linked as
        this attempt's, as a local start links it), its cwd the launcher's."""
        if plan.name not in self.nodes:
            return record
        mirror = os.path.abspath(link_attempt_log(plan.cwd, plan))
        open(mirror, 'ab').close()
        return dataclasses.replace(record, log=mirror, cwd=os.path.abspath(plan.cwd))

    def private(self, name: str) -> dict:
        """What a record's handle keeps of a private task ({}: a shared one)."""
        node = self.nodes.get(name)
        return dataclasses.asdict(node) if node is not None else {}

    # -- reading ----------------------------------------------------------------------------------
    def _node_of(self, record: TaskRecord, anyones: bool = False) -> tuple[Any, NodeDirs] | None:
        """The actor that reads a private task's files, and where they lie; None for a shared
        task, and for another launcher's unless `anyones` (its files are read here then: the
        mirror of its log)."""
        node = self.nodes.get(record.name)
        if node is not None:
            actor = self._actors.get(record.name)
        elif anyones and (node := dirs_of(record)) is not None:
            actor = self._find(record)
        else:
            return None
        return None if actor is None or isinstance(actor, str) else (actor, node)

    @staticmethod
    def _there(record: TaskRecord, node: NodeDirs, path: str) -> str:
        return node_path(path, record.cwd, node.cwd, node.train_dir, node.node_dir)

    def log_record(self, plan: TaskPlan) -> TaskRecord:
        return dataclasses.replace(self.local.log_record(plan), backend='ray')

    def read_file(self, record: TaskRecord, path: str) -> str | None:
        found = self._node_of(record, anyones=True)
        if found is None:
            return self.local.read_file(record, path)
        actor, node = found
        try:
            return self._ray().get(actor.read_text.remote(self._there(record, node, path)), timeout=CALL_TIMEOUT)
        except Exception as e:      # noqa: BLE001 (Ray's many errors: the actor or node gone)
            log.debug('cannot read %s of %s on its node: %s', path, record.name, e)
            return self.local.read_file(record, path)

    def read_log(self, record: TaskRecord, follow: bool = False, stop: threading.Event | None = None,
                 offset: int = 0) -> Iterator[str]:
        found = self._node_of(record)
        if found is None:
            return self.local.read_log(record, follow, stop, offset)
        return self._node_lines(record, self._there(record, found[1], record.log), stop if follow else None, offset)

    def _node_lines(self, record: TaskRecord, path: str, stop: threading.Event | None, offset: int) -> Iterator[str]:
        """A node file's lines from `offset`, read by its actor; with `stop`, until it is set and
        all is read. An actor that cannot be asked leaves the rest to the file here (the mirror)."""
        pending = b''
        while True:
            try:
                data = self._ray().get(self._actors[record.name].read.remote(path, offset, READ_SIZE),
                                       timeout=CALL_TIMEOUT) or b''
            except Exception as e:      # noqa: BLE001 (Ray's many errors)
                log.debug('cannot read %s on its node: %s', path, e)
                yield from self.local.read_log(record, stop is not None, stop, offset)
                return
            if data:
                offset += len(data)
                *lines, pending = (pending + data).split(b'\n')
                yield from (line.decode('utf-8', 'replace') for line in lines)
            elif stop is None or stop.is_set():
                if pending:
                    yield pending.decode('utf-8', 'replace')
                return
            else:
                stop.wait(READ_SECS)

    def log_tail(self, record: TaskRecord, offset: int, here: str) -> LogTail:
        found = self._node_of(record)
        if found is None:
            return FileTail(record.log, offset, written_here=self._machines.get(record.name) == here)
        path = self._there(record, found[1], record.log)
        return RayTail(_ActorChunks(self._ray(), self._actors, record.name, path), record.log, offset)

    def disk_full(self, record: TaskRecord) -> str | None:
        """A private node's train_dir, asked of its actor (the task's pulse says it too)."""
        found = self._node_of(record)
        if found is None:
            return self.local.disk_full(record)
        actor, node = found
        try:
            cause = self._ray().get(actor.no_room.remote(node.node_dir), timeout=CALL_TIMEOUT)
        except Exception:       # noqa: BLE001 (the node cannot be asked: nothing to say)
            return None
        return f'the disk under {node.node_dir} on {node.address} is full: {cause}' if cause else None

    # -- leases -----------------------------------------------------------------------------------
    def renew(self, plans: list[TaskPlan], text: str | None = None) -> None:
        """Shared tasks' leases here; each private node's by one of its actors, every RENEW_SECS
        or at once when `text` changed, not waited for (one renewal outstanding per node)."""
        touch_leases([p for p in plans if p.name not in self.nodes], text=text)
        with self._lock:
            for key, group in self._on_node([p for p in plans if LEASE_ENV in p.env]).items():
                self._renew_node(key, group, text)

    def _renew_node(self, key: tuple[str, str], plans: list[TaskPlan], text: str | None) -> None:
        at, sent, ref = self._renewals.get(key, (-RENEW_SECS, None, None))
        changed = text is not None and text != sent
        if not changed and (time.monotonic() - at < RENEW_SECS or (ref is not None and not self._done(ref))):
            return
        actor = self._actors.get(plans[0].name)
        if actor is None:
            return
        try:
            ref = actor.renew.remote(plans, text if changed else None)
        except Exception as e:      # noqa: BLE001 (an actor gone: its tasks went with it)
            log.debug('cannot renew the leases on %s: %s', key[0], e)
            return
        self._renewals[key] = (time.monotonic(), text if changed else sent, ref)

    def _done(self, ref: Any) -> bool:
        return bool(self._ray().wait([ref], timeout=0)[0])
