"""The recovery clock counts the tasks a restart started from a warm standby and cold, and says
them only when a standby was used (a run without standbys writes what it always wrote)."""
from __future__ import annotations

from launch.records.event_types import Recovered
from launch.run.supervised.mending import RecoveryClock, line


def mended(starts: list[bool]):
    told: list = []
    clock = RecoveryClock(told.append)
    clock.fault(('ps:0',), cluster=True, step=90)
    for phase in ('stop', 'backoff'):
        clock.phase(phase, from_step=80 if phase == 'backoff' else None)
    for warm in starts:
        clock.started(warm)
    clock.phase('start')
    clock.stepped('worker:0', 81)
    [found] = told
    return found


def test_a_restart_from_standbys_counts_them_and_the_cold_starts_in_the_record_event_and_line():
    found = mended([True, True, False])
    assert (found.standby, found.cold) == (2, 1)
    event = Recovered.of(found).to_json()
    assert event['standby'] == 2 and event['cold'] == 1
    assert line(found).endswith('; 10 step(s) trained again; 2 task(s) from a warm standby, 1 cold)'), line(found)


def test_a_restart_without_standbys_writes_no_counts():
    found = mended([False, False, False])
    assert found.standby is None and found.cold is None
    event = Recovered.of(found).to_json()
    assert 'standby' not in event and 'cold' not in event
    assert 'standby' not in line(found)


def test_starts_outside_a_restart_count_nowhere():
    told: list = []
    clock = RecoveryClock(told.append)
    clock.started(True)         # the first start of the run: nothing being mended
    assert clock.current is None and told == []
