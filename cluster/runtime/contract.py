"""The contract between a task and its launcher: who a task is, how it is started and how it ends,
typed, in one place.

Both sides import this module (the launcher may import `cluster.runtime`, never the task side's
top layers), so a change to a name, a flag or an exit code is made here and both follow:

- `TaskName(job, index)`: a task's name in logs, events and messages (`worker:3`), parsed once;
- the task's command line: `task_argv` builds what the launcher runs, `parse_task_argv` is the
  parser `python -m cluster.task` runs; `--place NAME` picks where the task learns its place
  (cluster/env/: `tf_config`, `slurm`, `jobset`), `--slurm`/`--jobset` still mean what they meant;
- the environment's names and the exit codes both sides use.

What a task tells its launcher while it runs (each message, its one writer `say`, its channel and
its one reader) is cluster/runtime/messages.py.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cluster.env import places
from cluster.env.slurm import DEFAULT_PORT_BASE
from cluster.spec import DEFAULT_SPEC, JOBS, TF_CONFIG_ENV
from cluster.spec.load import take_overrides

# -- names ----------------------------------------------------------------------------------------
_TASK_NAME = re.compile(r'([A-Za-z_][\w-]*):([0-9]+)')


@dataclass(frozen=True, order=True)
class TaskName:
    """A task's name: its job and its index in that job (`worker:3`)."""
    job: str
    index: int

    def __str__(self) -> str:
        return f'{self.job}:{self.index}'

    @classmethod
    def parse(cls, name: str) -> TaskName:
        """`worker:3` -> TaskName('worker', 3); ValueError for anything else."""
        m = _TASK_NAME.fullmatch(name)
        if m is None:
            raise ValueError(f'not a task name (JOB:INDEX): {name!r}')
        return cls(m.group(1), int(m.group(2)))


def job_of(name: str) -> str | None:
    """The job of a task's name (`ps:1` -> 'ps'), None where `name` is not one: the test a
    caller makes of a name it did not make itself (an event's, a decision's)."""
    try:
        return TaskName.parse(name).job
    except ValueError:
        return None


# -- the environment and the exit codes -----------------------------------------------------------
# Set by the launcher in each task's environment: a file it touches every second or so. A task
# whose lease is older than LEASE_SECS_ENV seconds has lost its launcher (killed, or cut off from
# its host) and stops itself. Tasks started by hand, by Slurm or by a TFJob have none.
LEASE_ENV, LEASE_SECS_ENV = 'TFCLUSTER_LEASE', 'TFCLUSTER_LEASE_SECS'

# Set by the launcher on the tasks it starts again after a fault: one line saying why, e.g.
# `restart 1/3: ps:0 was killed by SIGKILL`. The chief records it in TensorBoard (a text summary).
RESTART_ENV = 'TFCLUSTER_RESTART'

# TFCLUSTER_CHANNEL, the file a task writes its messages' records to: cluster/runtime/messages.py.

# Exit codes, of a task and of the launcher alike.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_NO_RESTART = 3     # a task failed in a way a restart cannot mend (no checkpoint restores)
# A task that left on a preemption notice (a SIGTERM from outside the launcher, supervise.preemption_grace):
# >= 128, so TFJob's ExitCode policy and the like take it as retryable; > 192, so no decoder reads a signal.
EXIT_PREEMPTED = 200


# -- the task's command line ----------------------------------------------------------------------
TASK_MODULE = 'cluster.task'


def task_argv(python: str, spec_file: str, task: TaskName) -> tuple[str, ...]:
    """The command line that runs `task` of the spec in `spec_file` (what `launch up` starts)."""
    return (python, '-m', TASK_MODULE, '--spec', spec_file, '--job', task.job, '--index', str(task.index))


@dataclass(frozen=True)
class TaskArgs:
    """What a task's command line says: the spec, the overrides, and where the task's place comes
    from: `task` (--job/--index: the spec's cluster), else `place` (a source of cluster/env/places)."""
    spec: str | None
    overrides: tuple[str, ...]
    task: TaskName | None
    place: str | None
    port_base: int = DEFAULT_PORT_BASE


def _parser(doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f'python -m {TASK_MODULE}', description=doc)
    p.add_argument('--spec', help=f'cluster spec (default: $CLUSTER_SPEC, else {DEFAULT_SPEC})')
    p.add_argument('--job', choices=list(JOBS), help='the task\'s job (default: from $TF_CONFIG)')
    p.add_argument('--index', type=int, help="the task's position in its job's list (default: from $TF_CONFIG)")
    p.add_argument('--set', dest='overrides', action='append', default=[], metavar='KEY=VALUE',
                   help='override a spec key, e.g. --set train.steps=50')
    p.add_argument('--slurm', action='store_true',
                   help="inside an srun step: every task's job, index, host and port from Slurm's environment "
                        '(ranks in node order, the spec\'s ps tasks first)')
    p.add_argument('--port-base', type=int, default=DEFAULT_PORT_BASE, metavar='PORT',
                   help=f'with --slurm: the first port on each node (default {DEFAULT_PORT_BASE})')
    p.add_argument('--jobset', action='store_true',
                   help="in a pod of a JobSet (launch render --format jobset|trainjob): every task's job, index "
                        "and DNS name from the pod's labels and the rendered TFCLUSTER_JOBSET_* variables")
    # Hidden from --help and the usage line, which stay as they were (round 3 changes no CLI text):
    # the sources are cluster/env/places.SOURCES, `--slurm`/`--jobset` the spellings users know.
    p.add_argument('--place', choices=list(places.SOURCES), default=None, help=argparse.SUPPRESS)
    return p


def parse_task_argv(argv: Sequence[str] | None = None, doc: str = '',
                    environ: Mapping[str, str] = os.environ) -> TaskArgs:
    """A task's command line (sys.argv[1:] by default) as TaskArgs; a bad one exits with argparse's
    usage line and code 2, before anything is imported or started."""
    p = _parser(doc)
    rest, overrides = take_overrides(sys.argv[1:] if argv is None else list(argv))
    args = p.parse_args(rest)       # without the --set options: argparse is quadratic in them
    if args.slurm and args.jobset:
        p.error('give --slurm or --jobset, not both')
    flagged = [name for name in (places.SLURM, places.JOBSET) if getattr(args, name)]
    if args.place is not None and flagged and flagged != [args.place]:
        p.error(f'give --place {args.place} or --{flagged[0]}, not both')
    place = args.place or (flagged[0] if flagged else None)
    if place is not None and place != places.TF_CONFIG and (args.job is not None or args.index is not None):
        flag = f'--{place}' if place in flagged else f'--place {place}'
        p.error(f'{flag} takes the task from {places.SOURCES[place].where}: drop --job and --index')
    if (args.job is None) != (args.index is None):
        p.error('give --job and --index together (or neither, to take both from $TF_CONFIG)')
    if args.job is None and place in (None, places.TF_CONFIG) and not environ.get(TF_CONFIG_ENV):
        p.error(f'--job and --index are required unless ${TF_CONFIG_ENV} names the task')
    task = TaskName(args.job, args.index) if args.job is not None else None
    return TaskArgs(spec=args.spec, overrides=tuple(overrides + args.overrides), task=task,
                    place=place if task is None else None, port_base=args.port_base)


def run_to_exit(main: Callable[[], int], closes: Sequence[Callable[[], None]] = ()) -> None:
    """Run a task's `main` and end the process with its code through os._exit: a TF server has no
    stop(), and tearing it (or any gRPC server) down in interpreter shutdown races its threads
    (crashes or hangs at exit, seen under load). A usage error keeps argparse's code, Ctrl-C is
    130, a bug or a lost peer is shown and is EXIT_FAILED. `closes` run first (a command's last
    lines), then the logs and streams are flushed; a full disk under the log still ends the task."""
    try:
        code = main()
    except SystemExit as e:     # argparse's usage error (2) or --help (0): its message is printed
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:
        code = 130
    except BaseException:       # a bug or a lost peer: show it, and still end through os._exit
        traceback.print_exc()
        code = EXIT_FAILED
    for close in (*closes, logging.shutdown, sys.stdout.flush, sys.stderr.flush):
        try:
            close()
        except (OSError, ValueError):
            pass
    os._exit(code)
