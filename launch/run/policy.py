"""The supervisor's decisions, as a pure function of task states and training progress.

`launch/run/supervised/loop.py` observes the tasks (through their backends) and the global step (from the workers'
progress lines), and asks `decide` what to do; it never decides itself. So every rule here is
tested in milliseconds with plain values (tests/unit/launch/run/test_supervise.py), and the real-cluster tests
only check that the decisions are carried out.

The rules, in order:
  - a task that ended badly, or that no one can reach for `unreachable_secs`, is lost. Losing a
    non-chief worker is tolerated when the training copes without it: always in async mode, and in
    sync mode while at least `replicas_to_aggregate` workers are left. With `restart: on-failure`
    (and restarts left) a tolerated worker is started again and rejoins.
  - losing a ps, the chief, or too many sync workers is fatal: restart the cluster from its
    checkpoint if the policy allows and restarts are left, else give up.
  - no new global step for `stall_secs` (once the first step is seen, and until the last) is a
    stall: restart or give up likewise.
  - once every worker is done (finished, or lost and tolerated), the run is finished; ps tasks
    left running then are only waiting for reports that will never come.
  - the first restart after a healthy run waits nothing; each further restart in a row waits
    `backoff_secs`, doubling up to `backoff_max_secs`; a run whose training came back after its
    last restart, or that went HEALTHY_SECS without a fault, starts again with no wait (launch/run/supervised/faults.py FaultHistory).
  - a fault that repeats the one before the last restart (the same task, the same error of its
    own, no newer checkpoint in between) ends the run: another restart would fail the same way.
    A fault with no error of its own (a kill, a lost host) comes from outside and never repeats.
  - a task lost while a restart starts the cluster again is one more fault, under the same rules.
  - while the disk under the run is full (Progress.disk), a fault is named with it, first, and the
    cluster is not started again (on_full_disk).
  - a user's `train.command` is a black box: losing any of its tasks is fatal, and its ps tasks are
    stopped once every worker has exited 0 (they `server.join()` for ever).

A coordinator run (a `chief`: TF2 ParameterServerStrategy) follows PSS's own recovery rules
(`decide_coordinator`): a lost worker is started again alone at its address while the chief
trains on (PSS re-queues its work and takes it back); a lost ps is started again with the chief,
which resumes from its checkpoint; a lost chief or evaluator is started again alone (a chief lost
while a ps cannot be asked waits for that ps's verdict first, for the ps is most often what it
lost). A ps or chief lost with its host starts again only where its backend can place it
elsewhere (Ray), and then with the whole cluster, which must learn its new address. Without
restarts a lost worker or evaluator is let go, a lost ps or chief ends the run. The evaluator's
restarts are its own (as many as supervise.max_restarts), never the run's, and it never ends the
training. On a full disk neither the ps nor the chief is started again (the chief could not save).
The run is done when the chief's process has ended and the evaluator (if any) has evaluated the
last checkpoint; the servers, which never end by themselves, are then stopped, never before the
chief has ended (a chief still talking to stopped servers logs a gRPC error per function it frees).
"""
from __future__ import annotations

import dataclasses
import enum
import re
import signal
from dataclasses import dataclass
from collections.abc import Mapping
from typing import TYPE_CHECKING

from cluster.runtime.contract import job_of
from cluster.runtime.rundir import EXIT_NO_RESTART
from cluster.spec import ClusterSpec, is_chief

if TYPE_CHECKING:
    from launch.run.stacks import StackDump


class TaskState(str, enum.Enum):
    STARTING = 'starting'
    RUNNING = 'running'
    SUCCEEDED = 'succeeded'
    FAILED = 'failed'
    UNKNOWN = 'unknown'      # its host could not be asked; `since` says for how long

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class TaskStatus:
    name: str                # 'worker:1'
    job: str
    index: int
    state: TaskState
    exit_code: int | None = None     # FAILED: the code (negative: killed by that signal)
    since: float = 0.0               # UNKNOWN: seconds it has been unknown
    movable: bool = False            # UNKNOWN: lost with its host, it can start elsewhere (Ray; placing.py)
    frozen: float = 0.0              # RUNNING: seconds it has been stopped (SIGSTOP, docker pause)
    preempted: bool = False          # FAILED: it left on a preemption notice (supervise.preemption_grace)

    @property
    def is_chief(self) -> bool:
        return is_chief(self.job, self.index)


@dataclass(frozen=True)
class Progress:
    step: int | None          # the newest global step any worker reported; None before the first
    total: int                # train.steps
    quiet_secs: float         # seconds since `step` last changed (or since the run began)
    saved: int | None = None  # the newest checkpoint the chief said it saved (this start of it)
    disk: str | None = None   # why the disk under the tasks' files refuses them, while it does (with its path)


class Action(str, enum.Enum):
    CONTINUE = 'continue'
    TOLERATE = 'tolerate'            # note the lost worker(s) and go on
    RESTART_TASKS = 'restart tasks'  # start the lost worker(s) again; the rest keep training
    RESTART = 'restart'              # stop everything, start again from the checkpoint
    FINISH = 'finish'                # every worker is done: stop what is left, exit 0
    GIVE_UP = 'give up'              # exit 1

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Decision:
    action: Action
    tasks: tuple[str, ...] = ()      # the tasks the decision is about (lost, or stuck)
    reason: str = ''                 # why, in words, for the one line the user sees
    stalled: bool = False
    note: str = ''                   # why a restart was not tried (after the task's error, in that line)
    disk: str | None = None          # a full disk under the run (Progress.disk): named first, as the cause
    stacks: StackDump | None = None  # a stall's stack dumps, taken before anything is done (launch/run/stacks.py)
    preempted: bool = False          # its cause left on a preemption notice: no fault, not counted (preemption.py)


@dataclass(frozen=True)
class Policy:
    """What `decide` needs of the spec: kept small so tests can state it directly."""
    sync: bool
    num_workers: int
    replicas_to_aggregate: int
    restart: str = 'never'
    max_restarts: int = 3
    stall_secs: float = 60.0
    unreachable_secs: float = 30.0
    # A user's `train.command`: nothing is known of how it copes with a lost worker (so every loss
    # counts), and its ps tasks serve until stopped (`server.join()`), not until told "done".
    user_command: bool = False
    backoff_secs: float = 1.0
    backoff_max_secs: float = 30.0
    coordinator: bool = False        # a chief runs a ParameterServerStrategy program: PSS's rules

    @classmethod
    def of(cls, spec: ClusterSpec) -> Policy:
        s = spec.supervise
        return cls(sync=spec.train.sync, num_workers=spec.live_workers,
                   replicas_to_aggregate=spec.replicas_to_aggregate, restart=s.restart,
                   max_restarts=s.max_restarts, stall_secs=s.stall_secs, unreachable_secs=s.unreachable_secs,
                   user_command=spec.train.command is not None, backoff_secs=s.backoff_secs,
                   backoff_max_secs=s.backoff_max_secs, coordinator=spec.coordinator)


def is_lost(t: TaskStatus, policy: Policy, stalled: bool = False) -> bool:
    """Ended badly, unreachable for `unreachable_secs`, or stopped for `stall_secs` while the global
    step is not stalled (a frozen task the others train around: an async worker, or the chief once
    the other workers are done; a stall is the stall rule's, which names the frozen task)."""
    return t.state is TaskState.FAILED or (t.state is TaskState.UNKNOWN and t.since >= policy.unreachable_secs) \
        or (t.state is TaskState.RUNNING and not stalled and t.frozen >= policy.stall_secs)


def scale_moves(pool: int, live: tuple[int, ...], retired: set[int], want: int) -> tuple[list[int], list[int]]:
    """`launch scale` to `want` workers: (indices to start, indices to take out). New ones are the
    lowest free indices of the pool (never a worker failed over: its host was lost); the ones
    taken out are the highest, never the chief. Fewer than asked when the pool has no more."""
    free = [i for i in range(pool) if i not in live and i not in retired]
    add = free[:max(0, want - len(live))]
    remove = sorted((i for i in live if i != 0), reverse=True)[:max(0, len(live) - want)]
    return add, remove


def pick_spares(lost: list[str], host_of: Mapping[str, str], unreachable: set[str],
                spares: list[str]) -> dict[str, str]:
    """Failover: for each lost worker whose host cannot be reached, the first spare of the pool
    (in index order) on a host that can be, each spare used once; workers with no such spare are
    left out (they stay tolerated). Pure: names and hosts in, lost -> spare out."""
    free = [s for s in spares if host_of.get(s) not in unreachable]
    moves = {}
    for name in lost:
        if host_of.get(name) in unreachable and free:
            moves[name] = free.pop(0)
    return moves


def describe_exit(code: int | None) -> str:
    if code is None:
        return 'could not be reached'
    if code < 0:
        try:
            return f'was killed by {signal.Signals(-code).name}'
        except ValueError:
            return f'was killed by signal {-code}'
    return f'exited with code {code}'


def how_lost(t: TaskStatus) -> str:
    if t.preempted:
        return f'{t.name} was preempted'
    if t.state is TaskState.RUNNING and t.frozen:
        return f'{t.name} has been stopped (SIGSTOP, or paused) for {t.frozen:.0f}s'
    if t.state is TaskState.UNKNOWN:
        return f'{t.name} could not be reached for {t.since:.0f}s'
    return f'{t.name} {describe_exit(t.exit_code)}'


def decide(policy: Policy, tasks: list[TaskStatus], tolerated: frozenset[str] | set[str],
           restarts: int, progress: Progress, evaluator_restarts: int = 0) -> Decision:
    """What to do now. `tolerated`: workers already lost and let go (not counted again);
    `restarts`: restarts made so far in this run; `evaluator_restarts`: a coordinator run's
    evaluator's, which are its own (decide_coordinator)."""
    if policy.coordinator:
        decision = decide_coordinator(policy, tasks, tolerated, restarts, progress, evaluator_restarts)
    else:
        decision = _decide(policy, tasks, tolerated, restarts, progress)
    cause = next((t for t in tasks if decision.tasks and t.name == decision.tasks[0]), None)
    if cause is not None and cause.preempted and decision.action is not Action.FINISH:
        decision = dataclasses.replace(decision, preempted=True)
    return on_full_disk(decision, progress)


NO_RESTART_ON_FULL_DISK = ('no restart while the disk is full (the tasks started again could neither log nor '
                           'save a checkpoint): free space first')


def on_full_disk(decision: Decision, progress: Progress) -> Decision:
    """A fault while the disk under the run refuses its files (progress.disk) is named with the
    disk, first: its words are never those of a training that stopped by itself (a stall then
    is the disk's: the steps cannot be seen). And the cluster is not started again: the new
    tasks could not log that they serve, nor save a checkpoint, so a restart would only stop a
    training that may still go on and fail the same way; ending the run keeps the steps of the
    newest checkpoint for a `launch up` once there is room. A run that goes on meanwhile goes on:
    its steps are read from the tasks' pulses (launch/run/disk.py)."""
    if progress.disk is None or decision.action in (Action.CONTINUE, Action.FINISH):
        return decision
    if decision.action is not Action.RESTART:
        return dataclasses.replace(decision, disk=progress.disk)
    return dataclasses.replace(decision, action=Action.GIVE_UP, disk=progress.disk,
                               note=decision.note or NO_RESTART_ON_FULL_DISK)


def _decide(policy: Policy, tasks: list[TaskStatus], tolerated: frozenset[str] | set[str],
            restarts: int, progress: Progress) -> Decision:
    """`decide` for a run of the built-in trainer, a program or a command (see the module's docstring)."""
    can_restart = policy.restart == 'on-failure' and restarts < policy.max_restarts
    stalled = progress.step is not None and progress.step < progress.total and progress.quiet_secs >= policy.stall_secs
    newly_lost = [t for t in tasks if is_lost(t, policy, stalled) and t.name not in tolerated]
    if newly_lost:
        fatal = [t for t in newly_lost if t.job == 'ps' or t.is_chief or policy.user_command]
        why = ''
        if policy.sync and not fatal:
            lost_workers = {t.name for t in tasks if t.job == 'worker' and is_lost(t, policy, stalled)} | set(tolerated)
            left = policy.num_workers - len(lost_workers)
            if left < policy.replicas_to_aggregate:
                fatal = [t for t in newly_lost if t.job == 'worker']
                why = (f'; {left} worker(s) left, fewer than the {policy.replicas_to_aggregate} '
                       'each sync step needs')
        # Several lost at once: the likely cause first (a ps, then a task killed by a signal);
        # the others most often only lost their peer.
        newly_lost.sort(key=lambda t: (t.job != 'ps', not (t.exit_code or 0) < 0, not t.is_chief))
        names = tuple(t.name for t in newly_lost)
        reason = how_lost(newly_lost[0])
        if len(newly_lost) > 1:
            reason += f' (then {", ".join(how_lost(t) for t in newly_lost[1:])})'
        if newly_lost[0].preempted:
            can_restart = policy.restart == 'on-failure'    # a preemption is no fault: it spends no restart
        # A task that said a restart cannot help (no checkpoint restores), or a worker whose host
        # cannot be reached (a new start there would fail too), is not started again.
        if any(t.exit_code == EXIT_NO_RESTART for t in newly_lost):
            can_restart = False
        if fatal:
            return Decision(Action.RESTART if can_restart else Action.GIVE_UP, names, reason + why)
        reachable = all(t.state in (TaskState.FAILED, TaskState.RUNNING) for t in newly_lost)   # not UNKNOWN
        return Decision(Action.RESTART_TASKS if can_restart and reachable else Action.TOLERATE, names, reason)

    workers = [t for t in tasks if t.job == 'worker']
    done = all(t.state is TaskState.SUCCEEDED or t.name in tolerated for t in workers)
    if done:
        ps_running = [t for t in tasks if t.job == 'ps' and t.state is not TaskState.SUCCEEDED]
        # With every worker reported, the ps tasks leave by themselves; a lost worker never reports,
        # and a user command's ps tasks serve until stopped.
        if policy.user_command and ps_running:
            return Decision(Action.FINISH, tuple(t.name for t in ps_running),
                            'a command\'s ps tasks serve until they are stopped')
        if not ps_running or tolerated:
            return Decision(Action.FINISH, tuple(t.name for t in ps_running),
                            'they would wait for the lost workers\' reports' if ps_running else '')
        return Decision(Action.CONTINUE)

    if progress.step is not None and progress.step < progress.total and progress.quiet_secs >= policy.stall_secs:
        stuck = tuple(t.name for t in tasks if t.state in (TaskState.RUNNING, TaskState.UNKNOWN))
        reason = f'no new global step for {progress.quiet_secs:.0f}s (stuck at {progress.step}/{progress.total})'
        return Decision(Action.RESTART if can_restart else Action.GIVE_UP, stuck, reason, stalled=True)
    return Decision(Action.CONTINUE)


# The order a coordinator run's losses are named in: the likely cause first.
_CAUSE_ORDER = {'ps': 0, 'chief': 1, 'worker': 2, 'evaluator': 3}


def chief_done(progress: Progress) -> bool:
    """A coordinator run's chief has saved its checkpoint at the last step: the training is done,
    whether or not its process has ended yet."""
    return progress.saved is not None and progress.saved >= progress.total


def decide_coordinator(policy: Policy, tasks: list[TaskStatus], tolerated: frozenset[str] | set[str],
                       restarts: int, progress: Progress, evaluator_restarts: int = 0) -> Decision:
    """`decide` for a coordinator run (see the module's docstring)."""
    can_restart = policy.restart == 'on-failure' and restarts < policy.max_restarts
    stalled = progress.step is not None and progress.step < progress.total and progress.quiet_secs >= policy.stall_secs
    lost = sorted((t for t in tasks if is_lost(t, policy, stalled) and t.name not in tolerated),
                  key=lambda t: (_CAUSE_ORDER.get(t.job, 9), not (t.exit_code or 0) < 0))
    if lost and all(t.job == 'evaluator' for t in lost):
        return decide_evaluator(policy, lost, evaluator_restarts)
    lost = [t for t in lost if t.job != 'evaluator']    # an evaluator lost with them is decided on next
    if lost and lost[0].preempted:
        can_restart = policy.restart == 'on-failure'    # a preemption is no fault: it spends no restart
    if any(t.job == 'chief' for t in lost) and not any(t.job == 'ps' for t in lost) and any(
            t.job == 'ps' and t.state is TaskState.UNKNOWN for t in tasks):
        # A chief lost while a ps cannot be asked most often lost that ps: its verdict first, one restart for both.
        return Decision(Action.CONTINUE)
    if lost:
        reason = how_lost(lost[0]) + (f' (then {", ".join(how_lost(t) for t in lost[1:])})' if len(lost) > 1 else '')
        if any(t.exit_code == EXIT_NO_RESTART for t in lost):
            can_restart = False
        reachable = all(t.state in (TaskState.FAILED, TaskState.RUNNING) for t in lost)
        vital = [t for t in lost if t.job in ('ps', 'chief')]
        if vital:
            chiefs = [t.name for t in tasks if t.job == 'chief']
            names = tuple(dict.fromkeys([t.name for t in vital if t.job == 'ps'] + chiefs))
            # A task lost with its host starts again only where its backend can place it elsewhere,
            # at a new address every task must be told: with the whole cluster.
            movable = all(t.state in (TaskState.FAILED, TaskState.RUNNING) or t.movable for t in lost)
            if not can_restart or not movable or progress.disk:
                # A chief started again on a full disk fails at its next checkpoint as this one did.
                note = NO_RESTART_ON_FULL_DISK if can_restart and movable else ''
                return Decision(Action.GIVE_UP, names, reason, note=note)
            if not reachable:
                return Decision(Action.RESTART, tuple(t.name for t in tasks if t.job != 'evaluator'),
                                reason + '; the cluster starts again elsewhere, from the chief\'s checkpoint')
            why = ('; the chief resumes from its checkpoint' if any(t.job == 'ps' for t in vital)
                   else '; it resumes from its checkpoint')
            return Decision(Action.RESTART_TASKS, names, reason + why)
        names = tuple(t.name for t in lost)
        return Decision(Action.RESTART_TASKS if can_restart and reachable else Action.TOLERATE, names, reason)

    chief = [t for t in tasks if t.job == 'chief']
    if chief and all(t.state is TaskState.SUCCEEDED for t in chief):
        evaluating = [t for t in tasks if t.job == 'evaluator' and t.state is not TaskState.SUCCEEDED
                      and t.name not in tolerated]
        if evaluating:
            return Decision(Action.CONTINUE)     # it evaluates the last checkpoint (bounded by the supervisor)
        left = tuple(t.name for t in tasks if t.state is not TaskState.SUCCEEDED)
        return Decision(Action.FINISH, left, 'the chief\'s program has ended, and servers never end by themselves'
                        if left else '')
    if chief_done(progress):
        # The last checkpoint is saved: the chief ends within moments (it frees nothing of its
        # program: cluster/coordinator.py keep_program_alive); the servers wait for it, which the
        # supervisor bounds by --finish-timeout.
        return Decision(Action.CONTINUE)
    if stalled:
        stuck = tuple(t.name for t in chief)
        reason = f'no new global step for {progress.quiet_secs:.0f}s (stuck at {progress.step}/{progress.total})'
        return Decision(Action.RESTART if can_restart else Action.GIVE_UP, stuck, reason, stalled=True)
    return Decision(Action.CONTINUE)


def decide_evaluator(policy: Policy, lost: list[TaskStatus], restarts: int) -> Decision:
    """A coordinator run's evaluator lost (and nothing else): started again alone while its own
    restarts last (supervise.max_restarts of them, never the run's: an evaluator that fails at every
    checkpoint must not spend what a lost ps or chief needs), else let go. The training goes on
    either way: an evaluator never ends it."""
    reason = how_lost(lost[0]) + (f' (then {", ".join(how_lost(t) for t in lost[1:])})' if len(lost) > 1 else '')
    names = tuple(t.name for t in lost)
    reachable = all(t.state in (TaskState.FAILED, TaskState.RUNNING) for t in lost)
    if policy.restart != 'on-failure' or not reachable or any(t.exit_code == EXIT_NO_RESTART for t in lost):
        return Decision(Action.TOLERATE, names, reason)
    if restarts >= policy.max_restarts and not lost[0].preempted:
        return Decision(Action.TOLERATE, names, reason, note=f'its own {restarts} restart(s) are spent '
                                                             '(supervise.max_restarts)')
    return Decision(Action.RESTART_TASKS, names, reason)


def evaluator_only(decision: Decision) -> bool:
    """A decision about a coordinator run's evaluator alone: its restarts are its own, and the
    training never stopped for it."""
    return bool(decision.tasks) and all(job_of(name) == 'evaluator' for name in decision.tasks)


# -- after the decision: how long to wait, and whether a restart can help -------------------------

HEALTHY_SECS = 60.0     # this long without a fault, and the next restart waits backoff_secs again


def backoff_delay(policy: Policy, streak: int) -> float:
    """The wait before the `streak`-th restart in a row (1: the first since the run was healthy).
    The first waits nothing: a healthy run that lost a task wants it back at once, and a crash
    loop shows only from the second restart in a row, which waits backoff_secs, doubling from
    there (as Kubernetes' CrashLoopBackOff restarts a container at once the first time)."""
    if streak < 2 or policy.backoff_secs <= 0:
        return 0.0
    return min(policy.backoff_max_secs, policy.backoff_secs * 2 ** min(streak - 2, 30))


def next_streak(streak: int, since_last_fault: float | None) -> int:
    """The restart streak after one more fault, `since_last_fault` seconds after the one before
    (None: the first fault of the run)."""
    if since_last_fault is None or since_last_fault >= HEALTHY_SECS:
        return 1
    return streak + 1


@dataclass(frozen=True)
class Fault:
    """What identifies a fault for the repeat rule."""
    task: str
    error: str | None          # the task's own last error line (None: it had none)
    checkpoint: int | None     # the newest checkpoint's step when it happened

    @classmethod
    def of(cls, task: str, error: str | None, checkpoint: int | None) -> Fault:
        # An address or a number that changes from one try to the next (the step a save failed at,
        # a pid) does not make it another error; the checkpoint says whether the run got further.
        same = re.sub(r'\d+', 'N', re.sub(r'0x[0-9a-fA-F]+', '0x?', error)) if error else None
        return cls(task, same, checkpoint)


def repeats(previous: Fault | None, fault: Fault) -> bool:
    """Whether `fault` is the fault before the last restart again: a restart would fail the same way."""
    return previous is not None and fault.error is not None and previous == fault


def escalate(decision: Decision, previous: Fault | None, fault: Fault) -> Decision:
    """A restart decision about a fault that repeats the one before becomes giving up."""
    if decision.action not in (Action.RESTART, Action.RESTART_TASKS) or not repeats(previous, fault):
        return decision
    return dataclasses.replace(decision, action=Action.GIVE_UP,
                               note='the same failure as before the last restart, with no newer checkpoint: '
                                    'a restart cannot help')


def during_recovery(policy: Policy, restarts: int, task: str, how: str, exit_code: int | None) -> Decision:
    """A task lost while a restart started the cluster again: one more fault, restarting the
    cluster again while restarts are left (a task that said no restart can help ends the run)."""
    can_restart = (policy.restart == 'on-failure' and restarts < policy.max_restarts
                   and exit_code != EXIT_NO_RESTART)
    return Decision(Action.RESTART if can_restart else Action.GIVE_UP, (task,), how)
