"""`launch debug`: every task of a running run writes its Python stacks (launch/run/stacks.py), kept
under its train_dir's stacks/attempt-N/; the command says where, and which tasks did not answer."""
from __future__ import annotations

import os

from cluster.runtime import rundir
from cluster.spec import ClusterSpec
from launch.commands.flags import NoFlags
from launch.commands.request import Request, backends_for, plans_of
from launch.errors import UsageError
from launch.planning.plan import state_path
from launch.records.events import typed_events
from launch.run import stacks
from launch.run.preflight import launcher_alive
from launch.run.state import LaunchState


def cmd_debug(spec: ClusterSpec, req: Request[NoFlags]) -> int:
    """Exit 0 once some task wrote its stacks, 1 when none did; a run that is not running: UsageError."""
    state = LaunchState.load(state_path(spec))
    if state is None or not launcher_alive(state) or not state.tasks:
        raise UsageError(f'{spec.path}: no run of it is running (no live launcher in '
                         f'{os.path.abspath(spec.train.train_dir)}): there are no tasks to ask for their stacks')
    with backends_for(spec, req, plans_of(spec, req), state) as backends:
        found = stacks.dump(state.tasks, backends, spec.train.train_dir, current_attempt(spec.train.train_dir))
    print(found.words())
    for line in found.lines():
        print(f'  {line}')
    return 0 if found.written else 1


def current_attempt(train_dir: str) -> int | None:
    """The attempt the run's launcher is at: its newest event's (None: no event yet)."""
    return max((e.attempt for e in typed_events(rundir.events_path(train_dir))), default=None)
