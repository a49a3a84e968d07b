"""What the supervised strategy says of a fault: the event log's account of a lost task, the
words of a stall, and the one line a run that is given up ends with.

The supervisor's decisions come from `launch/run/policy.py`; this module only explains them.
It reads the lost tasks' logs for their last error (a task's own words beat a bare exit code)
and probes the tasks of a stall, so that a long silence is never a mystery. Keeping the
repeat rule's memory here too (FaultHistory) puts everything a fault leaves behind in one place.
"""
from __future__ import annotations

import dataclasses
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from collections.abc import Callable, Collection, Mapping, Sequence

from cluster.runtime import causes, rundir
from cluster.runtime.contract import job_of
from cluster.runtime.rundir import EXIT_FAILED, EXIT_NO_RESTART
from cluster.runtime.runjson import short
from launch.backends.base import ENDED, Backend, TaskRecord, tail
from launch.run import disk
from launch.records.event_types import Stall, TaskLost
from launch.run import policy
from launch.run import stacks
from launch.run.console import is_chatter
from launch.run.lifecycle import Failure, Lifecycle, resume_hint
from launch.run.policy import Action, Decision, Policy, TaskState, TaskStatus

PROBE_SECS = 3.0                # a stall probe's deadline for each task's gRPC server
FINAL_LINE = 295                # characters the line a failed run ends with keeps to (its cause's detail: the log)
ERROR_CHARS = 300               # of a task's last error, in a failure's cause


class TaskFailed(Exception):
    """The run cannot go on: one line for the user, then the task's last log lines.

    `code` is the launcher's exit code; `failures` what run.json keeps of the tasks lost;
    `task` and `exit_code` name a task that died, froze or never came up on the way (during a
    start), so a restart can count it as one more fault rather than end the run; `how` says what
    became of a task that did not die."""

    def __init__(self, message: str, log_tail: Sequence[str] = (), code: int = EXIT_FAILED,
                 failures: Sequence[Failure] = (), task: str | None = None, exit_code: int | None = None,
                 how: str | None = None) -> None:
        super().__init__(message)
        self.log_tail = list(log_tail)
        self.code = code
        self.failures = list(failures)
        self.task = task
        self.exit_code = exit_code
        self.how = how


def log_tail(record: TaskRecord, backends: Mapping[str, Backend], n: int = 15) -> list[str]:
    """The last `n` lines of this start of the task; a log that cannot be read says so in a line
    of its own, because it must not hide the failure itself."""
    try:
        return tail(backends[record.backend].lines(record, offset=record.log_offset), n)
    except Exception as e:  # whatever a backend raises reading it
        return [f'(could not read {record.log}: {e})']


def explaining_tail(record: TaskRecord, backends: Mapping[str, Backend], n: int = 10) -> list[str]:
    """A task's last log lines that may explain its end: its own error if it logged one, else
    its last lines without TensorFlow's start-up chatter."""
    lines = log_tail(record, backends, 200)
    error = causes.last_error_line(lines)
    if error:
        return [error]
    return [line for line in lines if not is_chatter(line)][-n:]


def last_error(record: TaskRecord, backends: Mapping[str, Backend]) -> str | None:
    """The task's last Python error line in this start's log (None: it logged none)."""
    return causes.last_error_line(log_tail(record, backends, 200))


def own_error(name: str, error: str | None) -> str | None:
    """A task's error line without its leading `name: ` (the line it goes into names the task)."""
    return error[len(name) + 2:] if error and error.startswith(f'{name}: ') else error


def holds_variables(name: str) -> bool:
    """The ps tasks hold the variables, the chief writes the checkpoint: both for a save."""
    return job_of(name) == 'ps' or name == 'worker:0'


@dataclass
class StallView:
    """What the tasks of a stall do, probed: the words for those that do not answer (or are
    stopped) and their names, those that answer (and wait), and a full disk under the run."""
    silent: list[str]
    stopped: list[str]
    waiting: list[str]
    disk: str | None


def look_at_stall(records: Sequence[TaskRecord], backends: Mapping[str, Backend], names: Sequence[str]) -> StallView:
    """Probe these tasks (stopped, not answering, or answering) and look at the disk under the run."""
    running = [r for r in records if r.name in names]

    def probe(r: TaskRecord) -> tuple[TaskRecord, bool, str | None]:
        backend = backends[r.backend]
        return r, backend.probe(r, PROBE_SECS), backend.status(r).stopped

    with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
        found = list(pool.map(probe, running))
    silent = [f'{r.name} {how + " and " if how else ""}does not answer on {r.endpoint}'
              for r, answers, how in found if not answers or how]
    return StallView(silent, [r.name for r, answers, how in found if not answers or how],
                     [r.name for r, answers, how in found if answers and not how], disk.refusal(records, backends))


def stall_words(view: StallView) -> str:
    """What the tasks of a stall do, in words (the disk left to the caller, who names it first).
    Only when every task answers and the disk has room is the cause inside the training."""
    if view.silent:
        parts = list(view.silent)
    elif view.disk:
        parts = ['every task answers on its port, so none is frozen; with the disk full, neither their logs nor '
                 'their pulses can show a step']
    else:
        parts = ['every task answers on its port, so none is frozen; the cause is inside the training (a lost '
                 'gradient, a deadlock)']
    if view.silent and view.waiting:
        one = len(view.waiting) == 1
        parts.append(f'{", ".join(view.waiting)} answer{"s" if one else ""} and '
                     f'wait{"s" if one else ""} for {"it" if len(view.silent) == 1 else "them"}')
    return '; '.join(parts)


def explain_stall(records: Sequence[TaskRecord], backends: Mapping[str, Backend],
                  names: Sequence[str]) -> tuple[str, list[str]]:
    """Name what each of these tasks is doing: stopped, not answering, or answering (waiting),
    after a full disk under the run if there is one; returns the words and the tasks that do not
    answer (or are stopped)."""
    view = look_at_stall(records, backends, names)
    return first(view.disk, stall_words(view)), view.stopped


def first(full: str | None, text: str) -> str:
    """`text` after the full disk, if there is one: the cause comes first."""
    return f'{full}; {text}' if full else text


def _cause(decision: Decision, records: Sequence[TaskRecord],
           backends: Mapping[str, Backend]) -> tuple[str | None, str, bool]:
    """cause() in its parts: the full disk (or None), the fault's own words, whether the chief can save."""
    if decision.stalled:
        view = look_at_stall(records, backends, decision.tasks)
        full = decision.disk or view.disk
        view.disk = full
        dumped = f'; {decision.stacks.words()}' if decision.stacks else ''
        return full, f'stall: {decision.reason}; {stall_words(view)}{dumped}', \
            not any(holds_variables(n) for n in view.stopped)
    return decision.disk or disk.refusal(records, backends), decision.reason, \
        not any(holds_variables(n) for n in decision.tasks)


def cause(decision: Decision, records: Sequence[TaskRecord], backends: Mapping[str, Backend]) -> tuple[str, bool]:
    """The fault in words (a full disk under the run first; a stall's stack dumps named last),
    and whether the chief can still save a checkpoint (it and every ps answer): a checkpoint the
    frozen or lost ps cannot write is not waited for."""
    full, text, can_save = _cause(decision, records, backends)
    return first(full, text), can_save


def dump_stacks(life: Lifecycle, decision: Decision, records: Sequence[TaskRecord],
                backends: Mapping[str, Backend], starting: Collection[str] = ()) -> Decision:
    """A stall, before anything is done about it: every task that still answers writes its
    stacks (launch/run/stacks.py), which its line and event then name (`starting`: tasks started
    again that have not said they serve, not asked)."""
    if not decision.stalled:
        return decision
    found = stacks.dump(records, backends, life.spec.train.train_dir, life.attempt, starting=starting)
    return dataclasses.replace(decision, stacks=found)


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return str(-code)


def record_faults(life: Lifecycle, decision: Decision, statuses: Sequence[TaskStatus],
                  records: Sequence[TaskRecord],
                  backends: Mapping[str, Backend]) -> tuple[dict[str, str | None], list[Failure]]:
    """The event log's account of a fault, before anything is done about it; returns each lost
    task's last error line (None: it logged none) and the failures run.json keeps of them."""
    if decision.stalled:
        dump = decision.stacks
        tasks, why = list(decision.tasks), first(decision.disk, decision.reason)
        if dump is None:
            life.emit(Stall(tasks=tasks, cause=why))
        else:       # `stacks` is null when none was written
            life.emit(Stall(tasks=tasks, cause=why, stacks=dump.relative(life.spec.train.train_dir) if dump.written
                            else None, no_stacks=[name for name, _ in dump.silent],
                            keys=('tasks', 'cause', 'stacks', 'no_stacks')))
        return {}, []
    by_name = {t.name: t for t in statuses}
    errors: dict[str, str | None] = {}
    failures = []
    followers = _followers(decision, by_name)
    for name in decision.tasks:
        t = by_name.get(name)
        record = next((r for r in records if r.name == name), None)
        code = t.exit_code if t else None
        error = errors[name] = last_error(record, backends) if record else None
        lost = t is not None and t.state is not TaskState.RUNNING
        after = decision.tasks[0] if name in followers else None
        why = policy.how_lost(t) if t and lost else f'{name} stopped with {after}' if after else decision.reason
        why = first(decision.disk, why)
        life.emit(TaskLost(task=name, cause=why, exit_code=code, signal=_signal_name(code), error=error, after=after))
        if after is not None:
            continue        # its words join the cause's failure
        then = [policy.how_lost(by_name[f]) for f in followers if by_name[f].state is not TaskState.RUNNING]
        if lost and then:       # (a task not lost, a frozen one, has the decision's whole reason already)
            why += f' (then {", ".join(then)})'
        failures.append(Failure(name, why + (f'; its last error: {short(error, ERROR_CHARS)}' if error else ''),
                                record.host if record else '', record.pid if record else None))
    return errors, failures


def _followers(decision: Decision, by_name: Mapping[str, TaskStatus]) -> set[str]:
    """The tasks of a fault that only followed its first (the likely cause, launch/run/policy.py
    decide): when a ps is lost, a task that ended with the code of a lost peer (EXIT_FAILED: its
    session failed), or that still runs and is only restarted with it (a coordinator run's chief).
    Those are one fault with the ps, not faults of their own; a task killed by a signal, or one
    that ended another way, is its own."""
    if not decision.tasks or job_of(decision.tasks[0]) != 'ps' or decision.stalled:
        return set()
    out = set()
    for name in decision.tasks[1:]:
        t = by_name.get(name)
        if t is not None and (t.exit_code == EXIT_FAILED or (t.state is TaskState.RUNNING and not t.frozen)):
            out.add(name)
    return out


@dataclass
class Verdict:
    """A run given up, before its tasks are stopped: everything of its last line but what a new
    `launch up` would do, which needs the checkpoint the stopping chief writes."""
    message: str                        # which task, how (with its pid and host)
    code: int                           # the launcher's exit code
    failures: list[Failure]
    can_save: bool                      # whether the chief can still save a checkpoint
    error: str | None = None            # the task's last Python error
    after: str = ''                     # why no restart was made, '; ...'
    no_restore: bool = False            # the task said no checkpoint restores

    def hint(self, checkpoint_step: Callable[[], int | None]) -> str:
        """What a new `launch up` would do (the checkpoint is read only when it matters)."""
        if self.no_restore:
            return 'no checkpoint restores, so a new `launch up` fails the same way until they are moved away'
        return resume_hint(checkpoint_step())

    def failed(self, checkpoint_step: Callable[[], int | None]) -> TaskFailed:
        """The one line a lost run ends with (under ~300 characters); the whole error is in the log."""
        hint = self.hint(checkpoint_step)
        message = self.message
        if self.error:       # as much of it as fits the line
            room = max(70, FINAL_LINE - len(message) - len(self.after) - len(hint) - len('error: ; its last error: ; '))
            cut = short(self.error, room)
            refused = rundir.os_cause(self.error)
            if cut != self.error and refused and refused.partition(' (')[0] not in cut:
                # a refusal of the disk or the OS is the error's point: kept, however long the path before it
                cut = f'{refused}: {short(self.error, room - len(refused) - len(": (see its log)"))} (see its log)'
            elif cut != self.error:
                cut = short(self.error, room - len(' (see its log)')) + ' (see its log)'
            message += f'; its last error: {cut}'
        return TaskFailed(f'{message}{self.after}; {hint}', code=self.code, failures=self.failures)


def judge(decision: Decision, records: Sequence[TaskRecord], backends: Mapping[str, Backend],
          rules: Policy, restarts: int) -> Verdict:
    """Giving up: which task, how, its last Python error, and why no restart was made. A user
    command's run ends with its worker's own exit code."""
    full, message, can_save = _cause(decision, records, backends)
    verdict = Verdict(first(full, message), EXIT_FAILED,
                      [Failure(name, first(full, message)) for name in decision.tasks], can_save)
    if not decision.stalled:
        lost = next(r for r in records if r.name == decision.tasks[0])
        seen = backends[lost.backend].status(lost)
        exit_code = seen.exit_code if seen.state == ENDED else None
        verdict.no_restore = exit_code == EXIT_NO_RESTART
        if rules.user_command and lost.job == 'worker' and exit_code is not None and exit_code > 0:
            verdict.code = exit_code
        verdict.message = first(full, message.replace(lost.name, f'{lost.name} (pid {lost.pid} on {lost.host})', 1))
        error = last_error(lost, backends)
        error = own_error(lost.name, error)
        verdict.error = error
        verdict.failures = [Failure(lost.name, verdict.message + (f'; its last error: {short(error, ERROR_CHARS)}'
                                                                  if error else ''), lost.host, lost.pid)]
    verdict.after = f'; {decision.note}' if decision.note else ''
    if restarts >= rules.max_restarts and rules.restart == 'on-failure':
        verdict.after += f'; {restarts} restart(s) made, the most supervise.max_restarts allows'
    return verdict


@dataclass(frozen=True)
class Backoff:
    """One more restart of the run's, with the wait before it: the restart streak it makes and
    when it was counted (FaultHistory.peek); a plan (plan.py) carries it to the loop, which commits it."""
    streak: int
    at: float           # time.monotonic() when it was counted
    delay: float        # the wait before the restarted tasks start (supervise.backoff_secs)



@dataclass
class FaultHistory:
    """The faults a run has met, as far as the next restart needs them: the backoff streak and
    the fault before the last restart (the repeat rule)."""
    last: policy.Fault | None = None         # the fault before the last restart
    last_at: float | None = None
    streak: int = 0                             # restarts in a row

    def trained_again(self) -> None:
        """The training is back after the last restart: the next fault is a new one, not the same
        crash coming back, so its restart waits nothing again. The backoff grows only while
        restarts do not bring the training back (a crash loop), never because unrelated faults
        came one after another on a run that mended each of them."""
        self.streak = 0

    def peek(self, rules: Policy, now: float) -> Backoff:
        """The restart counted `now` and the wait before it, without counting it (the loop
        commits it with the plan that makes the restart): the wait grows with each restart in a
        row that did not bring the training back."""
        since = None if self.last_at is None else now - self.last_at
        streak = policy.next_streak(self.streak, since)
        return Backoff(streak, now, policy.backoff_delay(rules, streak))

    def commit(self, backoff: Backoff) -> None:
        """The restart of `backoff` is made."""
        self.streak, self.last_at = backoff.streak, backoff.at

    def backoff(self, rules: Policy) -> float:
        """Count one more restart now; returns the wait before it."""
        counted = self.peek(rules, time.monotonic())
        self.commit(counted)
        return counted.delay

    def escalate(self, decision: Decision, errors: Mapping[str, str | None],
                 checkpoint_step: Callable[[], int | None]) -> Decision:
        """A restart that would repeat the last one's failure exactly is no restart: give up."""
        if decision.action not in (Action.RESTART, Action.RESTART_TASKS) or not decision.tasks:
            return decision
        first = decision.tasks[0]
        fault = policy.Fault.of(first, None if decision.stalled else errors.get(first), checkpoint_step())
        escalated = policy.escalate(decision, self.last, fault)
        self.last = fault
        return escalated
