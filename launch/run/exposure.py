"""Which task ports the network can reach: the warning `launch check` and `launch up` print.

TensorFlow's gRPC servers listen on every interface whatever host the spec names, and have no
authentication: a local task's port is reachable at every address this machine has besides
127.0.0.0/8 and ::1, and an SSH host's task ports at that host's addresses. Tasks in a private
network namespace (isolation: netns) and compose tasks (an internal network) are out of reach.
"""
from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterable

from launch.run import registry
from launch.planning.plan import TaskPlan

SECURITY = 'docs/security.md'


def is_loopback(host: str) -> bool:
    if host == 'localhost':
        return True
    try:
        return ipaddress.ip_address(host.split('%')[0]).is_loopback
    except ValueError:
        return False


def parse_ip_addr(text: str) -> list[str]:
    """The non-loopback addresses in the output of `ip -o addr show up`, in order, once each.
    A line: '4: eth0    inet 192.0.2.2/24 brd ... scope global eth0\\ ...'."""
    out: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ('inet', 'inet6'):
            continue
        address = fields[3].split('/')[0]
        if not is_loopback(address) and address not in out:
            out.append(address)
    return out


def machine_addresses() -> list[str] | None:
    """This machine's non-loopback addresses on interfaces that are up; None if they cannot be
    listed (no iproute2)."""
    try:
        done = subprocess.run(['ip', '-o', 'addr', 'show', 'up'], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_ip_addr(done.stdout) if done.returncode == 0 else None


def _ports(plans: Iterable[TaskPlan]) -> str:
    return ', '.join(str(p) for p in sorted({p.task.port for p in plans}))


def warning(plans: Iterable[TaskPlan], addresses: list[str] | None) -> str | None:
    """The one-line warning for these tasks, given this machine's non-loopback addresses (None:
    unknown), or None when no task port is reachable from another machine. Pure."""
    here: list[TaskPlan] = []
    remote: dict[str, list[TaskPlan]] = {}
    for p in plans:
        k = registry.kind(p.backend)
        if k.isolates_ports or p.netns:
            continue
        if k.on_this_machine or is_loopback(p.task.host):    # an SSH "host" at 127.0.0.2 is this machine
            here.append(p)
        else:
            remote.setdefault(p.task.host, []).append(p)
    reachable = []
    if here and addresses is None:
        reachable.append(f'port(s) {_ports(here)} of this machine at every address it has besides loopback')
    elif here and addresses:
        reachable.append(f'port(s) {_ports(here)} of this machine at {", ".join(addresses)}')
    for host, tasks in remote.items():
        reachable.append(f'port(s) {_ports(tasks)} at {host}')
    if not reachable:
        return None
    local = any(registry.kind(p.backend).on_this_machine for p in here)    # only those can be isolated here
    fix = ('run a local cluster with `isolation: netns` (as root), or ' if local else '') + \
        'keep the hosts on a private network or behind a firewall that admits only the cluster\'s hosts'
    return ("TensorFlow's gRPC servers have no authentication and listen on every interface: "
            f'{"; ".join(reachable)} can be reached from the network, and anyone who can reach them can run '
            f'code in the tasks; {fix} ({SECURITY})')


def short_warning(plans: Iterable[TaskPlan], addresses: list[str] | None) -> str | None:
    """What `launch up` says, once per run, in one short line: which task ports the network can
    reach; `launch check` gives the full `warning` (every address, and what to do)."""
    plans = list(plans)
    if warning(plans, addresses) is None:
        return None
    ports = sorted({p.task.port for p in plans if not (registry.kind(p.backend).isolates_ports or p.netns)})
    shown = ', '.join(map(str, ports[:6])) + (f' and {len(ports) - 6} more' if len(ports) > 6 else '')
    return f'task ports {shown} are reachable from the network; see {SECURITY} (`launch check` lists where)'
