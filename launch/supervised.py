"""The supervised strategy of `launch up` (local processes, SSH, compose): start every task
through its Backend, wait for every server, observe, supervise, tear down.

What happens when a task is lost or the run stops making progress is decided by
`launch/supervise.py` (tolerate, restart, give up); this module observes the tasks, carries the
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

from cluster import rundir
from cluster.rundir import EXIT_FAILED, EXIT_OK
from cluster.spec import ClusterSpec
from launch import supervise
from launch.backend import ENDED, UNKNOWN, Backend, BackendError, TaskRecord, stop_all, tail
from launch.lifecycle import CHECKPOINT_GRACE_SECS, Failure, Lifecycle, Outcome, RunResult, Strategy, resume_hint
from launch.local import process_ident
from launch.plan import TaskPlan, state_path
from launch.state import LaunchState
from launch.supervise import Action, Decision, Policy, Progress, TaskState, TaskStatus, describe_exit

log = logging.getLogger(__name__)

LEASE_RENEW_SECS = 1.0          # how often the launcher renews its tasks' lease
PROBE_SECS = 3.0                # a stall probe's deadline for each task's gRPC server
UNREACHABLE_SECS = 30.0         # a host that cannot be asked for this long has lost its tasks
SUPERVISE_SECS = 0.2            # how often the supervisor observes the tasks


class TaskFailed(Exception):
    """One line for the user, then the task's last log lines."""

    def __init__(self, message: str, log_tail: list[str] = (), code: int = 1):
        super().__init__(message)
        self.log_tail = list(log_tail)
        self.code = code            # the launcher's exit code


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
                                        _log_tail(record, backends))
                    failed.failures = [Failure(record.name, str(failed), record.host, record.pid or None)]
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


def _log_tail(record: TaskRecord, backends: Mapping[str, Backend], n: int = 15) -> list[str]:
    try:
        return tail(backends[record.backend].read_log(record, offset=record.log_offset), n)
    except Exception as e:  # a log we cannot read must not hide the failure itself
        return [f'(could not read {record.log}: {e})']


class SupervisedRun(Strategy):
    """The launcher runs every task itself, through the backends the plans name."""

    def __init__(self, spec: ClusterSpec, spec_yaml: str, plans: list[TaskPlan], backends: Mapping[str, Backend],
                 start_timeout: float = 120.0, finish_timeout: float = 60.0,
                 checks: Callable[[], None] | None = None, warn: Callable[[], None] | None = None):
        self.spec, self.spec_yaml, self.plans, self.backends = spec, spec_yaml, plans, backends
        self.start_timeout, self.finish_timeout = start_timeout, finish_timeout
        self._checks = checks                        # the pre-flight, run by prepare()
        self._warn = warn                            # once per run: what the user should know (exposure)
        self.policy = Policy.of(spec, UNREACHABLE_SECS)
        self.records: list[TaskRecord] = []          # the current start of every task, in plan order
        self.restarts = 0
        self.tolerated: set[str] = set()
        self.failures: list[Failure] = []            # every task lost in this attempt
        self.life: Lifecycle | None = None
        self._unknown_since: dict[str, float] = {}
        self._serving: dict[str, threading.Event] = {}   # set once a task's own log says it serves
        self._done = threading.Event()
        self._progress_lock = threading.Lock()
        self._step: int | None = None                 # the newest global step seen in this start
        self._step_at = time.monotonic()
        self._state = LaunchState.new(spec.path, process_ident(os.getpid()) or '')

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
            for name, backend in self.backends.items():
                backend.prepare([p for p in self.plans if p.backend == name], self.spec_yaml)
            for name in self.backends:      # one thread each: a slow SSH host never delays local leases
                self._renew(name)
                threading.Thread(target=self._renew_leases, args=(name,), name=f'lease-{name}', daemon=True).start()
            self._start(self.plans)
            self.say(f'started {len(self.records)} tasks; waiting for their servers')
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
                                          f'{self.spec.num_workers} workers)')
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
        self._state.save(state_path(self.spec))

    def _renew(self, name: str) -> None:
        plans = [p for p in self.plans if p.backend == name]
        if plans:
            self.backends[name].renew(plans)

    def _renew_leases(self, name: str) -> None:
        while not self._done.wait(LEASE_RENEW_SECS):
            try:
                self._renew(name)
            except Exception as e:      # a host that cannot be reached now: the poll reports it
                log.debug('lease renewal failed: %s', e)

    def _follow(self, record: TaskRecord) -> None:
        serving = self._serving[record.name] = threading.Event()
        backend = self.backends[record.backend]

        def seen(line: str) -> None:
            if not serving.is_set() and rundir.says_serving(line, record.name):
                serving.set()
            found = self.life.saw_line(record.name, line, record.job == 'worker', record.is_chief)
            if found is not None:
                self._saw_step(found['step'])
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
            out.append(TaskStatus(r.name, r.job, r.index, state,
                                  exit_code=seen.exit_code if seen.state == ENDED else None))
        return out

    def _supervise(self) -> None:
        """Observe, decide, act, until the run is finished, given up (TaskFailed) or interrupted."""
        tail_deadline = None
        last_saved = 0.0
        while not self.interrupted.is_set():
            statuses = self._observe()
            decision = supervise.decide(self.policy, statuses, frozenset(self.tolerated), self.restarts,
                                        self._progress())
            if decision.action is Action.FINISH:
                if decision.tasks:
                    self.say(f'every worker is done; stopping {", ".join(decision.tasks)}: {decision.reason}')
                    self._stop([r for r in self.records if r.name in decision.tasks])
                return
            if decision.action is not Action.CONTINUE and decision.action is not Action.FINISH:
                self._record_faults(decision, statuses)
            if decision.action is Action.GIVE_UP:
                raise self._give_up(decision)
            if decision.action is Action.TOLERATE:
                self.tolerated.update(decision.tasks)
                for name in decision.tasks:
                    self.life.emit('tolerated', task=name, cause=decision.reason)
                left = self.spec.num_workers - len(self.tolerated)      # only workers are tolerated
                self.say(f'{decision.reason}; training goes on with {left} worker(s)')
            elif decision.action is Action.RESTART_TASKS:
                self.restarts += 1
                self.say(f'restart {self.restarts}/{self.policy.max_restarts}: {decision.reason}; '
                         f'starting {", ".join(decision.tasks)} again, it rejoins the training')
                self.life.next_attempt(decision.reason, None, tasks=decision.tasks)
                try:
                    self._start([dataclasses.replace(p, restart=self.restarts) for p in self.plans
                                 if p.name in decision.tasks])
                except BackendError as e:
                    self.tolerated.update(decision.tasks)
                    self.say(f'could not start {", ".join(decision.tasks)} again ({e}); training goes on '
                             'without it')
            elif decision.action is Action.RESTART:
                self._restart_cluster(decision)
                tail_deadline = None
            else:
                tail_deadline = self._check_tail(statuses, tail_deadline)
                if tail_deadline == -1:
                    return
            first_step = self._state.progress is None and self._step is not None
            if first_step or time.monotonic() - last_saved > 1:     # `launch status` shows the step
                self._save_state()
                last_saved = time.monotonic()
            time.sleep(SUPERVISE_SECS)

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

    def _explain_stall(self, decision: Decision) -> str:
        """Name what each stuck task is doing: stopped, not answering, or answering (waiting)."""
        running = [r for r in self.records if r.name in decision.tasks]

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
        return '; '.join(parts)

    def _cause(self, decision: Decision) -> str:
        return f'stall: {decision.reason}; {self._explain_stall(decision)}' if decision.stalled else decision.reason

    def _restart_cluster(self, decision: Decision) -> None:
        """Stop every task (the chief checkpoints first if it can), then start them all again: the
        chief restores the newest checkpoint and training goes on to the requested step."""
        self.restarts += 1
        self.say(f'restart {self.restarts}/{self.policy.max_restarts}: {self._cause(decision)}; '
                 'stopping every task')
        self._teardown()
        step = self.life.checkpoint_step()
        self.say(f'restart {self.restarts}/{self.policy.max_restarts}: resuming from '
                 + (f'the checkpoint at global step {step}' if step is not None else
                    'step 0 (no checkpoint was written yet)'))
        cause = f'restart {self.restarts}/{self.policy.max_restarts}: {decision.reason}'
        ended = RunResult(state='failed', exit_code=EXIT_FAILED, restarts=self.restarts - 1,
                          failures=list(self.failures), global_step=self._step)
        self.life.next_attempt(cause, step, ended=ended)
        self.failures = []
        # The next attempt's logs are files of their own; the chief notes the restart in TensorBoard.
        self.plans = [dataclasses.replace(p, attempt=self.life.attempt, env={**p.env, rundir.RESTART_ENV: cause})
                      for p in self.plans]
        self.tolerated.clear()
        self._unknown_since.clear()
        with self._progress_lock:
            self._step, self._step_at = None, time.monotonic()
        self._state.progress = None
        t0 = time.monotonic()
        self._start([dataclasses.replace(p, restart=self.restarts) for p in self.plans])
        self._wait_ready(t0)

    def _wait_ready(self, t0: float) -> None:
        wait_for_servers(self.records, self.backends, t0 + self.start_timeout, self.interrupted,
                         reported=lambda name: self._serving[name].is_set())

    def _record_faults(self, decision: Decision, statuses: list[TaskStatus]) -> None:
        """The event log's account of a fault, before anything is done about it."""
        if decision.stalled:
            self.life.emit('stall', tasks=list(decision.tasks), cause=decision.reason)
            return
        by_name = {t.name: t for t in statuses}
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
            error = rundir.last_error_line(_log_tail(record, self.backends, 200)) if record else None
            cause = supervise.how_lost(t) if t else decision.reason
            self.life.emit('task_lost', task=name, cause=cause, exit_code=code, signal=signame, error=error)
            self.failures.append(Failure(name, cause + (f'; its last error: {error}' if error else ''),
                                         record.host if record else '', record.pid if record else None))

    def _give_up(self, decision: Decision) -> TaskFailed:
        """The one line a lost run ends with: which task, how, its last Python error, and where
        a new `launch up` would resume."""
        message = self._cause(decision)
        code = EXIT_FAILED
        failures = [Failure(name, message) for name in decision.tasks]
        if not decision.stalled:
            first = next(r for r in self.records if r.name == decision.tasks[0])
            seen = self.backends[first.backend].status(first)
            exit_code = seen.exit_code if seen.state == ENDED else None
            if self.policy.user_command and first.job == 'worker' and (exit_code or 0) > 0:
                code = exit_code        # a user command's run ends with its workers' exit code
            message = message.replace(first.name, f'{first.name} (pid {first.pid} on {first.host})', 1)
            error = rundir.last_error_line(_log_tail(first, self.backends, 200))
            if error:
                message += f'; its last error: {error}'
            failures = [Failure(first.name, message, first.host, first.pid)]
        if self.restarts >= self.policy.max_restarts and self.policy.restart == 'on-failure':
            message += f'; {self.restarts} restart(s) made, the most supervise.max_restarts allows'
        self._teardown()        # the chief's checkpoint first, so the step below is current
        failed = TaskFailed(f'{message}; {resume_hint(self.life.checkpoint_step())}', code=code)
        failed.failures = failures
        return failed

    def _stop(self, records: list[TaskRecord]) -> None:
        """Stop these tasks: the chief first, with time to write its checkpoint while the ps tasks
        still run (only then can it save), then everything else at once."""
        live = [r for r in records if self.backends[r.backend].status(r).alive]
        ps_alive = all(self.backends[r.backend].status(r).alive for r in self.records if r.job == 'ps')
        first = [r for r in live if r.is_chief] if ps_alive else []
        if first:
            self.backends[first[0].backend].stop(first, grace=CHECKPOINT_GRACE_SECS)
        stop_all([r for r in live if r not in first], self.backends)

    def _teardown(self) -> None:
        """Stop every task and stop following their logs once all is read."""
        self._stop(self.records)
        self.life.unfollow([r.name for r in self.records])
