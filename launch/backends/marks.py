"""The launcher's stop marks: a file per task (rundir.stop_mark_path), written before every SIGTERM
the launcher sends to stop a task, so that the task tells that stop from a preemption notice (any
other SIGTERM: cluster/runtime/notice.py). Cleared as each start clears the task's channel; the
run-wide mark (rundir.stop_all_path: a Slurm cancel) at `launch up`.

A mark is found from what a backend holds at stop time: the task's record (its log, on its host,
lies in the train_dir the task reads: rundir.train_dir_of_log). `send_signal` (`launch debug`,
`launch preempt`) writes none: a signal sent on purpose is what it says.
"""
from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Iterable

from cluster.runtime import rundir
from launch.backends.base import TaskRecord
from launch.planning.plan import TaskPlan

log = logging.getLogger(__name__)


def of_record(record: TaskRecord) -> str:
    """The stop mark of a started task, on its host (absolute where the record's log is)."""
    train_dir = rundir.train_dir_of_log(record.log)
    return posixpath.join(record.cwd, rundir.stop_mark_path(train_dir, record.job, record.index))


def of_plan(plan: TaskPlan, root: str | None = None) -> str:
    """The stop mark of a task about to start, under `root` (default: its cwd)."""
    train_dir = rundir.train_dir_of_log(plan.log_path)
    return os.path.join(root or plan.cwd, rundir.stop_mark_path(train_dir, plan.task.job, plan.task.index))


def write(paths: Iterable[str]) -> None:
    """Mark these tasks stopped by the launcher (files on this machine). A mark that cannot be
    written is logged: that task will read the SIGTERM as a preemption notice, and exit
    EXIT_PREEMPTED within its grace instead of at once."""
    for path in paths:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'a'):
                pass
        except OSError as e:
            log.warning('cannot write the stop mark %s (%s): the task will take its SIGTERM for a preemption '
                        'notice', path, e.strerror)


def clear(path: str) -> None:
    """Remove a task's mark (or the run-wide one) as it starts: the mark was for an earlier copy."""
    try:
        os.unlink(path)
    except OSError:
        pass


def clear_all(train_dir: str) -> None:
    """`launch up`: no run-wide mark from an earlier launcher (a Slurm cancel) stands."""
    clear(rundir.stop_all_path(train_dir))
