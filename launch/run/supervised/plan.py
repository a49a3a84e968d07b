"""A plan: what the supervisor's loop is to do about one decision or request, as data.

Recovery (launch/run/supervised/recovery.py), failover (failover.py) and scaling (scaling.py)
never change the run: each is a function from the run's state (state.py), what was observed and
the decision or request at hand to a Plan. The loop (loop.py) is the one writer of the state: it
applies a plan in one fixed order, so what a fault or a scale does is read off the plan, and a
table test can state it without starting a process.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping

from cluster.runtime.membership import Members
from launch.records.event_types import Event
from launch.run.lifecycle import RunResult
from launch.run.supervised.faults import Backoff, Verdict
from launch.run.supervised.state import ScaleOp


@dataclass(frozen=True)
class Relaunch:
    """Every task stopped, to start the whole cluster again in a new attempt (a restart of the
    cluster, a sync scale). What follows the stop needs what the stop leaves (the checkpoint to
    resume from, and a restart's backoff, counted once every task stopped): the loop reads those
    then and applies the plan recovery.py `resume` (scaling.py `resume_scaled`) makes of them."""
    number: int | None      # the restart it is, of supervise.max_restarts (None: a sync scale, no fault)
    reason: str             # the fault, as the decision gives it; a scale's attempt's reason
    checkpoint: bool        # the chief saves first (it and every ps can still answer)
    members: Members | None = None      # a sync scale's live set from the next attempt on
    leaving: tuple[str, ...] = ()       # ... and the workers that leave it
    preempted: bool = False             # a preemption's: `number` is the restarts so far (none spent), no backoff


@dataclass(frozen=True)
class NewAttempt:
    """The attempt ends (`ended`, to run.json) and the next begins from the checkpoint at
    `from_step` (the `restart` event); its tasks are told `env` besides."""
    reason: str
    from_step: int | None
    ended: RunResult
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StartAll:
    """Every live task started (a new attempt's), after `wait` seconds (the backoff), as restart
    `restart` (None: a sync scale's start, no restart), and their servers waited for. A task
    lost on the way is an observation the loop decides about (SupervisorState.lost_starting)."""
    wait: float
    restart: int | None


@dataclass(frozen=True)
class SaveFirst:
    """The chief asked for a checkpoint through every lease (the plan's `members` count one more
    save) before anything stops: the loop waits at most `secs` for a checkpoint other than
    `before` to read back, and notes in SupervisorState.saved_first whether one did (a sync
    scale goes on only then, scaling.py). The cluster trains on either way."""
    before: int | None
    secs: float


@dataclass(frozen=True)
class Plan:
    """What to change, in the order the loop applies it: the restart counted, the desired set
    (members, tolerated, retired), a new attempt of all tasks, the leases told, the lines said,
    a new attempt of the tasks named, the events, the tasks stopped (some, or all to start
    again, or all to give up), the tasks due and when, the due ones started (`starts`, as
    reconcile.py makes them; `start`: reconcile at once), a checkpoint waited for, the whole
    cluster started again. The scale under way is set first. The empty plan changes nothing."""
    restart: Backoff | None = None              # one more of supervise.max_restarts, committed to the history
    evaluator_restart: bool = False             # one more of a coordinator run's evaluator's own restarts
    preemptions: int = 0                        # preemption notices told (preemption.py): none is a restart
    members: Members | None = None              # the live set from now on
    leaving: tuple[str, ...] = ()               # workers whose records go (they left the live set between attempts)
    publish: bool = False                       # told to every lease at once (else within LEASE_RENEW_SECS)
    tolerate: frozenset[str] = frozenset()      # lost and let go (the training goes on without them)
    welcome: frozenset[str] = frozenset()       # let go before, now asked to join anew
    retire: frozenset[str] = frozenset()        # failed over: never started again
    say: tuple[str, ...] = ()                   # the console's lines
    restart_tasks: tuple[str, ...] = ()         # these tasks begin the next attempt (the `restart` event)
    restart_reason: str = ''                    # ... for this reason
    events: tuple[Event, ...] = ()              # the event log's lines, after the `restart` event
    kill: tuple[str, ...] = ()                  # stopped at once (no grace: a coordinator's chief without its ps)
    drop: tuple[str, ...] = ()                  # stopped in the background (a failed-over worker's host may hang)
    starts: tuple[str, ...] = ()                # due tasks whose time came, started in this order (reconcile.py)
    restarted_chief: bool = False               # the chief resumes from a checkpoint: an older step is progress
    due: Mapping[str, float] = field(default_factory=dict)     # tasks to start, and when (time.monotonic())
    start: bool = False                         # reconcile now: start what is due (else at the loop's next round)
    unserved: tuple[str, ...] = ()              # tasks whose earlier start's "serving" no longer counts
    relaunch: Relaunch | None = None            # every task stopped, the cluster to start again (recovery.resume)
    attempt: NewAttempt | None = None           # the attempt ends and the next begins
    start_all: StartAll | None = None           # every live task started, after a wait
    give_up: Verdict | None = None              # the run ends: every task stopped, then its one line (TaskFailed)
    scale: ScaleOp | None = None                # the scale under way from now on (SupervisorState.scale)
    scale_over: bool = False                    # the scale under way is answered: none is under way
    save_first: SaveFirst | None = None         # the chief's checkpoint asked for and waited for, after the leases

    @property
    def empty(self) -> bool:
        return self == Plan()
