"""Local backend: each task is a child process in its own session (so its process group can be
signalled as a whole and a terminal's Ctrl-C reaches only the launcher), output to its log file.
With `isolation: netns` every task runs in the run's private network namespace (launch/backends/netns.py)."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

from cluster.rehearsal.argv import REHEARSAL_MODULE
from cluster.runtime import children, hostinfo, ports
from cluster.runtime.contract import TASK_MODULE
from cluster.runtime.standby import STANDBY_MODULE, ZYGOTE_MODULE
from cluster.runtime.messages import channel_beside, channel_env, clear_channel
from cluster.runtime.ports import port_in_use
from launch.backends import marks, netns, sessions
from launch.backends.local.standby import LocalStandbys, kill_left, train_dir_of
from launch.backends.local.zygote import AdoptedChild, Child, Zygotes
from launch.backends.procstat import STATE, process_ident, read_stat_fields
from launch.backends.tail import FileTail, follow_file
from launch.system import poll_until
from cluster.runtime.rundir import PRIVATE, read_text, write_atomically
from launch.backends.probes import HOST_PROBE
from launch.backends.base import (ENDED, RUNNING, STOP_GRACE_SECS, Backend, BackendError, HostCheck,
                            Observation, busy_port, TaskRecord, handle_of, link_attempt_log,
                            local_disk_full, planned_record, touch_leases)
from launch.planning.plan import TaskPlan

if TYPE_CHECKING:
    import threading

    import grpc

log = logging.getLogger(__name__)

IMPORT_TIMEOUT = 60    # seconds `launch check` gives the tasks' Python to import TensorFlow


def gpu_count() -> int:
    """The NVIDIA GPUs this machine has, asked as a remote host is (cluster/runtime/hostinfo.py)."""
    return hostinfo.gpu_count()


# What a local task takes from the launcher's environment: what running the same Python needs
# (the search paths, the virtualenv or conda environment, the locale, home and temporary folder),
# the proxies, and tfcluster's own knobs (TFCLUSTER_PROFILE). Anything else a task should see is
# the spec's `env:`, which every backend passes alike; an SSH task sees its login environment.
INHERITED = frozenset({'PATH', 'HOME', 'USER', 'LOGNAME', 'SHELL', 'LANG', 'LANGUAGE', 'TZ', 'TMPDIR', 'TERM',
                       'LD_LIBRARY_PATH', 'VIRTUAL_ENV', 'SSL_CERT_FILE', 'SSL_CERT_DIR'}
                      | {f'{name}_proxy' for name in ('http', 'https', 'ftp', 'no', 'all')}
                      | {f'{name}_PROXY' for name in ('HTTP', 'HTTPS', 'FTP', 'NO', 'ALL')})
INHERITED_PREFIXES = ('LC_', 'PYTHON', 'CONDA_', 'PYENV_', 'TFCLUSTER_')


def inherited(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the launcher's environment a local task starts with (INHERITED)."""
    return {k: v for k, v in environ.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)}


# A task's state as psutil names it -> why it cannot answer though it runs (None: it can).
NOT_ANSWERING = {psutil.STATUS_STOPPED: 'is stopped (SIGSTOP, or a debugger)',
                 psutil.STATUS_TRACING_STOP: 'is stopped (SIGSTOP, or a debugger)',
                 psutil.STATUS_DISK_SLEEP: 'is in uninterruptible sleep (disk or network I/O)'}


# A task's state letter in /proc/PID/stat -> why it cannot answer though it runs (as NOT_ANSWERING).
STATE_LETTERS = {'T': NOT_ANSWERING[psutil.STATUS_STOPPED], 't': NOT_ANSWERING[psutil.STATUS_TRACING_STOP],
                 'D': NOT_ANSWERING[psutil.STATUS_DISK_SLEEP]}
STOPPED_SECS = 5.0      # how long status_many trusts what /proc said of a running task's state (D, t)


def not_answering(pid: int) -> str | None:
    """Why the running process `pid` cannot answer (stopped, in uninterruptible sleep), or None:
    one read of /proc/PID/stat where there is one (no psutil object), else psutil's status."""
    if os.path.isdir('/proc'):
        fields = read_stat_fields(pid)
        return STATE_LETTERS.get(fields[STATE]) if fields else None
    return NOT_ANSWERING.get(process_status(pid) or '')


def process_status(pid: int) -> str | None:
    """psutil's status of `pid` ('running', 'stopped', ...), or None if it is gone."""
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return None


def process_cmdline(pid: int) -> str:
    """The command line of `pid`, its arguments joined by spaces ('' if it is gone)."""
    try:
        return ' '.join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ''


@dataclass
class LocalHandle:
    """A local task's own facts: the network namespace it runs in, if any (isolation: netns)."""
    netns: str | None = None


def _reap(proc: Child) -> int | None:
    """The child's exit code once it has ended, None while it runs. Before the ended child is
    reaped, whatever is left of its session (its command, anything that started) is killed: its
    unreaped pid keeps the session's id from naming any other process meanwhile, and a restart
    finds the task's port free."""
    if proc.returncode is None:
        try:
            ended = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:       # reaped already: poll() has its code
            ended = False
        if ended:
            sessions.end_session(proc.pid)
    return proc.poll()


def _child_reports(options: int) -> Iterator[os.waitid_result]:
    """What waitid reports of any child of this process with `options` (WNOHANG added), one report
    after another until it has none (or there are no children at all)."""
    while True:
        try:
            found = os.waitid(os.P_ALL, 0, options | os.WNOHANG)
        except ChildProcessError:
            return
        if found is None:
            return
        yield found


class LocalBackend(Backend):
    name = 'local'
    records_channel = True      # the channel: a file here
    start_window = max(8, 4 * (os.cpu_count() or 1))    # its tasks share this machine's cores

    def __init__(self, death_signal: int | None = None) -> None:
        # The signal a task gets when this process ends (PR_SET_PDEATHSIG), None: none. A Ray
        # actor that keeps a task sets it (launch/backends/ray/actor.py); the launcher does not:
        # its tasks outlive it by their lease, so a launcher restarted in time finds them.
        self._death_signal = death_signal
        self._children: dict[int, Child] = {}
        self._stopped: dict[int, str | None] = {}     # running children's not_answering, read at _stopped_at
        self._stopped_at = -STOPPED_SECS
        self._halted: set[int] = set()      # children the kernel said stopped (SIGSTOP) and not since continued
        self._namespaces: set[str] = set()      # made (or taken over) by this launcher: deleted by close()
        self._standbys = LocalStandbys(self._children, self._halted, self._task_env)
        self._zygotes = Zygotes(self._task_env)

    def prepare(self, plans: list[TaskPlan], spec_yaml: str) -> None:
        for ns in sorted({p.netns for p in plans if p.netns}):
            netns.create(ns)
            self._namespaces.add(ns)
        for plan in plans:
            os.makedirs(os.path.dirname(os.path.join(plan.cwd, plan.log_path)) or '.', exist_ok=True)
            spec_file = os.path.join(plan.cwd, plan.spec_path)
            os.makedirs(os.path.dirname(spec_file) or '.', exist_ok=True)
            write_atomically(spec_file, spec_yaml, PRIVATE)
        # Standbys of a launcher that died (taken over now, under the train_dir's lock): the lease
        # they watch is renewed again, so they would wait, unused, until the run ends.
        kill_left({train_dir_of(p) for p in plans}, frozenset(self._children))

    @staticmethod
    def busy(plans: list[TaskPlan]) -> list[TaskPlan]:
        """The local tasks whose port something on this machine already listens on (a task in a
        private network namespace has the namespace's ports to itself)."""
        return [p for p in plans if not p.netns and port_in_use(p.task.port)]

    def check(self, plans: list[TaskPlan], imports: bool = False) -> list[HostCheck]:
        if not plans:
            return []
        problems = [busy_port(p.name, p.task.port, p.task.host) + ports.held_by(p.task.port) for p in self.busy(plans)]
        busy = problems[0] if problems else ''
        version = ''
        if imports:
            python = plans[0].argv[0]
            try:
                probe = subprocess.run([python, '-c', HOST_PROBE, '--import'], cwd=plans[0].cwd,
                                       stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                       timeout=IMPORT_TIMEOUT, env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'})
                found = json.loads(probe.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                found = {'missing': [f'tensorflow (the import took over {IMPORT_TIMEOUT}s)']}
            except (ValueError, IndexError):
                last = (probe.stderr.strip().splitlines() or [f'exit {probe.returncode}'])[-1]
                found = {'missing': [f'tensorflow ({last})']}
            if found['missing']:
                problems.insert(0, f'python {python} cannot import {" nor ".join(found["missing"])}')
            else:
                version = f', tensorflow {found["tensorflow"]}'
        if problems:
            return [HostCheck('localhost', False, '; '.join(problems), refusal=busy if problems[0] == busy else '')]
        where = sorted({p.netns for p in plans if p.netns})    # a fresh namespace has every port free
        return [HostCheck('localhost', True, f'{len(plans)} task(s){version}, ports '
                                             f'{", ".join(str(p.task.port) for p in plans)} free'
                                             + (f' (in network namespace {where[0]})' if where else ''))]

    def gpu_counts(self, plans: list[TaskPlan]) -> dict[str, int]:
        return {p.task.host: gpu_count() for p in plans[:1]}

    def start(self, plan: TaskPlan) -> TaskRecord:
        log_file = link_attempt_log(plan.cwd, plan)
        clear_channel(channel_beside(os.path.abspath(log_file)))   # its records: this start's alone
        marks.clear(marks.of_plan(plan))        # a stop mark was for an earlier copy
        env = {**self._task_env(plan), **channel_env(os.path.abspath(log_file))}
        warm = self._standbys.become(plan, env, log_file)     # a standby of its host becomes it, or None
        if warm is not None:
            pid, ident, offset = warm
        else:
            forked = self._zygotes.fork(plan, env, log_file)     # at start-up, or None
            child: Child
            if forked is not None:
                pid, ident, offset = forked
                child = AdoptedChild(pid)
            else:
                with open(log_file, 'ab') as out:       # a task restarted in the same attempt appends
                    offset = out.tell()
                    argv = netns.wrap(plan.netns, plan.argv) if plan.netns else plan.argv
                    child = subprocess.Popen(argv, cwd=plan.cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             preexec_fn=self._preexec())
                pid, ident = child.pid, process_ident(child.pid) or ''
            self._children[pid] = child
            self._halted.discard(pid)       # a pid used before: the earlier child's stop is not this one's
        t = plan.task
        return TaskRecord(name=t.name, job=t.job, index=t.index, host=t.host, port=t.port, backend=self.name,
                          pid=pid, log=os.path.abspath(log_file), ident=ident, cwd=os.path.abspath(plan.cwd),
                          log_offset=offset, handle=LocalHandle(plan.netns), warm=warm is not None)

    @staticmethod
    def _task_env(plan: TaskPlan) -> dict[str, str]:
        """What a task starts with but its channel: the launcher's inherited part, then the plan's."""
        return {**inherited(os.environ), **plan.env}

    def tend(self, plans: list[TaskPlan], per_host: int) -> None:
        self._standbys.tend(plans, per_host)

    def preload(self, plans: list[TaskPlan]) -> None:
        if self._death_signal is None:      # a Ray actor's backend runs one task: nothing to share
            self._zygotes.open(plans)

    def unload(self) -> None:
        self._zygotes.close()

    def standby_views(self) -> list[tuple[str, int, str]]:
        return self._standbys.views()

    def _preexec(self) -> Callable[[], None] | None:
        return children.die_with(os.getpid(), self._death_signal) if self._death_signal else None

    def renew(self, plans: list[TaskPlan], text: str | None = None) -> None:
        touch_leases(plans, text=text)

    def probe(self, record: TaskRecord, timeout: float, handshake: bool = True,
              channel_ready: grpc.Future | None = None) -> bool:
        # A task in a namespace is out of the launcher's own reach: ask from inside (launch/backends/netns.py).
        ns = handle_of(record, LocalHandle).netns
        if not ns:
            return super().probe(record, timeout, handshake, channel_ready)
        ask = netns.answers if handshake else netns.listening
        return ask(ns, record.host, record.port, 0.5 if channel_ready is not None else timeout)

    def release(self, plans: list[TaskPlan]) -> None:
        for ns in sorted({p.netns for p in plans if p.netns}):
            netns.delete(ns)
            self._namespaces.discard(ns)
        left = kill_left({train_dir_of(p) for p in plans}, frozenset(self._children))     # an earlier launcher's standbys
        if left:
            log.info('killed %d standby(s) an earlier launcher left', left)

    def close(self) -> None:
        """Delete the namespaces this launcher made, once every task in them is stopped (one whose
        tasks could not be stopped stays, for `launch down`); kill the standbys."""
        self._standbys.close()
        self._zygotes.close()
        for ns in sorted(self._namespaces):
            try:
                netns.delete(ns)
            except BackendError as e:
                log.warning('%s; `launch down` removes it once they are stopped', e)
        self._namespaces.clear()

    def status(self, record: TaskRecord) -> Observation:
        proc = self._children.get(record.pid)
        code = _reap(proc) if proc is not None else (None if self._ours(record) else 0)
        if code is not None:
            # A task of this launcher's has nothing left (_reap); one of another's may have.
            left = () if proc is not None else tuple(p.pid for p in self._left(record))
            return Observation(ENDED, code, left=left)
        return Observation(RUNNING, stopped=not_answering(record.pid))

    def status_many(self, records: Sequence[TaskRecord]) -> dict[str, Observation]:
        """Every task's state from what the kernel tells a parent: the children that ended since
        the last look (_reap_ended) and those stopped or continued (_halts), none asked one by one;
        and, at most every STOPPED_SECS, one read of each running task's /proc stat for what the
        kernel does not report (uninterruptible sleep, a debugger's stop). A supervisor's round
        costs O(changed), not a look per task."""
        self._reap_ended()
        self._halts()
        now = time.monotonic()
        if now - self._stopped_at >= STOPPED_SECS:
            self._stopped, self._stopped_at = {}, now
        out = {}
        for r in records:
            proc = self._children.get(r.pid)
            if proc is None:            # another launcher's task: looked at on its own
                out[r.name] = self.status(r)
            elif proc.returncode is not None:
                out[r.name] = Observation(ENDED, proc.returncode)
            elif r.pid in self._halted:
                out[r.name] = Observation(RUNNING, stopped=STATE_LETTERS['T'])
            else:
                if r.pid not in self._stopped:
                    self._stopped[r.pid] = not_answering(r.pid)
                out[r.name] = Observation(RUNNING, stopped=self._stopped[r.pid])
        return out

    def _halts(self) -> None:
        """Take the kernel's reports of children stopped (SIGSTOP, SIGTSTP) or continued since
        the last look (waitid WSTOPPED|WCONTINUED: each report is given once; exits are left to
        _reap_ended)."""
        for found in _child_reports(os.WSTOPPED | os.WCONTINUED):
            if found.si_code in (os.CLD_STOPPED, os.CLD_TRAPPED):
                self._halted.add(found.si_pid)
            else:
                self._halted.discard(found.si_pid)
                self._stopped.pop(found.si_pid, None)    # a continued task's /proc letter is old news
        self._halted = {pid for pid in self._halted if (child := self._children.get(pid)) and child.returncode is None}

    def _reap_ended(self) -> None:
        """Reap each child that has ended (its session ended first, _reap), found by waitid on
        any child, which names one ended child without reaping it. A child that is no task's
        (a command another thread waits for) blocks that scan: then every task is polled."""
        reaped: set[int] = set()
        for found in _child_reports(os.WEXITED | os.WNOWAIT):
            proc = self._children.get(found.si_pid)
            if proc is None or found.si_pid in reaped:
                for child in list(self._children.values()):
                    if child.returncode is None:
                        _reap(child)
                return
            reaped.add(found.si_pid)
            _reap(proc)

    def _left(self, record: TaskRecord) -> list[psutil.Process]:
        """What still runs of an ended task that another launcher started (sessions.left_behind)."""
        if record.pid in self._children:
            return []
        return sessions.left_behind(record.pid, record.job, record.index)

    def _ours(self, record: TaskRecord) -> bool:
        """Whether the record's pid still runs the task this launcher (or an earlier one) started."""
        proc = self._children.get(record.pid)
        if proc is not None:
            return _reap(proc) is None
        ident = process_ident(record.pid)
        if ident is None or (record.ident and ident != record.ident):
            return False
        command = process_cmdline(record.pid)
        # a task, a standby that became one, one a start-up zygote forked, or a rehearsal's stand-in
        return any(m in command for m in (TASK_MODULE, STANDBY_MODULE, ZYGOTE_MODULE, REHEARSAL_MODULE))

    def send_signal(self, records: list[TaskRecord], signum: int) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for r in records:
            try:
                if not self._ours(r):
                    raise ProcessLookupError
                os.kill(r.pid, signum)      # the task's own process (`ip netns exec` execs it)
                out[r.name] = None
            except ProcessLookupError:
                out[r.name] = 'has ended'
            except PermissionError as e:
                out[r.name] = f'cannot be signalled ({e.strerror})'
        return out

    def stop(self, records: list[TaskRecord], grace: float = STOP_GRACE_SECS) -> None:
        marks.write(marks.of_record(r) for r in records)    # this SIGTERM is a stop, not a preemption notice
        live = [r for r in records if self._ours(r)]
        left = [p for r in records if r not in live for p in self._left(r)]     # its leader gone, its command not
        for sig in (signal.SIGTERM, signal.SIGKILL):
            sessions.signal_all(left, sig)
            _, left = psutil.wait_procs(left, timeout=grace if sig == signal.SIGTERM else 5.0)
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            for r in live:
                try:
                    os.killpg(r.pid, sig)
                    if sig == signal.SIGTERM:       # a stopped (SIGSTOP) task handles it only once resumed
                        os.killpg(r.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            # poll_until calls the lambda before it returns: `live` is this turn's (B023 fears a later call)
            poll_until(lambda: not any(self._ours(r) for r in live), time.monotonic() + wait)  # noqa: B023
            live = [r for r in live if self._ours(r)]
            if not live:
                break

    def read_file(self, record: TaskRecord, path: str) -> str | None:
        return read_text(os.path.join(record.cwd, path))

    def disk_full(self, record: TaskRecord) -> str | None:
        return local_disk_full(record)      # the log is a file here

    def log_record(self, plan: TaskPlan) -> TaskRecord:
        return planned_record(plan, os.path.abspath(os.path.join(plan.cwd, plan.log_path)),
                              os.path.abspath(plan.cwd), self.name)

    def read_log(self, record: TaskRecord, follow: bool = False, stop: threading.Event | None = None,
                 offset: int = 0) -> Iterator[str]:
        return follow_file(record.log, stop if follow else None, offset=offset)

    def log_tail(self, record: TaskRecord, offset: int = 0) -> FileTail:
        """The log is a file here: read at each poll, no thread and no open file of its own."""
        return FileTail(record.log, offset, written_here=True)
