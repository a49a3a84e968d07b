"""A preemption's recovery clock (launch/run/supervised/mending.py, preemption.py clocked): timed from
its notice, with a first phase `save` up to the chief's checkpoint seen after the notice (or the
decision, when none was), so the record reads save, stop, backoff, start, step; the console line and
the `recovered` event say it was a preemption. Pure logic on the real clock; no process started."""
from __future__ import annotations

import time

from launch.records.event_types import Recovered, parse_event
from launch.records.result import MendedFault, RunRecord, RunResult, RunState
from launch.run.supervised import mending, preemption
from launch.run.supervised.mending import Notice, RecoveryClock
from launch.run.supervised.state import SupervisorState
from tests.conftest import write_spec
from tests.harness.fake_backend import fake_cluster


def clock() -> tuple[RecoveryClock, list]:
    told: list = []
    return RecoveryClock(told.append), told


def test_a_preemption_is_timed_from_its_notice_with_the_save_its_first_phase():
    c, told = clock()
    now = time.monotonic()
    c.fault(('ps:0',), cluster=True, step=130, notice=Notice(at=now - 3.0, saved_at=now - 1.0))
    for phase in ('stop', 'backoff', 'start'):
        c.phase(phase, from_step=128 if phase == 'backoff' else None)
    c.stepped('worker:0', 129)
    [mended] = told
    assert list(mended.phases) == ['save', 'stop', 'backoff', 'start', 'step']
    assert abs(mended.phases['save'] - 2.0) < 0.05 and mended.phases['stop'] >= 1.0     # the stop from the save on
    assert mended.seconds >= 3.0 and abs(sum(mended.phases.values()) - mended.seconds) < 0.01
    assert mended.preempted is True and mended.steps_redone == 2


def test_with_no_checkpoint_seen_the_save_lasts_until_the_supervisor_acts():
    c, told = clock()
    c.fault(('worker:1',), cluster=False, step=50, notice=Notice(at=time.monotonic() - 2.0))
    c.phase('backoff')
    c.served('worker:1')
    c.stepped('worker:1', 51)
    [mended] = told
    assert list(mended.phases) == ['save', 'backoff', 'start', 'step'] and mended.phases['save'] >= 2.0


def test_a_save_seen_before_the_notice_or_after_now_is_held_within_them():
    c, told = clock()
    now = time.monotonic()
    c.fault(('ps:0',), cluster=True, step=9, notice=Notice(at=now - 1.0, saved_at=now - 5.0))
    assert c.current is not None and c.current.phases['save'] == 0.0
    c.forget()
    c.fault(('ps:0',), cluster=True, step=9, notice=Notice(at=now + 5.0, saved_at=now + 6.0))
    assert c.current is not None and c.current.seen_at <= time.monotonic()


def test_a_preemption_during_a_restart_joins_the_fault_being_mended():
    c, told = clock()
    c.fault(('worker:1',), cluster=True, step=40)
    c.fault(('ps:0',), cluster=True, step=41, notice=Notice(at=time.monotonic()))
    c.phase('stop')
    c.stepped('worker:0', 42)
    [mended] = told
    assert mended.tasks == ['worker:1', 'ps:0'] and 'save' not in mended.phases and mended.preempted is None


def test_the_console_line_tells_a_preemption_from_a_fault():
    fault = MendedFault(tasks=['ps:0'], seconds=6.04, steps_redone=3, phases={'stop': 1.0, 'step': 5.04})
    assert mending.line(fault) == 'training again 6.0s after the fault (stop 1.0s, step 5.0s; 3 step(s) trained again)'
    preempted = MendedFault(tasks=['ps:0'], seconds=8.0, steps_redone=0, phases={'save': 2.0, 'stop': 6.0},
                            preempted=True)
    assert mending.line(preempted) == 'training again 8.0s after the preemption of ps:0 (save 2.0s, stop 6.0s)'


def test_the_preempted_flag_goes_to_the_event_and_run_json_only_for_a_preemption():
    preempted = MendedFault(tasks=['ps:0'], seconds=8.0, steps_redone=0, phases={'save': 2.0}, preempted=True)
    fault = MendedFault(tasks=['ps:0'], seconds=8.0, steps_redone=0, phases={'stop': 2.0})
    event = Recovered.of(preempted).to_json()
    assert event['preempted'] is True and 'preempted' not in Recovered.of(fault).to_json()
    assert parse_event({'time': '', 'run': 'r', 'attempt': 2, 'event': 'recovered', **event}) == Recovered.of(preempted)
    record = RunResult(state=RunState.DONE, exit_code=0, recoveries=[preempted, fault]).record('r', 2, 's', 'local', 'd')
    written = record.to_json()['recoveries']
    assert written[0]['preempted'] is True and 'preempted' not in written[1]
    assert RunRecord.from_json(record.to_json()).recoveries == [preempted, fault]


def test_the_clock_starts_at_the_first_notice_and_takes_the_checkpoint_saved_after_it(tmp_path):
    spec, plans = fake_cluster(write_spec(tmp_path, workers=2, sync=False,
                                          supervise={'restart': 'on-failure', 'max_restarts': 0}))
    state = SupervisorState.new(spec, plans, None)
    assert preemption.clocked(state, ['ps:0']) is None          # left EXIT_PREEMPTED with its line lost
    state.attempt.saw_saved(40)
    state.attempt.saw_notice('ps:0', 30.0, 52)
    first = state.attempt.notices['ps:0'].at
    assert preemption.clocked(state, ['ps:0', 'worker:0']) == Notice(first, None)    # no checkpoint since
    state.attempt.saw_saved(52)
    found = preemption.clocked(state, ['ps:0'])
    assert found is not None and found.at == first and found.saved_at == state.attempt.saved_at
