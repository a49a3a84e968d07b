"""Where each task of a run goes on a Ray cluster, and the ports it gets there: the actors are
created first (pinned to the node its host names, on any node with its host's labels, or in one
bundle each of the run's placement group), then each picks a free port on its node, and only then
is the cluster written: the spec the tasks read and their TF_CONFIG name the nodes and ports the
tasks really have.

Ray is passed in (the module the connection made), never imported here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cluster.spec import ClusterSpec, TaskSpec
from cluster.runtime.rundir import PRIVATE, write_atomically
from launch.backends.base import BackendError, HostCheck
from launch.backends.ray.connect import NAMESPACE
from launch.backends.ray.nodes import Ask, How, HostPlace, NodeFacts, asks
from launch.planning.plan import TaskPlan

FACTS_TIMEOUT = 60.0        # an actor's process starting on a busy node: seconds, not minutes


@dataclass(frozen=True)
class Where:
    """How one task's actor is scheduled: on a node (`node_id`), on any node with the labels of
    `selector` (pairs, so that a Where stays hashable), or in a bundle of the group."""
    node_id: str = ''
    bundle: int = -1
    selector: tuple[tuple[str, str], ...] = ()


def options(ray: Any, run_id: str, task: TaskSpec, ask: Ask, where: Where, group: Any,
            placed_on: str = '') -> dict[str, Any]:
    """The actor's options: named after the run and task in tfcluster's namespace, owned by this
    driver (it dies with it), never restarted by Ray (the launcher's policy decides), threaded
    (wait_exit blocks one thread while the others answer), and scheduled as `where` says. A task
    placed by labels whose actor is made again (`placed_on`: the node it was placed on) goes back
    to that node: its address and port are in every task's TF_CONFIG."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
    own = {'name': actor_name(run_id, task), 'namespace': NAMESPACE, 'lifetime': None, 'max_restarts': 0,
           'max_task_retries': 0, 'max_concurrency': 8, 'num_cpus': ask.cpus, 'num_gpus': ask.gpus}
    node_id = where.node_id or (placed_on if where.selector else '')
    if node_id:
        return {**own, 'scheduling_strategy': NodeAffinitySchedulingStrategy(node_id, soft=False)}
    if where.selector:
        return {**own, 'label_selector': dict(where.selector)}    # Ray picks among the nodes that match
    return {**own, 'scheduling_strategy': PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=where.bundle, placement_group_capture_child_tasks=False)}


def actor_name(run_id: str, task: TaskSpec) -> str:
    return f'{run_id}/{task.job}-{task.index}'


def wheres(spec: ClusterSpec, places: Mapping[str, HostPlace]) -> tuple[dict[str, Where], list[dict[str, float]]]:
    """Each task's Where, and the bundles of the placement group the tasks on loopback hosts share
    (one per task, its CPUs and GPUs; [] when every task is pinned or placed by labels)."""
    out: dict[str, Where] = {}
    bundles: list[dict[str, float]] = []
    for task in spec.tasks:
        place = places[task.host]
        if place.how is How.NODE:
            out[task.name] = Where(node_id=place.nodes[0].node_id)
            continue
        if place.how is How.LABELS:
            out[task.name] = Where(selector=tuple(place.selector.items()))
            continue
        ask = asks(spec, task)
        bundle = {'CPU': float(ask.cpus)}
        if ask.gpus:
            bundle['GPU'] = float(ask.gpus)
        out[task.name] = Where(bundle=len(bundles))
        bundles.append(bundle)
    return out, bundles


def group(ray: Any, run_id: str, bundles: list[dict[str, float]], timeout: float, nodes: Sequence[NodeFacts]) -> Any:
    """The run's placement group (SPREAD: its tasks over as many nodes as fit), ready, or
    BackendError saying what it asked and what the cluster has."""
    if not bundles:
        return None
    from ray.util import placement_group, remove_placement_group
    pg = placement_group(bundles, strategy='SPREAD', name=f'tfcluster/{run_id}')
    if not pg.wait(timeout_seconds=timeout):
        remove_placement_group(pg)
        cpus = sum(b.get('CPU', 0) for b in bundles)
        gpus = sum(b.get('GPU', 0) for b in bundles)
        has = ', '.join(f'{n.address}: {n.cpus:g} CPU, {n.gpus:g} GPU' for n in nodes)
        raise BackendError(f'the Ray cluster could not place {len(bundles)} task(s) asking {cpus:g} CPU and '
                           f'{gpus:g} GPU in {timeout:g}s (other work holds its resources?); its nodes: {has}')
    return pg


def ports(ray: Any, spec: ClusterSpec, actors: Mapping[str, Any], facts: Mapping[str, dict]) -> dict[str, int]:
    """Each task's port, chosen free by its actor on its node: the spec's port where it is free,
    else another; tasks of one machine (nodes 127.0.0.1 and .2 of one host share its ports) never
    get the same one. Asked one task at a time per machine, all machines at once."""
    by_machine: dict[str, list[TaskSpec]] = {}
    for task in spec.tasks:
        by_machine.setdefault(facts[task.name]['machine'], []).append(task)
    chosen: dict[str, int] = {}
    rounds = max(len(tasks) for tasks in by_machine.values())
    for i in range(rounds):
        asked = {tasks[i].name: actors[tasks[i].name].reserve_port.remote(
            tasks[i].port, [chosen[t.name] for t in tasks[:i]]) for tasks in by_machine.values() if i < len(tasks)}
        chosen.update(zip(asked, ray.get(list(asked.values()), timeout=FACTS_TIMEOUT)))
    return chosen


def placed_spec(spec: ClusterSpec, facts: Mapping[str, dict], chosen: Mapping[str, int]) -> ClusterSpec:
    """The spec as placed: every task at its node's address and the port it was given."""
    tasks = tuple(dataclasses.replace(t, host=facts[t.name]['address'], port=chosen[t.name]) for t in spec.tasks)
    return dataclasses.replace(spec, tasks=tasks)


def facts(get: Callable[[list[Any]], list[Any]], actors: Sequence[Any], names: Sequence[str],
          token_path: str) -> dict[str, dict]:
    """Task -> what its actor finds where it runs (TaskActor.facts), `shared` among them: whether
    the actor reads back a token written at `token_path` in the launcher's train_dir (the node
    sees that folder at the same path). `get` waits for the actors' answers."""
    token = secrets.token_hex(8)
    os.makedirs(os.path.dirname(token_path), exist_ok=True)
    write_atomically(token_path, token, PRIVATE)
    try:
        got = get([actor.facts.remote(token_path, token) for actor in actors])
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(token_path)
    return dict(zip(names, got))


def node_checks(plans: Sequence[TaskPlan], facts: Mapping[str, dict]) -> list[HostCheck]:
    """One verdict per node these tasks were placed on: its Python, and TensorFlow found there."""
    by_node: dict[str, list[str]] = {}
    for p in plans:
        if p.name in facts:
            by_node.setdefault(facts[p.name]['address'], []).append(p.name)
    out = []
    for node, names in sorted(by_node.items()):
        first = facts[names[0]]
        ok = bool(first['tensorflow'])
        detail = (f'{len(names)} task(s), python {first["python"]}' if ok else
                  f'python {first["python"]} on the Ray node cannot import tensorflow')
        out.append(HostCheck(f'ray node {node}', ok, detail))
    return out
