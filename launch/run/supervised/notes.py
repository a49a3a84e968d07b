"""What the supervisor says of a run besides its faults: what a coordinator run's evaluator needs
of a train.command, said as the run starts, and what to do about tasks still running after the
training ended."""
from __future__ import annotations

import os

from cluster.runtime import rundir
from cluster.spec import ClusterSpec
from launch.run.lifecycle import Lifecycle


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
