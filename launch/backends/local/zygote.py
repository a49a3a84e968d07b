"""The local backend's start-up zygotes (the process and its protocol: cluster/zygote.py).

At a run's start, one zygote per import key (launch/backends/standby.py plan_key) imports
TensorFlow once, and each task the backend starts then is forked from it instead of importing
on its own: on a host of two cores, three tasks that import at once take 1.5x one import. The
zygote lives only while the run's tasks first start (`open` .. `close`); restarts are the warm
standbys' (standby.py). A task that no zygote can fork (another key, a network namespace, a
zygote that died or did not import within READY_SECS) starts cold, as before.

A forked task is made an orphan at once (cluster/zygote.py fork_task) and this process, a child
subreaper while the zygotes live, adopts it: it is then this process's child as a cold start is,
and the backend's waitid scans see its end, code and stops (AdoptedChild stands in for its Popen).
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping

from cluster.runtime import children, procenv
from cluster.runtime.contract import LEASE_ENV, LEASE_SECS_ENV
from cluster.runtime.ports import RUN_ENV
from cluster.runtime.standby import ZYGOTE_READY, Become, import_env, standby_dir, zygote_argv
from launch.backends.procstat import process_ident
from launch.backends.standby import plan_key
from launch.planning.plan import TaskPlan

log = logging.getLogger(__name__)

READY_SECS = 60.0       # how long a start waits for a zygote's import before the task starts cold
ANSWER_SECS = 10.0      # how long a fork may take to be answered
MAX_ROOM = 120_000      # bytes: one environment string may not exceed 128 KiB (MAX_ARG_STRLEN)


class AdoptedChild:
    """A task a zygote forked and this process adopted: what the backend asks of a child's Popen
    (pid, returncode, poll), from waitpid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:       # reaped elsewhere: no code to have (as Popen says)
                    self.returncode = 0
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode


Child = subprocess.Popen | AdoptedChild


class _Zygote:
    """One zygote process and what it said."""

    def __init__(self, proc: subprocess.Popen, key: str) -> None:
        self.proc, self.key = proc, key
        self.lock = threading.Lock()
        self.ready = False
        self._buf = b''

    def line(self, deadline: float) -> dict | None:
        """Its next line (a JSON object), or None: it ended, said no JSON, or said nothing in time."""
        out = self.proc.stdout
        assert out is not None
        while b'\n' not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                return None
            chunk = os.read(out.fileno(), 65536)
            if not chunk:
                return None
            self._buf += chunk
        text, self._buf = self._buf.split(b'\n', 1)
        try:
            said = json.loads(text)
        except ValueError:
            return None
        return said if isinstance(said, dict) else None

    def end(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()     # it leaves on its stdin's end
            except OSError:
                pass
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Zygotes:
    """The zygotes of one LocalBackend; `env` is what a task of a plan starts with."""

    def __init__(self, env: Callable[[TaskPlan], Mapping[str, str]]) -> None:
        self._env = env
        self._by_key: dict[str, _Zygote] = {}
        self._lock = threading.Lock()
        self._adopting = False      # this process adopts orphans (from open to close)

    def open(self, plans: list[TaskPlan]) -> None:
        """A zygote for each import key of these tasks (none for tasks no zygote can fork)."""
        firsts: dict[str, TaskPlan] = {}
        for plan in plans:
            key = plan_key(plan, self._env(plan))
            if key is not None and LEASE_ENV in plan.env:
                firsts.setdefault(key, plan)
        if not firsts or not children.adopt_orphans(True):
            return
        self._adopting = True
        # Room in the zygote's environment block for each task's own (cluster/runtime/procenv.py).
        largest = max(len(procenv.block(self._env(p))) for p in plans) + procenv.ROOM_MARGIN
        with self._lock:
            for key, plan in firsts.items():
                if key not in self._by_key:
                    self._by_key[key] = self._spawn(plan, key, min(largest, MAX_ROOM))

    def _spawn(self, plan: TaskPlan, key: str, room: int) -> _Zygote:
        folder = standby_dir(os.path.abspath(os.path.join(plan.cwd, os.path.dirname(plan.spec_path))), plan.task.host)
        os.makedirs(folder, exist_ok=True)
        argv = zygote_argv(plan.argv[0], folder, plan.env.get(RUN_ENV, ''), key, bool(plan.keras),
                           plan.env[LEASE_ENV], float(plan.env[LEASE_SECS_ENV]))
        env = dict(self._env(plan))
        env = {**{k: v for k, v in env.items() if k not in plan.env}, **import_env(env),    # no task's own names
               procenv.ROOM_ENV: procenv.room(room)}      # last: the end of its environment block
        with open(os.path.join(folder, f'zygote-{key}.log'), 'ab') as err:
            proc = subprocess.Popen(argv, cwd=plan.cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err, start_new_session=True)
        log.debug('zygote for key %s spawned: pid %d', key, proc.pid)
        return _Zygote(proc, key)

    def fork(self, plan: TaskPlan, env: Mapping[str, str], log_file: str) -> tuple[int, str, int] | None:
        """Fork the plan's task from its key's zygote: (pid, ident, log offset), the task adopted
        by this process; None where no zygote can (the caller starts it cold)."""
        key = plan_key(plan, env)
        with self._lock:
            zygote = self._by_key.get(key) if key is not None else None
        if zygote is None:
            return None
        with zygote.lock:
            if not zygote.ready:
                said = zygote.line(time.monotonic() + READY_SECS)
                if said is None or ZYGOTE_READY not in said:
                    self._lost(zygote, f'did not import within {READY_SECS:g}s')
                    return None
                zygote.ready = True
                log.debug('zygote %s ready: imported in %ss', key, said.get('imported'))
            path = os.path.abspath(log_file)
            offset = os.path.getsize(path) if os.path.exists(path) else 0
            become = Become(tuple(plan.argv), dict(env), os.path.abspath(plan.cwd), path)
            try:
                assert zygote.proc.stdin is not None
                zygote.proc.stdin.write((become.to_json() + '\n').encode())
                zygote.proc.stdin.flush()
            except OSError as e:
                self._lost(zygote, f'cannot be written to ({e})')
                return None
            said = zygote.line(time.monotonic() + ANSWER_SECS)
            pid = said.get('pid') if said else None
            if not isinstance(pid, int):
                self._lost(zygote, f'did not fork {plan.name}: {said.get("error") if said else "no answer"}')
                return None
        return pid, process_ident(pid) or '', offset

    def _lost(self, zygote: _Zygote, why: str) -> None:
        """A zygote that cannot serve: ended; its tasks start cold."""
        log.warning('the start-up zygote (pid %d) %s: tasks start cold', zygote.proc.pid, why)
        with self._lock:
            self._by_key.pop(zygote.key, None)
        zygote.end()

    def close(self) -> None:
        """End every zygote (the tasks are started) and adopt orphans no more."""
        with self._lock:
            zygotes, self._by_key = list(self._by_key.values()), {}
        for zygote in zygotes:
            zygote.end()
        if self._adopting:      # also when every zygote was lost before
            self._adopting = not children.adopt_orphans(False)
