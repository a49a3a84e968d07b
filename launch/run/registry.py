"""The backend registry: every way `launch` can run a cluster, listed, and found by name.

A backend is one class in its own folder (launch/backends/<name>/, a launch/backends/kind.py Kind)
that carries its capabilities, its flags and options, its planning and what runs its tasks. This
module only lists them: the commands, the command line (launch/cli.py) and the pre-flight ask a
backend found here, never compare its name. A new backend is its folder plus one line in BACKENDS.
What `launch` does with them (plans, backends, the strategy of `launch up`) is launch/run/launching.py.
"""
from __future__ import annotations

from collections.abc import Iterable

from launch.backends.compose import Compose
from launch.backends.kind import DELEGATED, SUPERVISED, Kind, Mode, Options
from launch.backends.local import Local
from launch.backends.ray import Ray
from launch.backends.slurm import Slurm
from launch.backends.ssh import SSH

__all__ = ['BACKENDS', 'DEFAULT', 'DELEGATED', 'KINDS', 'SUPERVISED', 'Kind', 'Mode', 'Options', 'kind', 'names',
           'remembered']

BACKENDS: tuple[Kind, ...] = (
    Local(),
    SSH(),
    Compose(),
    Slurm(),
    Ray(),
)
KINDS: dict[str, Kind] = {k.name: k for k in BACKENDS}
DEFAULT = Local.name    # with no --backend: local processes, or SSH for hosts that are not this machine


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def kind(name: str | None) -> Kind:
    return KINDS[name or DEFAULT]


def remembered(names_recorded: Iterable[object]) -> str | None:
    """The backend a state file's tasks (or a run's events, as written) name when `status`, `down`
    and `logs` need no --backend."""
    return next((n for n in names_recorded if isinstance(n, str) and n in KINDS and KINDS[n].remembered), None)
