"""The running tasks' telemetry (cluster/runtime/telemetry.py, in each task's pulse), read by the
launcher every LOOK_SECS while the run trains, from a thread of its own (a slow host's read never
holds up the supervision):

- a `sample` event every supervise.sample_secs (30 s by default), with the tasks' newest figures
  (bounded: one line per sample_secs however long the run, EVENT_TASKS tasks in it however many);
- a worker whose steps per second stay below STRAGGLER_BELOW of the other workers' median for
  STRAGGLER_LOOKS looks in a row is a straggler: one line and a `straggler` event naming it, how
  slow, and the likely cause from its CPU against the others'. It is named once, and again only
  after it has kept up for a while.

In sync training without backup workers every worker steps at the pace of the slowest, so no
rate stands out: a straggler shows only as a slower run there (`train.replicas_to_aggregate`
below the worker count lets the others go on without it). `judge` is pure."""
from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from cluster.runtime.telemetry import Sample
from launch.backends.base import Backend, TaskRecord
from launch.records.event_types import Event, Sample as SampleEvent, Straggler as StragglerEvent
from launch.records.telemetry import Board
from launch.run.disk import read_pulse

log = logging.getLogger(__name__)

LOOK_SECS = 5.0
EVENT_EVERY = 6             # looks between two `sample` events (30 s)
STRAGGLER_BELOW = 0.67      # of the other workers' median steps/s
STRAGGLER_LOOKS = 3         # looks in a row below it (15 s)
LESS_CPU = 0.67             # a straggler with less than this of the others' CPU is short of CPU
READS_PER_LOOK = 64         # pulses read a look at most (in turn beyond)
EVENT_TASKS = 200           # tasks a `sample` event holds at most


@dataclass(frozen=True)
class Straggler:
    task: str
    rate: float
    median: float
    cause: str

    def line(self) -> str:
        return (f'straggler: {self.task} trains {self.rate:.2f} steps/s, {self.rate / self.median:.0%} of the other '
                f'workers\' median ({self.median:.2f}); {self.cause}')


@dataclass
class Judge:
    """The stragglers among the workers' samples, look after look."""
    below: float = STRAGGLER_BELOW
    looks: int = STRAGGLER_LOOKS
    counts: dict[str, int] = field(default_factory=dict)     # looks in a row below, per worker
    named: set[str] = field(default_factory=set)             # named, and not yet caught up

    def judge(self, samples: Mapping[str, Sample]) -> list[Straggler]:
        """The workers that became stragglers at this look. A worker counts once it has stepped
        (its rate is not that of a start); two workers at least."""
        rates = {t: s.steps_per_sec for t, s in samples.items()
                 if t.startswith('worker:') and s.steps_per_sec is not None and s.steps}
        out = []
        for task, rate in sorted(rates.items()):
            others = [r for t, r in rates.items() if t != task]
            if not others or statistics.median(others) <= 0:
                continue
            median = statistics.median(others)
            if rate >= self.below * median:
                self.counts.pop(task, None)
                if rate >= median * (1 + self.below) / 2:       # caught up: it may be named again
                    self.named.discard(task)
                continue
            self.counts[task] = self.counts.get(task, 0) + 1
            if self.counts[task] >= self.looks and task not in self.named:
                self.named.add(task)
                out.append(Straggler(task, rate, median, cause(task, samples)))
        return out


def cause(task: str, samples: Mapping[str, Sample]) -> str:
    """The likely cause, from the straggler's CPU against the other workers'."""
    mine = samples[task].cpu
    others = [s.cpu for t, s in samples.items() if t != task and t.startswith('worker:') and s.cpu is not None]
    if mine is None or not others:
        return 'its CPU is not measured'
    median = statistics.median(others)
    if median > 0 and mine < LESS_CPU * median:
        return (f'it had {mine:.0%} of a core against the others\' {median:.0%}: its host is busy, or it is '
                'stopped part of the time')
    return (f'its CPU is like the others\' ({mine:.0%} against {median:.0%}): it waits, on its input or on its '
            'link')


def shown(samples: Mapping[str, Sample]) -> list[str]:
    """The tasks a `sample` event holds, at most EVENT_TASKS: the ps tasks, then the workers from
    the slowest, then the rest (a chief, an evaluator)."""
    def order(task: str) -> tuple:
        job, rate = task.split(':')[0], samples[task].steps_per_sec
        return (0 if job == 'ps' else 1 if job == 'worker' else 2, rate if rate is not None else float('inf'), task)
    return sorted(samples, key=order)[:EVENT_TASKS]


class Watch:
    """Reads the running tasks' samples every LOOK_SECS; says and records what `judge` finds."""

    def __init__(self, records: Callable[[], Sequence[TaskRecord]], backends: Mapping[str, Backend],
                 say: Callable[[str], None], emit: Callable[[Event], None], sample_secs: float = 30.0,
                 train_dir: str | None = None) -> None:
        self.records, self.backends, self.say, self.emit = records, backends, say, emit
        self.board = Board(train_dir) if train_dir else None     # the sample events in TensorBoard
        self.sample_secs = sample_secs                  # supervise.sample_secs (0: no watch)
        self.look_secs = min(LOOK_SECS, sample_secs) if sample_secs else LOOK_SECS
        self.event_every = max(1, round(sample_secs / self.look_secs)) if sample_secs else EVENT_EVERY
        self.judge = Judge()
        self.looked = 0
        self._seen: dict[str, float] = {}      # task -> the time of the sample read last
        self._turn = 0                          # where the next look's reads begin (many tasks)

    def start(self, stop: threading.Event) -> None:
        """Look every look_secs from a thread of its own until `stop`; nothing with sample_secs 0."""
        if self.sample_secs:
            threading.Thread(target=self._watch, args=(stop,), name='tfcluster-telemetry', daemon=True).start()

    def _watch(self, stop: threading.Event) -> None:
        while not stop.wait(self.look_secs):
            try:
                self.look()
            except Exception:   # a watch is a courtesy: it must never end the run
                log.debug('reading the tasks\' telemetry failed', exc_info=True)
        if self.board is not None:
            self.board.close()

    def fresh(self) -> dict[str, Sample]:
        """Each task's newest sample, where it is newer than the one read before (a task that has
        ended, or is stopped, writes none). At most READS_PER_LOOK tasks are read a look, in turn
        (a pulse on another host is a remote read): at 1,000 tasks each is read every 16 looks."""
        records = list(self.records())
        if len(records) > READS_PER_LOOK:
            start = self._turn % len(records)
            self._turn += READS_PER_LOOK
            records = (records[start:] + records[:start])[:READS_PER_LOOK]
        out = {}
        for record in records:
            beat = read_pulse(record, self.backends[record.backend])
            sample = beat.sample if beat else None
            if sample is not None and sample.t > self._seen.get(record.name, 0.0):
                self._seen[record.name] = sample.t
                out[record.name] = sample
        return out

    def look(self) -> None:
        samples = self.fresh()
        self.looked += 1
        if samples and self.looked % self.event_every == 0:
            tasks = {t: samples[t].facts() for t in shown(samples)}
            self.emit(SampleEvent(tasks=tasks))
            if self.board is not None:
                self.board.add(time.time(), tasks)
        for straggler in self.judge.judge(samples):
            self.say(straggler.line())
            self.emit(StragglerEvent(task=straggler.task, steps_per_sec=round(straggler.rate, 3),
                                     median=round(straggler.median, 3), cause=straggler.cause))
