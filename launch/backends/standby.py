"""The launcher's book of warm standbys (cluster/runtime/standby.py is the contract with them):
which slots each host has, which one a restart may take, which to spawn and which to kill.

Pure, and the same for every backend that keeps standbys: a backend tells the pool what it saw
(a spawn, a ready file and its age, a death, a stop by SIGSTOP) and does what the pool answers
(spawn one here, kill those). A standby is taken only when nothing says it might hang or differ
from the task: READY, its heartbeat fresh, not halted, spawned for this run with the task's
import key. Anything else is killed and replaced, never used.

At most one standby spawns per host at a time: its import takes a core for seconds, and the
run's tasks share the host with it.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from operator import itemgetter

from cluster.runtime.standby import FRESH_SECS, Ready, import_key
from cluster.runtime.contract import TASK_MODULE
from launch.planning.plan import TaskPlan

SPAWN_SECS = 120.0      # a standby not READY this long after its spawn is stuck in its import: killed
# How long after the run's first step standbys are spawned: a run that short never pays for one.
TEND_AFTER_SECS = 5.0


class SlotState(str, enum.Enum):
    SPAWNING = 'starting'       # spawned, importing
    READY = 'ready'             # imported, waiting (its ready file says so)
    TAKEN = 'taken'             # being made a task (a become file written)
    DEAD = 'dead'               # gone, or to be killed

    def __str__(self) -> str:
        return self.value


SPAWNING, READY, TAKEN, DEAD = SlotState.SPAWNING, SlotState.READY, SlotState.TAKEN, SlotState.DEAD


@dataclass
class Slot:
    """One standby: where (host, slot id: its files' names), which process (pid, ident: its start
    time, so a reused pid is never taken for it), what it serves (run, key), and what was last seen
    of it: its state, when it was spawned, its ready file's mtime (its heartbeat), stopped or not."""
    host: str
    slot: str
    run: str
    key: str
    spawned_at: float
    pid: int = 0
    ident: str = ''
    state: SlotState = SPAWNING
    beat: float | None = None
    halted: bool = False

    def fresh(self, now: float) -> bool:
        return self.beat is not None and now - self.beat < FRESH_SECS


@dataclass(frozen=True)
class Want:
    """How many standbys a host should keep, and the import key they should have."""
    count: int
    key: str


def plan_key(plan: TaskPlan, env: Mapping[str, str]) -> str | None:
    """The import key a standby needs to become this plan's task, with `env` the environment the
    task would start with; None: no standby can become it (it runs a command or a rehearsal, not
    cluster.task; or it runs in a network namespace, where a standby is not)."""
    if plan.keras is None or plan.netns or list(plan.argv[1:3]) != ['-m', TASK_MODULE]:
        return None
    return import_key(plan.argv[0], plan.cwd, env, plan.keras)


def wants(keyed: Iterable[tuple[str, str | None]], per_host: int) -> dict[str, Want]:
    """What each host should keep, from (host, key) of every task it runs: `per_host` standbys
    with the key most of its tasks need (the first such, on a tie); a host none of whose tasks
    a standby can become keeps none."""
    keys: dict[str, dict[str, int]] = {}
    for host, key in keyed:
        counts = keys.setdefault(host, {})
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    return {host: Want(per_host, max(counts.items(), key=itemgetter(1))[0])
            for host, counts in keys.items() if counts and per_host > 0}


class StandbyPool:
    """Every standby slot of one launcher, by (host, slot id). Slot ids are `prefix` and a count:
    a launcher that takes over a run uses a prefix of its own, so it never reuses a slot's files."""

    def __init__(self, run: str, prefix: str = 's') -> None:
        self.run, self.prefix = run, prefix
        self.slots: dict[tuple[str, str], Slot] = {}
        self._made = 0

    def of(self, host: str) -> list[Slot]:
        return [s for s in self.slots.values() if s.host == host]

    def new(self, host: str, key: str, now: float) -> Slot:
        """A slot to spawn a standby into (SPAWNING, no pid yet: spawned() gives it)."""
        self._made += 1
        slot = Slot(host, f'{self.prefix}{self._made}', self.run, key, now)
        self.slots[(host, slot.slot)] = slot
        return slot

    @staticmethod
    def spawned(slot: Slot, pid: int, ident: str) -> None:
        slot.pid, slot.ident = pid, ident

    @staticmethod
    def seen(slot: Slot, ready: Ready | None, beat: float | None, halted: bool = False) -> None:
        """What its slot's files and its process say now: the Ready record and the ready file's
        mtime (None: no file), and whether it is stopped. A ready file of another process, run or
        key is never this slot's: the slot is DEAD."""
        if slot.state in (TAKEN, DEAD):
            return
        slot.halted = halted
        if ready is None:
            if slot.state == READY:         # a standby removes its file only as it leaves
                slot.state = DEAD
            return
        if (ready.pid, ready.run, ready.key) != (slot.pid, slot.run, slot.key):
            slot.state = DEAD
            return
        slot.state, slot.beat = READY, beat

    @staticmethod
    def died(slot: Slot) -> None:
        """Its process ended, or it failed to become a task: to be killed (its group) and forgotten."""
        slot.state = DEAD

    def pick(self, host: str, key: str | None, now: float) -> Slot | None:
        """A standby of `host` that may become a task of import key `key` now, marked TAKEN; None
        when there is none (the task starts cold)."""
        if key is None:
            return None
        for slot in sorted(self.of(host), key=lambda s: s.spawned_at):
            if (slot.state == READY and slot.fresh(now) and not slot.halted and slot.key == key
                    and slot.run == self.run and slot.pid):
                slot.state = TAKEN
                return slot
        return None

    def taken(self, slot: Slot) -> None:
        """It is a task now: no longer a standby of the pool."""
        self.slots.pop((slot.host, slot.slot), None)

    def doomed(self, want: Mapping[str, Want], now: float) -> list[Slot]:
        """The slots to kill (their process group, if any) and forget: dead; halted; a heartbeat
        gone stale; stuck in its import; a key or run no longer wanted; more than its host wants.
        They leave the pool here: the caller kills each."""
        out = [s for s in self.slots.values() if s.state != TAKEN and self._doomed(s, want.get(s.host), now)]
        for host, w in want.items():
            keep = [s for s in self.of(host) if s.state in (SPAWNING, READY) and s not in out]
            out += sorted(keep, key=lambda s: s.spawned_at)[w.count:]
        for slot in out:
            self.slots.pop((slot.host, slot.slot), None)
        return out

    def _doomed(self, slot: Slot, want: Want | None, now: float) -> bool:
        if slot.state == DEAD or slot.halted or want is None or slot.key != want.key or slot.run != self.run:
            return True
        if slot.state == SPAWNING:
            return now - slot.spawned_at > SPAWN_SECS
        return not slot.fresh(now)

    def spawns(self, want: Mapping[str, Want]) -> list[tuple[str, str]]:
        """(host, key) of the standbys to spawn now: one per host that has fewer than it wants and
        none spawning (call doomed() first, so a stale one is not counted)."""
        out = []
        for host, w in sorted(want.items()):
            mine = [s for s in self.of(host) if s.state in (SPAWNING, READY)]
            if len(mine) < w.count and not any(s.state == SPAWNING for s in mine):
                out.append((host, w.key))
        return out

    def views(self) -> list[tuple[str, int, str]]:
        """(host, pid, state) of every standby still the pool's, for the state file."""
        return [(s.host, s.pid, str(s.state)) for s in self.slots.values() if s.state in (SPAWNING, READY)]


def counts(views: Iterable[Mapping[str, object]]) -> tuple[int, int]:
    """(ready, starting) among a state file's standbys (StandbyPool.views as dicts)."""
    states = [v.get('state') for v in views]
    return states.count(str(READY)), states.count(str(SPAWNING))
