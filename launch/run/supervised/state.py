"""The supervisor's state: every mutable fact of a supervised run in one object, written only by
the loop (launch/run/supervised/loop.py) as it applies plans (plan.py).

The *desired* set (`desired()`) is the ps tasks and `members` (the live workers, told to every
task's lease), less `tolerated` (lost and let go) and `retired` (failed over); `records` is what
was started. Scale, failover, rejoin and tolerate change the desired set; a start of the cluster
starts the desired set, and between starts the loop holds it against what was started once per
round (reconcile.py): what is due (`attempt.due`) starts, what was failed over stops. The
`launch scale` request under way (ScaleOp) is held here too, replaced as scaling.py's plans say.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from cluster.runtime.membership import Members
from cluster.spec import ClusterSpec
from launch.backends.base import TaskRecord
from launch.planning.plan import TaskPlan
from launch.run.control import ScaleRequest
from launch.run.policy import Policy, TaskState, TaskStatus
from launch.run.supervised.attempt import Attempt
from launch.run.supervised.faults import FaultHistory


@dataclass(frozen=True)
class StartLoss:
    """A task lost while the cluster started (startup.py's TaskFailed naming it): an observation
    the loop decides about in its next round, as one more fault (recovery.py lost_in_start)."""
    task: str
    how: str | None             # its words for it, where start-up gave some
    exit_code: int | None


@dataclass(frozen=True)
class ScaleOp:
    """A scale request under way: what must happen before it is answered, and by when. The
    loop holds it (SupervisorState.scale) and replaces it as scaling.py's plans say."""
    request: ScaleRequest                   # as control.take read it
    add: list[str]                  # workers that join: each must log a step
    remove: list[str]               # workers that leave: each must have ended
    lines: list[str]                # what the launcher said of it, for the reply
    deadline: float                 # monotonic
    secs: float                     # the time it was given
    attempt: Attempt | None = None  # the attempt it began in (a restart of the cluster begins another)
    failures_seen: int = 0          # of that attempt's failures, those already read

    @classmethod
    def of(cls, request: ScaleRequest, add: list[str], remove: list[str], line: str, secs: float,
           attempt: Attempt | None = None) -> ScaleOp:
        return cls(request, add, remove, [line], time.monotonic() + secs, secs, attempt,
                   len(attempt.failures) if attempt else 0)

    @property
    def workers(self) -> int:
        """The worker count asked for."""
        return self.request.workers

    def let_go(self, tolerated: set[str]) -> list[str]:
        """Joiners lost and not started again (the supervisor tolerated their loss)."""
        return [name for name in self.add if name in tolerated]

    def took_effect(self, by_name: Mapping[str, TaskStatus], stepped: set[str], finished: bool) -> bool:
        """Every new worker ran a step (or the training is over), and every leaving one ended."""
        joined = all(name in stepped for name in self.add)
        left = all(name in by_name and by_name[name].state is not TaskState.RUNNING for name in self.remove)
        return (joined or finished) and left



@dataclass
class SupervisorState:
    """What the supervisor knows of its run now; the plan functions read it, the loop writes it."""
    spec: ClusterSpec
    plans: list[TaskPlan]
    members: Members                        # the live workers and their generations (the desired set)
    policy: Policy                          # the policy for the live count
    records: list[TaskRecord] = field(default_factory=list)    # the current start of every task, in plan order
    restarts: int = 0                       # the run's, of supervise.max_restarts
    evaluator_restarts: int = 0             # a coordinator run's evaluator's own
    preemptions: int = 0                    # preemption notices told (none counted among the restarts)
    attempt: Attempt = field(default_factory=Attempt)          # what this attempt has seen
    history: FaultHistory = field(default_factory=FaultHistory)    # the backoff streak, the repeat rule's memory
    retired: set[str] = field(default_factory=set)             # workers failed over: never started again
    dropped: set[str] = field(default_factory=set)             # ... and stopped already (once: reconcile.py)
    stepped: set[str] = field(default_factory=set)             # workers whose current start logged a step
    serving: dict[str, threading.Event] = field(default_factory=dict)  # set once a task's own log says it serves
    lost_starting: StartLoss | None = None      # a task lost while the cluster started, not decided about yet
    scale: ScaleOp | None = None                # the `launch scale` request under way (scaling.py)
    saved_first: bool = False                   # the checkpoint a plan asked for first read back (plan.py SaveFirst)
    # Each backend's warm standbys as it last said (Backend.standby_views): (host, pid, state).
    standbys: dict[str, list[tuple[str, int, str]]] = field(default_factory=dict)

    @classmethod
    def new(cls, spec: ClusterSpec, plans: list[TaskPlan], workers: int | None) -> SupervisorState:
        """The state before anything starts: the first `workers` of the pool live (all by default)."""
        return cls(spec, plans, Members(1, {i: 1 for i in range(workers or spec.num_workers)}),
                   Policy.of(dataclasses.replace(spec, live=workers)))

    def live_policy(self) -> Policy:
        """The policy for the live count now (after the live set changed between attempts)."""
        return Policy.of(dataclasses.replace(self.spec, live=self.members.count))

    def plan_of(self, name: str) -> TaskPlan:
        return next(p for p in self.plans if p.name == name)

    def record_of(self, name: str) -> TaskRecord | None:
        return next((r for r in self.records if r.name == name), None)

    def started(self, record: TaskRecord) -> None:
        """`record` is its task's current start: it replaces the earlier one, in its place."""
        same = next((i for i, r in enumerate(self.records) if r.name == record.name), None)
        if same is None:
            self.records.append(record)
        else:
            self.records[same] = record

    def desired(self) -> list[TaskPlan]:
        """The tasks that should run now, in plan order: the ps tasks and the tasks of the live
        workers' indices (a coordinator run's chief and evaluator are index 0, which never
        leaves), less those lost and let go in this attempt and those failed over. At the start
        of an attempt (nothing let go yet) these are the tasks a start of the cluster starts."""
        gone = self.attempt.tolerated | self.retired
        return [p for p in self.plans if (p.task.job == 'ps' or p.task.index in self.members.workers)
                and p.name not in gone]

    def waiting(self) -> frozenset[str]:
        """Tasks lost and let go, or due to start again: the policy does not count them lost again."""
        return frozenset(self.attempt.tolerated | set(self.attempt.due))
