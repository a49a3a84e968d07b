"""The supervised strategy of `launch up` (local processes, SSH, compose): start every task
through its Backend, wait for every server, observe, supervise, tear down.

What happens when a task is lost or the run stops making progress is decided by
`launch/run/policy.py` (tolerate, restart, give up); this module observes the tasks, carries the
decisions out, and makes sure nothing is left running whichever way the run ends. Every stop asks
the chief for a checkpoint first, while the ps tasks still hold the variables.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping

import grpc

from cluster.runtime import rundir
from cluster.runtime.rundir import EXIT_FAILED, EXIT_NO_RESTART, EXIT_OK
from cluster.runtime.membership import Members
from cluster.spec import ClusterSpec
from launch.run import control
from launch.run import policy as supervise
from launch.backends.base import ENDED, UNKNOWN, Backend, BackendError, TaskRecord, process_ident, stop_all, tail
from launch.run.lifecycle import (CHECKPOINT_GRACE_SECS, Failure, Lifecycle, Outcome, RunResult, Strategy, is_chatter,
                              resume_hint)
from launch.planning.plan import TaskPlan, state_path
from launch.run.state import LaunchState
from launch.run.policy import Action, Decision, Policy, Progress, TaskState, TaskStatus, describe_exit

log = logging.getLogger(__name__)

LEASE_RENEW_SECS = 1.0          # how often the launcher renews its tasks' lease
PROBE_SECS = 3.0                # a stall probe's deadline for each task's gRPC server
SUPERVISE_SECS = 0.2            # how often the supervisor observes the tasks
FINAL_LINE = 295                # characters the line a failed run ends with keeps to (its cause's detail: the log)


class TaskFailed(Exception):
    """One line for the user, then the task's last log lines."""

    def __init__(self, message: str, log_tail: list[str] = (), code: int = 1):
        super().__init__(message)
        self.log_tail = list(log_tail)
        self.code = code            # the launcher's exit code
        self.task: str | None = None          # a task that died on the way, and its exit code
        self.exit_code: int | None = None


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1].rstrip() + '…'


def wait_for_servers(records: list[TaskRecord], backends: Mapping[str, Backend], deadline: float,
                     stop: threading.Event, reported: Callable[[str], bool] = lambda name: True) -> None:
    """Return once every task's gRPC server accepts connections and the task itself has reported
    serving (`reported(name)`: a port answered by some other process, say another cluster's task on
    the same port, proves nothing); raise TaskFailed naming the first task that died on the way or
    did not come up before the deadline."""
    # Retry connecting every 100-500 ms: gRPC's default backoff grows towards two minutes, so a
    # server that came up during a backoff would be noticed long after it was serving.
    options = [('grpc.enable_http_proxy', 0), ('grpc.initial_reconnect_backoff_ms', 100),
               ('grpc.min_reconnect_backoff_ms', 100), ('grpc.max_reconnect_backoff_ms', 500)]
    pending = {r.name: (r, grpc.insecure_channel(r.endpoint, options=options)) for r in records}
    futures = {name: grpc.channel_ready_future(ch) for name, (_, ch) in pending.items()}
    try:
        while pending and not stop.is_set():
            for name, (record, _) in list(pending.items()):
                backend = backends[record.backend]
                seen = backend.status(record)
                code = seen.exit_code if seen.state == ENDED else None
                if code is not None and code != 0:
                    failed = TaskFailed(f'{record.name} {describe_exit(code)} during start-up',
                                        _explaining_tail(record, backends))
                    failed.failures = [Failure(record.name, str(failed), record.host, record.pid or None)]
                    failed.task, failed.exit_code = record.name, code
                    raise failed
                if code == 0 or (backend.probe(record, 0.5, channel_ready=futures[name]) and reported(name)):
                    del pending[name]
            if pending and time.monotonic() > deadline:
                name, (record, _) = next(iter(pending.items()))
                if futures[name].done():
                    raise TaskFailed(f'{record.name}: {record.endpoint} answers, but not from this task '
                                     '(it never reported serving): another process holds that port?',
                                     _log_tail(record, backends))
                raise TaskFailed(f'{record.name} ({record.endpoint}) did not accept gRPC connections '
                                 f'in time; raise the limit with --start-timeout', _log_tail(record, backends))
            time.sleep(0.1)
    finally:
        for name, future in futures.items():
            future.cancel()
        for _, ch in pending.values():
            ch.close()


def _explaining_tail(record: TaskRecord, backends: Mapping[str, Backend], n: int = 10) -> list[str]:
    """A task's last log lines that may explain its end: its own error if it logged one, else
    its last lines without TensorFlow's start-up chatter."""
    lines = _log_tail(record, backends, 200)
    error = rundir.last_error_line(lines)
    if error:
        return [error]
    return [line for line in lines if not is_chatter(line)][-n:]


def _log_tail(record: TaskRecord, backends: Mapping[str, Backend], n: int = 15) -> list[str]:
    try:
        return tail(backends[record.backend].read_log(record, offset=record.log_offset), n)
    except Exception as e:  # a log we cannot read must not hide the failure itself
        return [f'(could not read {record.log}: {e})']


class SupervisedRun(Strategy):
    """The launcher runs every task itself, through the backends the plans name."""

    def __init__(self, spec: ClusterSpec, spec_yaml: str, plans: list[TaskPlan], backends: Mapping[str, Backend],
                 start_timeout: float = 120.0, finish_timeout: float = 60.0,
                 checks: Callable[[], None] | None = None, warn: Callable[[], None] | None = None,
                 workers: int | None = None):
        self.spec, self.spec_yaml, self.plans, self.backends = spec, spec_yaml, plans, backends
        # The spec's workers are a pool; these run (cluster/runtime/membership.py), each with the epoch
        # of its start. `launch scale` changes the set while the run goes on (launch/run/control.py).
        self.members = Members(1, {i: 1 for i in range(workers or spec.num_workers)})
        self._scaling: dict | None = None             # the scale request being carried out
        self._stepped: set[str] = set()               # workers whose current start logged a step
        self._retired: set[str] = set()               # workers failed over: never started again
        self._run_dir_fd: int | None = None           # the run's directory, held open (_check_run_dir)
        self.start_timeout, self.finish_timeout = start_timeout, finish_timeout
        self._checks = checks                        # the pre-flight, run by prepare()
        self._warn = warn                            # once per run: what the user should know (exposure)
        self.policy = Policy.of(dataclasses.replace(spec, live=workers))
        self.records: list[TaskRecord] = []          # the current start of every task, in plan order
        self.restarts = 0
        self.tolerated: set[str] = set()
        self.failures: list[Failure] = []            # every task lost in this attempt
        self.life: Lifecycle | None = None
        self._unknown_since: dict[str, float] = {}
        self._frozen_since: dict[str, float] = {}     # tasks seen stopped (SIGSTOP, paused), since
        self._serving: dict[str, threading.Event] = {}   # set once a task's own log says it serves
        self._done = threading.Event()
        self._progress_lock = threading.Lock()
        self._step: int | None = None                 # the newest global step seen in this start
        self._step_at = time.monotonic()
        self._state = LaunchState.new(spec.path, process_ident(os.getpid()) or '')
        self._last_fault: supervise.Fault | None = None     # the fault before the last restart
        self._last_fault_at: float | None = None
        self._streak = 0                              # restarts in a row (backoff)
        self._due: dict[str, float] = {}              # tasks to start again, and when (backoff)
        self._warned_step: int | None = -1            # the step a stall warning was given at
        self._state_error = False

    @property
    def say(self) -> Callable[[str], None]:
        return self.life.console.say

    @property
    def interrupted(self) -> threading.Event:
        return self.life.interrupted

    def prepare(self, life: Lifecycle) -> None:
        if self._checks is not None:
            self._checks()

    def read_file(self, path: str) -> str | None:
        chief = next((r for r in self.records if r.is_chief), None)
        if chief is None:
            return None
        return self.backends[chief.backend].read_file(chief, path)

    def hurry(self) -> None:
        self.say(f'{self.life.signal_name} again: killing every task now (SIGKILL, no checkpoint)')
        try:
            stop_all(list(self.records), self.backends, grace=0)
        except BackendError as e:
            self.say(f'error: {e}')

    # -- the run --------------------------------------------------------------------------
    def run(self, life: Lifecycle) -> Outcome:
        self.life = life
        t0 = time.monotonic()
        self.plans = [dataclasses.replace(p, attempt=life.attempt) for p in self.plans]
        if self._warn is not None and life.attempt == 1:
            self._warn()
        try:
            self._run_dir_fd = os.open(self.spec.train.train_dir, os.O_RDONLY | os.O_DIRECTORY)
            for name, backend in self.backends.items():
                backend.prepare([p for p in self.plans if p.backend == name], self.spec_yaml)
            for name in self.backends:      # one thread each: a slow SSH host never delays local leases
                self._renew(name)
                threading.Thread(target=self._renew_leases, args=(name,), name=f'lease-{name}', daemon=True).start()
            self._start(self._active_plans())
            spares = self.spec.num_workers - self.members.count
            self.say(f'started {len(self.records)} tasks; waiting for their servers'
                     + (f' ({spares} more worker(s) of the pool can join: `launch scale`)' if spares else ''))
            self._wait_ready(t0)
            if not self.interrupted.is_set():
                self.say(f'all {len(self.records)} servers are up after {time.monotonic() - t0:.1f}s')
                self._supervise()
            if self.interrupted.is_set():
                self.say(f'{life.signal_name} received: stopping every task (the chief saves a checkpoint first)')
                life.emit('interrupted', signal=life.signal_name)
                return self._outcome(128 + life.signum)
            mode = 'command' if self.spec.train.command else 'sync' if self.spec.train.sync else 'async'
            return self._outcome(EXIT_OK, f'done in {time.monotonic() - t0:.1f}s ({mode}, '
                                          f'{self.members.count} workers)')
        except (TaskFailed, BackendError, OSError) as e:    # OSError: e.g. a train_dir we cannot write
            self.say(f'error: {e}')
            for line in getattr(e, 'log_tail', ()):
                self.say(f'    {line}')
            return self._outcome(getattr(e, 'code', EXIT_FAILED), failures=getattr(e, 'failures', ()))
        finally:
            try:
                self._teardown()
            except BackendError as e:
                self.say(f'error: stopping the tasks failed: {e}; run `launch down {self.spec.path}`')
            if self._run_dir_fd is not None:
                os.close(self._run_dir_fd)
                self._run_dir_fd = None
            self._done.set()
            unknown = [r.name for r in self.records if self.backends[r.backend].status(r).alive]
            if not unknown:
                try:
                    os.remove(state_path(self.spec))
                except FileNotFoundError:
                    pass
            else:
                self.say(f'warning: {", ".join(unknown)} may still run (not stopped, or its host cannot be asked); '
                         f'`launch down {self.spec.path}` stops what is left')

    def _outcome(self, code: int, headline: str = '', failures=()) -> Outcome:
        """Every task lost on the way (tolerated, restarted or fatal), the fatal one's words last."""
        seen = {f.task for f in failures}
        every = [f for f in self.failures if f.task not in seen] + list(failures)
        return Outcome(code, headline, self.restarts, every, tuple(sorted(self.tolerated)))

    def _start(self, plans: list[TaskPlan]) -> None:
        """Start these tasks (replacing their earlier records), follow their logs, save the state."""
        for plan in plans:
            if self.interrupted.is_set():
                break
            self.life.unfollow([plan.name])     # the earlier start's lines are all read before this one writes
            record = self.backends[plan.backend].start(plan)
            same = [i for i, r in enumerate(self.records) if r.name == record.name]
            if same:
                self.records[same[0]] = record
            else:
                self.records.append(record)
            self._save_state()
            self.life.task_started(record.name, host=record.host, **self.backends[record.backend].locate(record))
            self._follow(record)

    def _save_state(self) -> None:
        self._state.tasks = list(self.records)
        with self._progress_lock:
            if self._step is not None:
                self._state.progress = {'global_step': self._step, 'steps': self.spec.train.steps,
                                        'at': time.time() - (time.monotonic() - self._step_at)}
        self._state.restarts = self.restarts
        self._state.workers = {'pool': self.spec.num_workers, 'live': list(self.members.indices),
                               'scaling': self._scaling['request']['workers'] if self._scaling else None}
        try:
            self._state.save(state_path(self.spec))
            self._state_error = False
        except OSError as e:        # a full disk, or a train_dir removed under the run (checked apart)
            if not self._state_error:
                self.say(f'warning: cannot write {state_path(self.spec)}: {e.strerror}')
            self._state_error = True

    def _renew(self, name: str) -> None:
        plans = [p for p in self.plans if p.backend == name]
        if plans:
            self.backends[name].renew(plans, text=self.members.to_text())

    def _publish(self) -> None:
        """Write the live set (and a request for a checkpoint) into every task's lease now."""
        for name in self.backends:
            self._renew(name)

    def _active_plans(self) -> list[TaskPlan]:
        """The ps tasks and the live workers."""
        return [p for p in self.plans if p.task.job == 'ps' or p.task.index in self.members.workers]

    def _renew_leases(self, name: str) -> None:
        while not self._done.wait(LEASE_RENEW_SECS):
            try:
                self._renew(name)
            except Exception as e:      # a host that cannot be reached now: the poll reports it
                log.debug('lease renewal failed: %s', e)

    def _follow(self, record: TaskRecord) -> None:
        serving = self._serving[record.name] = threading.Event()
        self._stepped.discard(record.name)
        backend = self.backends[record.backend]

        def seen(line: str) -> None:
            if not serving.is_set() and rundir.says_serving(line, record.name):
                serving.set()
            found = self.life.saw_line(record.name, line, record.job == 'worker', record.is_chief)
            if found is not None:
                self._saw_step(found['step'])
                self._stepped.add(record.name)
        self.life.follow(record.name,
                         lambda stop: backend.read_log(record, follow=True, stop=stop, offset=record.log_offset),
                         seen)

    def _saw_step(self, step: int) -> None:
        with self._progress_lock:
            if self._step is None or step > self._step:
                self._step, self._step_at = step, time.monotonic()

    def _progress(self) -> Progress:
        with self._progress_lock:
            return Progress(self._step, self.spec.train.steps, time.monotonic() - self._step_at)

    # -- supervision ----------------------------------------------------------------------
    def _observe(self) -> list[TaskStatus]:
        """Every current task's state; a host that cannot be asked makes its tasks UNKNOWN."""
        out = []
        now = time.monotonic()
        for r in self.records:
            seen = self.backends[r.backend].status(r)
            if seen.state == UNKNOWN:
                first = self._unknown_since.setdefault(r.name, now)
                if now - first < 1:
                    self.say(f'warning: cannot ask about {r.name} ({seen.error}); retrying')
                out.append(TaskStatus(r.name, r.job, r.index, TaskState.UNKNOWN, since=now - first))
                continue
            if self._unknown_since.pop(r.name, None) is not None:
                self.say(f'{r.name} can be reached again')
            if seen.state == ENDED:
                state = TaskState.SUCCEEDED if seen.exit_code == 0 else TaskState.FAILED
            else:
                state = TaskState.RUNNING
            frozen = 0.0
            if state is TaskState.RUNNING and (seen.stopped or '').startswith(('is stopped', 'is paused')):
                frozen = now - self._frozen_since.setdefault(r.name, now)
            else:
                self._frozen_since.pop(r.name, None)
            out.append(TaskStatus(r.name, r.job, r.index, state,
                                  exit_code=seen.exit_code if seen.state == ENDED else None, frozen=frozen))
        return out

    def _supervise(self) -> None:
        """Observe, decide, act, until the run is finished, given up (TaskFailed) or interrupted."""
        tail_deadline = None
        last_saved = 0.0
        while not self.interrupted.is_set():
            self._check_run_dir()
            self._start_due()
            statuses = self._observe()
            self._scale_step(statuses)
            decision = supervise.decide(self.policy, statuses, frozenset(self.tolerated | set(self._due)),
                                        self.restarts, self._progress())
            if decision.action is Action.FINISH:
                if decision.tasks:
                    self.say(f'every worker is done; stopping {", ".join(decision.tasks)}: {decision.reason}')
                    self._stop([r for r in self.records if r.name in decision.tasks])
                return
            if decision.action is not Action.CONTINUE:
                errors = self._record_faults(decision, statuses)
                decision = self._escalate(decision, errors)
            if decision.action is Action.GIVE_UP:
                raise self._give_up(decision)
            if decision.action is Action.TOLERATE and self._failover(decision, statuses):
                pass
            elif decision.action is Action.TOLERATE:
                self.tolerated.update(decision.tasks)
                for name in decision.tasks:
                    self.life.emit('tolerated', task=name, cause=decision.reason)
                left = self.spec.num_workers - len(self.tolerated)      # only workers are tolerated
                self.say(f'{decision.reason}; training goes on with {left} worker(s)')
            elif decision.action is Action.RESTART_TASKS:
                self.restarts += 1
                delay = self._backoff()
                wait = f' in {delay:g}s (supervise.backoff_secs)' if delay else ''
                self.say(f'restart {self.restarts}/{self.policy.max_restarts}: {decision.reason}; '
                         f'starting {", ".join(decision.tasks)} again{wait}, it rejoins the training')
                self.life.next_attempt(decision.reason, None, tasks=decision.tasks)
                for name in decision.tasks:
                    self._due[name] = time.monotonic() + delay
                self._start_due()
            elif decision.action is Action.RESTART:
                self._restart_cluster(decision)
                tail_deadline = None
            else:
                self._warn_quiet()
                tail_deadline = self._check_tail(statuses, tail_deadline)
                if tail_deadline == -1:
                    return
            first_step = self._state.progress is None and self._step is not None
            if first_step or time.monotonic() - last_saved > 1:     # `launch status` shows the step
                self._save_state()
                last_saved = time.monotonic()
            time.sleep(SUPERVISE_SECS)

    # -- elastic workers: `launch scale` ----------------------------------------------------
    def _scale_step(self, statuses: list[TaskStatus]) -> None:
        """Take a scale request, or see the one under way to its end (launch/run/control.py)."""
        train_dir = self.spec.train.train_dir
        if self._scaling is None:
            request = control.take(train_dir)
            if request is not None:
                self._begin_scale(request)
            return
        op = self._scaling
        by_name = {t.name: t for t in statuses}
        joined = all(name in self._stepped for name in op['add'])      # each has run a step
        finished = self._step is not None and self._step >= self.spec.train.steps
        left = all(by_name.get(name) is not None and by_name[name].state is not TaskState.RUNNING for name in op['remove'])
        failed = [name for name in op['add'] if by_name.get(name) is not None and by_name[name].state is TaskState.FAILED]
        if failed:
            self._end_scale(control.FAILED, f'{", ".join(failed)} ended while joining the training')
        elif (joined or finished) and left:
            self._end_scale(control.DONE, f'{self.members.count} worker(s) train now '
                                          f'({", ".join(f"worker:{i}" for i in self.members.indices)})')
        elif time.monotonic() > op['deadline']:
            self._end_scale(control.FAILED, f'the change did not take effect within {op["secs"]:.0f}s')

    def _begin_scale(self, request: dict) -> None:
        want, pool, now = request['workers'], self.spec.num_workers, self.members
        r = self.spec.train.replicas_to_aggregate
        refusal = (f'--workers {want}: expected 1..{pool} (the spec\'s pool of workers)' if not 1 <= want <= pool
                   else f'--workers {want}: fewer than train.replicas_to_aggregate ({r}), which each sync step needs'
                   if self.spec.train.sync and r and want < r else
                   'a train.command is a program of its own: its workers cannot be scaled' if self.spec.train.command
                   else None)
        if refusal:
            self._refuse(request, refusal)
            return
        if want == now.count:
            control.answer(self.spec.train.train_dir, request, control.DONE, [f'{want} worker(s) train already'])
            return
        epoch = now.epoch + 1
        workers = dict(now.workers)
        retired = {int(name.split(':')[1]) for name in self._retired}
        add, remove = supervise.scale_moves(pool, now.indices, retired, want)
        if len(add) < want - now.count:
            why = f'the pool has {len(add)} worker(s) left to start (failed over: {", ".join(sorted(self._retired))})'
            self._refuse(request, why)
            return
        for i in add:
            workers[i] = epoch
        for i in remove:
            del workers[i]
        names_add, names_remove = [f'worker:{i}' for i in add], [f'worker:{i}' for i in remove]
        if self.spec.train.sync:
            unsaved = self._checkpoint_now()
            if unsaved:
                self._refuse(request, unsaved)
                return
            self._scale_restart(request, Members(epoch, workers, self.members.save), names_add, names_remove)
            return
        self.members = Members(epoch, workers)
        self._publish()     # at once: the leaving ones stop after their current step
        line = (f'scaling {now.count} -> {want} workers: ' + (f'starting {", ".join(names_add)}' if add else
                f'{", ".join(names_remove)} ' + ('finishes its step and leaves' if len(remove) == 1 else
                                                'finish their step and leave')) + ' (async: the others train on)')
        self.say(line)
        self.life.emit('scale', to=want, add=names_add, remove=names_remove, pid=request.get('pid'))
        for name in names_add:
            self._due[name] = time.monotonic()
            self._serving.pop(name, None)
        secs = self.start_timeout + self.policy.stall_secs
        self._scaling = {'request': request, 'add': names_add, 'remove': names_remove, 'lines': [line],
                         'deadline': time.monotonic() + secs, 'secs': secs}
        self._save_state()
        self._start_due()

    def _refuse(self, request: dict, why: str) -> None:
        self.say(f'scale refused: {why}')
        control.answer(self.spec.train.train_dir, request, control.REFUSED, [why])

    def _checkpoint_now(self) -> str | None:
        """Before a sync scale stops anything: ask the chief for a checkpoint (through the lease,
        cluster/runtime/membership.py Members.save) and read it back as a restart would. Why it cannot be
        done, or None once a new checkpoint is there; the cluster trains on either way."""
        before = self.life.checkpoint_step()
        self.members = dataclasses.replace(self.members, save=self.members.save + 1)
        self._publish()
        secs = min(CHECKPOINT_GRACE_SECS, self.policy.stall_secs / 2)     # a chief stuck that long is stuck
        deadline = time.monotonic() + secs
        while time.monotonic() < deadline:
            step = self.life.checkpoint_step()
            if step is not None and step != before:
                return None
            time.sleep(0.5)
        return (f'sync training restarts through a checkpoint, but no new checkpoint of the chief could be '
                f'read back from {self.spec.train.train_dir} within {secs:.0f}s; nothing was changed')

    def _scale_restart(self, request: dict, members: Members, add: list[str], remove: list[str]) -> None:
        """Sync: SyncReplicasOptimizer fixes the number of replicas in the graph, so the cluster
        stops (the chief saves first) and starts again with the new live set, from the checkpoint;
        replicas_to_aggregate and the default learning rate follow the count. Not a fault: no
        restart of supervise.max_restarts is used."""
        before, want = self.members.count, members.count
        line = (f'scaling {before} -> {want} workers: sync training fixes its number of replicas '
                '(SyncReplicasOptimizer), so the cluster restarts through a checkpoint; the chief saves first')
        self.say(line)
        self.life.emit('scale', to=want, add=add, remove=remove, pid=request.get('pid'))
        self._teardown(checkpoint=True)
        step = self.life.checkpoint_step()
        ended = RunResult(state='scaled', exit_code=EXIT_OK, restarts=self.restarts, failures=list(self.failures),
                          global_step=self._step)
        self.members = members
        self.records = [r for r in self.records if r.name not in remove]
        self.policy = Policy.of(dataclasses.replace(self.spec, live=want))
        resumed = f'the checkpoint at global step {step}' if step is not None else 'step 0 (no checkpoint yet)'
        self.life.next_attempt(f'scale {before} -> {want} workers', step, ended=ended)
        self.failures = []
        self.plans = [dataclasses.replace(p, attempt=self.life.attempt) for p in self.plans]
        self.tolerated.clear()
        self._due.clear()
        self._unknown_since.clear()
        self._frozen_since.clear()
        with self._progress_lock:
            self._step, self._step_at = None, time.monotonic()
        self._warned_step = -1
        self._state.progress = None
        self._publish()
        self.say(f'scaling {before} -> {want} workers: starting the cluster again from {resumed}')
        secs = self.start_timeout + self.policy.stall_secs
        joining = [f'worker:{i}' for i in members.indices]
        self._scaling = {'request': request, 'add': joining, 'remove': [], 'lines': [line],
                         'deadline': time.monotonic() + secs, 'secs': secs}
        t0 = time.monotonic()
        self._start(self._active_plans())
        self._wait_ready(t0)

    def _failover(self, decision: Decision, statuses: list[TaskStatus]) -> bool:
        """A lost worker whose host cannot be reached starts on a spare address of the pool
        instead (supervise.restart: on-failure, restarts left); False when none can."""
        if self.policy.restart != 'on-failure' or self.restarts >= self.policy.max_restarts or self.spec.train.command:
            return False
        host_of = {p.name: p.task.host for p in self.plans}
        unreachable = {host_of[t.name] for t in statuses if t.state is TaskState.UNKNOWN}
        spares = [f'worker:{i}' for i in range(self.spec.num_workers)
                  if i not in self.members.workers and f'worker:{i}' not in self._retired]
        moves = supervise.pick_spares(list(decision.tasks), host_of, unreachable, spares)
        if not moves:
            return False
        self.restarts += 1
        delay = self._backoff()
        epoch = self.members.epoch + 1
        workers = dict(self.members.workers)
        for lost, spare in moves.items():
            workers.pop(int(lost.split(':')[1]), None)
            workers[int(spare.split(':')[1])] = epoch
            self._retired.add(lost)
            self.tolerated.add(lost)
        self.members = Members(epoch, workers)
        self._publish()
        for lost, spare in moves.items():
            plan = next(p for p in self.plans if p.name == spare)
            self.say(f'restart {self.restarts}/{self.policy.max_restarts}: {decision.reason}; starting {spare} on '
                     f'{plan.task.address} in its place (a spare of the pool)')
            self.life.emit('failover', task=lost, to=spare, host=plan.task.host, cause=decision.reason)
            self._due[spare] = time.monotonic() + delay
        gone = [r for r in self.records if r.name in moves]
        threading.Thread(target=lambda: stop_all(gone, self.backends, grace=1), name='failover-stop', daemon=True).start()
        self._start_due()
        return True

    def _end_scale(self, state: str, line: str) -> None:
        op, self._scaling = self._scaling, None
        self._save_state()
        self.say(f'scale {state}: {line}')
        self.life.emit('scaled', state=state, workers=list(self.members.indices), cause=line)
        control.answer(self.spec.train.train_dir, op['request'], state, op['lines'] + [line])

    def _check_run_dir(self) -> None:
        """The run's own directory (its state, events, and for local tasks their logs and
        checkpoints) removed under a running launcher: one line, and every task stopped.
        The directory is held open from the start of the run: once removed it has no links left,
        even when a task that still writes there (a chief's checkpoint) has made a new one by
        the same name before this check comes round."""
        train_dir = self.spec.train.train_dir
        if os.fstat(self._run_dir_fd).st_nlink == 0 or not os.path.isdir(train_dir):
            raise TaskFailed(f'the run\'s directory {os.path.abspath(train_dir)} was removed while the run went on; '
                             'stopping every task (nothing of the run can be kept there any more)')

    def _start_due(self) -> None:
        """Start the tasks whose backoff has passed (a worker that rejoins)."""
        for name, due in sorted(self._due.items(), key=lambda item: item[1]):
            if time.monotonic() < due or self.interrupted.is_set():
                continue
            del self._due[name]
            earlier = [r for r in self.records if r.name == name and self.backends[r.backend].status(r).alive]
            if earlier:         # a frozen copy still holds its port: it goes first
                stop_all(earlier, self.backends)
            self._frozen_since.pop(name, None)
            try:
                self._start([dataclasses.replace(p, restart=self.restarts) for p in self.plans if p.name == name])
            except BackendError as e:
                self.tolerated.add(name)
                self.say(f'could not start {name} again ({e}); training goes on without it')

    def _backoff(self) -> float:
        """The wait before the restart just counted: it grows with each restart in a row."""
        now = time.monotonic()
        since = None if self._last_fault_at is None else now - self._last_fault_at
        self._streak = supervise.next_streak(self._streak, since)
        self._last_fault_at = now
        return supervise.backoff_delay(self.policy, self._streak)

    def _escalate(self, decision: Decision, errors: dict[str, str | None]) -> Decision:
        """A restart that would repeat the last one's failure exactly is no restart: give up."""
        if decision.action not in (Action.RESTART, Action.RESTART_TASKS) or not decision.tasks:
            return decision
        first = decision.tasks[0]
        fault = supervise.Fault.of(first, None if decision.stalled else errors.get(first), self.life.checkpoint_step())
        escalated = supervise.escalate(decision, self._last_fault, fault)
        self._last_fault = fault
        return escalated

    def _warn_quiet(self) -> None:
        """Half way to the stall limit with no new global step: say so once, and what the
        training waits for, so a long silence is never a mystery."""
        p = self._progress()
        if p.step is None or p.step >= p.total or p.quiet_secs < self.policy.stall_secs / 2 \
                or self._warned_step == p.step:
            return
        self._warned_step = p.step
        names = tuple(r.name for r in self.records if self.backends[r.backend].status(r).alive)
        text, _ = self._explain_stall(names)
        self.say(f'warning: no new global step for {p.quiet_secs:.0f}s (at {p.step}/{p.total}); {text}; '
                 f'a stall is declared at {self.policy.stall_secs:g}s (supervise.stall_secs)')

    def _check_tail(self, statuses: list[TaskStatus], deadline: float | None) -> float | None:
        """Once one side (all workers, or all ps tasks) has finished, the other gets --finish-timeout
        to follow; returns the deadline, or -1 once it has passed (what is left is then stopped)."""
        finished = {t.name for t in statuses if t.state is TaskState.SUCCEEDED}
        workers_done = all(t.name in finished for t in statuses if t.job == 'worker')
        ps_done = all(t.name in finished for t in statuses if t.job == 'ps')
        if not (workers_done or ps_done):
            return None
        if deadline is None:
            return time.monotonic() + self.finish_timeout
        if time.monotonic() > deadline:
            left = ', '.join(t.name for t in statuses if t.name not in finished)
            self.say(f'warning: {left} still running {self.finish_timeout:.0f}s after the '
                     f'{"workers" if workers_done else "ps tasks"} finished; stopping them '
                     '(raise --finish-timeout)')
            return -1
        return deadline

    def _explain_stall(self, names: tuple[str, ...]) -> tuple[str, list[str]]:
        """Name what each of these tasks is doing: stopped, not answering, or answering (waiting);
        returns the words and the tasks that do not answer (or are stopped)."""
        running = [r for r in self.records if r.name in names]

        def probe(r: TaskRecord) -> tuple[TaskRecord, bool, str | None]:
            backend = self.backends[r.backend]
            return r, backend.probe(r, PROBE_SECS), backend.status(r).stopped

        with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
            found = list(pool.map(probe, running))
        silent = [f'{r.name} {how + " and " if how else ""}does not answer on {r.endpoint}'
                  for r, answers, how in found if not answers or how]
        waiting = [r.name for r, answers, how in found if answers and not how]
        parts = silent or ['every task answers on its port, so none is frozen; the cause is inside the '
                           'training (a lost gradient, a deadlock)']
        if silent and waiting:
            parts.append(f'{", ".join(waiting)} answer{"s" if len(waiting) == 1 else ""} and '
                         f'wait{"s" if len(waiting) == 1 else ""} for {"it" if len(silent) == 1 else "them"}')
        return '; '.join(parts), [r.name for r, answers, how in found if not answers or how]

    def _cause(self, decision: Decision) -> tuple[str, bool]:
        """The fault in words, and whether the chief can still save a checkpoint (it and every ps
        answer): a checkpoint the frozen or lost ps cannot write is not waited for."""
        if decision.stalled:
            text, silent = self._explain_stall(decision.tasks)
            return f'stall: {decision.reason}; {text}', not any(self._holds_variables(n) for n in silent)
        return decision.reason, not any(self._holds_variables(n) for n in decision.tasks)

    @staticmethod
    def _holds_variables(name: str) -> bool:
        """The ps tasks hold the variables, the chief writes the checkpoint: both for a save."""
        return name.startswith('ps:') or name == 'worker:0'

    def _restart_cluster(self, decision: Decision) -> None:
        """Stop every task (the chief checkpoints first if it can), then start them all again: the
        chief restores the newest checkpoint and training goes on to the requested step. A task
        lost while they start again is one more fault, under the same policy."""
        while True:
            self.restarts += 1
            cause, can_save = self._cause(decision)
            self.say(f'restart {self.restarts}/{self.policy.max_restarts}: {cause}; stopping every task'
                     + ('' if can_save else ' (no checkpoint can be saved without the lost task)'))
            self._teardown(checkpoint=can_save)
            step = self.life.checkpoint_step()
            delay = self._backoff()
            self.say(f'restart {self.restarts}/{self.policy.max_restarts}: resuming from '
                     + (f'the checkpoint at global step {step}' if step is not None else
                        'step 0 (no checkpoint was written yet)')
                     + (f' in {delay:g}s (supervise.backoff_secs, doubling with each restart in a row)' if delay else ''))
            reason = f'restart {self.restarts}/{self.policy.max_restarts}: {decision.reason}'
            ended = RunResult(state='failed', exit_code=EXIT_FAILED, restarts=self.restarts - 1,
                              failures=list(self.failures), global_step=self._step)
            self.life.next_attempt(reason, step, ended=ended)
            self.failures = []
            # The next attempt's logs are files of their own; the chief notes the restart in TensorBoard.
            self.plans = [dataclasses.replace(p, attempt=self.life.attempt, env={**p.env, rundir.RESTART_ENV: reason})
                          for p in self.plans]
            self.tolerated.clear()
            self._due.clear()
            self._unknown_since.clear()
            self._frozen_since.clear()
            with self._progress_lock:
                self._step, self._step_at = None, time.monotonic()
            self._warned_step = -1
            self._state.progress = None
            if self.interrupted.wait(delay):
                return
            self._check_run_dir()
            t0 = time.monotonic()
            try:
                self._start([dataclasses.replace(p, restart=self.restarts) for p in self._active_plans()])
                self._wait_ready(t0)
                return
            except TaskFailed as e:
                if e.task is None:          # not a task lost on the way (a port, a timeout): as before
                    raise
                statuses = self._observe()
                lost = next((t for t in statuses if t.name == e.task), None)
                how = (supervise.how_lost(lost) if lost and lost.state is TaskState.FAILED
                       else f'{e.task} {describe_exit(e.exit_code)}') + ' while the cluster started again'
                decision = supervise.during_recovery(self.policy, self.restarts, e.task, how, e.exit_code)
                errors = self._record_faults(decision, statuses)
                decision = self._escalate(decision, errors)
                if decision.action is Action.GIVE_UP:
                    raise self._give_up(decision) from None

    def _wait_ready(self, t0: float) -> None:
        wait_for_servers(self.records, self.backends, t0 + self.start_timeout, self.interrupted,
                         reported=lambda name: self._serving[name].is_set())

    def _record_faults(self, decision: Decision, statuses: list[TaskStatus]) -> dict[str, str | None]:
        """The event log's account of a fault, before anything is done about it; returns each lost
        task's last error line (None: it logged none)."""
        if decision.stalled:
            self.life.emit('stall', tasks=list(decision.tasks), cause=decision.reason)
            return {}
        by_name = {t.name: t for t in statuses}
        errors = {}
        for name in decision.tasks:
            t = by_name.get(name)
            record = next((r for r in self.records if r.name == name), None)
            code = t.exit_code if t else None
            signame = None
            if code is not None and code < 0:
                try:
                    signame = signal.Signals(-code).name
                except ValueError:
                    signame = str(-code)
            error = errors[name] = rundir.last_error_line(_log_tail(record, self.backends, 200)) if record else None
            cause = supervise.how_lost(t) if t and t.state is not TaskState.RUNNING else decision.reason
            self.life.emit('task_lost', task=name, cause=cause, exit_code=code, signal=signame, error=error)
            self.failures.append(Failure(name, cause + (f'; its last error: {_short(error, 300)}' if error else ''),
                                         record.host if record else '', record.pid if record else None))
        return errors

    def _give_up(self, decision: Decision) -> TaskFailed:
        """The one line a lost run ends with (under ~300 characters): which task, how, its last
        Python error, and what a new `launch up` would do. The whole error is in the task's log."""
        message, can_save = self._cause(decision)
        code = EXIT_FAILED
        failures = [Failure(name, message) for name in decision.tasks]
        no_restore = False
        error = None
        if not decision.stalled:
            first = next(r for r in self.records if r.name == decision.tasks[0])
            seen = self.backends[first.backend].status(first)
            exit_code = seen.exit_code if seen.state == ENDED else None
            no_restore = exit_code == EXIT_NO_RESTART
            if self.policy.user_command and first.job == 'worker' and (exit_code or 0) > 0:
                code = exit_code        # a user command's run ends with its workers' exit code
            message = message.replace(first.name, f'{first.name} (pid {first.pid} on {first.host})', 1)
            error = rundir.last_error_line(_log_tail(first, self.backends, 200))
            if error and error.startswith(f'{first.name}: '):       # the task is named already
                error = error[len(first.name) + 2:]
            failures = [Failure(first.name, message + (f'; its last error: {_short(error, 300)}' if error else ''),
                                first.host, first.pid)]
        after = f'; {decision.note}' if decision.note else ''
        if self.restarts >= self.policy.max_restarts and self.policy.restart == 'on-failure':
            after += f'; {self.restarts} restart(s) made, the most supervise.max_restarts allows'
        self._teardown(checkpoint=can_save)      # the chief's checkpoint first, so the step below is current
        if no_restore:
            hint = 'no checkpoint restores, so a new `launch up` fails the same way until they are moved away'
        else:
            hint = resume_hint(self.life.checkpoint_step())
        if error:       # as much of it as fits one line of ~300 characters; the whole is in the log
            room = max(70, FINAL_LINE - len(message) - len(after) - len(hint) - len('error: ; its last error: ; '))
            short = _short(error, room)
            if short != error:
                short = _short(error, room - len(' (see its log)')) + ' (see its log)'
            message += f'; its last error: {short}'
        message += after
        failed = TaskFailed(f'{message}; {hint}', code=code)
        failed.failures = failures
        return failed

    def _stop(self, records: list[TaskRecord], checkpoint: bool = True) -> None:
        """Stop these tasks: the chief first, with time to write its checkpoint while the ps tasks
        still run (only then can it save; `checkpoint`: and they answer), then everything else at once."""
        live = [r for r in records if self.backends[r.backend].status(r).alive]
        ps_alive = all(self.backends[r.backend].status(r).alive for r in self.records if r.job == 'ps')
        first = [r for r in live if r.is_chief] if ps_alive and checkpoint else []
        if first:
            self.backends[first[0].backend].stop(first, grace=CHECKPOINT_GRACE_SECS)
        stop_all([r for r in live if r not in first], self.backends)

    def _teardown(self, checkpoint: bool = True) -> None:
        """Stop every task and stop following their logs once all is read."""
        self._stop(self.records, checkpoint)
        self.life.unfollow([r.name for r in self.records])
