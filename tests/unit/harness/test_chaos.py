"""The chaos harness (tests/harness/chaos.py) in its short form: a few faults per backend on a real cluster
with `restart: on-failure`, and every invariant it checks (the run ends at the final step, one
restart per fault, no resume below the checkpoint that existed at the fault, nothing left). The
long runs docs/faults.md reports are `python -m tests.harness.chaos --backend B --faults N`. The fast tests
check that the invariants do catch what they are for, on made-up event logs."""
from __future__ import annotations

import datetime

import pytest

from tests.harness.chaos import Chaos, Driver, Fault, Options


# -- the checker, on made-up runs (no process) -----------------------------------------------

T0 = 1_800_000_000.0


def ev(secs: float, event: str, attempt: int = 1, **fields) -> dict:
    when = datetime.datetime.fromtimestamp(T0 + secs).astimezone().isoformat(timespec='milliseconds')
    return {'time': when, 'run': 'r', 'attempt': attempt, 'event': event, **fields}


def started(secs: float, attempt: int = 1) -> list[dict]:
    return [e for t in ('ps:0', 'worker:0', 'worker:1')
            for e in (ev(secs, 'task_started', attempt, task=t, pid=1), ev(secs + 1, 'serving', attempt, task=t))]


class _Ended:
    returncode = 0


class _Checkpoints(Driver):
    def __init__(self, step):
        super().__init__('/nowhere')
        self.step = step

    def checkpoint_step(self, sub):
        return self.step


def judge(events: list[dict], faults: list[Fault], restarts: int, steps: int = 100, final: int = 100) -> list[str]:
    run = Chaos(Options(plan=tuple((f.task, f.kind) for f in faults), steps=steps), _Checkpoints(final), say=None)
    run.proc = _Ended()
    Chaos._match(faults, events)
    return run.check(faults, events, {'state': 'done', 'exit_code': 0, 'global_step': steps, 'restarts': restarts},
                     {}, [], '', 'chaos')


def a_fault(at: float, task='ps:0', checkpoint=40, step=45) -> Fault:
    return Fault(1, task, 'kill', at=T0 + at, step=step, checkpoint=checkpoint)


def test_a_run_mended_as_it_should_be_passes():
    events = started(0) + [ev(5, 'first_step', step=1), ev(10, 'progress', step=45), ev(11, 'task_lost', task='ps:0'),
                           ev(11, 'restart', cause='ps:0 was killed', from_step=40)] + started(12, 2) + \
        [ev(15, 'first_step', 2, step=41), ev(20, 'progress', 2, step=100), ev(21, 'finished', 2, result={})]
    fault = a_fault(10.5)
    assert judge(events, [fault], restarts=1) == []
    assert fault.redone == 5 and fault.detected_secs == pytest.approx(0.5, abs=0.01)


def test_two_restarts_for_one_fault_break_the_count():
    events = started(0) + [ev(10, 'progress', step=45), ev(11, 'restart', cause='worker:1 lost', from_step=None,
                                                             tasks=['worker:1']),
                           ev(12, 'restart', cause='worker:1 lost again', from_step=None, tasks=['worker:1']),
                           ev(20, 'progress', step=100)]
    broken = judge(events, [a_fault(10.5, 'worker:1')], restarts=2)
    assert any(b.startswith('restarts: 1 fault(s) but 2 restart event(s)') for b in broken), broken
    assert any('answered by 2 restart(s)' in b for b in broken), broken


def test_a_resume_below_the_checkpoint_at_the_fault_is_caught():
    events = started(0) + [ev(10, 'progress', step=45), ev(11, 'restart', cause='ps:0 was killed', from_step=20)] + \
        started(12, 2) + [ev(15, 'first_step', 2, step=21), ev(20, 'progress', 2, step=100)]
    broken = judge(events, [a_fault(10.5)], restarts=1)
    assert any(b.startswith('resume: fault 1 (kill ps:0) came with the checkpoint at step 40') for b in broken), broken
    assert any('went back to 21' in b for b in broken), broken


def test_an_unfinished_run_and_a_missing_fault_are_caught():
    events = started(0) + [ev(10, 'progress', step=45)]
    run = Chaos(Options(plan=(('ps:0', 'kill'), ('worker:0', 'kill')), steps=100), _Checkpoints(45), say=None)
    run.proc = _Ended()
    run.proc.returncode = 1
    broken = run.check([], events, {'state': 'failed', 'exit_code': 1, 'global_step': 45, 'restarts': 0},
                       {'processes': ['123: python -m cluster.task']}, [], '', 'chaos')
    assert [b.split(':')[0] for b in broken] == ['planned', 'finished', 'nothing left'], broken


def test_the_cluster_trains_only_once_every_restarted_task_serves_again():
    before = started(0) + [ev(5, 'first_step', step=1)]
    assert Chaos.training(before)
    restarted = before + [ev(6, 'restart', cause='worker:1 lost', from_step=None, tasks=['worker:1']),
                          ev(7, 'progress', step=20)]
    assert not Chaos.training(restarted)          # the launcher waits out its backoff: no start yet
    restarted += [ev(8, 'task_started', task='worker:1', pid=2), ev(9, 'progress', step=30)]
    assert not Chaos.training(restarted)
    restarted += [ev(10, 'serving', task='worker:1'), ev(11, 'progress', step=40)]
    assert Chaos.training(restarted)
    assert not Chaos.training(restarted + [ev(12, 'restart', cause='ps:0 was killed', from_step=40)])


def test_random_plans_hold_only_faults_the_launcher_can_see():
    plan = Options(faults=60, seed=3).fault_plan()
    assert {(t, k) for t, k, _ in plan} == {('ps:0', 'kill'), ('ps:0', 'stop'), ('worker:0', 'kill'),
                                             ('worker:1', 'kill')}
    sync = Options(backend='compose', faults=90, seed=3, sync=True).fault_plan()
    assert {k for _, k, _ in sync} == {'kill', 'pause', 'disconnect'} and {t for t, _, _ in sync} == \
        {'ps:0', 'worker:0', 'worker:1'}
    assert plan == Options(faults=60, seed=3).fault_plan() != Options(faults=60, seed=4).fault_plan()


def test_faults_during_a_restarts_start_up_are_planned_by_the_seed_and_counted():
    options = Options(faults=40, seed=3, startup=0.3)
    plan = options.startup_plan()
    assert len(plan) == 40 and plan == Options(faults=40, seed=3, startup=0.3).startup_plan()
    assert 5 <= sum(k is not None for k in plan) <= 20 and {k for k in plan if k} <= {'kill', 'stop'}
    assert set(Options(backend='compose', faults=40, seed=3, startup=1).startup_plan()) <= {'kill', 'pause'}
    assert not any(Options(faults=40, seed=3).startup_plan())
    run = Chaos(options, _Checkpoints(None), say=None)
    train, supervise = run.settings()
    assert supervise['max_restarts'] == 40 + sum(k is not None for k in plan) + options.margin
