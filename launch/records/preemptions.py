"""A run's preemptions, read from its event log: each `preempted` event (the notice) paired with the
`recovered` event that timed the training back after it (its `save` phase, the seconds to training
again, the steps redone), for the report's Preemptions table and `launch status`, which tell them
apart from faults (a `task_lost` event each).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from collections.abc import Sequence

from cluster.runtime import rundir
from launch.records.event_types import Event, Preempted, Recovered
from launch.records.events import typed_events

log = logging.getLogger(__name__)
REQUEUED = 'the job (requeued)'      # a Slurm requeue's notice names no task


@dataclass(frozen=True)
class Preemption:
    """One preemption: its notice, and what the recovery after it took (None: not back yet, or
    no recovery timed it: the run ended on it, or a fault joined it)."""
    notice: Preempted
    recovered: Recovered | None

    @property
    def task(self) -> str:
        return self.notice.task or REQUEUED

    @property
    def save(self) -> float | None:
        """Seconds from the notice to the chief's checkpoint (or the grace up)."""
        return None if self.recovered is None else (self.recovered.phases or {}).get('save')

    @property
    def seconds(self) -> float | None:
        """Seconds from the notice to training again."""
        return None if self.recovered is None else self.recovered.seconds

    @property
    def redone(self) -> int | None:
        return None if self.recovered is None else self.recovered.steps_redone

    def to_json(self) -> dict:
        """`launch status --json`'s entry of `preempted`."""
        return {'task': self.task, 'time': self.notice.time, 'attempt': self.notice.attempt, 'grace': self.notice.grace,
                'step': self.notice.step, 'save_secs': self.save, 'seconds': self.seconds, 'steps_redone': self.redone}


def preemptions(events: Sequence[Event]) -> list[Preemption]:
    """Every notice in order, each with the first preemption's recovery after it that restarted its
    task (a requeue's: the first after it)."""
    timed = [(j, e) for j, e in enumerate(events) if isinstance(e, Recovered) and e.preempted]
    found, used = [], set()
    for i, e in enumerate(events):
        if not isinstance(e, Preempted):
            continue
        match = next(((j, r) for j, r in timed if j > i and j not in used
                      and (e.task is None or e.task in (r.tasks or ()))), None)
        if match is not None:
            used.add(match[0])
        found.append(Preemption(e, None if match is None else match[1]))
    return found


def summary(found: Sequence[Preemption]) -> str:
    """`launch status`'s line on preemptions ('' for none): how many, where, and the steps trained
    again after them; a preemption is no fault (`launch status` counts those apart)."""
    if not found:
        return ''
    redone = sum(p.redone or 0 for p in found)
    each = ', '.join(f'{p.task} at step {p.notice.step}' if p.notice.step is not None else p.task for p in found)
    return (f'preemptions: {len(found)} ({each}), {redone} step(s) trained again after them; '
            'not faults: no restart spent')


def of_run(train_dir: str) -> list[Preemption]:
    """The preemptions of the run in `train_dir` ([] with no event log, or one that cannot be read:
    said once)."""
    path = rundir.events_path(train_dir)
    try:
        return preemptions(typed_events(path))
    except FileNotFoundError:
        return []
    except OSError as e:
        log.warning('%s: cannot read it (%s); skipped', path, e.strerror or e)
        return []
