"""How long a fault took to mend: from the moment the supervisor saw it to the first global step
trained after it, split into the phases of the restart (stopping the tasks, the backoff, starting
them until their servers answer, the first step), with the global steps trained again because the
cluster resumed from an older checkpoint.

One fault is mended at a time: a second fault before the training is back (a task lost while the
restart brings the cluster up) joins the one being mended, whose clock keeps running, since the
user waits for the training as long as both take. The `recovered` event and run.json's
`recoveries` carry the figures; the report shows them.

A preemption is timed from its notice, not from the decision: its first phase, `save`, runs from
the notice (the `preempted` event) to the chief's checkpoint seen after it (or, with none, to the
decision: the grace was up or the task left), so its record reads save, stop, start, step.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from collections.abc import Callable

from launch.records.result import PHASES, MendedFault


@dataclass(frozen=True)
class Notice:
    """When a preemption's notice came (time.monotonic()), and when the chief's checkpoint after it
    was seen (None: none was; the save phase then ends when the supervisor acts)."""
    at: float
    saved_at: float | None = None


@dataclass
class Mending:
    """A fault being mended."""
    tasks: list[str]
    cluster: bool                       # the whole cluster restarts (else only `tasks`)
    seen_at: float                      # time.monotonic() when the supervisor saw the fault
    step: int | None                    # the newest global step seen by then
    from_step: int | None = None        # the checkpoint a cluster restart resumed from
    phases: dict[str, float] = field(default_factory=dict)
    mark: float = 0.0                   # where the current phase began
    preempted: bool = False             # a preemption: `seen_at` is its notice
    warm: int = 0                       # tasks the restart started from a warm standby
    cold: int = 0                       # ... and cold

    def __post_init__(self) -> None:
        self.mark = self.seen_at

    def phase(self, name: str) -> None:
        """Phase `name` ends now (a phase met twice, as after a second fault, adds up)."""
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.mark
        self.mark = now

    def redone(self) -> int:
        """Global steps trained again: those after the checkpoint a cluster restart resumed from."""
        if not self.cluster or self.step is None or self.from_step is None:
            return 0
        return max(0, self.step - self.from_step)


class RecoveryClock:
    """The fault being mended, if any, and every fault mended so far in this `launch up`."""

    def __init__(self, emit: Callable[..., None]) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self.current: Mending | None = None
        self.done: list[MendedFault] = []

    def fault(self, tasks: tuple[str, ...] | list[str], cluster: bool, step: int | None,
              seen_at: float | None = None, notice: Notice | None = None) -> None:
        """The supervisor saw a fault (at `seen_at`, time.monotonic(); default now) it restarts
        `tasks` (or the cluster) for; `notice`: a preemption's, the clock's start, with its save."""
        now = time.monotonic()
        with self._lock:
            if self.current is not None:
                self._join(tasks, cluster, step)
            elif notice is None:
                self.current = Mending(list(tasks), cluster, now if seen_at is None else seen_at, step)
            else:
                self.current = _preempted(tasks, cluster, step, notice, now)

    def _join(self, tasks: tuple[str, ...] | list[str], cluster: bool, step: int | None) -> None:
        """A fault while another is mended: one more to mend on the same clock."""
        m = self.current
        assert m is not None
        m.tasks += [t for t in tasks if t not in m.tasks]
        m.cluster = m.cluster or cluster
        if step is not None and (m.step is None or step > m.step):
            m.step = step

    def mending_for(self) -> float | None:
        """How long the fault being mended has been (seconds since it was seen); None: none is."""
        with self._lock:
            return None if self.current is None else time.monotonic() - self.current.seen_at

    def phase(self, name: str, from_step: int | None = None) -> None:
        """The restart under way finished phase `name` (a cluster restart's resume step with 'backoff')."""
        with self._lock:
            if self.current is None:
                return
            self.current.phase(name)
            if from_step is not None:
                self.current.from_step = from_step

    def started(self, warm: bool) -> None:
        """A task of the restart under way was started, from a warm standby or cold."""
        with self._lock:
            if self.current is not None:
                if warm:
                    self.current.warm += 1
                else:
                    self.current.cold += 1

    def served(self, task: str) -> None:
        """A task said it serves (from a log follower's thread): a task restart's start ends when
        the first of its tasks does (a cluster restart's, once every server answers)."""
        with self._lock:
            m = self.current
            if m is not None and not m.cluster and task in m.tasks and 'start' not in m.phases:
                m.phase('start')

    def stepped(self, task: str, step: int, by_chief: bool = False) -> None:
        """A global step was seen (from a log follower's thread): for a cluster restart any task's
        step ends the mending, for a task restart a step of a task restarted, or the chief's
        (`by_chief`: a coordinator run, whose workers log no steps of their own)."""
        with self._lock:
            m = self.current
            if m is None or (not m.cluster and task not in m.tasks and not by_chief):
                return
            if m.cluster and 'stop' not in m.phases:    # the old attempt, before its tasks stopped: trained
                m.step = step if m.step is None else max(m.step, step)     # on, to be trained again
                return
            m.phase('step')
            self.current = None
            found = MendedFault(tasks=m.tasks, seconds=round(time.monotonic() - m.seen_at, 3),
                                steps_redone=m.redone(), phases={p: round(m.phases[p], 3) for p in PHASES
                                                                 if p in m.phases},
                                preempted=True if m.preempted else None,
                                standby=m.warm or None, cold=m.cold if m.warm else None)
            self.done.append(found)
        self._emit(found)

    def forget(self) -> None:
        """The run ends (or is given up) before the training came back: nothing mended."""
        with self._lock:
            self.current = None


def _preempted(tasks: tuple[str, ...] | list[str], cluster: bool, step: int | None, notice: Notice,
               now: float) -> Mending:
    """A preemption's mending: on the clock since its notice, its save phase already over (at the
    checkpoint seen after the notice, else now)."""
    start = min(notice.at, now)
    end = now if notice.saved_at is None else min(max(notice.saved_at, start), now)
    m = Mending(list(tasks), cluster, start, step, preempted=True)
    m.phases['save'], m.mark = end - start, end
    return m


def line(mended: MendedFault) -> str:
    """The console's line once the training is back: the seconds, each phase's, the steps redone."""
    phases = ', '.join(f'{name} {secs:.1f}s' for name, secs in (mended.phases or {}).items())
    redone = f'; {mended.steps_redone} step(s) trained again' if mended.steps_redone else ''
    what = f'the preemption of {", ".join(mended.tasks or ())}' if mended.preempted else 'the fault'
    warm = f'; {mended.standby} task(s) from a warm standby, {mended.cold or 0} cold' if mended.standby else ''
    return f'training again {mended.seconds:.1f}s after {what} ({phases}{redone}{warm})'
