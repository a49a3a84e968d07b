"""What the supervisor says of a run besides its faults: what a coordinator run's evaluator needs
of a train.command, said as the run starts, a training quiet for half the stall limit, and what
to do about tasks still running after the training ended, and when to stop them."""
from __future__ import annotations

import os
import time
from collections.abc import Mapping

from cluster.runtime import rundir
from cluster.spec import ClusterSpec
from launch.backends.base import Backend
from launch.run import policy
from launch.run.lifecycle import Lifecycle
from launch.run.policy import Progress, TaskState, TaskStatus
from launch.run.supervised import faults
from launch.run.supervised.state import SupervisorState


def evaluator_needs(spec: ClusterSpec) -> list[str]:
    """What a coordinator run's evaluator needs of a train.command, said as it starts (no line
    without both): the launcher cannot see what the command saves, and an evaluator that finds
    nothing waits in silence."""
    names = ', '.join(t.name for t in spec.job_tasks('evaluator'))
    if not (names and spec.train.command):
        return []
    return [(f'note: {rundir.evaluator_waits_line(names, spec.train.train_dir)}: train.command must save its '
            f'checkpoints there by that name (tf.train.CheckpointManager(..., checkpoint_name=\'{rundir.CHECKPOINT_PREFIX}\')); '
            'Keras\' BackupAndRestore files are none (docs/pss.md)')]


def finish_hint(spec: ClusterSpec, life: Lifecycle) -> str:
    """What to do about tasks still running --finish-timeout after the training ended: wait longer,
    unless a coordinator run's evaluator has no checkpoint to evaluate (waiting could never help)."""
    if spec.coordinator and life.checkpoint_step() is None:
        return (f'no {rundir.CHECKPOINT_PREFIX}-<step> checkpoint is in {os.path.abspath(spec.train.train_dir)} '
                'for an evaluator to evaluate: docs/pss.md')
    return 'raise --finish-timeout'


def check_tail(spec: ClusterSpec, life: Lifecycle, statuses: list[TaskStatus], deadline: float | None,
               progress: Progress, finish_timeout: float) -> float | None:
    """Once one side (all workers, or all ps tasks) has finished, the other gets --finish-timeout
    to follow; returns the deadline, or -1 once it has passed (what is left is then stopped)."""
    finished = {t.name for t in statuses if t.state is TaskState.SUCCEEDED}
    if spec.coordinator:        # the chief is done: the evaluator's last evaluation is waited for
        workers_done = any(t.job == 'chief' and t.name in finished for t in statuses) \
            or policy.chief_done(progress)
        ps_done = False
    else:
        workers_done = all(t.name in finished for t in statuses if t.job == 'worker')
        ps_done = all(t.name in finished for t in statuses if t.job == 'ps')
    if not (workers_done or ps_done):
        return None
    if deadline is None:
        return time.monotonic() + finish_timeout
    if time.monotonic() > deadline:
        left = ', '.join(t.name for t in statuses if t.name not in finished)
        ended = 'chief' if spec.coordinator else 'workers' if workers_done else 'ps tasks'
        life.console.say(f'warning: {left} still running {finish_timeout:.0f}s after the {ended} finished; '
                         f'stopping them ({finish_hint(spec, life)})')
        return -1
    return deadline


def quiet_warning(state: SupervisorState, backends: Mapping[str, Backend], p: Progress) -> str | None:
    """Half way to the stall limit with no new global step: the line that says so (once per
    step), and what the training waits for, so a long silence is never a mystery."""
    if p.step is None or p.step >= p.total or p.quiet_secs < state.policy.stall_secs / 2 \
            or state.attempt.warned_step == p.step:
        return None
    names = tuple(r.name for r in state.records if backends[r.backend].status(r).alive)
    text, _ = faults.explain_stall(state.records, backends, names)
    return (f'warning: no new global step for {p.quiet_secs:.0f}s (at {p.step}/{p.total}); {text}; '
            f'a stall is declared at {state.policy.stall_secs:g}s (supervise.stall_secs)')
