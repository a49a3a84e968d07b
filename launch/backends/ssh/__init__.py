"""The SSH backend: tasks on remote hosts, over SSH. The `SSH` class here is what the launcher
knows of it (launch/backends/kind.py); the machinery is in three layers: `connections` (one
Fabric connection and SFTP client per host, host keys, SSHError), `scripts` (the remote shell
scripts as pure text, every value quoted), and `backend` (SSHBackend: start, status, stop, logs
and leases over those).

The names other modules import from `launch.backends.ssh` stay here, loaded when first asked for
(Fabric takes a while to import, and `launch --help` needs none of it); the backend's tunables
(SNAPSHOT_TTL and the like) are read from `launch.backends.ssh.backend`, so patch them there.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

from cluster.spec import ClusterSpec, TaskSpec
from launch.backends.base import Backend
from launch.backends.kind import FlagPlace, Kind, Options
from launch.errors import UsageError
from launch.planning.plan import TaskPlan, is_local, plan_cluster

_LAZY = {'RemoteState': 'backend', 'SSHBackend': 'backend', 'SSHHandle': 'backend', 'SSHError': 'connections',
         'host_addresses': 'connections', 'load_ssh_config': 'connections', 'ssh_target': 'connections'}
__all__ = ['SSH', 'SSHOptions', 'RemoteState', 'SSHBackend', 'SSHHandle', 'SSHError', 'host_addresses',
           'load_ssh_config', 'ssh_target']


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f'{__name__}.{_LAZY[name]}'), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


@dataclass(frozen=True)
class SSHOptions:
    """How to reach the hosts (every command on a spec or run takes them)."""
    ssh_config: str | None = None
    accept_any_host_key: bool = False


def ssh_options(opts: Options) -> SSHOptions:
    return opts.of(SSH.name, SSHOptions)


def host_plans(spec: ClusterSpec, addresses: dict[str, str], counts: dict[str, int]) -> tuple[TaskPlan, ...]:
    """Each task a local process or an SSH task, as its host says (launch/planning/plan.py is_local)."""
    return plan_cluster(spec, addresses=addresses, counts=counts)


def ssh_addresses(spec: ClusterSpec, opts: Options) -> dict[str, str]:
    """Where tasks reach each SSH host (hosts.X.address, else the ssh config's HostName)."""
    if all(is_local(spec, t.host) for t in spec.tasks):
        return {}
    from launch.backends.ssh.connections import host_addresses
    return host_addresses(spec, ssh_options(opts).ssh_config)


class SSH(Kind):
    """Tasks on the spec's remote hosts over SSH; it plans as `local` does (each task as its host
    says), so `--backend ssh`, `--backend local` and no --backend are one choice."""
    name = 'ssh'
    standbys = True             # launch/backends/ssh/standby.py

    def add_flags(self, parser: argparse.ArgumentParser, place: FlagPlace) -> None:
        if place is not FlagPlace.SPEC:
            return
        parser.add_argument('--ssh-config', metavar='FILE', default=None,
                            help='OpenSSH client config for remote hosts (default ~/.ssh/config); its '
                                 'UserKnownHostsFile is where host keys are checked')
        parser.add_argument('--insecure-accept-any-host-key', action='store_true',
                            help='DANGEROUS: do not check SSH host keys (accepts unknown and changed keys)')

    def read_flags(self, args: argparse.Namespace) -> SSHOptions:
        config = getattr(args, 'ssh_config', None)
        if config is not None and not os.path.isfile(config):
            raise UsageError(f'--ssh-config {config}: file not found')
        return SSHOptions(config, bool(getattr(args, 'insecure_accept_any_host_key', False)))

    def addresses(self, spec: ClusterSpec, opts: Options) -> dict[str, str]:
        return ssh_addresses(spec, opts)

    def plan(self, spec: ClusterSpec, addresses: dict[str, str], counts: dict[str, int]) -> tuple[TaskPlan, ...]:
        return host_plans(spec, addresses, counts)

    def where(self, plan: TaskPlan, task: TaskSpec, opts: Options) -> str:
        from launch.backends.ssh.connections import ssh_target
        return f'ssh {ssh_target(plan, ssh_options(opts).ssh_config)}'

    def start_text(self, plan: TaskPlan) -> str | None:
        from launch.backends.ssh.backend import start_script_size_text
        return start_script_size_text(plan)

    def make(self, spec: ClusterSpec, opts: Options) -> Backend:
        from launch.backends.ssh.backend import SSHBackend
        own = ssh_options(opts)
        if own.accept_any_host_key:
            print('launch: WARNING: SSH host keys are NOT checked (--insecure-accept-any-host-key): '
                  'anyone on the network path can impersonate these hosts', file=sys.stderr)
        return SSHBackend(spec, ssh_config=own.ssh_config, check_host_keys=not own.accept_any_host_key)
