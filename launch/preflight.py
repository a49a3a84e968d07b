"""What `launch up` checks before anything starts: one clear line and exit code 2 for each
problem (UsageError or SpecError), nothing started and nothing left behind."""
from __future__ import annotations

import os
import sys

from cluster.spec import ClusterSpec
from launch import exposure, netns, registry
from launch.errors import UsageError
from launch.local import process_ident
from launch.plan import TaskPlan, state_path
from launch.state import LaunchState


def launcher_alive(state: LaunchState) -> bool:
    ident = process_ident(state.launcher_pid)
    return ident is not None and ident == state.launcher_ident and state.launcher_pid != os.getpid()


def running_state(spec: ClusterSpec, backends) -> LaunchState | None:
    """The state of a run of this spec whose launcher or tasks still live, else None."""
    state = LaunchState.load(state_path(spec))
    if state is None:
        return None
    if launcher_alive(state) or any(r.backend in backends and backends[r.backend].status(r).alive
                                    for r in state.tasks):
        return state
    return None


def check_isolation(spec: ClusterSpec, command: str, backend: str | None) -> None:
    """`isolation: netns` needs local processes and the right to make network namespaces."""
    if spec.isolation != 'netns' or command not in ('up', 'check', 'plan', 'compose'):
        return
    refusal = registry.kind('compose' if command == 'compose' else backend).netns_refusal
    if refusal:
        raise UsageError(f'{spec.path}: {refusal}')
    why = netns.unavailable() if command in ('up', 'check') else None
    if why:
        raise UsageError(f'{spec.path}: isolation: netns {why}')


def check_user_code(spec: ClusterSpec, plans: list[TaskPlan]) -> None:
    """A `train.program` or `train.command` can be found where local tasks run (remote tasks check
    on their own host as they start), and is not given to a backend that cannot run it."""
    user = 'train.program' if spec.train.program else 'train.command' if spec.train.command else None
    if not user:
        return
    refusal = next((registry.kind(p.backend).user_code_refusal for p in plans
                    if registry.kind(p.backend).user_code_refusal), '')
    if refusal:
        raise spec.error(user, refusal)
    from cluster.task import check_user_code as check
    for plan in plans:
        if registry.kind(plan.backend).on_this_machine:
            check(spec, plan.task, plan.cwd)


def prepare_data(spec: ClusterSpec, plans: list[TaskPlan]) -> None:
    """Check the data set (and write the synthetic one) once, before local workers would race for it."""
    if spec.train.program or spec.train.command:
        return      # the user's code reads its own data
    if any(registry.kind(p.backend).on_this_machine and p.task.job == 'worker' for p in plans):
        from cluster import data
        data.resolve_spec_data(spec)


def preflight(spec: ClusterSpec, plans: list[TaskPlan], backends) -> None:
    """Everything that can be wrong before anything starts; raises UsageError (exit 2)."""
    running = running_state(spec, backends)
    if running is not None:
        raise UsageError(f'{spec.path}: a cluster of this spec is already running (launcher pid '
                         f'{running.launcher_pid}, state in {state_path(spec)}); stop it with `launch down {spec.path}`')
    check_user_code(spec, plans)
    for name, backend in backends.items():
        backend.preflight(spec, [p for p in plans if p.backend == name])


def warn_exposure(plans: list[TaskPlan], short: bool = False) -> None:
    """One warning line when a task port can be reached from another machine (README: Security):
    in full for `launch check`, short for `launch up` (once per run)."""
    text = (exposure.short_warning if short else exposure.warning)(plans, exposure.machine_addresses())
    if text:
        print(f'launch: WARNING: {text}', file=sys.stderr, flush=True)
