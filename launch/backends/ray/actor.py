"""What runs on a Ray node for one task: `TaskActor`, a Ray actor that the launcher's driver
creates (and so owns) and that starts, watches, signals and stops the task's process there.

The task is a child process of the actor, not the actor itself: TensorFlow's server has no stop,
a TF1 restart needs a fresh process, and "kill -9 a worker's process" must hit the task. The
actor keeps the local backend's guarantees (launch/backends/local/backend.py: its own session,
its log appended to, its group stopped as a whole) by running a LocalBackend for its one task,
and adds one: the task gets SIGTERM when the actor's process ends (PR_SET_PDEATHSIG), so a
launcher killed hard leaves nothing behind (its driver's death ends the actors it owns). The
death signal follows the thread that forked, so every start runs on one spawner thread that
lives as long as the actor, never on one of Ray's pool threads.

Ray is not imported here: the backend wraps the class with `ray.remote` (launch/backends/ray/backend.py),
and the actor asks Ray for its node's facts through `ray.get_runtime_context()` at call time.
"""
from __future__ import annotations

import errno
import importlib.util
import os
import signal
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from cluster.runtime.ports import port_in_use
from cluster.runtime.rundir import no_room, read_text
from launch.backends.base import ENDED, Observation, TaskRecord, touch_leases
from launch.backends.local.backend import LocalBackend
from launch.backends.ray.childenv import GPUS_ENV, read_machine_key
from launch.planning.plan import TaskPlan

PORT_RANGE = (20000, 32767)     # below the kernel's ephemeral range, above Ray's worker ports (10002-19999)


def _can_bind(port: int) -> bool:
    """Whether nothing on this machine listens on `port` (and no one else holds it bound)."""
    if port_in_use(port):
        return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(('', port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise
    return True


class TaskActor:
    """One task's keeper on its node (see the module's docstring). Its methods are what the
    launcher's RayBackend asks of it; each is short, except wait_exit, which returns when the
    task's process ends (the launcher keeps one such call outstanding per start: an end is seen
    when it returns, a dead actor or node when it fails)."""

    def __init__(self, death_signal: int = signal.SIGTERM) -> None:
        self._local = LocalBackend(death_signal=death_signal)
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix='tfcluster-spawner')
        self._lock = threading.Lock()       # the LocalBackend's books are not for two threads at once
        self._record: TaskRecord | None = None

    def facts(self, token_path: str = '', token: str = '') -> dict:
        """Where the actor runs: the node's id and address, this machine's key (ports are the
        machine's, whatever node of it), the GPUs Ray gave it, its Python, whether TensorFlow is
        installed, its home (a node that does not share the launcher's train_dir runs the task in a
        workdir there), and whether it reads `token` at `token_path` (the launcher's train_dir is
        the same folder here)."""
        import ray      # installed wherever the actor runs: it is a Ray worker
        context = ray.get_runtime_context()
        gpus = context.get_accelerator_ids().get('GPU', [])
        return {'node_id': context.get_node_id(), 'address': ray.util.get_node_ip_address(),
                'machine': read_machine_key(), 'gpus': [str(g) for g in gpus], 'python': sys.executable,
                'pid': os.getpid(), 'tensorflow': importlib.util.find_spec('tensorflow') is not None,
                'home': os.path.expanduser('~'),
                'shared': bool(token_path) and read_text(token_path) == token}

    def reserve_port(self, preferred: int, avoid: list[int]) -> int:
        """A port free on this machine: `preferred` (the spec's) where it is, else the first free
        one of PORT_RANGE not in `avoid` (the ports other tasks of this machine were given)."""
        taken = set(avoid)
        if preferred not in taken and _can_bind(preferred):
            return preferred
        low, high = PORT_RANGE
        for port in range(low + (os.getpid() % 997) * 7, high):
            if port not in taken and _can_bind(port):
                return port
        for port in range(low, high):
            if port not in taken and _can_bind(port):
                return port
        raise OSError(errno.EADDRINUSE, f'no free port in {low}-{high}')

    def start(self, plan: TaskPlan) -> TaskRecord:
        """Start the task (on the spawner thread) with the GPUs Ray gave this actor (none: an
        empty CUDA_VISIBLE_DEVICES, or a ps would see every GPU of the node). Of the actor's own
        environment it takes what a local task takes of the launcher's (local.backend.inherited),
        so not what Ray set for the actor (OMP_NUM_THREADS: its 1 CPU would hold TensorFlow's
        thread pools to one thread)."""
        import ray
        gpus = ray.get_runtime_context().get_accelerator_ids().get('GPU', [])
        env = {GPUS_ENV: ','.join(str(g) for g in gpus), **plan.env}     # a spec's own value wins
        with self._lock:
            record = self._spawner.submit(self._local.start, replace(plan, env=env)).result()
            self._record = record
        return record

    def wait_exit(self, pid: int) -> int | None:
        """Block until the task `pid` ends; its exit code (negative: the signal), None if it is
        not this actor's."""
        record = self._record
        if record is None or record.pid != pid:
            return None
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            pass
        with self._lock:
            seen = self._local.status(record)
        return seen.exit_code if seen.state == ENDED else None

    def observe(self) -> Observation | None:
        """The task's state now (stopped, in uninterruptible sleep), None before any start."""
        with self._lock:
            return self._local.status(self._record) if self._record is not None else None

    def send_signal(self, signum: int) -> str | None:
        """Signal the task's own process: None when sent, else why not."""
        if self._record is None:
            return 'has not started'
        with self._lock:
            return self._local.send_signal([self._record], signum)[self._record.name]

    def stop(self, grace: float) -> bool:
        """SIGTERM the task's group, SIGKILL after `grace`: True once nothing of it runs."""
        if self._record is None:
            return True
        with self._lock:
            self._local.stop([self._record], grace=grace)
            return not self._local.status(self._record).alive

    # -- files on this node, for a node that does not share the launcher's train_dir (files.py)
    def prepare(self, plans: list[TaskPlan], spec_yaml: str) -> None:
        """What the launcher's prepare writes for tasks that share its files, here: the workdir,
        the tasks' log folders and the spec file they read (`plans` carry this node's cwd)."""
        for cwd in {p.cwd for p in plans}:
            os.makedirs(cwd, exist_ok=True)
        self._local.prepare(plans, spec_yaml)

    def read(self, path: str, offset: int = 0, size: int = 1 << 20) -> bytes | None:
        """Up to `size` bytes of a file on this node from `offset`; None where it is not there."""
        try:
            with open(path, 'rb') as f:
                f.seek(offset)
                return f.read(size)
        except OSError:
            return None

    def read_text(self, path: str) -> str | None:
        """A small file on this node (a channel, a checkpoint index, a pulse), as rundir reads one."""
        return read_text(path)

    def no_room(self, path: str) -> str | None:
        """Why the file system under `path` on this node has no room left, or None."""
        return no_room(path)

    def renew(self, plans: list[TaskPlan], text: str | None = None) -> None:
        """Renew these tasks' lease files on this node (`plans` carry this node's cwd), as the
        launcher renews its own tasks' (base.touch_leases)."""
        touch_leases(plans, text=text)

    def ping(self) -> int:
        return os.getpid()
