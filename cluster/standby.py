"""A warm standby: `python -m cluster.standby --dir D --slot S --run R --key K --lease L --lease-secs N`.

It imports what a task imports, says so in its slot's ready file, and waits to be told which task
to become (the contract: cluster/runtime/standby.py), so a restart costs no process start and no
import. Told, it takes the task's folder, environment (whole), command line and log, and runs
`cluster.task`'s main in this process: from there it is the task in every way, its pid included.

Everything it does while it waits happens in the main thread, the heartbeat too: a touched ready
file then proves that the loop which would take a become file is alive, and nothing the standby
started runs on under the task. It leaves by itself, exit 0, on SIGTERM (the launcher's "go away")
or once the run's lease goes stale (its launcher died), as a task would.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import resource
import signal
import sys
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass

from cluster import task
from cluster.runtime import masking, rundir
from cluster.runtime.contract import EXIT_OK, EXIT_USAGE, run_to_exit
from cluster.runtime.standby import HEARTBEAT_SECS, POLL_SECS, Became, Become, Ready, SlotFiles, slot_files

# TensorFlow's lazy attributes a task reaches first: loading them here takes them off a restart.
WARM_ATTRIBUTES = ('compat.v1.train.Server', 'compat.v1.train.ClusterSpec', 'compat.v1.train.replica_device_setter',
                   'compat.v1.train.MonitoredTrainingSession', 'compat.v1.Session', 'compat.v1.ConfigProto',
                   'compat.v1.disable_eager_execution', 'distribute', 'data.Dataset', 'errors.OpError', 'nn', 'train')


@dataclass(frozen=True)
class StandbyArgs:
    folder: str
    slot: str
    run: str
    key: str
    lease: str
    lease_secs: float
    keras: bool


def parse_args(argv: Sequence[str] | None = None) -> StandbyArgs:
    """The command line the launcher builds with cluster.runtime.standby.standby_argv."""
    p = argparse.ArgumentParser(prog='python -m cluster.standby', description=__doc__.splitlines()[0])
    p.add_argument('--dir', required=True, help="the host's standby folder (standby_dir)")
    p.add_argument('--slot', required=True, help='this standby\'s slot: its files are SLOT.ready, .become, ...')
    a = parse_warm_args(p, argv)
    return StandbyArgs(a.dir, a.slot, a.run, a.key, a.lease, a.lease_secs, a.keras)


def parse_warm_args(p: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """`p`'s arguments with those every warm process takes (a standby's, a start-up zygote's):
    the run, the import key, the lease and whether Keras is imported."""
    p.add_argument('--run', required=True, help='the run id it serves')
    p.add_argument('--key', required=True, help='the import key (import_key) of the tasks it may become')
    p.add_argument('--lease', required=True, help="the run's lease file: stale means the launcher is gone")
    p.add_argument('--lease-secs', type=float, required=True, help='how old the lease may grow')
    p.add_argument('--keras', action='store_true', help='import Keras with TensorFlow (a program that uses it)')
    a = p.parse_args(argv)
    if a.lease_secs <= 0:
        p.error(f'--lease-secs must be positive, not {a.lease_secs:g}')
    return a


def lease_stale(touched: float | None, started: float, now: float, secs: float) -> bool:
    """Whether the run's lease says the launcher is gone: its file older than `secs`, a missing
    one counted from the standby's start (the task's rule, cluster/runtime/lease.py)."""
    return now - (started if touched is None else touched) > secs


def launcher_gone(lease: str, secs: float, started: float, who: str = 'cluster.standby') -> bool:
    """Whether the run's `lease` file is stale (lease_stale, read now); if so, says it is leaving."""
    try:
        touched: float | None = os.stat(lease).st_mtime
    except OSError:
        touched = None
    if not lease_stale(touched, started, time.time(), secs):
        return False
    say(f'the launcher has not renewed {lease} for {secs:g}s: it is gone; leaving', who)
    return True


def say(line: str, who: str = 'cluster.standby') -> None:
    """One line of a warm process's own (`who`: a standby, a zygote): to stderr, never through
    logging (task.main's basicConfig must find the root logger without handlers)."""
    print(f'{who}: {line}', file=sys.stderr, flush=True)


def unready(files: SlotFiles) -> None:
    """Remove the ready file: a standby that leaves, or is a task now, is no longer one to pick."""
    for path in (files.ready, files.ready + '.tmp'):
        try:
            os.unlink(path)
        except OSError:
            pass


def leave(files: SlotFiles, code: int) -> None:
    """End the standby, its ready file gone first (also from a signal handler: no exception to unwind)."""
    unready(files)
    sys.stderr.flush()
    os._exit(code)


def warm_up(keras: bool) -> types.ModuleType:
    """Import what a task imports, in the order it does, and load the lazy parts it reaches first."""
    tf = task.import_tensorflow(keras)
    import grpc   # noqa: F401  (the servers' and the coordinator's transport)

    import cluster.coordinator   # noqa: F401
    import cluster.program   # noqa: F401
    import cluster.runtime.session   # noqa: F401
    import cluster.training.train   # noqa: F401
    for path in WARM_ATTRIBUTES:
        thing: object = tf
        for name in path.split('.'):
            thing = getattr(thing, name, None)
    return tf


def read_become(path: str) -> Become:
    """The launcher's word, read and unlinked (it is 0600: the environment may hold hidden values);
    ValueError, naming the file, for one that is no Become of a cluster.task."""
    with open(path) as f:
        text = f.read()
    os.unlink(path)
    try:
        return parse_become(text)
    except ValueError as e:
        raise ValueError(f'{path}: {e}') from None


def parse_become(text: str) -> Become:
    """A Become of a cluster.task from its JSON text; ValueError for anything else."""
    become = Become.parse(text)
    if not (isinstance(become.env, dict) and all(isinstance(v, str) for v in become.env.values())
            and isinstance(become.cwd, str) and isinstance(become.log, str)
            and isinstance(become.keep_env, bool)):
        raise ValueError('its env, cwd or log is not text')
    become.task_args()
    return become


def wait(args: StandbyArgs, files: SlotFiles, started: float) -> Become:
    """Touch the ready file every HEARTBEAT_SECS and look for the become file every POLL_SECS
    until one comes; leave (exit 0) once the lease is stale, exit 2 on a bad become file."""
    beat = time.monotonic()
    while True:
        if os.path.exists(files.become):
            try:
                return read_become(files.become)
            except (OSError, ValueError) as e:
                say(f'error: cannot become a task: {e}')
                leave(files, EXIT_USAGE)
        if time.monotonic() - beat >= HEARTBEAT_SECS:
            beat = time.monotonic()
            with contextlib.suppress(OSError):      # removed under it: the launcher counts on it no more
                os.utime(files.ready)
            if launcher_gone(args.lease, args.lease_secs, started):
                leave(files, EXIT_OK)
        time.sleep(POLL_SECS)


def take(become: Become, files: SlotFiles) -> list[str]:
    """Take the task's folder, environment, command line and log, and say so in the became file;
    the task's arguments. OSError: a folder or log that cannot be had (the launcher starts it cold)."""
    args, offset = enter(become)
    rundir.write_atomically(files.became, Became(os.getpid(), offset).to_json())
    return args


def enter(become: Become) -> tuple[list[str], int]:
    """Take the task's folder, environment, command line and log: the task's arguments, and the
    offset in the log where its lines start. OSError: a folder or log that cannot be had."""
    os.chdir(become.cwd)
    if not become.keep_env:     # SSH sends the task's names alone (Become.keep_env)
        os.environ.clear()
    os.environ.update(become.env)
    time.tzset()    # the log's times in the task's zone
    args = become.task_args()
    sys.argv = [task.__file__, *args]
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(become.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    offset = os.fstat(fd).st_size
    os.close(fd)
    return args, offset


def main(argv: Sequence[str] | None = None) -> None:
    """Import, say ready, wait, become (or leave)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    args = parse_args(argv)
    files = slot_files(args.folder, args.slot)
    term = signal.getsignal(signal.SIGTERM)
    if term != signal.SIG_IGN:      # an ignored SIGTERM stays ignored, as for a task (notice.py)
        signal.signal(signal.SIGTERM, lambda *_: leave(files, EXIT_OK))
    started = time.time()
    warm_up(args.keras)
    imported = time.time() - started
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    logging.root.handlers.clear()   # task.main's basicConfig must take effect (none is expected)
    rundir.write_atomically(files.ready, Ready(os.getpid(), args.key, args.run, round(imported, 3), rss_kb).to_json())
    say(f'ready: imported in {imported:.2f}s, {rss_kb // 1024} MB resident (pid {os.getpid()})')
    become = wait(args, files, started)
    signal.signal(signal.SIGTERM, signal.SIG_DFL if term is None else term)   # the task's own from here
    unready(files)
    try:
        task_args = take(become, files)
    except OSError as e:
        say(f'error: cannot become a task: {e}')
        leave(files, EXIT_USAGE)
    run_to_exit(lambda: task.main(task_args), closes=(masking.drain,))    # as cluster.task's __main__


if __name__ == '__main__':
    main()
