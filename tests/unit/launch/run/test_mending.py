"""The recovery clock (launch/run/supervised/mending.py): how long a fault takes to mend, phase by phase, and
how many steps the cluster trains again; pure logic, on the real clock."""
from __future__ import annotations

import time

from launch.records.event_types import Recovered, parse_event
from launch.records.result import RunRecord, RunResult, RunState
from launch.run.supervised.mending import RecoveryClock


def clock() -> tuple[RecoveryClock, list]:
    told: list = []
    return RecoveryClock(told.append), told


def test_a_cluster_restart_is_timed_phase_by_phase_and_counts_the_steps_trained_again():
    c, told = clock()
    c.fault(('ps:0',), cluster=True, step=130)
    for phase in ('stop', 'backoff', 'start'):
        time.sleep(0.01)
        c.phase(phase, from_step=120 if phase == 'backoff' else None)
    c.stepped('worker:1', 121)
    c.stepped('worker:0', 122)          # once mended, later steps tell nothing
    [mended] = told
    assert mended.tasks == ['ps:0'] and mended.steps_redone == 10
    assert list(mended.phases) == ['stop', 'backoff', 'start', 'step'] and min(mended.phases.values()) >= 0
    assert abs(sum(mended.phases.values()) - mended.seconds) < 0.01 and mended.seconds >= 0.03
    assert c.done == [mended] and c.current is None


def test_a_task_restart_ends_with_a_step_of_that_task_only():
    c, told = clock()
    c.fault(('worker:1',), cluster=False, step=50)
    c.phase('backoff')
    c.stepped('worker:0', 51)           # the other worker trains on: not the restarted one back
    c.served('worker:0')
    assert not told
    c.served('worker:1')
    c.stepped('worker:1', 60)
    [mended] = told
    assert list(mended.phases) == ['backoff', 'start', 'step'] and mended.steps_redone == 0


def test_a_fault_during_the_restart_joins_the_one_being_mended_and_a_run_given_up_mends_nothing():
    c, told = clock()
    c.fault(('ps:0',), cluster=True, step=40)
    c.phase('stop')
    c.phase('backoff', from_step=30)
    c.fault(('worker:1',), cluster=True, step=None)     # frozen while the cluster started again
    c.phase('stop')
    c.phase('backoff', from_step=30)
    c.phase('start')
    c.stepped('worker:0', 31)
    [mended] = told
    assert mended.tasks == ['ps:0', 'worker:1'] and mended.steps_redone == 10
    c.fault(('ps:0',), cluster=True, step=90)
    c.forget()
    c.stepped('worker:0', 91)
    assert len(told) == 1


def test_the_figures_go_to_the_event_log_and_run_json_and_read_back():
    c, told = clock()
    c.fault(('worker:0',), cluster=True, step=9)
    c.phase('stop')
    c.stepped('worker:0', 10)
    event = Recovered.of(told[0]).to_json()
    assert parse_event({'time': '', 'run': 'r', 'attempt': 2, 'event': 'recovered', **event}) \
        == Recovered.of(told[0])
    record = RunResult(state=RunState.DONE, exit_code=0, recoveries=list(c.done)).record('r', 2, 's', 'local', 'd')
    assert RunRecord.from_json(record.to_json()).recoveries == c.done
    plain = RunResult(state=RunState.DONE, exit_code=0).record('r', 1, 's', 'local', 'd').to_json()
    assert 'recoveries' not in plain        # a run without faults reads as before


def test_steps_of_the_old_attempt_before_its_tasks_stopped_do_not_end_a_cluster_restart():
    c, told = clock()
    c.fault(('worker:0',), cluster=True, step=70, seen_at=time.monotonic() - 1)     # seen before the account
    c.stepped('worker:1', 71)           # the async worker still trains until the teardown stops it
    assert not told
    c.phase('stop')
    c.phase('backoff', from_step=60)
    c.phase('start')
    c.stepped('worker:1', 61)
    [mended] = told
    assert mended.seconds >= 1 and mended.steps_redone == 11
