"""The leases' thread lets a backend keep its standbys (Leases.tend) only once the attempt has
trained for TEND_AFTER_SECS, with supervise.standby per host under restart: on-failure (0
otherwise: any standby is killed), and keeps what the backend then says for the state file."""
from __future__ import annotations

import threading
import time

from cluster.spec import load_spec
from launch.backends.standby import TEND_AFTER_SECS
from launch.planning.plan import plan_cluster
from launch.run.supervised.leases import Leases
from launch.run.supervised.state import SupervisorState


class Keeper:
    """A backend as far as the leases' tend sees one."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def tend(self, plans, per_host: int) -> None:
        self.asked.append((len(plans), per_host))

    def standby_views(self):
        return [('localhost', 7, 'ready')]


def _leases(tmp_path, restart: str) -> tuple[Leases, Keeper]:
    path = tmp_path / 'spec.yaml'
    path.write_text('cluster:\n  ps: [localhost:2222]\n  worker: [localhost:2223]\n'
                    f'supervise:\n  restart: {restart}\n  standby: 2\n')
    spec = load_spec(str(path))
    keeper = Keeper()
    return Leases(SupervisorState.new(spec, list(plan_cluster(spec)), None), {'local': keeper},
                  threading.Event()), keeper


def test_no_standby_is_kept_before_the_attempt_trains_and_for_a_while_after(tmp_path):
    leases, keeper = _leases(tmp_path, 'on-failure')
    assert leases.tend('local', None) is None and keeper.asked == []       # no step yet
    leases.state.attempt.saw_step(1)
    since = leases.tend('local', None)
    assert since is not None and keeper.asked == []                          # just stepped
    assert leases.tend('local', since) == since and keeper.asked == []


def test_once_it_trained_the_backend_keeps_the_count_asked_and_says_what_it_keeps(tmp_path):
    leases, keeper = _leases(tmp_path, 'on-failure')
    leases.state.attempt.saw_step(1)
    leases.tend('local', time.monotonic() - TEND_AFTER_SECS - 1)
    assert keeper.asked == [(2, 2)] and leases.state.standbys == {'local': [('localhost', 7, 'ready')]}


def test_a_run_that_restarts_nothing_keeps_none(tmp_path):
    leases, keeper = _leases(tmp_path, 'never')
    leases.state.attempt.saw_step(1)
    leases.tend('local', time.monotonic() - TEND_AFTER_SECS - 1)
    assert keeper.asked == [(2, 0)]


def test_once_begun_the_standbys_are_kept_through_a_restart_before_its_first_step(tmp_path):
    from launch.run.supervised.attempt import Attempt
    leases, keeper = _leases(tmp_path, 'on-failure')
    leases.state.attempt.saw_step(1)
    since = time.monotonic() - TEND_AFTER_SECS - 1
    leases.tend('local', since)
    leases.state.attempt = Attempt(from_step=1)      # a restart of the cluster: no step seen yet
    assert leases.tend('local', since) == since and keeper.asked == [(2, 2), (2, 2)]


def test_a_restart_under_way_holds_the_refill_until_it_trains_or_for_at_most_so_long(tmp_path):
    """The standbys a restart took are made again once it trains: a new standby's import would
    take the CPU the restarted tasks need to start; a restart that never trains holds it
    REFILL_HOLD_SECS at most."""
    from launch.run.supervised.leases import REFILL_HOLD_SECS
    leases, keeper = _leases(tmp_path, 'on-failure')
    leases.state.attempt.saw_step(1)
    since = time.monotonic() - TEND_AFTER_SECS - 1
    mending: list[float | None] = [2.0]
    leases.mending_for = lambda: mending[0]
    leases.tend('local', since)
    assert keeper.asked == []
    mending[0] = REFILL_HOLD_SECS + 0.5
    leases.tend('local', since)
    mending[0] = None                   # trained again: the fault is mended
    leases.tend('local', since)
    assert keeper.asked == [(2, 2), (2, 2)]
