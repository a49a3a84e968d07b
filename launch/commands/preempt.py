"""`launch preempt RUN TASK`: the preemption notice a cloud's spot watcher would give, by hand. The
task gets a SIGTERM that its launcher did not mark as its own stop (cluster/runtime/notice.py), so
it has supervise.preemption_grace seconds: the chief saves, the task leaves "preempted", and the
launcher starts again what its rules say without counting a fault
(launch/run/supervised/preemption.py)."""
from __future__ import annotations

import os
import signal

from cluster.runtime.contract import TaskName
from cluster.spec import ClusterSpec
from launch.commands.flags import PreemptFlags
from launch.commands.request import Request, backends_for, plans_of
from launch.errors import UsageError
from launch.planning.plan import state_path
from launch.run.preflight import launcher_alive
from launch.run.state import LaunchState


def cmd_preempt(spec: ClusterSpec, req: Request[PreemptFlags]) -> int:
    """Exit 0 once the notice is sent; a run that is not running, a task it does not run, or a
    spec whose preemption_grace is 0 (the SIGTERM would be a fault): UsageError."""
    task = req.flags.task
    try:
        TaskName.parse(task)
    except ValueError:
        raise UsageError(f'launch preempt: {task!r} is not a task (job:index, e.g. ps:0)') from None
    if not spec.supervise.preemption_grace:
        raise UsageError(f'{spec.path}: supervise.preemption_grace is 0, so a SIGTERM from outside the launcher is a '
                         'fault, not a notice: set it to the seconds a task has to save and go')
    state = LaunchState.load(state_path(spec))
    if state is None or not launcher_alive(state) or not state.tasks:
        raise UsageError(f'{spec.path}: no run of it is running (no live launcher in '
                         f'{os.path.abspath(spec.train.train_dir)}): there is no task to preempt')
    record = next((r for r in state.tasks if r.name == task), None)
    if record is None:
        raise UsageError(f'{spec.path}: the run does not run {task}; its tasks: '
                         f'{", ".join(r.name for r in state.tasks)}')
    with backends_for(spec, req, plans_of(spec, req), state) as backends:
        why = backends[record.backend].send_signal([record], signal.SIGTERM)[task]
    if why is not None:
        raise UsageError(f'{spec.path}: {task} {why}')
    print(f'sent a preemption notice to {task} (pid {record.pid} on {record.host}): it has '
          f'{spec.supervise.preemption_grace:g}s to have its checkpoint saved and go; the run\'s events say what follows')
    return 0
