"""The chaos harness's standby parts (tests/harness/chaos_standby.py) on made-up runs: the invariant
that no task starts in a standby that was killed or frozen, kill -> training again read from the
launcher's recovered events, and the summary line against one import."""
from __future__ import annotations

import argparse
import datetime

import pytest

from tests.harness.chaos_standby import STANDBY_KINDS, kill_to_training, never_used, standby_summary
from tests.harness.chaos import Chaos, Driver, Fault, Options, parse_plan

T0 = 1_800_000_000.0


def ev(secs: float, event: str, **fields) -> dict:
    when = datetime.datetime.fromtimestamp(T0 + secs).astimezone().isoformat(timespec='milliseconds')
    return {'time': when, 'run': 'r', 'attempt': 1, 'event': event, **fields}


def test_a_task_started_in_a_standby_that_was_hit_breaks_the_invariant():
    events = [ev(5, 'task_started', task='worker:1', pid=41, warm=True),      # before the hit: fine
              ev(12, 'task_started', task='ps:0', pid=41, warm=True),          # after it: broken
              ev(13, 'task_started', task='worker:0', pid=77)]
    broken = never_used(events, {41: T0 + 10})
    assert len(broken) == 1 and 'ps:0 started as pid 41' in broken[0] and '2.0s before' in broken[0], broken
    assert never_used(events, {}) == []


def test_kill_to_training_is_read_from_the_recovered_event_that_followed_each_kill():
    faults = [Fault(1, 'worker:1', 'kill', at=T0 + 10), Fault(2, 'ps:0', 'stop', at=T0 + 30),
              Fault(3, 'ps:0', 'kill', at=T0 + 50), Fault(4, 'worker:0', 'kill', at=T0 + 51, startup=True),
              Fault(5, 'worker:1', 'kill', at=T0 + 70)]
    events = [ev(11.5, 'recovered', seconds=1.3), ev(42, 'recovered', seconds=12),
              ev(58, 'recovered', seconds=7), ev(71.25, 'recovered', seconds=1.1)]
    # The stop is no kill; fault 3 was followed by a kill while its restart started: mended together.
    assert kill_to_training(faults, events) == pytest.approx([1.5, 1.25])


def test_the_summary_gives_the_median_as_a_share_of_one_import():
    line = standby_summary([1.0, 2.0, 1.5], [2.4, 2.6], warm=5, started=6)
    assert line.startswith('kill -> training again: median 1.50s = 0.60x one import (2.50s'), line
    assert '5 of 6 task starts after a fault from a standby' in line
    assert standby_summary([], [2.5], 0, 0) == ''


def test_standby_faults_are_planned_only_when_named_and_restart_nothing():
    assert parse_plan('worker:1=standby-kill,ps:0=kill') == (('worker:1', 'standby-kill'), ('ps:0', 'kill'))
    with pytest.raises(argparse.ArgumentTypeError):
        parse_plan('worker:1=standby-pause')
    default = Options(faults=20, seed=4)
    assert not {kind for _, kind, _ in default.fault_plan()} & set(STANDBY_KINDS)
    mixed = Chaos(Options(plan=(('ps:0', 'kill'), ('ps:0', 'standby-stop')), standby=2), Driver('/nowhere'))
    train, supervise = mixed.settings()
    assert supervise['max_restarts'] == 1 + mixed.o.margin and supervise['standby'] == 2


def test_no_fault_is_planned_for_the_start_up_of_a_restart_a_standby_fault_never_makes():
    options = Options(plan=(('ps:0', 'standby-kill'), ('ps:0', 'kill')) * 20, startup=1.0, standby=3)
    startup = options.startup_plan()
    assert all(s is None for (_, kind, _), s in zip(options.fault_plan(), startup) if kind in STANDBY_KINDS)
    assert all(s is not None for (_, kind, _), s in zip(options.fault_plan(), startup) if kind == 'kill')
