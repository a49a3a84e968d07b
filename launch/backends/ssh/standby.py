"""The SSH backend's warm standbys (launch/backends/standby.py keeps the book; the contract with the
standby process is cluster/runtime/standby.py).

A standby starts the way a task does (scripts.py: `setsid nohup sh -c WRAPPER`, its environment
from an env file), with the slot's files as its TaskFiles (SLOT.log, .pid, .task, .rc in the host's
standby folder): once it becomes a task, the status snapshot, the stop and the exit code work
on it unchanged. It gets what a task of its host gets from sshd, plus only the names of the plan's
environment that TensorFlow reads at import (import_env) and the lease: nothing of one task. So
when it becomes one, the Become sends the task's whole plan environment and its channel, to be set
over its own (Become.keep_env): exactly what a cold start's env file gives.

Everything on a host is one command: `tend` (about each second, from the leases' thread) kills
what the pool dooms, reports every slot (its ready file's age measured on the host, the Ready
record, the process's state letter and start time) and spawns what the pool wants, in one script;
a start hands each task that a standby can take to one in one script per host (become_script),
and starts cold, in the same call, every task that none took.
"""
from __future__ import annotations

import dataclasses
import logging
import posixpath
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import invoke

from cluster.runtime import rundir
from cluster.runtime.contract import LEASE_ENV, LEASE_SECS_ENV
from cluster.runtime.messages import channel_env
from cluster.runtime.ports import RUN_ENV
from cluster.runtime.standby import (BECOME_SECS, Become, Ready, SlotFiles, import_env, slot_files, standby_argv,
                                     standby_dir)
from launch.backends import marks
from launch.backends.base import TaskRecord
from launch.backends.ssh.connections import COMMAND_TIMEOUT, SSHError, parallel
from launch.backends.ssh.scripts import (STARTED, Started, TaskFiles, TaskProcess, detach, end_earlier_copy,
                                         env_file_text, host_script, parse_host_script, parse_started, q,
                                         spec_made_absolute, start_preamble, starttime, task_command, write_env_file)
from launch.backends.standby import Slot, StandbyPool, Want, plan_key, wants
from launch.planning.plan import TaskPlan

log = logging.getLogger(__name__)

SLOT_MARK = 'tfcluster-standby'      # a tend answer's line for each slot: SLOT_MARK slot|age|stat|ready
COLD = 'tfcluster-cold'              # a become's answer when its standby could not take the task
BECAME_POLL_SECS = 0.01              # how often a become script looks for the became file
STAT_SH = "sed 's/.*) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f1,20"   # state letter, start time


# -- the scripts (pure text) ---------------------------------------------------------------------

def standby_env(plan: TaskPlan) -> dict[str, str]:
    """What a standby for tasks like `plan` gets over what sshd gives it: the plan's names that
    TensorFlow reads at import, and the lease (it leaves with a launcher that died); no task's own."""
    lease = {k: plan.env[k] for k in (LEASE_ENV, LEASE_SECS_ENV) if k in plan.env}
    return {**import_env(plan.env), **lease}


def slot_task_files(files: SlotFiles) -> TaskFiles:
    """The standby's TaskFiles (its wrapper's pid, its own pid, the exit code): beside its slot log."""
    return TaskFiles.beside(files.log)


def spawn_script(argv: list[str], workdir: str, files: SlotFiles, env: Mapping[str, str]) -> str:
    """Start a standby (`argv`, standby_argv) detached in `workdir` as a task is started, its output
    in the slot's log; answers the STARTED line (the wrapper's and the standby's pid and start time)."""
    tf = slot_task_files(files)
    return '\n'.join([
        f'cd {q(workdir)} || exit 1',
        f'mkdir -p {q(posixpath.dirname(files.log))} || exit 1',
        f'rm -f {q(tf.rcfile)} {q(tf.pidfile)} {q(tf.taskfile)} {q(files.ready)} {q(files.become)} {q(files.became)}',
        write_env_file(env_file_text(env), tf.envfile),
        'o=0',
    ] + detach(task_command(argv, tf.envfile), tf, files.log))


def kill_script(files: SlotFiles) -> str:
    """SIGKILL the standby's process group (its wrapper's, from its pid file, while that process is
    still this slot's wrapper: its command line names the slot's rc file), and remove its files but
    the log and the exit code."""
    tf = slot_task_files(files)
    return (f'p=$(cat {q(tf.pidfile)} 2>/dev/null); [ -n "$p" ] && tr "\\0" " " < /proc/$p/cmdline 2>/dev/null '
            f'| grep -qF {q(tf.rcfile)} && kill -KILL -$p 2>/dev/null; '
            f'rm -f {q(files.ready)} {q(files.become)} {q(files.become + ".new")} {q(files.became)} {q(tf.envfile)}')


def report_script(slots: Iterable[tuple[str, SlotFiles, int]]) -> str:
    """One line per slot (name, files, pid): SLOT_MARK name|age of the ready file in seconds, measured
    on the host ('-': none)|the process's state letter and start time|the Ready record."""
    lines = ['n=$(date +%s)']
    for name, files, pid in slots:
        lines.append(f'a=-; r=; if [ -f {q(files.ready)} ]; then m=$(stat -c %Y {q(files.ready)} 2>/dev/null) && '
                     f'a=$((n - m)); r=$(cat {q(files.ready)} 2>/dev/null); fi; '
                     f's=$({STAT_SH.format(pid=int(pid))}); printf "%s|%s|%s|%s\\n" {q(SLOT_MARK + " " + name)} '
                     '"$a" "$s" "$r"')
    return '\n'.join(lines)


class SlotSeen(NamedTuple):
    """A report's line for a slot: its ready file's age (None: no file), the Ready record (None: none
    or unreadable), the process's state letter and start time ('' each: no such process)."""
    age: int | None
    ready: Ready | None
    state: str
    ident: str


def parse_report(stdout: str) -> dict[str, SlotSeen]:
    """Slot name -> what the report saw (report_script); a slot missing was not reported."""
    out = {}
    for line in stdout.splitlines():
        if not line.startswith(SLOT_MARK + ' '):
            continue
        name, age, stat, ready = (line[len(SLOT_MARK) + 1:].split('|', 3) + ['', '', ''])[:4]
        state, ident = (stat.split() + ['', ''])[:2]
        try:
            record: Ready | None = Ready.parse(ready) if ready else None
        except ValueError:
            record = None
        out[name] = SlotSeen(int(age) if age.lstrip('-').isdigit() else None, record, state, ident)
    return out


def write_private(text: str, path: str) -> str:
    """Lines that write `text` to `path` whole (under PATH.new first, then renamed), readable by its
    owner alone before it holds a byte; the here-document is quoted, so nothing in it is expanded."""
    end = 'TFCLUSTER_BECOME_END'
    while end in text.splitlines():
        end += '_'
    return f"(umask 077 && cat > {q(path + '.new')} <<'{end}'\n{text}\n{end}\n) && mv {q(path + '.new')} {q(path)}"


@dataclass(frozen=True)
class BecomeTask:
    """One task's become on its host: where it runs (workdir, link: log_path, log_file: this
    attempt's log, legacy, mark, earlier: as a cold start has them), the standby it goes to (its
    slot's files and processes), and the Become to hand it."""
    workdir: str
    link: str
    log_file: str
    legacy: str
    mark: str
    earlier: TaskProcess | None
    files: SlotFiles
    standby: TaskProcess
    become: Become


def become_script(t: BecomeTask) -> str:
    """A cold start's preamble; then, while the standby is still the slot's (its start time) and not
    stopped, the become file written and BECOME_SECS waited for the became file. Answers the STARTED
    line (the log's size before, the slot's wrapper as the group, the standby as the task), the task's
    .pid and .task files written beside its log; or a COLD line, the standby's group killed, and its
    reason."""
    s, files, tf = t.standby, t.files, TaskFiles.beside(t.link)
    rounds = max(1, round(BECOME_SECS / BECAME_POLL_SECS))
    return '\n'.join(start_preamble(t.workdir, t.link, t.log_file, t.legacy, t.earlier, t.mark) + [
        f'cold() {{ rm -f {q(files.become)} {q(files.become + ".new")}; {end_earlier_copy(s)}; echo "{COLD} $1"; '
        'exit 0; }',
        f'[ "$({starttime(s.pid)})" = {q(s.ident or "-")} ] || cold "the standby (pid {s.pid}) is gone"',
        f'case "$({STAT_SH.format(pid=s.pid)})" in T*|t*|Z*|X*) cold "the standby (pid {s.pid}) is stopped";; esac',
        f'o=$(wc -c < {q(t.log_file)} 2>/dev/null || echo 0)',
        f'rm -f {q(files.became)}',
        write_private(t.become.to_json(), files.become) + ' || cold "cannot write its become file"',
        f'i=0; while [ ! -s {q(files.became)} ] && [ $i -lt {rounds} ]; do sleep {BECAME_POLL_SECS:g}; '
        'i=$((i + 1)); done',
        f'[ -s {q(files.became)} ] || cold "the standby (pid {s.pid}) did not take it within {BECOME_SECS:g}s"',
        f'echo {s.pid} > {q(tf.taskfile)}; echo {s.group} > {q(tf.pidfile)}',     # the became file stays: a task now
        f'echo "{STARTED} $o {s.group} {q(s.group_ident or "-")} {s.pid} {q(s.ident or "-")}"',
    ])


def left_script(folder: str, own: str) -> str:
    """SIGKILL the group of every standby an earlier launcher left waiting in `folder` (its wrapper
    still the slot's: its command line names the slot's rc file), but one that became a task (its
    became file) and this launcher's own (slot names starting `own`); prints each group killed.
    A launcher taking over renews the lease they watch: left alone, they would wait, unused, until
    the run ends."""
    return (f'for f in {q(folder)}/*.pid; do [ -f "$f" ] || continue; b=${{f%.pid}}; '
            f'case "${{b##*/}}" in {q(own)}*) continue;; esac; [ -e "$b.became" ] && continue; '
            'p=$(cat "$f" 2>/dev/null); [ -n "$p" ] && tr "\\0" " " < /proc/$p/cmdline 2>/dev/null | '
            'grep -qF "$b.rc" && kill -KILL -$p 2>/dev/null && echo "$p"; '
            'rm -f "$b.ready" "$b.become" "$b.become.new" "$b.env"; done; true')


def cold_reason(said: str) -> str:
    """Why a become script's standby did not take its task ('' if it did, or the script said nothing)."""
    return next((line[len(COLD) + 1:] for line in said.splitlines() if line.startswith(COLD + ' ')), '')


# -- the book and the commands -------------------------------------------------------------------

class SSHHost(Protocol):
    """What the standbys need of the backend (backend.py's SSHBackend)."""

    def _run(self, name: str, script: str, timeout: float = ...) -> invoke.Result: ...
    def _workdir(self, name: str, cwd: str) -> str: ...
    def _earlier(self, plan: TaskPlan) -> TaskProcess | None: ...
    def _note_started(self, record: TaskRecord) -> None: ...
    def _started_record(self, plan: TaskPlan, started: Started, workdir: str, log_file: str,
                        files: TaskFiles) -> TaskRecord: ...


@dataclass
class _Kept:
    """What the backend keeps of a slot beside the pool's Slot: its files, and its processes once
    spawned (the wrapper leads its group; the standby is the task's pid to be)."""
    files: SlotFiles
    process: TaskProcess | None = None


@dataclass(frozen=True)
class _Round:
    """One tend's work on one host, decided under the lock: the slots to kill, to spawn (with the
    plan each is for), to report on."""
    kills: list[SlotFiles]
    spawns: list[tuple[Slot, TaskPlan]]
    watched: list[Slot]


class SSHStandbys:
    """The standbys of one SSHBackend. `tend` runs in the leases' thread and `become` in the one
    that starts tasks: one lock keeps the book, never held over a remote command."""

    def __init__(self, backend: SSHHost) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._pool: StandbyPool | None = None
        self._kept: dict[tuple[str, str], _Kept] = {}
        self._closed = False        # the run is over: a tend still in flight kills what it spawned
        # Its slots' prefix: a launcher taking over never reuses a slot's files, nor kills its own as left.
        self._prefix = f'{uuid.uuid4().hex[:6]}-'

    # -- the leases' thread ---------------------------------------------------------------------

    def tend(self, plans: list[TaskPlan], per_host: int) -> None:
        """Kill what the pool dooms, see every slot, spawn what each host lacks: one command per host."""
        if not plans:
            return
        with self._lock:
            if self._closed or (self._pool is None and not per_host):
                return      # none wanted and none ever made: no look at every plan each second
            if self._pool is None:
                self._pool = StandbyPool(plans[0].env.get(RUN_ENV, ''), prefix=self._prefix)
            keys = {p.name: plan_key(p, p.env) for p in plans}
            want = wants(((p.task.host, keys[p.name]) for p in plans), per_host)
            rounds = self._plan_round(self._pool, plans, keys, want)
        parallel(lambda item: self._tend_host(*item), rounds.items())

    def _plan_round(self, pool: StandbyPool, plans: list[TaskPlan], keys: Mapping[str, str | None],
                    want: Mapping[str, Want]) -> dict[str, _Round]:
        now = time.time()
        rounds: dict[str, _Round] = {}

        def on(host: str) -> _Round:
            return rounds.setdefault(host, _Round([], [], []))
        for slot in pool.doomed(want, now):
            kept = self._kept.pop((slot.host, slot.slot), None)
            if kept is not None:
                on(slot.host).kills.append(kept.files)
        for host, key in pool.spawns(want):
            plan = next((p for p in plans if p.task.host == host and keys[p.name] == key and LEASE_ENV in p.env), None)
            if plan is not None:        # a standby needs the run's lease, to leave with a launcher that died
                on(host).spawns.append((pool.new(host, key, now), plan))
        for slot in pool.slots.values():
            if slot.pid and (slot.host, slot.slot) in self._kept:
                on(slot.host).watched.append(slot)
        return rounds

    def _tend_host(self, host: str, work: _Round) -> None:
        """The host's round in one command; what it saw goes to the pool."""
        try:
            spawns = [(slot, *self._spawn_part(host, slot, plan)) for slot, plan in work.spawns]
            with self._lock:
                watched = [(s, self._kept[(host, s.slot)].files) for s in work.watched if (host, s.slot) in self._kept]
            script = '\n'.join([f'({kill_script(f)})' for f in work.kills]
                               + [report_script((s.slot, f, s.pid) for s, f in watched)]
                               + [host_script((slot.slot, text) for slot, _, text in spawns)])
            result = self._backend._run(host, script)
        except SSHError as e:
            log.debug('keeping the standbys of %s failed: %s', host, e)
            with self._lock:
                for slot, _ in work.spawns:
                    StandbyPool.died(slot)      # the next round kills whatever it started (its pid file)
            return
        seen_at = time.time()
        seen = parse_report(result.stdout)
        answers = parse_host_script(result.stdout)
        with self._lock:
            closed = self._closed
        if closed:      # closed while this round ran: what it spawned goes too (close could not see its pid)
            self._kill_now(host, [files for _, files, _ in spawns])
            return
        with self._lock:
            for slot, _ in watched:
                if self._pool is not None and self._pool.slots.get((host, slot.slot)) is slot and slot.slot in seen:
                    self._saw(slot, seen[slot.slot], seen_at)
            for slot, _, _ in spawns:
                self._spawned(slot, answers.get(slot.slot, ''))

    def _spawn_part(self, host: str, slot: Slot, plan: TaskPlan) -> tuple[SlotFiles, str]:
        """The slot's files and the script that spawns its standby for tasks like `plan` (noted)."""
        workdir = self._backend._workdir(host, plan.cwd)
        folder = standby_dir(posixpath.join(workdir, posixpath.dirname(plan.spec_path)), host)
        files = slot_files(folder, slot.slot)
        with self._lock:
            self._kept[(host, slot.slot)] = _Kept(files)
        argv = standby_argv(plan.argv[0], folder, slot.slot, slot.run, slot.key, bool(plan.keras),
                            posixpath.join(workdir, plan.env[LEASE_ENV]), float(plan.env.get(LEASE_SECS_ENV, 45)))
        return files, spawn_script(list(argv), workdir, files, standby_env(plan))

    def _spawned(self, slot: Slot, said: str) -> None:
        started = parse_started(said)
        kept = self._kept.get((slot.host, slot.slot))
        if started is None or kept is None:
            log.debug('no standby spawned in %s on %s: %s', slot.slot, slot.host, said.strip()[-200:])
            StandbyPool.died(slot)
            return
        kept.process = started.process
        StandbyPool.spawned(slot, started.process.pid, started.process.ident)

    @staticmethod
    def _saw(slot: Slot, seen: SlotSeen, seen_at: float) -> None:
        """A report's line to the pool: a process gone (or another in its pid) died; a stopped one
        is halted; the ready file's age, measured on the host, is the heartbeat on this clock."""
        if seen.ident != slot.ident or seen.state in ('', 'Z', 'X'):
            StandbyPool.died(slot)
            return
        beat = None if seen.age is None else seen_at - seen.age
        StandbyPool.seen(slot, seen.ready if seen.age is not None else None, beat, halted=seen.state in ('T', 't'))

    # -- the thread that starts tasks -------------------------------------------------------------

    def become(self, host: str, plans: list[TaskPlan]) -> tuple[list[TaskRecord], list[TaskPlan]]:
        """Hand each of these tasks of `host` that a standby may take to one, in one command: the
        records of those started so, and the plans left to start cold (no standby, or one that did
        not take its task: it was killed there)."""
        with self._lock:
            if self._pool is None:
                return [], plans
            picked, cold, now = [], [], time.time()
            for plan in plans:
                slot = self._pool.pick(host, plan_key(plan, plan.env), now)
                kept = None if slot is None else self._kept.get((host, slot.slot))
                if slot is not None and (kept is None or kept.process is None):
                    StandbyPool.died(slot)
                    slot = None
                if slot is None or kept is None or kept.process is None:
                    cold.append(plan)
                else:
                    picked.append((plan, slot, kept.files, kept.process))
        if not picked:
            return [], cold
        tasks = [(plan, slot, self._become_task(host, plan, files, process)) for plan, slot, files, process in picked]
        try:
            result = self._backend._run(host, host_script((plan.name, become_script(t)) for plan, _, t in tasks),
                                        timeout=COMMAND_TIMEOUT + BECOME_SECS * len(tasks))
        except SSHError as e:
            # A standby may have become its task before the answer was lost: killed, or the cold start
            # would find its port held.
            self._kill_now(host, [t.files for _, _, t in tasks])
            raise SSHError(host, f'{e.cause}; the standbys handed {", ".join(p.name for p, _, _ in tasks)} were killed') from None
        return self._took(host, tasks, parse_host_script(result.stdout), cold)

    def _become_task(self, host: str, plan: TaskPlan, files: SlotFiles, process: TaskProcess) -> BecomeTask:
        """What a become of `plan`'s task needs: its places on the host as a cold start has them."""
        workdir = self._backend._workdir(host, plan.cwd)
        link = posixpath.join(workdir, plan.log_path)
        log_file = posixpath.join(workdir, plan.attempt_log_path)
        become = Become(tuple(spec_made_absolute(plan.argv, workdir)), {**plan.env, **channel_env(log_file)},
                        workdir, log_file, keep_env=True)
        return BecomeTask(workdir, link, log_file, posixpath.join(posixpath.dirname(link), rundir.attempt_dirname(0)),
                          marks.of_plan(plan, workdir), self._backend._earlier(plan), files, process, become)

    def _took(self, host: str, tasks: list[tuple[TaskPlan, Slot, BecomeTask]], answers: Mapping[str, str],
              cold: list[TaskPlan]) -> tuple[list[TaskRecord], list[TaskPlan]]:
        """The records of the tasks a standby took; the others join `cold` (their standby is DEAD:
        the next tend forgets it, and kills it if the script could not)."""
        records = []
        for plan, slot, t in tasks:
            said = answers.get(plan.name, '')
            started = parse_started(said)
            with self._lock:
                if started is None:
                    StandbyPool.died(slot)
                    cold.append(plan)
                else:
                    self._kept.pop((host, slot.slot), None)
                    if self._pool is not None:
                        self._pool.taken(slot)
            if started is None:
                why = cold_reason(said) or ([x for x in said.splitlines() if x.strip()] or ['no answer'])[-1]
                log.warning('%s starts cold: %s', plan.name, why)
                continue
            record = self._backend._started_record(plan, started, t.workdir, t.log_file, slot_task_files(t.files))
            record = dataclasses.replace(record, warm=True)
            self._backend._note_started(record)
            records.append(record)
        return records, cold

    # -- the end --------------------------------------------------------------------------------

    def views(self) -> list[tuple[str, int, str]]:
        with self._lock:
            return self._pool.views() if self._pool else []

    def close(self) -> None:
        """Kill every standby (the run is over): one command per host."""
        with self._lock:
            self._closed = True
            kept, self._kept = self._kept, {}
            if self._pool is not None:
                self._pool.slots.clear()
        by_host: dict[str, list[SlotFiles]] = {}
        for (host, _), k in kept.items():
            by_host.setdefault(host, []).append(k.files)
        parallel(lambda item: self._kill_now(*item), by_host.items())

    def kill_left(self, host: str, folders: Iterable[str]) -> None:
        """Kill the standbys earlier launchers left waiting in these folders of `host` (left_script)."""
        try:
            result = self._backend._run(host, '\n'.join(left_script(f, self._prefix) for f in sorted(folders)))
        except SSHError as e:        # the start that follows reports the host; they leave by their lease
            log.warning('cannot look for standbys left on %s: %s', host, e)
            return
        if result.stdout.split():
            log.info('%s: killed %d standby(s) an earlier launcher left', host, len(result.stdout.split()))

    def _kill_now(self, host: str, files: list[SlotFiles]) -> None:
        try:
            self._backend._run(host, '\n'.join(f'({kill_script(f)})' for f in files) or 'true')
        except SSHError as e:
            log.warning('cannot kill the standbys on %s (%s): they leave by themselves once the lease is '
                        'no longer renewed', host, e)
