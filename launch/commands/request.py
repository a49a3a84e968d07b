"""What every command that acts on a spec or a run starts from: the request as the command line
gave it (typed), the spec or run it names, and the backends its plans need."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Generic, TypeVar

from cluster.runtime import rundir
from cluster.spec import ClusterSpec, load_spec
from launch.planning.plan import TaskPlan, state_path
from launch.records import runs
from launch.records.event_types import RunStarted
from launch.records.events import typed_events
from launch.run import launching, registry
from launch.run.preflight import check_isolation
from launch.run.state import LaunchState

F = TypeVar('F')

# Commands that, with no --backend, use the backend the run's state file remembers.
REMEMBERING = ('status', 'down', 'logs', 'scale', 'debug', 'preempt')


@dataclass(frozen=True)
class Request(Generic[F]):
    """One command as the command line gave it, parsed: what the command bodies take."""
    command: str
    backend: str | None
    options: registry.Options
    flags: F            # the command's own flags (launch/commands/flags.py), read by its body only


def load_target(ref: str, overrides: list[str]) -> tuple[ClusterSpec, str | None]:
    """The spec a command acts on, and the backend its run remembers (None: as the hosts say):
    a spec file as given; or a run (its id, or its train_dir), loaded as it was started (its spec
    file and --set options; relative paths in them as seen from the directory it ran in), with
    its train_dir where it is now. A run whose spec file is gone falls back on the effective spec
    it left in its train_dir (without SSH settings). Raises runs.RunNotFound."""
    if os.path.isfile(ref) or ref.endswith(('.yaml', '.yml')):
        return load_spec(ref, overrides), None
    train_dir = runs.resolve(ref)
    started = [e for e in typed_events(rundir.events_path(train_dir)) if isinstance(e, RunStarted)]
    first = started[-1] if started else RunStarted()
    remembered = registry.remembered([first.backend])
    recorded = first.spec
    if recorded and os.path.isfile(recorded):
        path, given = recorded, (first.overrides or []) + overrides
    else:
        path, given = rundir.spec_path(train_dir), list(overrides)
    given.append(f'train.train_dir={train_dir}')
    spec = load_spec(path, given)
    cwd = first.cwd or ''
    if spec.train.data != 'synthetic' and not os.path.isabs(spec.train.data) and os.path.isdir(cwd):
        spec = load_spec(path, given + [f'train.data={os.path.join(cwd, spec.train.data)}'])
    return spec, remembered


def check_request(spec: ClusterSpec, req: Request[F]) -> Request[F]:
    """Options a backend does not take, commands it cannot serve, isolation it cannot give:
    UsageError. Returns the request with the backend the state file remembers filled in."""
    launching.check_options(spec, req.command, req.backend, req.options)
    check_isolation(spec, req.command, req.backend)
    launching.check_user_code_place(spec, req.command, req.backend)
    launching.check_labels_place(spec, req.command, req.backend)
    if req.backend is None and req.command in REMEMBERING:
        state = LaunchState.load(state_path(spec))
        remembered = registry.remembered({r.backend for r in state.tasks}) if state else None
        if remembered:
            return Request(req.command, remembered, req.options, req.flags)
    return req


def plans_of(spec: ClusterSpec, req: Request[F]) -> list[TaskPlan]:
    """What every task of the spec runs where, for the request's backend."""
    return launching.plans(spec, req.backend, req.options)


def backends_for(spec: ClusterSpec, req: Request[F], plans: list[TaskPlan],
                 state: LaunchState | None = None) -> launching.Backends:
    """The backends the plans need, and those of any task the state file remembers."""
    names = {p.backend for p in plans} | {r.backend for r in (state.tasks if state else [])}
    return launching.make_backends(spec, req.options, names)
