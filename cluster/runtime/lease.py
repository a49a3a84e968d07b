"""What a task process learns first, shared by the real task (cluster/task.py) and its light
stand-in (cluster/rehearsal/): which task it is (`resolve_task`) and how long it may live (the
launcher's lease, `watch_lease`, which also carries the live workers of a `launch scale`).

Kept apart from cluster/task.py so that the stand-in imports neither TensorFlow's entry point nor
the program, checks and masking modules that come with it: a thousand stand-ins pay for each
module they import a thousand times.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

from cluster.env import places
from cluster.runtime.contract import EXIT_FAILED, TaskArgs
from cluster.runtime.notice import STOPPING
from cluster.runtime.membership import LIVE, Members
from cluster.runtime.rundir import read_text
from cluster.spec import DEFAULT_SPEC, ClusterSpec, TaskSpec, load_spec

if TYPE_CHECKING:
    import subprocess

log = logging.getLogger('cluster.task')

CHILDREN: list[subprocess.Popen] = []     # the train.command process this task runs, if any (killed with the task)


def resolve_task(args: TaskArgs) -> tuple[ClusterSpec, TaskSpec]:
    """The spec and this process's task. --job/--index name the task in the spec's cluster (how
    `launch up` starts tasks); without them a placement source (cluster/env/places.py) places it:
    $TF_CONFIG names both the cluster and the task, as Kubeflow's TFJob, SageMaker and Vertex set
    it, and the spec (if any) gives the train settings; --place slurm (--slurm), Slurm's
    environment places every task (cluster/env/slurm.py); --place jobset (--jobset), a JobSet
    pod's labels and variables (cluster/env/jobset.py), the spec (if any) again giving only the
    train settings."""
    path = args.spec or os.environ.get('CLUSTER_SPEC')
    if args.task is not None:
        spec = load_spec(path or DEFAULT_SPEC, list(args.overrides))
        return spec, spec.task(args.task.job, args.task.index)
    source = places.SOURCES[args.place or places.TF_CONFIG]
    return source.resolve(path, args.overrides, os.environ, args.port_base)


def watch_lease(path: str, secs: float, poll: float = 1.0, pool: int = 0) -> None:
    """End this task (SIGTERM to itself, so a chief still saves its checkpoint) once `path` has
    not been touched for `secs` seconds. A missing file counts from the task's start. What the
    file holds is the live workers of a pool of `pool` (cluster/runtime/membership.py): read now, and
    again whenever it changes."""
    started = time.time()
    seen: list[tuple[int, int, int] | None] = [None]

    def read_members(touched: tuple[int, int, int]) -> None:
        if touched != seen[0]:
            seen[0] = touched
            if LIVE.set(Members.parse(read_text(path) or '', pool)):
                log.info('live workers: %s', ', '.join(f'worker:{i}' for i in LIVE.current(pool).indices))

    def key(stat: os.stat_result) -> tuple[int, int, int]:
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    try:
        read_members(key(os.stat(path)))
    except OSError:
        pass

    def watch() -> None:
        while True:
            time.sleep(poll)
            try:
                stat = os.stat(path)
                touched = stat.st_mtime
                read_members(key(stat))
            except OSError:
                touched = started
            age = time.time() - touched
            if age > secs:
                log.error('the launcher has not renewed %s for %.0fs: it is gone or cannot reach this '
                          'host; stopping', path, age)
                STOPPING.set()      # this SIGTERM is a stop, not a preemption notice (notice.py)
                os.kill(os.getpid(), signal.SIGTERM)   # a chief saves; the others end at once
                time.sleep(3)       # short: the ps tasks are likely ending too, a save may not come
                for child in CHILDREN:                  # a train.command that ignored the SIGTERM
                    child.kill()
                os._exit(EXIT_FAILED)

    threading.Thread(target=watch, name='lease', daemon=True).start()
