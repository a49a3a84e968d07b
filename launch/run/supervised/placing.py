"""Placing the tasks again as the whole cluster starts again: a backend that places the tasks
itself (Ray: launch/backends/base.py `Backend.place`) may find that one cannot start where it ran
(its node left the cluster) and put it on another node, at another address. Every task must then
know the new cluster (TF1 reads the spec file, PSS its TF_CONFIG), which is why a move happens
only at a start of the whole cluster (policy.py decides one for a ps or chief lost with its host
that its backend can place elsewhere: TaskStatus.movable).

The loop calls `place_again` before each restart of the cluster; `moves` and `carried` are pure.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from cluster.spec import ClusterSpec
from launch.backends.base import Backend
from launch.planning.plan import TaskPlan
from launch.records.event_types import Moved
from launch.run.lifecycle import Lifecycle
from launch.run.supervised.state import SupervisorState


@dataclass(frozen=True)
class Placement:
    """The run's cluster as placed again: the spec the tasks read, its YAML, the tasks' plans, and
    why each task that moved did (task -> one line)."""
    spec: ClusterSpec
    spec_yaml: str
    plans: list[TaskPlan]
    why: dict[str, str]


# Places the run's tasks again (launching.py builds it over the run's backends): None when no
# backend places its tasks itself.
PlaceAgain = Callable[[], 'Placement | None']


class PlacedRun(Protocol):
    """What placing again asks of the loop (loop.py SupervisedRun): the cluster it runs, and its parts."""
    spec: ClusterSpec
    spec_yaml: str
    state: SupervisorState
    backends: Mapping[str, Backend]
    life: Lifecycle

    @property
    def say(self) -> Callable[[str], None]: ...


def moves(before: ClusterSpec, after: ClusterSpec) -> list[tuple[str, str, str]]:
    """(task, address before, address now) for each task whose address changed, in spec order."""
    now = {t.name: t.address for t in after.tasks}
    return [(t.name, t.address, now[t.name]) for t in before.tasks if now.get(t.name, t.address) != t.address]


def carried(old: Sequence[TaskPlan], new: Sequence[TaskPlan]) -> list[TaskPlan]:
    """The plans of the new placement with what the run gave the old ones since it began (the
    attempt, and the environment it added: the run's id, the restart's reason); the new plan's
    own environment wins, since it names the new addresses (TF_CONFIG)."""
    by_name = {p.name: p for p in old}
    out = []
    for plan in new:
        was = by_name.get(plan.name)
        out.append(plan if was is None else
                   dataclasses.replace(plan, attempt=was.attempt, restart=was.restart, env={**was.env, **plan.env}))
    return out


def place_again(run: PlacedRun, again: PlaceAgain) -> None:
    """Ask the backends to place the tasks again; where one moved, say where and why, record a
    `moved` event, and give the run (and every backend's files: the spec the tasks read) the new
    cluster. BackendError (a task that cannot be placed anywhere) ends the run as any start does."""
    placed = again()
    if placed is None:
        return
    moved = moves(run.spec, placed.spec)
    if not moved:
        return
    for name, was, now in moved:
        why = placed.why.get(name, 'it cannot start again where it ran')
        run.say(f'{name} moves from {was} to {now}: {why}')
        run.life.emit(Moved(task=name, before=was, address=now, cause=why))
    run.spec = run.state.spec = placed.spec
    run.spec_yaml = placed.spec_yaml
    run.state.plans = carried(run.state.plans, placed.plans)
    for name, backend in run.backends.items():
        backend.prepare([p for p in run.state.plans if p.backend == name], placed.spec_yaml)
