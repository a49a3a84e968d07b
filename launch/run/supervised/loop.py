"""The supervisor's loop (the supervised strategy of `launch up`: local processes, SSH, compose):
start every task through its Backend, wait for every server, then each round observe, decide
(launch/run/policy.py), apply the plan for the decision, until the run ends; whichever way it
ends, nothing is left running. Every stop asks the chief for a checkpoint first, while the ps
tasks still hold the variables.

The run's facts are one state object (state.py) that only this loop writes, applying plans
(plan.py) made by recovery.py, failover.py and scaling.py, a restart of the whole cluster
included; a task lost while the cluster starts is an observation its next round decides
about. Those plans change the desired set; each round begins with reconcile.py's plan, which
starts what is due and stops what was failed over. Its other parts: the wait for the
servers (startup.py), what one attempt has seen (attempt.py), the words of a fault (faults.py),
how long a fault took to mend (mending.py), the lines said at the start and end (notes.py).
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from cluster.runtime import ports
from cluster.runtime.membership import Members
from cluster.runtime.rundir import EXIT_OK
from cluster.spec import ClusterSpec
from launch.backends.base import Backend, BackendError, TaskRecord, preloaded, stop_all
from launch.planning.plan import TaskPlan, state_path
from launch.run import policy
from launch.run.supervised.attempt import Attempt
from launch.run.supervised.faults import TaskFailed
from launch.records.event_types import Interrupted, Recovered
from launch.records.result import MendedFault
from launch.run.lifecycle import CHECKPOINT_GRACE_SECS, Failure, Lifecycle, Outcome, RunResult, Strategy
from launch.run.supervised.admission import Gate, window_for
from launch.run.supervised.following import follow
from launch.run.supervised.leases import Leases
from launch.run.supervised import mending, telemetry
from launch.run.supervised.mending import RecoveryClock
from launch.run.supervised.notes import check_tail, evaluator_needs, quiet_warning
from launch.run.policy import Action, Policy, Progress, TaskState, TaskStatus
from launch.run.supervised.recovery import Recovery, resume
from launch.run.supervised.scaling import Scaling, resume_scaled
from launch.run.supervised.startup import wait_for_servers
from launch.run.supervised.plan import Plan, SaveFirst
from launch.run.supervised import preemption
from launch.run.supervised.placing import PlaceAgain, place_again
from launch.run.supervised.reconcile import reconcile
from launch.run.supervised.state import StartLoss, SupervisorState
from launch.run.supervised.statefile import StateFile

__all__ = ['SupervisedRun', 'TaskFailed', 'wait_for_servers']

SUPERVISE_SECS = 0.2            # how often the supervisor observes the tasks
SAVE_BATCH_SECS = 0.25         # how often the state file is saved while many tasks start


def tell_own_refusals(run: SupervisedRun, statuses: list[TaskStatus]) -> None:
    """Hand the tasks just lost to the disk watch, which reads their own last error (a coordinator
    run's or a command's task saves where the launcher cannot see the disk refuse it)."""
    failed = {t.name for t in statuses if t.state is TaskState.FAILED}
    attempt = run.state.attempt
    attempt.refusals.tell([r for r in run.state.records if r.name in failed], run.backends, run.spec.train.train_dir,
                          None if attempt.disk else run.say, run.life.emit)


def let_go(plan: Plan, records: Sequence[TaskRecord], backends: Mapping[str, Backend]) -> None:
    """The tasks a plan stops: at once, or in the background (a lost host may not answer)."""
    if plan.kill:
        stop_all([r for r in records if r.name in plan.kill], backends, grace=0)
    gone = [r for r in records if r.name in plan.drop]
    if gone:
        threading.Thread(target=lambda: stop_all(gone, backends, grace=1), name='failover-stop', daemon=True).start()


def saved_since(life: Lifecycle, first: SaveFirst) -> bool:
    """Whether a checkpoint other than `first.before` reads back within `first.secs` (as a
    restart would read it: Lifecycle.checkpoint_step)."""
    deadline = time.monotonic() + first.secs
    while time.monotonic() < deadline:
        step = life.checkpoint_step()
        if step is not None and step != first.before:
            return True
        time.sleep(0.5)
    return False


def check_run_dir(train_dir: str, fd: int | None) -> None:
    """The run's own directory (its state, events, and for local tasks their logs and
    checkpoints) removed under a running launcher: one line, and every task stopped.
    The directory is held open (`fd`) from the start of the run: once removed it has no links left,
    even when a task that still writes there (a chief's checkpoint) has made a new one by
    the same name before this check comes round."""
    assert fd is not None, 'checked only while the run goes on'
    if os.fstat(fd).st_nlink == 0 or not os.path.isdir(train_dir):
        raise TaskFailed(f'the run\'s directory {os.path.abspath(train_dir)} was removed while the run went on; '
                         'stopping every task (nothing of the run can be kept there any more)')


class SupervisedRun(Strategy):
    """The launcher runs every task itself, through the backends the plans name. `state` is the
    run's (state.py), written here; what recovery and scaling ask of the loop is what
    recovery.py RecoveringRun and scaling.py ScaledRun say."""

    life: Lifecycle             # the run's lifecycle, from run() on

    def __init__(self, spec: ClusterSpec, spec_yaml: str, plans: list[TaskPlan], backends: Mapping[str, Backend],
                 start_timeout: float = 120.0, finish_timeout: float = 60.0,
                 checks: Callable[[], None] | None = None, warn: Callable[[], None] | None = None,
                 workers: int | None = None, place_again: PlaceAgain | None = None) -> None:
        self.spec, self.spec_yaml, self.backends = spec, spec_yaml, backends
        self._place_again = place_again              # a restart of the cluster may move tasks (placing.py)
        self.start_timeout, self.finish_timeout = start_timeout, finish_timeout
        self._checks = checks                        # the pre-flight, run by prepare()
        self._warn = warn                            # once per run: what the user should know (exposure)
        # Every mutable fact of the run; only this loop writes it, applying plans (plan.py). The
        # spec's workers are a pool; `workers` of them run at first (cluster/runtime/membership.py).
        self.state = SupervisorState.new(spec, plans, workers)
        self.scaling = Scaling(self)
        self.recovery = Recovery(self)
        self.clock = RecoveryClock(self._mended)         # how long each fault takes to mend
        self._run_dir_fd: int | None = None          # the run's directory, held open (check_run_dir)
        self._done = threading.Event()
        self.leases = Leases(self.state, backends, self._done, self.clock.mending_for)   # renewed until the run is done
        self.state_file = StateFile(spec, lambda line: self.say(line), lambda: bool(self.life.disk and self.life.disk.check()))

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
        chief = next((r for r in self.state.records if self.is_chief(r)), None)
        if chief is None:       # before any start: where the chief will run (a finished run starts nothing)
            plan = next((p for p in self.state.plans if p.name == self.spec.chief.name), None)
            chief = self.backends[plan.backend].log_record(plan) if plan is not None else None
        if chief is None:
            return None
        return self.backends[chief.backend].read_file(chief, path)

    def hurry(self) -> None:
        self.say(f'{self.life.signal_name} again: killing every task now (SIGKILL, no checkpoint)')
        try:
            stop_all(list(self.state.records), self.backends, grace=0)
        except BackendError as e:
            self.say(f'error: {e}')

    # -- the run -------------------------------------------------------------------------------
    def run(self, life: Lifecycle) -> Outcome:
        self.life = life
        t0 = time.monotonic()
        # The run's id in every task's environment (and its command's): a task that finds its port
        # taken names the run holding it from there (cluster/runtime/ports.py).
        self.state.plans = [dataclasses.replace(p, attempt=life.attempt, env={**p.env, ports.RUN_ENV: life.run_id})
                      for p in self.state.plans]
        if self._warn is not None and life.attempt == 1:
            self._warn()
        for note in evaluator_needs(self.spec):
            self.say(note)
        try:
            self._launch(t0)
            if not self.interrupted.is_set():
                self.say(f'all {len(self.state.records)} servers are up after {time.monotonic() - t0:.1f}s')
                self._supervise()
            if self.interrupted.is_set():
                self.say(f'{life.signal_name} received: stopping every task (the chief saves a checkpoint first)')
                life.emit(Interrupted(signal=life.signal_name))
                return self._outcome(128 + life.signum)
            mode = ('coordinator' if self.spec.coordinator else 'command' if self.spec.train.command
                    else 'sync' if self.spec.train.sync else 'async')
            return self._outcome(EXIT_OK, f'done in {time.monotonic() - t0:.1f}s ({mode}, '
                                          f'{self.state.members.count} workers)')
        except TaskFailed as e:
            return self._failed(e)
        except (BackendError, OSError) as e:    # OSError: e.g. a train_dir we cannot write
            return self._failed(TaskFailed(str(e)))
        finally:
            self._close()

    def _launch(self, t0: float) -> None:
        """Open the run's directory, put the tasks' files in place, keep their leases fresh, start every
        live task (with warm processes wanted, from one import per host) and wait for their servers."""
        self._run_dir_fd = os.open(self.spec.train.train_dir, os.O_RDONLY | os.O_DIRECTORY)
        for name, backend in self.backends.items():
            backend.prepare([p for p in self.state.plans if p.backend == name], self.spec_yaml)
        self.leases.keep()
        with preloaded(self.backends, self.state.desired(), self.spec.supervise.standby > 0):
            self._start(self.state.desired())
        spares = self.spec.num_workers - self.state.members.count
        self.say(f'started {len(self.state.records)} tasks; waiting for their servers'
                 + (f' ({spares} more worker(s) of the pool can join: `launch scale`)' if spares else ''))
        self.wait_ready(t0)
        telemetry.Watch(lambda: list(self.state.records), self.backends, self.say, self.life.emit,
                        self.spec.supervise.sample_secs, self.spec.train.train_dir).start(self._done)

    def _failed(self, e: TaskFailed) -> Outcome:
        """The run cannot go on: its line and the task's last log lines, then its outcome."""
        self.say(f'error: {e}')
        for line in e.log_tail:
            self.say(f'    {line}')
        return self._outcome(e.code, failures=e.failures)

    def _close(self) -> None:
        """Whichever way the run ends: every task stopped, the state file gone once none lives."""
        try:
            self.teardown()
        except BackendError as e:
            self.say(f'error: stopping the tasks failed: {e}; run `launch down {self.spec.path}`')
        if self._run_dir_fd is not None:
            os.close(self._run_dir_fd)
            self._run_dir_fd = None
        self._done.set()
        unknown = [r.name for r in self.state.records if self.backends[r.backend].status(r).alive]
        if not unknown:
            try:
                os.remove(state_path(self.spec))
            except FileNotFoundError:
                pass
        else:
            self.say(f'warning: {", ".join(unknown)} may still run (not stopped, or its host cannot be asked); '
                     f'`launch down {self.spec.path}` stops what is left')

    def _outcome(self, code: int, headline: str = '', failures: Sequence[Failure] = ()) -> Outcome:
        """Every task lost on the way (tolerated, restarted or fatal), the fatal one's words last."""
        seen = {f.task for f in failures}
        every = [f for f in self.state.attempt.failures if f.task not in seen] + list(failures)
        return Outcome(code, headline, self.state.restarts, every, tuple(sorted(self.state.attempt.tolerated)),
                       global_step=self.state.attempt.global_step, recoveries=list(self.clock.done),
                       preemptions=self.state.preemptions)

    def _mended(self, mended: MendedFault) -> None:
        """The training is back after a fault: one line, and the event."""
        self.say(mending.line(mended))
        self.state.history.trained_again()
        self.life.emit(Recovered.of(mended))

    # -- supervision ---------------------------------------------------------------------------
    def _supervise(self) -> None:
        """Observe, decide, act, until the run is finished, given up (TaskFailed) or interrupted."""
        tail_deadline = None
        last_saved = 0.0
        while not self.interrupted.is_set():
            if self.state.lost_starting is not None:    # a task lost while the cluster started
                self._lost_in_start()
                tail_deadline = None
                continue
            self.check_run_dir()
            self.apply(reconcile(self.state, time.monotonic()))     # the desired set, before the look
            seen = preemption.step(self.state, self._observe(), time.monotonic())    # notices told, acted on
            if seen.plan is not None:
                self.apply(seen.plan)
            statuses = seen.statuses
            self._scale(statuses)
            waiting = frozenset(self.state.attempt.tolerated | set(self.state.attempt.due))     # lost, and let go or due back
            decision = policy.decide(self.state.policy, statuses, waiting, self.state.restarts, self._progress(), self.state.evaluator_restarts)
            if decision.action is Action.FINISH:
                if decision.tasks:
                    done = 'the chief is done' if self.spec.coordinator else 'every worker is done'
                    self.say(f'{done}; stopping {", ".join(decision.tasks)}: {decision.reason}')
                    self._stop([r for r in self.state.records if r.name in decision.tasks])
                return
            if decision.action is Action.CONTINUE:
                quiet = self._progress()
                warning = quiet_warning(self.state, self.backends, quiet)
                if warning is not None:         # once per step: the loop notes it was said
                    self.state.attempt.warned_step = quiet.step
                    self.say(warning)
                tail_deadline = check_tail(self.spec, self.life, statuses, tail_deadline, self._progress(),
                                           self.finish_timeout)
                if tail_deadline == -1:
                    return
            elif self.recovery.act(decision, statuses):
                tail_deadline = None
            first_step = self.state_file.launch_state.progress is None and self.state.attempt.step is not None
            if first_step or time.monotonic() - last_saved > 1:     # `launch status` shows the step
                self.save_state(changed_only=True)
                last_saved = time.monotonic()
            time.sleep(SUPERVISE_SECS)

    def _scale(self, statuses: list[TaskStatus]) -> None:
        """The scale request under way, or a new one; a task lost while a sync scale started the
        cluster again is a fault like any other, under the run's policy."""
        self.scaling.step(statuses)
        if self.state.lost_starting is not None:
            self._lost_in_start()

    def _lost_in_start(self) -> None:
        """The task lost while the cluster started: one more fault (recovery.py lost_in_start)."""
        loss, self.state.lost_starting = self.state.lost_starting, None
        assert loss is not None
        self.recovery.lost_in_start(loss)

    def _observe(self) -> list[TaskStatus]:
        """Every current task's state; a host that cannot be asked makes its tasks UNKNOWN. A task lost
        with its own error saying the disk had no room is a full disk (launch/run/disk.py Refusals)."""
        statuses = self.state.attempt.observe(self.state.records, self.backends, self.say)
        if self.spec.coordinator or self.spec.train.command:
            tell_own_refusals(self, statuses)
        return statuses

    def _progress(self) -> Progress:
        return self.state.attempt.progress(self.spec.train.steps)

    def check_run_dir(self) -> None:
        check_run_dir(self.spec.train.train_dir, self._run_dir_fd)

    # -- attempts and restarts -----------------------------------------------------------------
    def apply(self, plan: Plan) -> None:
        """Carry out a plan (plan.py), in its order: the one place the state changes for a fault
        tolerated, tasks restarted, a failover, a scale, the cluster restarted or the run given up."""
        state = self.state
        if plan.restart is not None:
            state.restarts += 1
            state.history.commit(plan.restart)
        if plan.relaunch is not None and plan.relaunch.number is not None:
            state.restarts = plan.relaunch.number
        state.evaluator_restarts += plan.evaluator_restart
        state.preemptions += plan.preemptions
        state.retired |= plan.retire
        state.attempt.tolerated = (state.attempt.tolerated | plan.tolerate) - plan.welcome
        if plan.members is not None:
            state.members = plan.members
        if plan.scale is not None or plan.scale_over:
            state.scale = plan.scale
        state.records = [r for r in state.records if r.name not in plan.leaving]
        if plan.attempt is not None:
            self.new_attempt(plan.attempt.reason, plan.attempt.from_step, plan.attempt.ended, plan.attempt.env)
        if plan.members is not None and plan.publish:
            self.leases.publish()
        for line in plan.say:
            self.say(line)
        if plan.restart_tasks:
            self.life.next_attempt(plan.restart_reason, None, tasks=plan.restart_tasks)
        for event in plan.events:
            self.life.emit(event)
        let_go(plan, self.state.records, self.backends)
        state.dropped |= set(plan.drop)
        if plan.restarted_chief:
            state.attempt.restarted_chief()
        for name in plan.unserved:
            state.serving.pop(name, None)
        state.attempt.due.update(plan.due)
        self.start_due(plan.starts)
        if plan.start:
            self.apply(reconcile(state, time.monotonic()))
        self._apply_whole(plan)

    def _apply_whole(self, plan: Plan) -> None:
        """The parts of a plan about every task: stopped to start again (then what the stop left
        decides the rest, recovery.py resume), started, or stopped to give the run up."""
        relaunch, start = plan.relaunch, plan.start_all
        if plan.save_first is not None:
            self.state.saved_first = saved_since(self.life, plan.save_first)
        if relaunch is not None:
            self.teardown(checkpoint=relaunch.checkpoint)
            if relaunch.number is None:     # a sync scale: no fault, no backoff
                self.apply(resume_scaled(self.state, relaunch, self.life.checkpoint_step()))
            else:
                self.clock.phase('stop')
                step = self.life.checkpoint_step()
                delay = 0.0 if relaunch.preempted else self.state.history.backoff(self.state.policy)
                self.apply(resume(self.state, relaunch, step, delay, self.clock.done))
        if start is not None and not self.interrupted.wait(start.wait):
            if start.restart is not None:
                self.clock.phase('backoff', from_step=self.state.attempt.from_step)
                self.check_run_dir()
            try:
                self.start_cluster(restart=start.restart)
                if start.restart is not None:
                    self.clock.phase('start')
            except TaskFailed as e:
                if e.task is None:          # not a task lost on the way (a port, a timeout): the run ends
                    raise
                self.state.lost_starting = StartLoss(e.task, e.how, e.exit_code)
        if plan.give_up is not None:
            self.clock.forget()
            self.teardown(checkpoint=plan.give_up.can_save)
            raise plan.give_up.failed(self.life.checkpoint_step)

    def new_attempt(self, reason: str, step: int | None, ended: RunResult,
                    env: Mapping[str, str] | None = None) -> None:
        """End this attempt (`ended` goes to run.json) and begin the next from nothing seen: its
        logs are files of their own; `env`: what its tasks are told besides."""
        self.life.next_attempt(reason, step, ended=ended)
        # Workers let go (recovery.py tolerate) stay out of the live set: their records
        # (stopped with the rest) go, and the policy counts the workers that train now.
        self.resize(self.state.members, [r.name for r in self.state.records if r.job == 'worker' and not self.spec.coordinator
                                   and r.index not in self.state.members.workers])
        plans = [dataclasses.replace(p, attempt=self.life.attempt) for p in self.state.plans]
        if env:
            plans = [dataclasses.replace(p, env={**p.env, **env}) for p in plans]
        self.state.plans = plans
        self.state.attempt = Attempt(from_step=step)
        self.state_file.launch_state.progress = None

    def resize(self, members: Members, leaving: Sequence[str]) -> None:
        """A new live set, between two attempts: the leaving workers' records go, and the policy
        counts the workers that train now."""
        self.state.members = members
        self.state.records = [r for r in self.state.records if r.name not in leaving]
        self.state.policy = Policy.of(dataclasses.replace(self.spec, live=members.count))

    # -- starting, following and stopping tasks ------------------------------------------------
    def _start(self, plans: list[TaskPlan]) -> None:
        """Start these tasks (replacing their earlier records), follow their logs, save the state at
        most every SAVE_BATCH_SECS (once per start costs N^2/2 records) and at the end: a launcher
        killed in between leaves that much unrecorded, and those tasks end by their lease. At most
        a backend's start_window of them are starting at once (admission.py)."""
        self.life.unfollow([plan.name for plan in plans])   # the earlier starts' lines are all read before these write
        saved = time.monotonic()
        try:
            for name in dict.fromkeys(plan.backend for plan in plans):
                backend, mine = self.backends[name], [p for p in plans if p.backend == name]
                gate = Gate(window_for(backend.start_window, len(mine)), self.interrupted)
                for record in backend.start_many(mine, self.interrupted):
                    self._started(backend, record)
                    gate.admit(self.state.serving[record.name])
                    if time.monotonic() - saved >= SAVE_BATCH_SECS:
                        self.save_state()
                        saved = time.monotonic()
        finally:
            self.save_state()

    def _started(self, backend: Backend, record: TaskRecord) -> None:
        self.state.started(record)
        self.state.attempt.forget_notice(record.name)
        self.life.task_started(record.name, host=record.host, **backend.locate(record),
                               **({'warm': True} if record.warm else {}))
        self.clock.started(record.warm)
        follow(self.life, self.state, self.clock, backend, record, self.is_chief(record), self.spec.coordinator)

    def start_cluster(self, restart: int | None = None) -> None:
        """Start every live task (`restart`: as that restart, their logs appended to) and wait for
        their servers."""
        t0 = time.monotonic()
        if restart is not None and self._place_again is not None:
            place_again(self, self._place_again)
        plans = self.state.desired()
        self._start(plans if restart is None else [dataclasses.replace(p, restart=restart) for p in plans])
        self.wait_ready(t0)

    def wait_ready(self, t0: float) -> None:
        wait_for_servers(self.state.records, self.backends, t0 + self.start_timeout, self.interrupted,
                         reported=lambda name: self.state.serving[name].is_set(), stall_secs=self.state.policy.stall_secs)

    def start_due(self, names: Sequence[str]) -> None:
        """Start these due tasks, whose backoff has passed (reconcile.py ready), in this order."""
        for name in names:
            if self.interrupted.is_set():
                break
            del self.state.attempt.due[name]
            earlier = [r for r in self.state.records if r.name == name and self.backends[r.backend].status(r).alive]
            if earlier:         # a frozen copy still holds its port: it goes first
                stop_all(earlier, self.backends)
            self.state.attempt.frozen_since.pop(name, None)
            self.clock.phase('backoff')
            try:
                self._start([dataclasses.replace(p, restart=self.state.restarts) for p in self.state.plans if p.name == name])
            except BackendError as e:
                self.state.attempt.tolerated.add(name)
                self.say(f'could not start {name} again ({e}); training goes on without it')

    def is_chief(self, record: TaskRecord) -> bool:
        """The task that saves: a coordinator run's chief (its worker 0 only serves), else worker 0."""
        return record.job == 'chief' if self.spec.coordinator else record.is_chief

    def _stop(self, records: list[TaskRecord], checkpoint: bool = True) -> None:
        """Stop these tasks: the chief first, with time to write its checkpoint while the ps tasks
        still run (only then can it save; `checkpoint`: and they answer), then everything else at once."""
        live = [r for r in records if self.backends[r.backend].status(r).alive]
        ps_alive = all(self.backends[r.backend].status(r).alive for r in self.state.records if r.job == 'ps')
        first = [r for r in live if self.is_chief(r)] if ps_alive and checkpoint else []
        if first:
            self.backends[first[0].backend].stop(first, grace=CHECKPOINT_GRACE_SECS)
        stop_all([r for r in live if r not in first], self.backends)

    def teardown(self, checkpoint: bool = True) -> None:
        """Stop every task and stop following their logs once all is read."""
        self._stop(self.state.records, checkpoint)
        self.life.unfollow([r.name for r in self.state.records])

    # -- the tasks' leases and the state file --------------------------------------------------
    def save_state(self, changed_only: bool = False) -> None:
        """The state file `launch status` reads (statefile.py); `changed_only`: the once a second's."""
        self.state_file.save(self.state, self.scaling.asked, changed_only)
