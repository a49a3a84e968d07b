"""The local backend's warm standbys (launch/backends/standby.py keeps the book; the contract with
the standby process is cluster/runtime/standby.py).

Each standby is a child of the launcher in its own session, as a task is, registered among the
backend's children: the waitid scans that see a task end or stop (SIGSTOP) see a standby's too,
and a standby that becomes a task is then already a child the backend knows, pid and all.
`tend` runs in the leases' thread and `become` in the one that starts tasks: one lock keeps the
book.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping

import psutil

from cluster.runtime.contract import LEASE_ENV, LEASE_SECS_ENV
from cluster.runtime.ports import RUN_ENV
from cluster.runtime.rundir import PRIVATE, read_text, write_atomically
from cluster.runtime.standby import (BECOME_SECS, STANDBY_DIR, STANDBY_MODULE, Became, Become, Ready, SlotFiles,
                                     import_env, slot_files, standby_argv, standby_dir)
from launch.backends.local.zygote import Child
from launch.backends.procstat import STATE, process_ident, read_stat_fields
from launch.backends.standby import Slot, StandbyPool, plan_key, wants
from launch.planning.plan import TaskPlan
from launch.system import poll_until

log = logging.getLogger(__name__)

BECAME_POLL_SECS = 0.01     # how often `become` looks for the standby's became file


def train_dir_of(plan: TaskPlan) -> str:
    """The plan's train_dir, absolute: where its effective spec lies."""
    return os.path.abspath(os.path.join(plan.cwd, os.path.dirname(plan.spec_path)))


def _halted(pid: int) -> bool:
    """Whether `pid` is stopped (SIGSTOP, a debugger) now, as /proc says."""
    fields = read_stat_fields(pid)
    return fields is not None and fields[STATE] in ('T', 't')


class LocalStandbys:
    """The standbys of one LocalBackend. `children` and `halted` are the backend's own: every
    child by pid, and those the kernel said stopped; `env` is what a task of a plan starts with
    (the local backend's inherited environment and the plan's)."""

    def __init__(self, children: dict[int, Child], halted: set[int],
                 env: Callable[[TaskPlan], Mapping[str, str]]) -> None:
        self._children, self._halted, self._env = children, halted, env
        self._lock = threading.Lock()
        self._pool: StandbyPool | None = None
        self._files: dict[tuple[str, str], SlotFiles] = {}
        self._closed = False        # the run is over: a late tend spawns nothing

    # -- the leases' thread -----------------------------------------------------------------

    def tend(self, plans: list[TaskPlan], per_host: int) -> None:
        """Kill what may not be used, then spawn what each host lacks (one per host at a time)."""
        with self._lock:
            if self._closed or not plans or (self._pool is None and not per_host):
                return      # none wanted and none ever made: no look at every plan each second
            if self._pool is None:
                self._pool = StandbyPool(plans[0].env.get(RUN_ENV, ''), prefix=f'{os.getpid()}-')
            pool, now = self._pool, time.time()
            self._look(pool)
            keys = {p.name: plan_key(p, self._env(p)) for p in plans}
            want = wants(((p.task.host, keys[p.name]) for p in plans), per_host)
            for slot in pool.doomed(want, now):
                self._kill(slot)
            for host, key in pool.spawns(want):
                self._spawn(pool, next(p for p in plans if p.task.host == host and keys[p.name] == key), key, now)

    def _look(self, pool: StandbyPool) -> None:
        """What each slot's process and files say now (the scans' reaping and stops included)."""
        for slot in list(pool.slots.values()):
            proc = self._children.get(slot.pid)
            if proc is None or proc.poll() is not None:
                pool.died(slot)
                continue
            files = self._files[(slot.host, slot.slot)]
            try:
                ready: Ready | None = Ready.parse(read_text(files.ready) or '')
                beat: float | None = os.stat(files.ready).st_mtime
            except (ValueError, OSError):
                ready, beat = None, None
            pool.seen(slot, ready, beat, halted=slot.pid in self._halted or _halted(slot.pid))

    def _spawn(self, pool: StandbyPool, plan: TaskPlan, key: str, now: float) -> None:
        """A standby for tasks like `plan` (its Python, folder and import environment)."""
        slot = pool.new(plan.task.host, key, now)
        folder = standby_dir(train_dir_of(plan), plan.task.host)
        os.makedirs(folder, exist_ok=True)
        files = slot_files(folder, slot.slot)
        self._files[(slot.host, slot.slot)] = files
        argv = standby_argv(plan.argv[0], folder, slot.slot, pool.run, key, bool(plan.keras),
                            plan.env[LEASE_ENV], float(plan.env[LEASE_SECS_ENV]))
        env = dict(self._env(plan))
        env = {**{k: v for k, v in env.items() if k not in plan.env}, **import_env(env)}    # no task's own names
        with open(files.log, 'ab') as out:
            proc = subprocess.Popen(argv, cwd=plan.cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self._children[proc.pid] = proc
        self._halted.discard(proc.pid)
        pool.spawned(slot, proc.pid, process_ident(proc.pid) or '')
        log.debug('standby %s spawned: pid %d', slot.slot, proc.pid)

    def _kill(self, slot: Slot) -> None:
        """SIGKILL the slot's process group (while its pid is still our unreaped child, so it names
        nothing else), and remove its files but the log."""
        proc = self._children.get(slot.pid)
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(slot.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        files = self._files.pop((slot.host, slot.slot), None)
        for path in (files.ready, files.become, files.became) if files else ():
            try:
                os.remove(path)
            except FileNotFoundError:
                pass

    # -- the thread that starts tasks -------------------------------------------------------

    def become(self, plan: TaskPlan, env: Mapping[str, str], log_file: str) -> tuple[int, str, int] | None:
        """Hand the plan's task to a standby of its host: (pid, ident, log offset) of the task it
        became, or None when there is none that may be used, or it did not answer within
        BECOME_SECS (then it is killed): the caller starts the task cold."""
        key = plan_key(plan, env)
        with self._lock:
            if self._pool is None or key is None:
                return None
            self._look(self._pool)
            slot = self._pool.pick(plan.task.host, key, time.time())
        if slot is None:
            return None
        files = self._files[(slot.host, slot.slot)]
        write_atomically(files.become, Become(tuple(plan.argv), dict(env), os.path.abspath(plan.cwd),
                                              os.path.abspath(log_file)).to_json(), PRIVATE)
        became = self._became(files.became)
        with self._lock:
            if became is None or became.pid != slot.pid:
                log.warning('standby pid %d did not become %s within %gs: killed, the task starts cold',
                            slot.pid, plan.name, BECOME_SECS)
                self._kill(slot)
                self._pool.taken(slot)
                return None
            self._pool.taken(slot)
            self._files.pop((slot.host, slot.slot), None)
        return slot.pid, slot.ident, became.offset

    @staticmethod
    def _became(path: str) -> Became | None:
        """The standby's Became, once it wrote it, within BECOME_SECS; None if it did not."""
        found: list[Became] = []

        def written() -> bool:
            try:
                found[:] = [Became.parse(read_text(path) or '')]
                return True
            except ValueError:
                return False
        poll_until(written, time.monotonic() + BECOME_SECS, poll=BECAME_POLL_SECS)
        return found[0] if found else None

    # -- the end ----------------------------------------------------------------------------

    def views(self) -> list[tuple[str, int, str]]:
        with self._lock:
            return self._pool.views() if self._pool else []

    def close(self) -> None:
        """Kill every standby (the run is over, or its tasks are torn down)."""
        with self._lock:
            self._closed = True
            if self._pool is not None:
                for slot in list(self._pool.slots.values()):
                    self._kill(slot)
                self._pool.slots.clear()


def left_standbys(train_dirs: set[str], mine: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """Standbys of these train_dirs (absolute) that an earlier launcher left running, found by
    their command line (`python -m cluster.standby --dir <train_dir>/standby/...`); `mine`: the
    pids of this launcher's own, left out."""
    roots = tuple(os.path.join(d, STANDBY_DIR) + os.sep for d in train_dirs)
    found = []
    for process in psutil.process_iter(['cmdline']):
        argv = process.info.get('cmdline') or []
        if (process.pid not in mine and STANDBY_MODULE in argv and '--dir' in argv[:-1]
                and argv[argv.index('--dir') + 1].startswith(roots)):
            found.append(process)
    return found


def kill_left(train_dirs: set[str], mine: frozenset[int] = frozenset()) -> int:
    """SIGKILL the process group of every standby an earlier launcher of these train_dirs left
    (`mine`: this launcher's children, spared); how many there were."""
    left = left_standbys(train_dirs, mine)
    for process in left:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    psutil.wait_procs(left, timeout=5.0)
    return len(left)
