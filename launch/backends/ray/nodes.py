"""What the Ray backend knows of a cluster's nodes, and the two checks it makes of a spec against
them before it places anything: which node each host of the spec stands for (resolve_hosts), and
whether the CPUs and GPUs the tasks ask for can be had there at all (demand).

Pure: the nodes come in as NodeFacts (made by the caller from `ray.nodes()`, or from this machine
when the run starts its own Ray instance, so that a bad spec starts nothing), names are resolved by
an injected function, and Ray is never imported. Each refusal is one line naming the spec file, its
line and the key or task at fault (UsageError: exit 2, nothing started).
"""
from __future__ import annotations

import socket
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from cluster.spec import JOBS, LOOPBACK_NAMES, ClusterSpec, TaskSpec
from launch.errors import UsageError
from launch.planning import gpus

NAMED_NODES = 6         # nodes a line lists by name, at most (the rest are counted)


def _empty() -> Mapping[str, str]:
    return types.MappingProxyType({})


@dataclass(frozen=True)
class NodeFacts:
    """One alive node of a Ray cluster, as far as placing tasks goes: its id (what a pinned actor's
    scheduling strategy names), the address its raylet listens on and its name (which a spec's
    host may be), its logical CPUs and GPUs (Ray's totals, not what is free now) and its labels."""
    node_id: str
    address: str
    name: str = ''
    cpus: float = 0.0
    gpus: float = 0.0
    labels: Mapping[str, str] = field(default_factory=_empty, hash=False)

    @classmethod
    def from_ray(cls, entry: Mapping[str, Any]) -> NodeFacts:
        """The facts of one entry of `ray.nodes()` (its keys as Ray 2.60 spells them)."""
        resources = entry.get('Resources') or {}
        return cls(node_id=str(entry['NodeID']), address=str(entry['NodeManagerAddress']),
                   name=str(entry.get('NodeName') or ''), cpus=float(resources.get('CPU', 0.0)),
                   gpus=float(resources.get('GPU', 0.0)),
                   labels=types.MappingProxyType(dict(entry.get('Labels') or {})))

    def matches(self, selector: Mapping[str, str]) -> bool:
        """Whether every label of `selector` is on this node with that value."""
        return all(self.labels.get(key) == value for key, value in selector.items())


def alive_nodes(entries: Iterable[Mapping[str, Any]]) -> tuple[NodeFacts, ...]:
    """The alive nodes of `ray.nodes()` (which lists dead ones too), in address order."""
    return tuple(sorted((NodeFacts.from_ray(e) for e in entries if e.get('Alive')),
                        key=lambda n: (n.address, n.name, n.node_id)))


def cluster_words(address: str | None) -> str:
    """How lines name the cluster: by the address the launcher was given, or, with none, as the
    Ray instance the run starts on this machine."""
    return f'the Ray cluster at {address}' if address else 'the Ray instance this run starts on this machine'


# -- which node each host of the spec is --------------------------------------------------------------

class How(str, Enum):
    """How the tasks of one spec host are placed."""
    NODE = 'node'           # on the one node the host names (an affinity to its id)
    LABELS = 'labels'       # on any node whose labels match the host's `labels` (a label selector)
    GROUP = 'group'         # a loopback host: wherever the run's placement group puts each task


@dataclass(frozen=True)
class HostPlace:
    """Where the tasks of one spec host go: `nodes` holds the node (NODE), the nodes that match
    now (LABELS; Ray picks among them), or nothing (GROUP)."""
    host: str
    how: How
    nodes: tuple[NodeFacts, ...] = ()
    selector: Mapping[str, str] = field(default_factory=_empty, hash=False)


Resolver = Callable[[str], Iterable[str]]


def resolve_name(name: str) -> tuple[str, ...]:
    """The IP addresses a host name resolves to here, none when it does not (the default resolver)."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return ()
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


def task_key(task: TaskSpec) -> str:
    """The spec key a task was given at: cluster.worker[1]."""
    return f'cluster.{task.job}[{task.index}]'


def _line(spec: ClusterSpec, key: str, message: str) -> str:
    """One refusal's line: the spec file, the line `key` is on (where known), the key, the words."""
    return str(spec.error(key, message))


def _named(nodes: Sequence[NodeFacts], say: Callable[[NodeFacts], str] = lambda n: n.address) -> str:
    """Nodes as a line lists them: the first NAMED_NODES, then how many more."""
    shown = ', '.join(say(n) for n in nodes[:NAMED_NODES])
    more = len(nodes) - NAMED_NODES
    return f'{shown} and {more} more' if more > 0 else shown or 'none'


def _selector_words(selector: Mapping[str, str]) -> str:
    return ', '.join(f'{key}={value}' for key, value in selector.items())


def spec_labels(spec: ClusterSpec) -> dict[str, Mapping[str, str]]:
    """Spec host -> the labels its `hosts.NAME.labels` gives, for the hosts that have some."""
    return {name: host.selector for name, host in spec.hosts.items() if host.labels}


def resolve_hosts(spec: ClusterSpec, nodes: Sequence[NodeFacts], where: str,
                  labels: Mapping[str, Mapping[str, str]] | None = None,
                  resolver: Resolver = resolve_name) -> dict[str, HostPlace]:
    """Spec host -> where its tasks go, for every host the cluster names. A host with a selector
    in `labels` (its `hosts.NAME.labels`) may go to any node that has them; otherwise a loopback
    name goes to the placement group, and any other name must be one node: matched by the node's
    address, then its name, then by `hosts.NAME.address` the same two ways, then by the addresses
    `resolver` gives for that address (or the name). `where` names the cluster (cluster_words).
    UsageError, one line naming the first task on the host, for a host that is no node, or is
    several, and for a selector no node matches."""
    labels = labels or {}
    first: dict[str, TaskSpec] = {}
    for task in spec.tasks:
        first.setdefault(task.host, task)
    return {host: _resolve_host(spec, host, task, nodes, where, labels.get(host), resolver)
            for host, task in first.items()}


def _resolve_host(spec: ClusterSpec, host: str, task: TaskSpec, nodes: Sequence[NodeFacts], where: str,
                  selector: Mapping[str, str] | None, resolver: Resolver) -> HostPlace:
    """One host's place (see resolve_hosts)."""
    if selector:
        matching = tuple(n for n in nodes if n.matches(selector))
        if not matching:
            raise UsageError(_line(spec, f'hosts.{host}.labels',
                                   f'no alive node of {where} has {_selector_words(selector)}'))
        return HostPlace(host, How.LABELS, matching, types.MappingProxyType(dict(selector)))
    if host in LOOPBACK_NAMES:
        return HostPlace(host, How.GROUP)
    config = spec.hosts.get(host)
    found = _match(host, config.address if config else None, nodes, resolver)
    if not found:
        raise UsageError(_line(spec, task_key(task), f'host {host} is no node of {where} '
                                                    f'(alive nodes: {_named(nodes)})'))
    if len(found) > 1:
        ids = _named(found, lambda n: f'{n.node_id[:8]} at {n.address}')
        raise UsageError(_line(spec, task_key(task), f'host {host} is {len(found)} nodes of {where} ({ids}): '
                                                    f'name the one meant with hosts.{host}.labels'))
    return HostPlace(host, How.NODE, found)


def _match(host: str, address: str | None, nodes: Sequence[NodeFacts], resolver: Resolver) -> tuple[NodeFacts, ...]:
    """The nodes a host is, tried in resolve_hosts' order; () if none."""
    names = [host] if address in (None, host) else [host, address]
    for name in names:
        found = tuple(n for n in nodes if n.address == name) or tuple(n for n in nodes if n.name and n.name == name)
        if found:
            return found
    resolved = set(resolver(address or host))
    return tuple(n for n in nodes if n.address in resolved)


# -- what the tasks ask for -------------------------------------------------------------------------

def _plural(n: float, word: str) -> str:
    return f'{n:g} {word}{"" if n == 1 else "s"}'


@dataclass(frozen=True)
class Ask:
    """The logical CPUs and GPUs one task asks Ray for."""
    cpus: int
    gpus: int

    def words(self) -> str:
        """'2 CPUs', '1 CPU and 1 GPU'."""
        cpus = _plural(self.cpus, 'CPU')
        return f'{cpus} and {_plural(self.gpus, "GPU")}' if self.gpus else cpus

    def fits(self, node: NodeFacts) -> bool:
        return self.cpus <= node.cpus and self.gpus <= node.gpus


def asks(spec: ClusterSpec, task: TaskSpec) -> Ask:
    """What a task asks for: a worker one GPU per gpu:N tower (`auto` asks none, as on Slurm and
    Kubernetes: Ray gives out GPUs only when asked) and a CPU per tower of `train.devices: N`, else
    one; a ps, chief or evaluator one CPU and no GPU."""
    if task.job != 'worker':
        return Ask(1, 0)
    devices = spec.train.devices
    cpus = devices if isinstance(devices, int) and not isinstance(devices, bool) else 1
    return Ask(cpus, gpus.scheduler_request(spec))


def _has(nodes: Sequence[NodeFacts], total: float, unit: str, of: Callable[[NodeFacts], float]) -> str:
    """'has 1 (127.0.0.2: 1)', or 'has none' where no node has any."""
    having = [n for n in nodes if of(n)]
    if not having:
        return f'has no {unit}'
    return f'has {total:g} ({_named(having, lambda n: f"{n.address}: {of(n):g}")})'


def _job_tasks(job: str, n: int) -> str:
    """'1 ps', '3 workers', '1 chief'."""
    return f'{n} {job}' if job == 'ps' or n == 1 else f'{n} {job}s'


def _task_names(tasks: Sequence[TaskSpec]) -> str:
    shown = ', '.join(t.name for t in tasks[:NAMED_NODES])
    more = len(tasks) - NAMED_NODES
    return f'{shown} and {more} more' if more > 0 else shown


# (the unit in words, the key a shortfall is told at, a task's ask of it, a node's total of it)
RESOURCES: tuple[tuple[str, str, Callable[[Ask], int], Callable[[NodeFacts], float]], ...] = (
    ('CPU', 'cluster', lambda a: a.cpus, lambda n: n.cpus),
    ('GPU', 'train.devices', lambda a: a.gpus, lambda n: n.gpus),
)


def demand(spec: ClusterSpec, places: Mapping[str, HostPlace], nodes: Sequence[NodeFacts], where: str) -> None:
    """UsageError with the first of `shortfalls`, if any: the run could never be placed."""
    lines = shortfalls(spec, places, nodes, where)
    if lines:
        raise UsageError(lines[0])


def shortfalls(spec: ClusterSpec, places: Mapping[str, HostPlace], nodes: Sequence[NodeFacts],
               where: str) -> list[str]:
    """One line per reason the tasks' CPUs and GPUs (asks) cannot be had on `nodes`, whatever
    else runs there: more than the whole cluster has, more than a node has for the tasks pinned
    to it together, or a task larger than any node it may go to (its label's, or any node for
    the placement group's tasks). `places` is resolve_hosts' answer for the same nodes."""
    return _over_cluster(spec, nodes, where) + _over_pinned(spec, places) + _over_any_node(spec, places, nodes, where)


def _over_cluster(spec: ClusterSpec, nodes: Sequence[NodeFacts], where: str) -> list[str]:
    """The whole run against the cluster's totals: '2 workers x 2 GPUs = 4 GPUs, but ... has 1'."""
    lines = []
    for unit, key, of_ask, of_node in RESOURCES:
        terms, asked = [], 0
        for job in JOBS:
            tasks = spec.job_tasks(job)
            each = of_ask(asks(spec, tasks[0])) if tasks else 0
            if each:
                terms.append(f'{_job_tasks(job, len(tasks))} x {_plural(each, unit)}')
                asked += each * len(tasks)
        total = sum(of_node(n) for n in nodes)
        if asked > total:
            lines.append(_line(spec, key, f'{" + ".join(terms)} = {_plural(asked, unit)}, but {where} '
                                          f'{_has(nodes, total, unit, of_node)}'))
    return lines


def _over_pinned(spec: ClusterSpec, places: Mapping[str, HostPlace]) -> list[str]:
    """The tasks pinned to each node, together, against that node."""
    pinned: dict[str, list[TaskSpec]] = {}
    node_of: dict[str, NodeFacts] = {}
    for task in spec.tasks:
        place = places[task.host]
        if place.how is How.NODE:
            node = place.nodes[0]
            pinned.setdefault(node.node_id, []).append(task)
            node_of[node.node_id] = node
    lines = []
    for node_id, tasks in pinned.items():
        node = node_of[node_id]
        for unit, _, of_ask, of_node in RESOURCES:
            asked = sum(of_ask(asks(spec, t)) for t in tasks)
            if asked > of_node(node):
                who = f'{tasks[0].name} asks' if len(tasks) == 1 else f'{_task_names(tasks)} ask'
                together = '' if len(tasks) == 1 else ' together'
                lines.append(_line(spec, task_key(tasks[0]), f'{who} {_plural(asked, unit)} of {node.address}'
                                                             f'{together}, which has {of_node(node):g}'))
    return lines


def _over_any_node(spec: ClusterSpec, places: Mapping[str, HostPlace], nodes: Sequence[NodeFacts],
                   where: str) -> list[str]:
    """Each task not pinned against the largest node it may go to: one line per host and ask."""
    lines = []
    told: set[tuple[str, Ask]] = set()
    for task in spec.tasks:
        place = places[task.host]
        if place.how is How.NODE or not nodes:      # no node at all: _over_cluster has said so
            continue
        ask = asks(spec, task)
        scope = place.host if place.how is How.LABELS else ''
        candidates = place.nodes if place.how is How.LABELS else tuple(nodes)
        if (scope, ask) in told or any(ask.fits(n) for n in candidates):
            continue
        told.add((scope, ask))
        which = f'with {_selector_words(place.selector)} ' if place.how is How.LABELS else ''
        sizes = _named(candidates, lambda n: f'{n.address}: {n.cpus:g} CPU, {n.gpus:g} GPU')
        lines.append(_line(spec, task_key(task), f'{task.name} asks {ask.words()}, but no node of {where} '
                                                 f'{which}has that much ({sizes})'))
    return lines


def strict_spread_refusal(spec: ClusterSpec, places: Mapping[str, HostPlace], nodes: Sequence[NodeFacts],
                          where: str) -> str | None:
    """Why `--ray-strategy STRICT_SPREAD` cannot place the placement group's tasks (each needs a
    node of its own), or None when it can."""
    grouped = sum(1 for t in spec.tasks if places[t.host].how is How.GROUP)
    if grouped <= len(nodes):
        return None
    return (f'{spec.path}: --ray-strategy STRICT_SPREAD puts each of the {grouped} tasks on loopback hosts on a '
            f'node of its own, but {where} has {_plural(len(nodes), "alive node")}: use SPREAD, or name their hosts')
