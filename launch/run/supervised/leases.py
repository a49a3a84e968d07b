"""Every task's lease (cluster/runtime/membership.py): the live set, and a request for a
checkpoint, written by the launcher and renewed each second while the run goes on; a task whose
lease goes stale knows its launcher is gone. One thread per backend, so a slow SSH host never
delays the leases of local tasks."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from launch.backends.base import Backend
from launch.backends.standby import TEND_AFTER_SECS
from launch.run.supervised.state import SupervisorState

log = logging.getLogger(__name__)

LEASE_RENEW_SECS = 1.0          # how often the launcher renews its tasks' lease
REFILL_HOLD_SECS = 10.0         # the longest a restart under way holds back the standbys' refill


class Leases:
    """The leases of a run's tasks, renewed from the state's live set until `done` is set."""

    def __init__(self, state: SupervisorState, backends: Mapping[str, Backend], done: threading.Event,
                 mending_for: Callable[[], float | None] = lambda: None) -> None:
        self.state, self.backends, self.done = state, backends, done
        self.mending_for = mending_for      # how long the fault being mended has been (None: none is)

    def keep(self) -> None:
        """Write every lease now, then renew them in the background until the run is done."""
        for name in self.backends:
            self.renew(name)
            threading.Thread(target=self._renew_each, args=(name,), name=f'lease-{name}', daemon=True).start()

    def publish(self) -> None:
        """Write the live set (and a request for a checkpoint) into every task's lease now."""
        for name in self.backends:
            self.renew(name)

    def renew(self, name: str) -> None:
        plans = [p for p in self.state.plans if p.backend == name]
        if plans:
            self.backends[name].renew(plans, text=self.state.members.to_text())

    def _renew_each(self, name: str) -> None:
        stepped_at: float | None = None
        while not self.done.wait(LEASE_RENEW_SECS):
            try:
                self.renew(name)
            except Exception as e:      # a host that cannot be reached now: the poll reports it
                log.debug('lease renewal failed: %s', e)
            stepped_at = self.tend(name, stepped_at)

    def tend(self, name: str, stepped_at: float | None) -> float | None:
        """Let the backend keep its standbys once the run has trained for TEND_AFTER_SECS (a
        standby's import never competes with the first start's, and a short run never pays for
        one), and from then on through every restart: the standbys a restart took are replaced
        once the restart trains (a new standby's import would take the CPU the restarted tasks
        need to start: at most REFILL_HOLD_SECS), for the next fault. Returns when the run was
        first seen stepping (None: not yet)."""
        if stepped_at is None and self.state.attempt.step is None:
            return None
        now = time.monotonic()
        stepped_at = now if stepped_at is None else stepped_at
        if now - stepped_at < TEND_AFTER_SECS:
            return stepped_at
        mending = self.mending_for()
        plans = [p for p in self.state.plans if p.backend == name]
        supervise = self.state.spec.supervise
        try:
            if mending is None or mending >= REFILL_HOLD_SECS:
                self.backends[name].tend(plans, supervise.standby if supervise.restart == 'on-failure' else 0)
            self.state.standbys[name] = self.backends[name].standby_views()     # the taken ones go at once
        except Exception as e:      # the next round tries again; a task then starts cold
            log.debug('keeping the standbys failed: %s', e)
        return stepped_at
