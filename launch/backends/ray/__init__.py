"""The Ray backend: a run's tasks on the nodes of a Ray cluster, each a process kept by a Ray actor
that the launcher's driver owns. `Ray` is what the launcher knows of it (launch/backends/kind.py);
the rest of the package is the machinery:

- `connect`: joining the cluster at `--ray-address`/`RAY_ADDRESS`, or starting a Ray instance for
  the run, and the refusals before either;
- `nodes` (pure): which node each spec host is, and whether the cluster can hold the tasks' CPUs
  and GPUs;
- `placement`: the actors' scheduling (pinned to a node, to the nodes with the host's labels, or
  in the run's placement group) and the ports they choose on their nodes;
- `actor`: TaskActor, what runs on a node for one task; `childenv` (pure): what the task starts with;
- `files`: where the tasks' files lie (the shared train_dir, or a node's workdir with each log
  mirrored here) and how they are read and their leases renewed;
- `backend`: RayBackend, the Backend over those actors.

Nothing in this package imports Ray at module level: Ray takes over a second to import, and every
command but a Ray run must work where it is not installed.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

from cluster.runtime.contract import TaskName, task_argv
from cluster.spec import LOOPBACK_NAMES, ClusterSpec, TaskSpec
from launch.backends.base import Backend
from launch.backends.kind import FlagPlace, Kind, Options
from launch.planning.gpus import Slot
from launch.planning.plan import TaskPlan, effective_spec_path, log_path, task_env, task_spec

__all__ = ['Ray', 'RayOptions', 'plan_ray']


def __getattr__(name: str) -> Any:
    if name in ('RayBackend', 'RayHandle'):
        return getattr(importlib.import_module(f'{__name__}.backend'), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


@dataclass(frozen=True)
class RayOptions:
    """The cluster to run on (None: $RAY_ADDRESS, else a Ray instance started for the run)."""
    address: str | None = None


def plan_ray(spec: ClusterSpec, cwd: str) -> tuple[TaskPlan, ...]:
    """Every task as a process on a Ray node, started in `cwd` (the launcher's folder; a node that
    does not share it starts the task in a workdir of its own: files.py) by the host's `python`,
    else the node's own (the backend puts it in at the start). Hosts and ports are the spec's until the backend places the tasks (RayBackend.place)
    and the plans are made again from the spec as placed. GPUs are Ray's to give (no slot)."""
    net = task_spec(spec)
    spec_file = effective_spec_path(spec)
    plans = []
    for task in spec.tasks:
        host = spec.hosts.get(task.host)
        python = (host.python if host else None) or sys.executable
        reach = net.task(task.job, task.index)
        plans.append(TaskPlan(task=task, backend=Ray.name, argv=task_argv(python, spec_file, TaskName(task.job, task.index)),
                              env=task_env(net, reach, Ray.name, Slot(task.host, None)), cwd=cwd,
                              spec_path=spec_file, log_path=log_path(spec, task), host=host, address=reach.host))
    return tuple(plans)


class Ray(Kind):
    """Tasks on a Ray cluster's nodes: a spec host that names a node (its address or name) pins its
    tasks there, one with `labels` puts them on any node that has those labels; `localhost` tasks
    go where the run's placement group spreads them."""
    name = 'ray'
    summary = ('ray: every task on a node of a Ray cluster (--ray-address or RAY_ADDRESS; with neither, a Ray '
               'instance started for the run)')
    logs_here = True            # in the train_dir here: shared, or mirrored from the node (files.py)
    remembered = True
    places = True
    places_by_labels = True
    exclusive = ('address',)
    options_label = 'Ray clusters'
    standby_refusal = 'its actors start the tasks on the nodes; standbys there are not built yet'
    netns_refusal = ('isolation: netns is for local processes; Ray runs the tasks on its nodes, on their own '
                     'network: drop isolation (--set isolation=none)')

    def add_flags(self, parser: argparse.ArgumentParser, place: FlagPlace) -> None:
        if place is not FlagPlace.SPEC:
            return
        parser.add_argument('--ray-address', metavar='ADDRESS', default=None,
                            help='with --backend ray: the Ray cluster (its GCS host:port, or auto); default '
                                 '$RAY_ADDRESS, else a Ray instance started for the run')

    def read_flags(self, args: argparse.Namespace) -> RayOptions:
        return RayOptions(getattr(args, 'ray_address', None))

    def check(self, spec: ClusterSpec, opts: Options) -> str | None:
        from launch.backends.ray import connect
        return connect.refusal(*connect.address_given(opts.of(self.name, RayOptions).address))

    def unsupported(self, command: str, spec: ClusterSpec) -> str | None:
        if command in ('check', 'compose'):
            return (f'launch {command} --backend ray is not supported: Ray places the tasks when the run starts '
                    f'(`launch up {spec.path} --backend ray` checks every node it places a task on)')
        from launch.backends.ray import connect
        if command != 'plan' and not connect.installed():
            return connect.not_installed()
        return None

    def plan(self, spec: ClusterSpec, addresses: dict[str, str], counts: dict[str, int]) -> tuple[TaskPlan, ...]:
        return plan_ray(spec, os.getcwd())

    def where(self, plan: TaskPlan, task: TaskSpec, opts: Options) -> str:
        if plan.host is not None and plan.host.labels:
            labels = ', '.join(f'{key}={value}' for key, value in plan.host.labels)
            return f'ray actor on a node labelled {labels} (port chosen there)'
        if task.host in LOOPBACK_NAMES:
            return 'ray actor in the run\'s placement group (spread over the nodes; port chosen there)'
        return f'ray actor on the node {task.host} (port chosen there)'

    def make(self, spec: ClusterSpec, opts: Options) -> Backend:
        from launch.backends.ray import connect
        from launch.backends.ray.backend import RayBackend
        address, source = connect.address_given(opts.of(self.name, RayOptions).address)
        return RayBackend(spec, address, source)
