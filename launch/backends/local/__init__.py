"""The local backend: every task a process on this machine (in a network namespace of its own
with `isolation: netns`, launch/backends/netns.py). `Local` is what the launcher knows of it
(launch/backends/kind.py); the processes are started, watched and stopped by `backend`."""
from __future__ import annotations

import os
from collections.abc import Mapping

from cluster.spec import ClusterSpec, TaskSpec
from launch.backends.base import Backend
from launch.backends.kind import Kind, Options
from launch.backends.local.backend import INHERITED, LocalBackend, inherited
from launch.backends.ssh import host_plans, ssh_addresses
from launch.planning.plan import TaskPlan

__all__ = ['INHERITED', 'Local', 'LocalBackend', 'inherited']


class Local(Kind):
    """The default: local processes for the spec's local hosts, SSH for the others (it plans as
    `ssh` does, and reads the SSH flags for the hosts that are not this machine)."""
    name = 'local'
    summary = 'local or ssh (the default): chosen per host, local processes for localhost'
    on_this_machine = True
    logs_here = True
    standbys = True             # for its local hosts (launch/backends/local/standby.py)
    zygotes = True              # launch/backends/local/zygote.py

    def addresses(self, spec: ClusterSpec, opts: Options) -> dict[str, str]:
        return ssh_addresses(spec, opts)

    def plan(self, spec: ClusterSpec, addresses: dict[str, str], counts: dict[str, int]) -> tuple[TaskPlan, ...]:
        return host_plans(spec, addresses, counts)

    def where(self, plan: TaskPlan, task: TaskSpec, opts: Options) -> str:
        return 'local process'

    def inherits(self, plan: TaskPlan) -> Mapping[str, str]:
        return inherited(os.environ)

    def make(self, spec: ClusterSpec, opts: Options) -> Backend:
        return LocalBackend()
