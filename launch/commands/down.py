"""`launch down`: stop whatever is left of a spec's cluster, through its launcher while it lives."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping

from cluster.spec import ClusterSpec
from launch.backends.base import Backend, BackendError, stop_all
from launch.commands.flags import NoFlags
from launch.commands.request import Request, backends_for, plans_of
from launch.commands.status import no_state
from launch.errors import CommandFailed
from launch.planning.plan import TaskPlan, state_path
from launch.run import registry
from launch.run.preflight import launcher_alive
from launch.run.state import LaunchState
from launch.system import poll_until

STOP_LAUNCHER_SECS = 45         # the chief's checkpoint (25 s), then the rest (5 + 5 s)


def cmd_down(spec: ClusterSpec, req: Request[NoFlags]) -> int:
    """Stop the run's launcher (it tears its cluster down), then any task still alive and what a
    backend leaves behind; CommandFailed when something will not stop."""
    plans = plans_of(spec, req)
    state = LaunchState.load(state_path(spec))
    if state is None:
        with backends_for(spec, req, []) as backends:
            _release(backends, plans)     # a namespace a launcher killed early may have left
        print(f'nothing to stop: {no_state(spec)}')
        return 0
    if launcher_alive(state):       # the launcher tears its own cluster down on SIGTERM
        _stop_launcher(state)
    with backends_for(spec, req, plans, state) as backends:
        # A backend that leaves resources behind (a compose project's containers and network) is
        # always stopped, whether or not its tasks still run.
        left = [r for r in state.tasks
                if registry.kind(r.backend).leaves_resources or backends[r.backend].status(r).alive]
        stop_all(left, backends)
        still = [r.name for r in state.tasks if backends[r.backend].status(r).alive]
        if not still:
            _release(backends, plans)
    if still:
        raise CommandFailed(f'could not stop {", ".join(still)}')
    if os.path.exists(state_path(spec)):
        os.remove(state_path(spec))
    print(f'stopped {len(left)} task(s) of {spec.path}' if left else f'nothing left running of {spec.path}')
    return 0


def _stop_launcher(state: LaunchState) -> None:
    """SIGTERM to the run's launcher; wait a while for it to end."""
    try:
        os.kill(state.launcher_pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    poll_until(lambda: not launcher_alive(state), time.monotonic() + STOP_LAUNCHER_SECS, poll=0.1)


def _release(backends: Mapping[str, Backend], plans: list[TaskPlan]) -> None:
    """Remove what the run's backends put in place besides its tasks (a network namespace) once
    its tasks are gone; CommandFailed if it cannot be."""
    try:
        for name, backend in backends.items():
            backend.release([p for p in plans if p.backend == name])
    except BackendError as e:
        raise CommandFailed(str(e)) from None
