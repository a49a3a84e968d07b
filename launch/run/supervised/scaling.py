"""Live scaling of a supervised run (`launch scale`): take a request (launch/run/control.py),
change the live workers, and answer once the change took effect, or why it did not.

Async training takes workers in and out while the others train on: a new worker starts, one
that leaves finishes its step and stops. Sync training cannot: SyncReplicasOptimizer fixes the
number of replicas in the graph, so the cluster restarts through a checkpoint with the new live
set. Either way the live set is written into every task's lease (cluster/runtime/membership.py).
Each change is a plan (plan.py) the loop applies: async, the new live set (change_live); sync, a
checkpoint asked for and waited for first (ask_checkpoint: the loop waits, plan.py SaveFirst),
then a restart of the cluster through it (restart_scaled, then resume_scaled); following a
request to its reply is a look at the state (look, followed), its end a plan (scale_ended). The
request under way is the state's (state.py SupervisorState.scale), set and cleared by plans
too; taking a request and answering it are Scaling's procedure.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Protocol
from collections.abc import Callable, Sequence

from cluster.runtime.membership import Members
from cluster.runtime.contract import TaskName
from cluster.runtime.rundir import EXIT_OK
from cluster.spec import ClusterSpec
from launch.run import control
from launch.run import policy
from launch.records.event_types import Scale, Scaled
from launch.run.control import Reply, ScaleRequest
from launch.run.supervised.plan import NewAttempt, Plan, Relaunch, SaveFirst, StartAll
from launch.run.supervised.state import ScaleOp, SupervisorState
from launch.run.lifecycle import CHECKPOINT_GRACE_SECS, Lifecycle, RunResult, RunState
from launch.run.policy import TaskStatus


class ScaledRun(Protocol):
    """What a scale asks of the loop (loop.py SupervisedRun): its state, and plans applied."""
    spec: ClusterSpec
    life: Lifecycle
    state: SupervisorState
    start_timeout: float

    @property
    def say(self) -> Callable[[str], None]: ...

    def apply(self, plan: Plan) -> None: ...

    def save_state(self) -> None: ...


@dataclass(frozen=True)
class ScaleMove:
    """The live set after a scale: the next epoch, every live worker's generation, and the
    indices that join and leave."""
    epoch: int
    workers: dict[int, int]
    add: list[int]
    remove: list[int]

    @classmethod
    def of(cls, now: Members, pool: int, retired: set[str], want: int) -> ScaleMove:
        epoch = now.epoch + 1
        workers = dict(now.workers)
        add, remove = policy.scale_moves(pool, now.indices, {TaskName.parse(n).index for n in retired}, want)
        for i in add:
            workers[i] = epoch
        for i in remove:
            del workers[i]
        return cls(epoch, workers, add, remove)

    @property
    def names_add(self) -> list[str]:
        return [f'worker:{i}' for i in self.add]

    @property
    def names_remove(self) -> list[str]:
        return [f'worker:{i}' for i in self.remove]


def refusal(spec: ClusterSpec, want: int) -> str | None:
    """Why `--workers want` cannot be carried out for this spec at all, or None."""
    pool, r = spec.num_workers, spec.train.replicas_to_aggregate
    if not 1 <= want <= pool:
        return f'--workers {want}: expected 1..{pool} (the spec\'s pool of workers)'
    if spec.train.sync and r and want < r:
        return f'--workers {want}: fewer than train.replicas_to_aggregate ({r}), which each sync step needs'
    if spec.train.command:
        return 'a train.command is a program of its own: its workers cannot be scaled'
    return None


def change_live(state: SupervisorState, request: ScaleRequest, move: ScaleMove, now: float) -> Plan:
    """Async training: the new live set told to every lease at once (the leaving workers stop
    after their current step), the joining ones due now (one let go before joins anew)."""
    add, remove = move.names_add, move.names_remove
    line = (f'scaling {state.members.count} -> {request.workers} workers: '
            + (f'starting {", ".join(add)}' if add else
               f'{", ".join(remove)} ' + ('finishes its step and leaves' if len(remove) == 1 else
                                           'finish their step and leave'))
            + ' (async: the others train on)')
    return Plan(members=Members(move.epoch, move.workers), publish=True, say=(line,),
                events=(Scale(to=request.workers, add=add, remove=remove, pid=request.pid),),
                welcome=frozenset(add), unserved=tuple(add), due={name: now for name in add})


def restart_scaled(state: SupervisorState, request: ScaleRequest, members: Members, add: list[str],
                   remove: list[str]) -> Plan:
    """Sync training: SyncReplicasOptimizer fixes the number of replicas in the graph, so the
    cluster stops (the chief saves first) and starts again with the new live set `members`, from
    the checkpoint; replicas_to_aggregate and the default learning rate follow the count. Not a
    fault: no restart of supervise.max_restarts is used. What follows the stop: `resume_scaled`."""
    before, want = state.members.count, members.count
    line = (f'scaling {before} -> {want} workers: sync training fixes its number of replicas '
            '(SyncReplicasOptimizer), so the cluster restarts through a checkpoint; the chief saves first')
    return Plan(say=(line,), events=(Scale(to=want, add=add, remove=remove, pid=request.pid),),
                relaunch=Relaunch(None, f'scale {before} -> {want} workers', True, members, tuple(remove)))


def resume_scaled(state: SupervisorState, relaunch: Relaunch, step: int | None) -> Plan:
    """Once every task stopped for a sync scale: the new live set, told to every lease, and a
    new attempt from the checkpoint at `step` (None: none yet) with every live task started."""
    assert relaunch.members is not None, 'a sync scale names its live set'
    ended = RunResult(state=RunState.SCALED, exit_code=EXIT_OK, restarts=state.restarts,
                      failures=list(state.attempt.failures), global_step=state.attempt.global_step)
    resumed = f'the checkpoint at global step {step}' if step is not None else 'step 0 (no checkpoint yet)'
    return Plan(members=relaunch.members, leaving=relaunch.leaving, publish=True,
                attempt=NewAttempt(relaunch.reason, step, ended),
                say=(f'scaling {state.members.count} -> {relaunch.members.count} workers: starting the cluster '
                     f'again from {resumed}',), start_all=StartAll(0.0, None))


def live_words(members: Members, when: str = 'now') -> str:
    """`2 worker(s) train now (worker:0, worker:1)`: the live set, as the supervisor has it."""
    return f'{members.count} worker(s) train {when} ({", ".join(f"worker:{i}" for i in members.indices)})'


@dataclass(frozen=True)
class ScaleNews:
    """What a look at the scale under way found: lines for its reply, whether it is given its
    time anew (a joiner or the cluster started again), and its end (a reply and why) if it has one."""
    lines: tuple[str, ...] = ()
    anew: bool = False
    reply: Reply | None = None
    line: str = ''


def look(op: ScaleOp, state: SupervisorState, statuses: Sequence[TaskStatus], now: float) -> ScaleNews:
    """The scale under way (`op`), seen `now`: a restart of the cluster or a joiner started again
    since the last look is a line of the reply each, and the change is given its time anew; a
    joiner let go ends it as failed, every change made ends it as done, and so does the time
    running out as failed. A joiner lost on the way is what the supervisor made of it: it
    decides after this look."""
    most, lines = state.policy.max_restarts, []
    seen = op.failures_seen
    if op.attempt is not None and state.attempt is not op.attempt:
        lines.append(f'restart {state.restarts}/{most}: the cluster started again while the change was under way')
        seen = 0
    for failure in state.attempt.failures[seen:]:
        if failure.task in op.add and failure.task not in state.attempt.tolerated:
            lines.append(f'{failure.task} ended while joining the training ({failure.cause}); '
                         f'restart {state.restarts}/{most} starts it again')
    anew = bool(lines)
    deadline = now + op.secs if anew else op.deadline
    finished = state.attempt.step is not None and state.attempt.step >= state.spec.train.steps
    let_go = op.let_go(state.attempt.tolerated)
    if let_go:
        why = (f'{", ".join(let_go)} ended while joining the training and '
               f'{"is" if len(let_go) == 1 else "are"} not started again; {live_words(state.members)}')
        return ScaleNews(tuple(lines), anew, Reply.FAILED, why)
    if op.took_effect({t.name: t for t in statuses}, state.stepped, finished):
        return ScaleNews(tuple(lines), anew, Reply.DONE, live_words(state.members))
    if now > deadline:
        return ScaleNews(tuple(lines), anew, Reply.FAILED, f'the change did not take effect within {op.secs:.0f}s')
    return ScaleNews(tuple(lines), anew)


def scale_ended(state: SupervisorState, reply: Reply, line: str) -> Plan:
    """The end of the scale under way: its line, and the event."""
    return Plan(say=(f'scale {reply}: {line}',),
                events=(Scaled(state=reply, workers=list(state.members.indices), cause=line),))


def followed(op: ScaleOp, news: ScaleNews, state: SupervisorState, now: float) -> ScaleOp:
    """The scale under way after a look (`news`, `now`): its reply's new lines, the attempt and
    failures read, and its time given anew where the look says so."""
    return dataclasses.replace(op, lines=op.lines + list(news.lines), attempt=state.attempt,
                               failures_seen=len(state.attempt.failures),
                               deadline=now + op.secs if news.anew else op.deadline)


def ask_checkpoint(state: SupervisorState, before: int | None) -> Plan:
    """Before a sync scale stops anything: the chief asked for a checkpoint through every lease
    (cluster/runtime/membership.py Members.save), waited for as a restart would read it back
    (`before`: the newest there now). A chief stuck for half the stall limit is stuck."""
    secs = min(CHECKPOINT_GRACE_SECS, state.policy.stall_secs / 2)
    return Plan(members=dataclasses.replace(state.members, save=state.members.save + 1), publish=True,
                save_first=SaveFirst(before, secs))


class Scaling:
    """Carries out `launch scale` requests on a run, one at a time. The request under way is
    the state's (SupervisorState.scale); each change of it is a plan the loop applies."""

    def __init__(self, run: ScaledRun) -> None:
        self.run = run
        self.launcher = control.this_launcher()     # the addressee of the requests this launcher takes

    @property
    def op(self) -> ScaleOp | None:
        """The request being carried out."""
        return self.run.state.scale

    @property
    def asked(self) -> int | None:
        """The worker count a change under way asks for (the state file's `scaling`)."""
        return self.op.workers if self.op else None

    def step(self, statuses: list[TaskStatus]) -> None:
        """Take a scale request, or see the one under way to its end. A joiner lost on the way
        is what the supervisor made of it (it decides after this step has looked): started
        again, the change goes on and the reply says so; let go, the change failed and the
        reply says how many train."""
        run = self.run
        if self.op is None:
            request = control.take(run.spec.train.train_dir, self.launcher)
            if request is not None:
                self._begin(request)
            return
        op, now = self.op, time.monotonic()
        news = look(op, run.state, statuses, now)
        op = followed(op, news, run.state, now)
        run.apply(Plan(scale=op))
        if news.reply is not None:
            self._end(op, news.reply, news.line)

    def _begin(self, request: ScaleRequest) -> None:
        """A new request: refused, answered at once (the count is met), or begun: live in async
        training, through a checkpoint and a restart in sync training."""
        run = self.run
        want, now = request.workers, run.state.members
        why = refusal(run.spec, want)
        if why:
            self._refuse(request, why)
            return
        if want == now.count:
            control.answer(run.spec.train.train_dir, request, Reply.DONE, [live_words(now, 'already')])
            return
        move = ScaleMove.of(now, run.spec.num_workers, run.state.retired, want)
        if len(move.add) < want - now.count:
            self._refuse(request, f'the pool has {len(move.add)} worker(s) left to start '
                                  f'(failed over: {", ".join(sorted(run.state.retired))})')
            return
        if not run.spec.train.sync:
            self._change_live(request, move)
            return
        plan = ask_checkpoint(run.state, run.life.checkpoint_step())
        run.apply(plan)
        if not run.state.saved_first:
            assert plan.save_first is not None
            self._refuse(request, f'sync training restarts through a checkpoint, but no new checkpoint of the chief '
                                  f'could be read back from {run.spec.train.train_dir} within '
                                  f'{plan.save_first.secs:.0f}s; nothing was changed')
            return
        # the count of checkpoint requests as ask_checkpoint left it
        self._restart(request, Members(move.epoch, move.workers, run.state.members.save), move.names_add, move.names_remove)

    def _secs(self) -> float:
        """The time a change has to take effect: a start, then as long as a step may take."""
        return self.run.start_timeout + self.run.state.policy.stall_secs

    def _change_live(self, request: ScaleRequest, move: ScaleMove) -> None:
        """Async: new workers start, leaving ones finish their step and stop; the others train on."""
        run = self.run
        plan = change_live(run.state, request, move, time.monotonic())
        run.apply(plan)
        run.apply(Plan(scale=ScaleOp.of(request, move.names_add, move.names_remove, plan.say[0], self._secs(),
                                        run.state.attempt)))
        run.save_state()
        # They start at the supervisor's next round, before it looks at the tasks again: what
        # it saw this round holds the end of an earlier start of one let go before, which must
        # not count as the new start lost.

    def _refuse(self, request: ScaleRequest, why: str) -> None:
        self.run.say(f'scale refused: {why}')
        control.answer(self.run.spec.train.train_dir, request, Reply.REFUSED, [why])

    def _restart(self, request: ScaleRequest, members: Members, add: list[str], remove: list[str]) -> None:
        """Sync: the cluster restarts with the new live set (restart_scaled); the request is under
        way from before the stop (the state file says so), given its time once the tasks started.
        A task lost while they start is left for the loop to decide about (state.lost_starting)."""
        run = self.run
        plan = restart_scaled(run.state, request, members, add, remove)
        op = ScaleOp.of(request, [f'worker:{i}' for i in members.indices], [], plan.say[0], 0.0)
        run.apply(dataclasses.replace(plan, scale=op))
        secs = self._secs()
        run.apply(Plan(scale=dataclasses.replace(op, attempt=run.state.attempt, secs=secs,
                                                 deadline=time.monotonic() + secs)))

    def _end(self, op: ScaleOp, reply: Reply, line: str) -> None:
        """The reply to the request under way (`op`); the next one can be taken."""
        run = self.run
        run.apply(Plan(scale_over=True))
        run.save_state()
        run.apply(scale_ended(run.state, reply, line))
        control.answer(run.spec.train.train_dir, op.request, reply, op.lines + [line])
