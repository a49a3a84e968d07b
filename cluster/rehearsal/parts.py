"""What each task of a spec does in its run, which its stand-in plays, and which peers it must
reach: pure functions of the spec, read by the stand-in (standin.py) and by the launcher, which
expects a `Links` report from every task that has peers (launch/run/rehearsal.py)."""
from __future__ import annotations

import enum

from cluster.spec import ClusterSpec, TaskSpec


class Part(str, enum.Enum):
    """What a task does in its run, which its stand-in plays."""
    SERVE = 'serve'             # a ps; a coordinator run's worker: serve until stopped
    TRAIN = 'train'             # a TF1 worker: step to train.steps (worker 0 the chief, which saves)
    COORDINATE = 'coordinate'   # a coordinator run's chief: step to train.steps, save
    EVALUATE = 'evaluate'       # a coordinator run's evaluator: evaluate the last checkpoint


def part_of(spec: ClusterSpec, task: TaskSpec) -> Part:
    if task.job == 'ps' or (spec.coordinator and task.job == 'worker'):
        return Part.SERVE
    if task.job == 'chief':
        return Part.COORDINATE
    if task.job == 'evaluator':
        return Part.EVALUATE
    return Part.TRAIN


def peers(spec: ClusterSpec, task: TaskSpec) -> tuple[TaskSpec, ...]:
    """The tasks the real `task` must reach: a trainer every ps (between-graph replication's
    device filters keep a TF1 worker to the ps), a coordinator every ps and every worker. A ps,
    a coordinator run's worker and an evaluator (its TF_CONFIG names only itself) reach none."""
    part = part_of(spec, task)
    if part is Part.TRAIN:
        return spec.job_tasks('ps')
    if part is Part.COORDINATE:
        return spec.job_tasks('ps') + spec.job_tasks('worker')
    return ()
