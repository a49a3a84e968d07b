"""A start-up zygote: `python -m cluster.zygote --dir D --run R --key K --lease L --lease-secs N [--keras]`.

Every task of a run starts by importing TensorFlow: seconds each, and three or more tasks on one
host import at once, sharing its cores (three imports on two cores take 1.5x one). The zygote
imports once, as a standby does (cluster/standby.py warm_up), and then forks each task the
launcher sends it: the child takes the task's folder, environment, command line and log as a
standby takes them (cluster.standby.enter) and runs `cluster.task`'s main, so its start costs a
fork, not an import.

The protocol is JSON lines on its stdin and stdout (the contract: cluster/runtime/standby.py):
- it writes {"ready": pid, "imported": secs, "rss_kb": kb} once it has imported;
- the launcher writes a Become, one line; the zygote forks the task and answers {"pid": P}, or
  {"error": "..."} for a Become it cannot take (then the launcher starts the task cold).

Each task is forked twice, the middle process leaving at once: the task is then an orphan, which
the kernel gives to the launcher (a child subreaper, prctl PR_SET_CHILD_SUBREAPER), so the task is
the launcher's child as a cold start is: waitid tells its end, its exit code and its stops. The
child leaves the zygote's session (setsid), as every task has its own.

The zygote leaves, exit 0, once its stdin ends (the launcher closed it once its tasks started, or
the launcher died), on SIGTERM, or once the run's lease goes stale.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import select
import signal
import sys
import time
from collections.abc import Sequence

from cluster import standby, task
from cluster.runtime import masking, procenv
from cluster.runtime.contract import EXIT_FAILED, EXIT_OK, run_to_exit
from cluster.runtime.standby import HEARTBEAT_SECS, ZYGOTE_MODULE, ZYGOTE_READY, Become

ADOPTED_SECS = 5.0      # how long a forked task waits for the middle process to go (it goes at once)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='python -m cluster.zygote', description=__doc__.splitlines()[0])
    p.add_argument('--dir', required=True, help="the host's standby folder (standby_dir): where its log is")
    return standby.parse_warm_args(p, argv)


def say(line: str) -> None:
    """One line of the zygote's own, to its log (stderr)."""
    standby.say(line, ZYGOTE_MODULE)


def answer(out: int, record: dict) -> None:
    """One line to the launcher (a pipe: one write of a short line is whole)."""
    os.write(out, (json.dumps(record, allow_nan=False) + '\n').encode())


def adopted(middle: int, wait: float = ADOPTED_SECS) -> bool:
    """Wait until the middle process (pid `middle`) has gone and this one has its new parent (the
    launcher): the task takes its parent's pid as its keeper's at start (notice.py: a SIGTERM after
    its keeper went is a stop), so it must not see the middle one, which leaves a moment later.
    The middle's pid comes from the middle itself: read here with getppid it could already be the
    launcher's (the middle gone first), and the wait would last its whole `wait`. Whether adopted."""
    deadline = time.monotonic() + wait
    while os.getppid() == middle:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def become_task(become: Become, extra: Sequence[int], middle: int) -> None:
    """In the forked task: its own session, the zygote's pipes gone (stdin from /dev/null, stdout
    and stderr to the task's log, `extra` closed), the task's folder and environment taken; then
    the task's main, to its exit; `middle` is the pid of the process it was forked from."""
    os.setsid()
    for fd in extra:
        os.close(fd)
    adopted(middle)
    numpy = sys.modules.get('numpy')
    if numpy is not None:       # its global generator came with the fork (Python's own `random` is reseeded)
        numpy.random.seed()
    null = os.open(os.devnull, os.O_RDONLY)     # above 2: the zygote's 0, 1 and 2 are open
    os.dup2(null, 0)
    os.close(null)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)       # the task's own from here (notice.py sets it)
    try:
        args, _ = standby.enter(become)
    except OSError as e:
        say(f'error: cannot become a task: {e}')
        os._exit(2)
    procenv.show(os.environ)        # /proc/PID/environ shows the task's, as a cold start's does
    run_to_exit(lambda: task.main(args), closes=(masking.drain,))    # as cluster.task's __main__


def fork_task(become: Become) -> int:
    """Fork the task twice (the middle process leaves at once, so the task is an orphan the
    launcher adopts); the task's pid."""
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(r)
            me = os.getpid()
            pid = os.fork()
            if pid == 0:
                try:
                    become_task(become, (w,), me)
                finally:
                    os._exit(EXIT_FAILED)       # it ends through run_to_exit: never here
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, 'rb') as f:
        said = f.read()
    os.waitpid(middle, 0)       # once it is gone, the task is the launcher's
    if not said.strip().isdigit():
        raise OSError('the forked task did not say its pid')
    return int(said)


def serve(a: argparse.Namespace, started: float) -> None:
    """Fork a task for each Become line on stdin until it ends, the lease goes stale, or SIGTERM."""
    buf, beat = b'', time.monotonic()
    while True:
        if select.select([0], [], [], HEARTBEAT_SECS)[0]:
            chunk = os.read(0, 65536)
            if not chunk:
                return
            buf += chunk
            while b'\n' in buf:
                line, buf = buf.split(b'\n', 1)
                try:
                    become = standby.parse_become(line.decode())
                    answer(1, {'pid': fork_task(become)})
                except (OSError, ValueError) as e:
                    answer(1, {'error': str(e)})
        if time.monotonic() - beat >= HEARTBEAT_SECS:
            beat = time.monotonic()
            if standby.launcher_gone(a.lease, a.lease_secs, started, ZYGOTE_MODULE):
                return


def main(argv: Sequence[str] | None = None) -> None:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(EXIT_OK))
    started = time.time()
    standby.warm_up(a.keras)
    imported = time.time() - started
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    logging.root.handlers.clear()   # task.main's basicConfig must take effect in the forked tasks
    answer(1, {ZYGOTE_READY: os.getpid(), 'imported': round(imported, 3), 'rss_kb': rss_kb})
    say(f'ready: imported in {imported:.2f}s, {rss_kb // 1024} MB resident (pid {os.getpid()})')
    serve(a, started)
    sys.stderr.flush()
    os._exit(EXIT_OK)


if __name__ == '__main__':
    main()
