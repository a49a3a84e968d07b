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


@dataclass(frozen=True)
class Backoff:
    """One more restart of the run's, with the wait before it: the restart streak it makes and
    when it was counted (launch/run/supervised/faults.py FaultHistory.peek)."""
    streak: int
    at: float           # time.monotonic() when it was counted
    delay: float        # the wait before the restarted tasks start (supervise.backoff_secs)


@dataclass(frozen=True)
class Plan:
    """What to change, in the order the loop applies it: the restart counted, the desired set
    (members, tolerated, retired), the lines said, a new attempt of the tasks named, the events,
    the tasks stopped, the tasks started and when. The empty plan changes nothing."""
    restart: Backoff | None = None              # one more of supervise.max_restarts, committed to the history
    evaluator_restart: bool = False             # one more of a coordinator run's evaluator's own restarts
    members: Members | None = None              # the live set from now on
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
    restarted_chief: bool = False               # the chief resumes from a checkpoint: an older step is progress
    due: Mapping[str, float] = field(default_factory=dict)     # tasks to start, and when (time.monotonic())
    start: bool = False                         # start what is due now (else at the loop's next round)
    unserved: tuple[str, ...] = ()              # tasks whose earlier start's "serving" no longer counts

    @property
    def empty(self) -> bool:
        return self == Plan()
