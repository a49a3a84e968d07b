"""What `launch plan` and `launch up` say of supervise.standby: how many warm standbys the run
would keep and their memory, or that the backend keeps none (said, never refused: the key's
default is not 0); and whether its tasks' first start forks them from one import per host (a
start-up zygote, launch/backends/local/zygote.py). Pure."""
from __future__ import annotations

from collections.abc import Sequence

from cluster.spec import ClusterSpec
from launch.backends.standby import plan_key
from launch.planning.plan import STANDBY_MB_EST, TaskPlan
from launch.run.registry import kind


def ignored(spec: ClusterSpec, name: str | None) -> str | None:
    """`supervise.standby: ignored by the X backend (why)` when the backend chosen keeps none
    and the run would use some (it restarts tasks, and asks for standbys); else None: a run that
    never restarts a task hears nothing of them."""
    k = kind(name)
    if k.standbys or not spec.supervise.standby or spec.supervise.restart != 'on-failure':
        return None
    return f'supervise.standby: ignored by the {k.name} backend' + (f' ({k.standby_refusal})' if k.standby_refusal
                                                                     else '')


def hosts(spec: ClusterSpec, plans: Sequence[TaskPlan]) -> list[str]:
    """The hosts that would keep standbys: those with a task a standby can become, on a backend
    that keeps them, in a run that restarts tasks."""
    if spec.supervise.restart != 'on-failure' or not spec.supervise.standby:
        return []
    return sorted({p.task.host for p in plans if kind(p.backend).standbys and plan_key(p, p.env) is not None})


def summary(spec: ClusterSpec, name: str | None, plans: Sequence[TaskPlan]) -> dict[str, int]:
    """`launch plan --json`'s standby: per_host, hosts and mb_each (0 hosts: none are kept)."""
    return {'per_host': spec.supervise.standby, 'hosts': 0 if ignored(spec, name) else len(hosts(spec, plans)),
            'mb_each': STANDBY_MB_EST}


def line(spec: ClusterSpec, name: str | None, plans: Sequence[TaskPlan]) -> str:
    """`launch plan`'s line about the standbys."""
    why_not = ignored(spec, name)
    if why_not:
        return why_not
    if not spec.supervise.standby:
        return 'standby: none (supervise.standby: 0)'
    if spec.supervise.restart != 'on-failure':
        return 'standby: none (only a restart uses one, and supervise.restart is never)'
    return (f'standby: {spec.supervise.standby} per host x {len(hosts(spec, plans))} host(s), about '
            f'{STANDBY_MB_EST} MB of its own each (supervise.standby; 0 turns it off)')


def zygote_line(spec: ClusterSpec, name: str | None, plans: Sequence[TaskPlan]) -> str | None:
    """`launch plan`'s line about the start-up zygote; None for a backend that has none."""
    mine = [p for p in plans if kind(p.backend or name).zygotes]
    if not mine:
        return None
    if not spec.supervise.standby:
        return 'start-up: each task imports TensorFlow itself (supervise.standby: 0)'
    keyed = sorted({p.task.host for p in mine if plan_key(p, p.env) is not None})
    if not keyed:
        return 'start-up: each task imports TensorFlow itself (none runs cluster.task)'
    return (f'start-up: the tasks of each host fork from one TensorFlow import, {len(keyed)} host(s), about '
            f'{STANDBY_MB_EST} MB each while they start (supervise.standby: 0 starts each cold)')
