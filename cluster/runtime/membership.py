"""Which workers of the pool are live: what the launcher tells its tasks, and how the ps tasks
count "every worker is done" when that set changes during a run (elastic workers, `launch scale`).

The spec's worker list is the pool: every server knows every pool address (TF_CONFIG never
changes), and the live set is a subset of it that always holds the chief. The launcher writes
the live set into the lease file it renews anyway (cluster/runtime/rundir.py LEASE_ENV), as one JSON line:

    {"epoch": 7, "workers": {"0": 1, "2": 7}, "save": 2}

`epoch` grows with every change; each worker's number is its generation, the epoch at which it
was last started, so a ps can tell a report from a worker that left and came back from the report
of its new start. `save` (optional) counts the launcher's requests for a checkpoint now: the chief
saves between two steps once it sees the number grow (a sync scale, which restarts through a
checkpoint, asks for one first). An empty or unreadable lease (an older launcher, a task started by hand) means
"every pool worker, generation 0": a fixed cluster, as before.

Pure: text in, sets out; no TensorFlow, no files.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from collections.abc import Iterable, Mapping

from cluster.runtime import runjson


@dataclass(frozen=True)
class Members:
    epoch: int
    workers: Mapping[int, int] = field(default_factory=dict)     # worker index -> its generation
    save: int = 0           # the launcher's requests for a checkpoint now, counted

    @classmethod
    def everyone(cls, pool: int) -> Members:
        """Every worker of a pool of `pool`, generation 0: a cluster nobody scales."""
        return cls(0, {i: 0 for i in range(pool)})

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(sorted(self.workers))

    @property
    def count(self) -> int:
        return len(self.workers)

    def rank(self, index: int) -> int | None:
        """A live worker's place among the live ones in index order (its input shard), else None."""
        return self.indices.index(index) if index in self.workers else None

    def without(self, indices: Iterable[int]) -> Members:
        """The live set once these workers are let go (lost, and not started again), in a new
        epoch: the others keep their generation, the ps tasks stop waiting for the reports of
        the ones let go, and async workers share the input among those left. Never the chief."""
        gone = {i for i in indices if i != 0} & set(self.workers)
        if not gone:
            return self
        return Members(self.epoch + 1, {i: g for i, g in self.workers.items() if i not in gone}, self.save)

    def to_text(self) -> str:
        raw = {'epoch': self.epoch, 'workers': {str(i): g for i, g in sorted(self.workers.items())}}
        if self.save:
            raw['save'] = self.save
        return runjson.dumps(raw, separators=(',', ':'))

    @classmethod
    def parse(cls, text: str, pool: int) -> Members | None:
        """The live set a lease holds, or None when it holds none (or nonsense): then every pool
        worker is live. Indices outside the pool, or a set without the chief, are nonsense."""
        try:
            raw = runjson.loads(text) if text.strip() else None
            if not isinstance(raw, dict):
                return None
            epoch, workers = raw['epoch'], {int(i): int(g) for i, g in raw['workers'].items()}
            save = int(raw.get('save', 0))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if not isinstance(epoch, int) or 0 not in workers or any(not 0 <= i < pool for i in workers):
            return None
        return cls(epoch, workers, save)


@dataclass
class DoneTracker:
    """The ps side of "every worker is done": reports are (worker, generation) pairs; the run is
    over once every live worker has reported from its current start (or a later one)."""
    reported: dict[int, int] = field(default_factory=dict)      # worker -> the newest generation reported

    def report(self, index: int, generation: int) -> None:
        self.reported[index] = max(generation, self.reported.get(index, -1))

    def finished(self, members: Members) -> bool:
        return all(self.reported.get(i, -1) >= g for i, g in members.workers.items())

    def waiting_for(self, members: Members) -> list[int]:
        return [i for i, g in sorted(members.workers.items()) if self.reported.get(i, -1) < g]


class LiveSet:
    """What this task last read of the live workers (the lease thread updates it; the training
    loop and the ps read it). Before any read, or with a lease that holds none: every worker."""

    def __init__(self) -> None:
        self._members: Members | None = None
        self._lock = threading.Lock()
        self.changed = threading.Event()

    def set(self, members: Members | None) -> bool:
        """Remember `members`; True when that changed which workers are live (a request for a
        checkpoint alone changes no worker's input shard)."""
        with self._lock:
            before, self._members = self._members, members
        if (before and (before.epoch, before.workers)) == (members and (members.epoch, members.workers)):
            return False
        self.changed.set()
        return True

    def save_requests(self) -> int:
        """How many checkpoints the launcher has asked for so far (see Members.save)."""
        with self._lock:
            return self._members.save if self._members else 0

    def current(self, pool: int) -> Members:
        with self._lock:
            return self._members or Members.everyone(pool)

    def generation(self, index: int, pool: int) -> int:
        """This worker's generation (0 where the lease holds no live set)."""
        return self.current(pool).workers.get(index, 0)

    def leaving(self, index: int, pool: int) -> bool:
        """Whether the launcher took worker `index` out of the live set (never the chief)."""
        return index != 0 and index not in self.current(pool).workers


LIVE = LiveSet()       # this process's view (one task per process)
