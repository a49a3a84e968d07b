"""RayBackend: the Backend (launch/backends/base.py) whose tasks run on the nodes of a Ray cluster,
each kept by its own TaskActor (launch/backends/ray/actor.py) that this launcher's driver owns.

- Placement (`place`, before anything starts): the nodes each spec host names, the CPUs and GPUs
  the tasks ask (launch/backends/ray/nodes.py: one line, exit 2, when the cluster cannot hold
  them); one actor per task (placement.py); each picks its port on its node; the spec is written
  with the nodes and ports the tasks have.
- Observing: each start leaves one outstanding `wait_exit` call, so an end is seen when it
  returns (no call per round); a dead actor makes it fail, and its node, asked of the cluster,
  tells a task lost with its node (UNKNOWN: the policy's lost host) from a task whose keeper died
  (ENDED). Every STOPPED_SECS the running tasks' states (stopped, uninterruptible) are asked in one
  batch.
- Files (launch/backends/ray/files.py): a node that shares the launcher's filesystem (a token
  written in the train_dir is read back by its actor at placement) runs its tasks here, with their
  files; any other runs them in a workdir of its own, and their logs are mirrored here as they are
  written.
"""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cluster.spec import ClusterSpec
from launch.backends.base import (ENDED, RUNNING, STOP_GRACE_SECS, UNKNOWN, Backend, BackendError, HostCheck,
                                  Observation, TaskRecord, handle_of)
from launch.backends.ray import connect, nodes, placement
from launch.backends.ray.childenv import child_python, read_machine_key
from launch.backends.ray.files import NodeFiles
from launch.backends.tail import LogTail
from launch.errors import UsageError
from launch.planning.plan import TaskPlan

log = logging.getLogger(__name__)

STOPPED_SECS = 5.0          # how long a running task's stopped/uninterruptible state is trusted
NODES_SECS = 1.0            # how long the cluster's list of alive nodes is trusted
CALL_TIMEOUT = 30.0         # an actor's answer to a short call
TOKEN_FILE = '.tfcluster-ray-fs'


@dataclass
class RayHandle:
    """What a record of a Ray task holds beyond a local one's: its actor, its node, the cluster."""
    actor: str = ''          # the actor's name in the tfcluster namespace
    node_id: str = ''
    node: str = ''           # the node's address
    cluster: str = ''        # the GCS address (`launch status`/`down` from another process join there)
    embedded: bool = False   # the cluster was the launcher's own Ray instance (it ended with it)
    private: dict = field(default_factory=dict)     # a node that does not share the train_dir: files.NodeDirs


class RayBackend(Backend):
    name = 'ray'
    records_channel = True      # a file beside the log (on its node: read by its actor)

    def __init__(self, spec: ClusterSpec, address: str | None, source: str = '') -> None:
        self._spec, self._address, self._source = spec, address, source
        self._placed = spec         # the spec as placed (place): the nodes and ports the tasks have
        self._ray: Any = None
        self._key = f'{os.getpid()}-{secrets.token_hex(3)}'       # names this launcher's actors
        self._actors: dict[str, Any] = {}           # task -> actor handle (kept: an actor dies with its last handle)
        self._wheres: dict[str, placement.Where] = {}
        self._asks: dict[str, nodes.Ask] = {}
        self._facts: dict[str, dict] = {}           # task -> where its actor runs (TaskActor.facts)
        self._made: dict[str, int] = {}             # task -> how many actors it has had
        self._ports: dict[str, int] = {}            # task -> the port it was given on its node
        self._moved: dict[str, str] = {}            # task -> why the last placement moved it
        self._names: dict[str, str] = {}            # task -> its actor's name now
        self._group: Any = None
        self._exits: dict[str, tuple[int, Any]] = {}    # task -> (pid, its outstanding wait_exit)
        self._ended: dict[str, Observation] = {}        # task -> its end, as seen (until its next start)
        self._states: dict[str, Observation] = {}       # task -> its last state asked (stopped or not)
        self._states_at = -STOPPED_SECS
        self._asking: dict[str, Any] = {}               # task -> an outstanding observe
        self._alive_nodes: tuple[frozenset[str], float] = (frozenset(), -NODES_SECS)
        self._here = read_machine_key()
        self._lock = threading.RLock()      # the books below: the supervisor, the stall watchdog's threads, a failover's stop
        self._joining = threading.Lock()
        self._files = NodeFiles(spec, self._actors, lambda: self._ray, self._find)

    # -- the connection and placement ------------------------------------------------------------
    def _connect(self, address: str | None = None, embedded: bool = False) -> Any:
        """Ray, joined to `address` (a record's cluster), else to the run's cluster (placing);
        once, whichever thread asks first (`launch status` asks of every task at once)."""
        with self._joining:
            return self._join(address, embedded)

    def _join(self, address: str | None, embedded: bool) -> Any:
        if self._ray is None:
            if address is not None:
                self._ray = connect.connect(address, 0, 0, token=embedded)
            else:
                if self._address is not None:
                    connect.answers(self._address, self._source)
                cpus = sum(nodes.asks(self._spec, t).cpus for t in self._spec.tasks)
                gpus = 0 if self._address else _gpus_here()
                try:
                    self._ray = connect.connect(self._address, cpus, gpus)
                except Exception as e:      # noqa: BLE001 (Ray raises many kinds, over many lines)
                    raise UsageError(f'cannot join {self.where} ({self._source or "no address: its own"}): '
                                     f'{_first_line(e)}') from None
        return self._ray

    @property
    def where(self) -> str:
        return nodes.cluster_words(self._address)

    def place(self, spec: ClusterSpec, plans: list[TaskPlan], timeout: float) -> ClusterSpec:
        """Place every task (see the module's docstring) and return the spec as placed. What cannot
        be placed is one line (UsageError: exit 2); what was placed is removed by close(). Called
        again as the whole cluster starts again: `_place_again`."""
        if self._facts:
            return self._place_again()
        if self._address is None:       # the run's own instance: a spec it could never hold starts none
            here = _this_machine()
            places = nodes.resolve_hosts(spec, here, self.where, nodes.spec_labels(spec))
            nodes.demand(spec, places, here[:1], self.where)
        ray = self._connect()
        try:
            return self._place(ray, spec, timeout)
        except (BackendError, ray.exceptions.RayError) as e:
            raise UsageError(f'{spec.path}: placing the tasks on {self.where}: {_first_line(e)}') from None

    def _place(self, ray: Any, spec: ClusterSpec, timeout: float) -> ClusterSpec:
        alive = nodes.alive_nodes(ray.nodes())
        places = nodes.resolve_hosts(spec, alive, self.where, nodes.spec_labels(spec))
        nodes.demand(spec, places, alive, self.where)
        self._wheres, bundles = placement.wheres(spec, places)
        self._group = placement.group(ray, self._key, bundles, timeout, alive)
        self._asks = {t.name: nodes.asks(spec, t) for t in spec.tasks}
        for task in spec.tasks:
            self._actors[task.name] = self._new_actor(task.name)
        self._facts = self._facts_of([t.name for t in spec.tasks], "starting the tasks' actors")
        apart = self._files.place(self._facts, self._here)
        if apart:
            log.info('the Ray node(s) %s do not share this train_dir: their tasks run in a workdir there, their '
                     'logs mirrored here', ', '.join(apart))
        self._ports = placement.ports(ray, spec, self._actors, self._facts)
        self._placed = placement.placed_spec(spec, self._facts, self._ports)
        return self._placed

    def _facts_of(self, names: list[str], doing: str) -> dict[str, dict]:
        """Where each of these tasks' actors runs, and whether it sees the train_dir (placement.facts)."""
        token_path = os.path.abspath(os.path.join(self._spec.train.train_dir, f'{TOKEN_FILE}-{self._key}'))
        return placement.facts(lambda refs: self._get(refs, placement.FACTS_TIMEOUT, doing),
                               [self._actors[name] for name in names], names, token_path)

    def _place_again(self) -> ClusterSpec:
        """Every task where it can start again: its actor asked, every one at once, and those that
        do not answer made again (`_remake`, moving those whose node left): the spec as placed now.
        A task pinned to a node that left is BackendError."""
        self._moved = {}
        try:
            for name in self._silent([t.name for t in self._spec.tasks]):
                self._remake(name, move=True)
        except self._ray.exceptions.RayError as e:
            raise BackendError(f'placing the tasks again on {self.where}: {_first_line(e)}') from None
        if self._moved:
            self._placed = placement.placed_spec(self._spec, self._facts, self._ports)
        return self._placed

    def moved(self) -> dict[str, str]:
        return dict(self._moved)

    def _new_actor(self, name: str, moving: bool = False) -> Any:
        """A new actor for the task, named after the run and task (and how many it had before: a
        dead actor's name may still be held a while); made again, where it was unless `moving`."""
        from launch.backends.ray.actor import TaskActor
        ray = self._ray
        task = self._spec.task(*_job_index(name))
        opts = placement.options(ray, self._key, task, self._asks[name], self._wheres[name], self._group,
                                 '' if moving else self._facts.get(name, {}).get('node_id', ''))
        made = self._made.get(name, 0)
        if made:
            opts['name'] = f'{opts["name"]}.{made}'
        self._made[name] = made + 1
        self._names[name] = opts['name']
        return ray.remote(TaskActor).options(**opts).remote()

    def _get(self, refs: list[Any], timeout: float, doing: str) -> list[Any]:
        try:
            return self._ray.get(refs, timeout=timeout)
        except self._ray.exceptions.GetTimeoutError:
            raise BackendError(f'{doing} took over {timeout:g}s on {self.where}') from None
        except self._ray.exceptions.RayError as e:
            raise BackendError(f'{doing}: {_first_line(e)}') from None

    # -- the pre-flight -----------------------------------------------------------------------------
    def check(self, plans: list[TaskPlan], imports: bool = False) -> list[HostCheck]:
        """One verdict per node the tasks were placed on: its Python, and TensorFlow found there."""
        return placement.node_checks(plans, self._facts)

    # -- starting -----------------------------------------------------------------------------------
    def prepare(self, plans: list[TaskPlan], spec_yaml: str) -> None:
        """The spec and the log folders, here and on each node that does not share the train_dir."""
        self._files.prepare(plans, spec_yaml)

    def start(self, plan: TaskPlan) -> TaskRecord:
        ray = self._connect()
        name = plan.name
        actor = self._live_actor(name)
        facts = self._facts[name]
        host = self._spec.hosts.get(self._spec.task(*_job_index(name)).host)
        python = child_python(host.python if host else None, facts['python'])     # else the node's Ray's
        there = self._files.to_start(replace(plan, argv=(python, *plan.argv[1:])))
        record = self._get([actor.start.remote(there)], CALL_TIMEOUT, f'starting {name} on {facts["address"]}')[0]
        record = self._files.started(record, plan)
        record.backend = self.name
        record.handle = RayHandle(actor=self._names[name], node_id=facts['node_id'],
                                  node=facts['address'], cluster=connect.gcs_address(ray),
                                  embedded=self._address is None, private=self._files.private(name))
        with self._lock:
            self._exits[name] = (record.pid, actor.wait_exit.remote(record.pid))
            self._asking.pop(name, None)        # an observe of the start before is not this one's
            self._ended.pop(name, None)
            self._states.pop(name, None)
        return record

    def _live_actor(self, name: str) -> Any:
        """The task's actor, made again (`_remake`) when it does not answer."""
        if name not in self._actors:
            raise BackendError(f'{name} was not placed on {self.where}')
        return self._remake(name) if self._silent([name]) else self._actors[name]

    def _silent(self, names: list[str]) -> list[str]:
        """Those of these tasks whose actor does not answer a ping (dead, its node gone, or hung
        for CALL_TIMEOUT), all asked at once."""
        asked = {self._actors[name].ping.remote(): name for name in names}
        answered, _ = self._ray.wait(list(asked), num_returns=len(asked), timeout=CALL_TIMEOUT)
        errors = self._ray.exceptions
        silent = [asked[ref] for ref in asked if ref not in answered]
        for ref in answered:
            try:
                self._ray.get(ref)
            except (errors.RayActorError, errors.ActorUnavailableError):
                silent.append(asked[ref])
        return silent

    def _remake(self, name: str, move: bool = False) -> Any:
        """A new actor for the task, on the same node (or bundle) where its node lives; where its
        node left, with `move` (the whole cluster starts again) one elsewhere where its host does not
        pin it (Ray moves a dead node's bundles), else BackendError."""
        facts = self._facts[name]
        gone = not self._node_alive(facts['node_id'], fresh=True)
        if gone and self._wheres[name].node_id:
            raise BackendError(f'{name}: its node {facts["address"]} left the Ray cluster, and its host '
                               f'{self._spec.task(*_job_index(name)).host} pins it to that node')
        if gone and not move:
            raise BackendError(f'{name}: its node {facts["address"]} left the Ray cluster; it moves to another '
                               'node only as the whole cluster starts again')
        # The same node, or the same bundle of the group (which holds the dead actor's CPUs and GPUs,
        # on another node once Ray moved the bundles of a node that left).
        self._actors[name] = actor = self._new_actor(name, moving=gone)
        doing = f"starting {name}'s actor again"
        now = self._facts_of([name], doing)[name]
        mine = self._ports[name]
        avoid = [port for task, port in self._ports.items()
                 if task != name and self._facts[task]['machine'] == now['machine']]
        port = self._get([actor.reserve_port.remote(mine, avoid)], placement.FACTS_TIMEOUT, doing)[0]
        if port != mine and not gone:
            raise BackendError(f'{name}: its port {mine} on {now["address"]} is still taken, so it cannot start '
                               'there again at its address')
        self._facts[name] = now
        self._files.place({name: now}, self._here)      # a task moved may now share the train_dir, or not
        if gone:
            self._ports[name] = port
            self._moved[name] = f'its node {facts["address"]} left the Ray cluster'
        return actor

    def renew(self, plans: list[TaskPlan], text: str | None = None) -> None:
        self._files.renew(plans, text)

    # -- observing ----------------------------------------------------------------------------------
    def status(self, record: TaskRecord) -> Observation:
        if record.name in self._exits or record.name in self._ended:
            return self.status_many([record])[record.name]
        return self._status_elsewhere(record)

    def status_many(self, records: Sequence[TaskRecord]) -> dict[str, Observation]:
        ours = [r for r in records if r.name in self._exits or r.name in self._ended]
        out = {r.name: self._status_elsewhere(r) for r in records if r not in ours}
        with self._lock:
            self._take_exits()
            self._ask_states([r.name for r in ours if r.name not in self._ended])
            for r in ours:
                out[r.name] = self._ended.get(r.name) or self._states.get(r.name) or Observation(RUNNING)
        return out

    def _take_exits(self) -> None:
        """The ends the outstanding wait_exit calls came back with since the last look. An actor
        Ray calls unavailable for now (its node not yet known dead) is asked again next round."""
        waiting = {ref: name for name, (_, ref) in self._exits.items() if name not in self._ended}
        if not waiting:
            return
        done, _ = self._ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
        for ref in done:
            name = waiting[ref]
            try:
                self._ended[name] = Observation(ENDED, self._ray.get(ref))
            except self._ray.exceptions.ActorUnavailableError:
                pid = self._exits[name][0]
                self._exits[name] = (pid, self._actors[name].wait_exit.remote(pid))
            except self._ray.exceptions.RayActorError as e:
                self._ended[name] = self._lost_actor(name, e)

    def _lost_actor(self, name: str, error: Exception) -> Observation:
        """A task whose actor died: lost with its node (UNKNOWN, the node named), else ended (the
        actor's death took the task with it: PR_SET_PDEATHSIG)."""
        facts = self._facts[name]
        if not self._node_alive(facts['node_id'], fresh=True):
            return Observation(UNKNOWN, error=f'its node {facts["address"]} left the Ray cluster',
                               movable=not self._wheres[name].node_id)
        log.info('%s: its actor died: %s', name, _first_line(error))
        return Observation(ENDED, None)

    def _ask_states(self, names: list[str]) -> None:
        """Every STOPPED_SECS, one observe call per running task; their answers are taken as they come."""
        for name, ref in list(self._asking.items()):
            done, _ = self._ray.wait([ref], timeout=0)
            if done:
                self._asking.pop(name, None)
                try:
                    seen = self._ray.get(ref)
                    if seen is not None and seen.state == RUNNING:
                        self._states[name] = seen
                except self._ray.exceptions.RayError:
                    pass
        now = time.monotonic()
        if now - self._states_at >= STOPPED_SECS:
            self._states_at = now
            for name in names:
                if name not in self._asking:
                    self._asking[name] = self._actors[name].observe.remote()

    def _node_alive(self, node_id: str, fresh: bool = False) -> bool:
        alive, at = self._alive_nodes
        if fresh or time.monotonic() - at > NODES_SECS:
            alive = frozenset(n['NodeID'] for n in self._ray.nodes() if n.get('Alive'))
            self._alive_nodes = (alive, time.monotonic())
        return node_id in alive

    def _status_elsewhere(self, record: TaskRecord) -> Observation:
        """A task another launcher started (`launch status`, `down`): asked of its actor, found by name."""
        actor = self._find(record)
        if actor is None:
            return Observation(ENDED, None)     # its actor is gone, and the task with it (PR_SET_PDEATHSIG)
        if isinstance(actor, str):
            return Observation(UNKNOWN, error=actor)
        try:
            seen = self._ray.get(actor.observe.remote(), timeout=CALL_TIMEOUT)
        except self._ray.exceptions.RayError as e:
            return Observation(UNKNOWN, error=_first_line(e))
        return seen or Observation(ENDED, None)

    def _find(self, record: TaskRecord) -> Any:
        """The record's actor, None when it is gone, or why the cluster cannot be asked."""
        handle = handle_of(record, RayHandle)
        if record.name in self._actors:
            return self._actors[record.name]
        if self._ray is None:
            try:
                connect.answers(handle.cluster, "the run's record")
            except UsageError as e:
                # A run's own Ray instance ended with its launcher, and the tasks with their actors.
                return None if handle.embedded else f'{e}'
            try:
                self._connect(handle.cluster or self._address, embedded=handle.embedded)
            except Exception as e:      # noqa: BLE001 (Ray raises many kinds for a cluster it cannot join)
                return f'the Ray cluster at {handle.cluster} cannot be asked: {_first_line(e)}'
        try:
            return self._ray.get_actor(handle.actor, namespace=connect.NAMESPACE)
        except ValueError:
            return None

    def locate(self, record: TaskRecord) -> dict:
        handle = handle_of(record, RayHandle)
        return {'pid': record.pid or None, 'node': handle.node, 'actor': handle.actor}

    # -- signals and stopping ---------------------------------------------------------------------
    def send_signal(self, records: list[TaskRecord], signum: int) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for r in records:
            actor = self._find(r)
            if actor is None or isinstance(actor, str):
                out[r.name] = actor or 'has ended'
                continue
            try:
                out[r.name] = self._ray.get(actor.send_signal.remote(signum), timeout=CALL_TIMEOUT)
            except self._ray.exceptions.RayError as e:
                out[r.name] = f'cannot be signalled: {_first_line(e)}'
        return out

    def stop(self, records: list[TaskRecord], grace: float = STOP_GRACE_SECS) -> None:
        """Every task's actor stops its task at once (one shared deadline); a task whose actor or
        node is gone has ended with it."""
        asked = {}
        for r in records:
            actor = self._find(r)
            if actor is not None and not isinstance(actor, str):
                asked[r.name] = actor.stop.remote(grace)
        for name, ref in asked.items():
            try:
                self._ray.get(ref, timeout=grace + CALL_TIMEOUT)
            except self._ray.exceptions.GetTimeoutError:
                raise BackendError(f'{name} did not stop within {grace + CALL_TIMEOUT:g}s') from None
            except self._ray.exceptions.RayError:       # its actor (and so the task) is gone
                with self._lock:
                    self._ended.setdefault(name, Observation(ENDED, None))
        with self._lock:
            for r in records:       # a task lost with its node: gone with its actor
                seen = self._ended.get(r.name)
                if seen is not None and seen.state == UNKNOWN:
                    self._ended[r.name] = Observation(ENDED, None)

    # -- files (files.py) ------------------------------------------------------------------------
    def log_record(self, plan: TaskPlan) -> TaskRecord:
        return self._files.log_record(plan)

    def read_log(self, record: TaskRecord, follow: bool = False, stop: threading.Event | None = None,
                 offset: int = 0) -> Iterator[str]:
        return self._files.read_log(record, follow, stop, offset)

    def log_tail(self, record: TaskRecord, offset: int = 0) -> LogTail:
        return self._files.log_tail(record, offset, self._here)

    def read_file(self, record: TaskRecord, path: str) -> str | None:
        return self._files.read_file(record, path)

    def disk_full(self, record: TaskRecord) -> str | None:
        return self._files.disk_full(record)

    def close(self) -> None:
        """Kill this launcher's actors (their tasks get SIGTERM), remove its placement group, and
        leave the cluster (an instance started for the run stops)."""
        if self._ray is None:
            return
        try:
            for actor in self._actors.values():
                with contextlib.suppress(Exception):     # an actor already gone
                    self._ray.kill(actor, no_restart=True)
            self._actors.clear()
            if self._group is not None:
                from ray.util import remove_placement_group
                with contextlib.suppress(Exception):     # the cluster gone: the group went with it
                    remove_placement_group(self._group)
                self._group = None
        finally:
            self._ray.shutdown()
            self._ray = None


def _job_index(name: str) -> tuple[str, int]:
    job, _, index = name.partition(':')
    return job, int(index)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _this_machine() -> tuple[nodes.NodeFacts, ...]:
    """The one node of a run's own Ray instance, once per address of this machine (a host of the
    spec may name any): as many CPUs as asked (the instance is started with them), its GPUs."""
    import psutil
    gpus = float(_gpus_here())
    found = sorted({a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                    if a.family in (socket.AF_INET, socket.AF_INET6) and '%' not in a.address})
    return tuple(nodes.NodeFacts('this machine', address, cpus=float(1 << 20), gpus=gpus)
                 for address in ['localhost', *found])


def _gpus_here() -> int:
    from cluster.runtime import hostinfo
    return hostinfo.gpu_count()
