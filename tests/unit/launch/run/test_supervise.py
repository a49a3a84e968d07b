"""The supervisor's decisions as a table (pure, milliseconds), and the observation of tasks over a
fake backend. The real-cluster tests (tests/system/launch/run/test_faults.py) check that the decisions are carried out."""
from __future__ import annotations

import os

import pytest

from cluster.runtime import causes, rundir
from launch.run import policy
from launch.run.supervised.faults import FaultHistory
from launch.backends.base import Backend, Observation, TaskRecord
from launch.run.policy import Action, Policy, Progress, TaskState, TaskStatus, decide
from tests.conftest import REPO

R, S, F, U = TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED, TaskState.UNKNOWN
QUIET = Progress(step=10, total=100, quiet_secs=1.0)


def cluster(*states, codes=None, since=0.0, ps=1):
    """ps tasks then workers, from state letters: cluster(R, R, F) is ps:0 running, worker:0
    running, worker:1 failed (killed by SIGKILL unless `codes` says otherwise)."""
    out = []
    for i, state in enumerate(states):
        job, index = ('ps', i) if i < ps else ('worker', i - ps)
        code = (codes or {}).get(f'{job}:{index}', -9) if state is F else (0 if state is S else None)
        out.append(TaskStatus(f'{job}:{index}', job, index, state, exit_code=code,
                              since=since if state is U else 0.0))
    return out


def rules(sync=True, workers=2, r=None, restart='never', max_restarts=3, stall=60.0):
    return Policy(sync=sync, num_workers=workers, replicas_to_aggregate=r or workers, restart=restart,
                  max_restarts=max_restarts, stall_secs=stall, unreachable_secs=30.0)


@pytest.mark.parametrize('name, pol, tasks, tolerated, restarts, progress, action, about', [
    ('all running', rules(), cluster(R, R, R), (), 0, QUIET, Action.CONTINUE, ()),
    ('async non-chief lost: tolerate', rules(sync=False), cluster(R, R, F), (), 0, QUIET,
     Action.TOLERATE, ('worker:1',)),
    ('async non-chief lost, on-failure: that worker again', rules(sync=False, restart='on-failure'),
     cluster(R, R, F), (), 0, QUIET, Action.RESTART_TASKS, ('worker:1',)),
    ('already tolerated: not again', rules(sync=False), cluster(R, R, F), {'worker:1'}, 0, QUIET,
     Action.CONTINUE, ()),
    ('sync backup worker lost, R still reachable', rules(workers=3, r=2), cluster(R, R, R, F), (), 0, QUIET,
     Action.TOLERATE, ('worker:2',)),
    ('sync second worker lost: fewer than R left', rules(workers=3, r=2), cluster(R, R, F, F), {'worker:2'}, 0,
     QUIET, Action.GIVE_UP, ('worker:1',)),
    ('sync without backups: a lost worker is fatal', rules(), cluster(R, R, F), (), 0, QUIET,
     Action.GIVE_UP, ('worker:1',)),
    ('sync without backups, on-failure: restart the cluster', rules(restart='on-failure'), cluster(R, R, F),
     (), 0, QUIET, Action.RESTART, ('worker:1',)),
    ('ps lost', rules(sync=False), cluster(F, R, R), (), 0, QUIET, Action.GIVE_UP, ('ps:0',)),
    ('chief lost in async mode too', rules(sync=False), cluster(R, F, R), (), 0, QUIET,
     Action.GIVE_UP, ('worker:0',)),
    ('chief lost, on-failure', rules(restart='on-failure'), cluster(R, F, R), (), 2, QUIET,
     Action.RESTART, ('worker:0',)),
    ('restarts used up', rules(restart='on-failure', max_restarts=2), cluster(R, F, R), (), 2, QUIET,
     Action.GIVE_UP, ('worker:0',)),
    ('max_restarts 0 is never', rules(sync=False, restart='on-failure', max_restarts=0), cluster(R, R, F), (),
     0, QUIET, Action.TOLERATE, ('worker:1',)),
    ('a clean early exit is no loss', rules(), cluster(R, R, S), (), 0, QUIET, Action.CONTINUE, ()),
    ('unreachable briefly: wait', rules(), cluster(R, U, R, since=5), (), 0, QUIET, Action.CONTINUE, ()),
    ('unreachable past the deadline: lost', rules(), cluster(U, R, R, since=31), (), 0, QUIET,
     Action.GIVE_UP, ('ps:0',)),
    ('every worker done, ps leaving by itself', rules(), cluster(R, S, S), (), 0, QUIET, Action.CONTINUE, ()),
    ('every worker done, ps gone too', rules(), cluster(S, S, S), (), 0, QUIET, Action.FINISH, ()),
    ('workers done, one lost: stop the waiting ps', rules(sync=False), cluster(R, S, F), {'worker:1'}, 0,
     QUIET, Action.FINISH, ('ps:0',)),
    ('stall', rules(stall=30), cluster(R, R, R), (), 0, Progress(10, 100, 31.0), Action.GIVE_UP,
     ('ps:0', 'worker:0', 'worker:1')),
    ('stall, on-failure', rules(stall=30, restart='on-failure'), cluster(R, R, R), (), 0,
     Progress(10, 100, 31.0), Action.RESTART, ('ps:0', 'worker:0', 'worker:1')),
    ('no stall before the first step', rules(stall=30), cluster(R, R, R), (), 0, Progress(None, 100, 99.0),
     Action.CONTINUE, ()),
    ('no stall after the last step', rules(stall=30), cluster(R, R, R), (), 0, Progress(100, 100, 99.0),
     Action.CONTINUE, ()),
    ('a loss is named before a stall', rules(stall=30), cluster(R, R, F), (), 0, Progress(10, 100, 99.0),
     Action.GIVE_UP, ('worker:1',)),
    ('no checkpoint restores: a restart cannot help', rules(restart='on-failure'),
     cluster(R, F, R, codes={'worker:0': 3}), (), 0, QUIET, Action.GIVE_UP, ('worker:0',)),
    ('an unreachable worker is not started again', rules(sync=False, restart='on-failure'),
     cluster(R, R, U, since=31), (), 0, QUIET, Action.TOLERATE, ('worker:1',)),
    ('several lost at once: the ps first, then by signal', rules(),
     cluster(F, F, F, codes={'ps:0': -9, 'worker:0': 1, 'worker:1': 1}), (), 0, QUIET, Action.GIVE_UP,
     ('ps:0', 'worker:0', 'worker:1')),
    ('a worker killed by a signal before one that followed it', rules(sync=False),
     cluster(R, R, F, F, codes={'worker:1': 1, 'worker:2': -9}), (), 0, QUIET, Action.TOLERATE,
     ('worker:2', 'worker:1')),
])
def test_decide(name, pol, tasks, tolerated, restarts, progress, action, about):
    decision = decide(pol, tasks, frozenset(tolerated), restarts, progress)
    assert (decision.action, decision.tasks) == (action, about), (name, decision)


def test_reasons_say_how_a_task_was_lost():
    d = decide(rules(), cluster(R, R, F, codes={'worker:1': 3}), frozenset(), 0, QUIET)
    assert d.reason.startswith('worker:1 exited with code 3; 1 worker(s) left, fewer than the 2')
    d = decide(rules(), cluster(R, R, F), frozenset(), 0, QUIET)
    assert 'worker:1 was killed by SIGKILL' in d.reason
    d = decide(rules(), cluster(U, R, R, since=40), frozenset(), 0, QUIET)
    assert d.reason == 'ps:0 could not be reached for 40s'
    d = decide(rules(), cluster(F, F, R, codes={'ps:0': -9, 'worker:0': 1}), frozenset(), 0, QUIET)
    assert d.reason == 'ps:0 was killed by SIGKILL (then worker:0 exited with code 1)'
    d = decide(rules(stall=5), cluster(R, R, R), frozenset(), 0, Progress(7, 50, 6.2))
    assert d.stalled and d.reason == 'no new global step for 6s (stuck at 7/50)'


@pytest.mark.parametrize('lines, expected', [
    (['Traceback (most recent call last):', '  File "x.py", line 1', 'ValueError: bad value'], 'ValueError: bad value'),
    (['2026-11-22T12:00:01.250+01:00 E worker:1: UnavailableError: Socket closed',
      'E1122 12:00:02.1 123 grpc.cc:1] chatter'],
     'worker:1: UnavailableError: Socket closed'),
    (['2026-11-22T12:00:01.250-05:30 E ps:0: a negative offset', '2026-11-22T12:00:02.001-05:30 I ok'],
     'ps:0: a negative offset'),
    (['12:00:01 E worker:1: a log of an older run'], 'worker:1: a log of an older run'),
    (['tensorflow.python.framework.errors_impl.DataLossError: truncated', '2026-11-22T12:00:03.000+00:00 I ok'],
     'tensorflow.python.framework.errors_impl.DataLossError: truncated'),
    (['KeyboardInterrupt'], 'KeyboardInterrupt'),
    (['W1122 12:00:00 oneDNN custom operations are on', 'I1122 started'], None),
    ([], None),
])
def test_last_error_line(lines, expected):
    assert causes.last_error_line(lines) == expected


PS_LOST = os.path.join(REPO, 'tests', 'data', 'ps-lost')     # see its README


def _ps_lost(name: str) -> str:
    with open(os.path.join(PS_LOST, name), encoding='utf-8') as f:
        return f.read()


def test_the_error_of_a_lost_ps_is_its_cause_never_tensorflows_banner():
    """TensorFlow 2.21's own words when a ps is killed: a task logs the cause of the message (the
    task's line, the console's, the event's and the report's), never the `=====` banner of a
    StatusGroup or the `Graph execution error:` that leads in to it; a log an older task wrote
    with the banner still names the error without it."""
    message = _ps_lost('unavailable-message.txt')
    assert message.splitlines()[2] == '=' * 21          # the banner, as TensorFlow writes it
    assert causes.cause_line(message) == 'recvmsg:Connection reset by peer'
    assert causes.last_error_line(_ps_lost('async-worker-1.log').splitlines()) == 'worker:1: UnavailableError'
    assert causes.last_error_line(_ps_lost('sync-worker-0.log').splitlines()) == \
        'the sync aggregator failed, so this chief cannot go on: UnavailableError'
    traceback = ['Traceback (most recent call last):', '  File "task.py", line 9, in <module>',
                 'tensorflow.python.framework.errors_impl.UnavailableError: Graph execution error:', '',
                 *message.splitlines()[2:]]      # an uncaught one: the rest of its message follows it
    assert causes.last_error_line(traceback) == \
        'tensorflow.python.framework.errors_impl.UnavailableError: recvmsg:Connection reset by peer'
    assert causes.last_error_line(['ValueError: File "x.py" not found']) == 'ValueError: File "x.py" not found'


def test_progress_and_checkpoint_parsing():
    assert rundir.step_of('2026-11-22T12:00:00.000+00:00 I step 57/200  loss 3.1  400 images/s') == (57, 200)
    assert rundir.step_of('2026-11-22T12:00:00.000+00:00 I session ready after 1.0s at global step 0') is None
    text = 'model_checkpoint_path: "/runs/x/model.ckpt-120"\nall_model_checkpoint_paths: "model.ckpt-100"\n'
    assert rundir.checkpoint_step(text) == 120
    assert rundir.checkpoint_step(None) is None and rundir.checkpoint_step('garbage') is None


class FakeBackend(Backend):
    """Scripted observations per task: None (running), an exit code, or 'down' (host unreachable)."""
    name = 'fake'

    def __init__(self, script: dict[str, object]):
        self.script = script

    def check(self, plans, imports=False):
        return []

    def start(self, plan):
        raise NotImplementedError

    def status(self, record):
        value = self.script[record.name]
        if value == 'down':
            return Observation('unknown', error=f'{record.host}: unreachable: connection refused')
        return Observation('running') if value is None else Observation('ended', value)

    def stop(self, records, grace=0):
        for r in records:
            self.script[r.name] = -15

    def log_record(self, plan):
        raise NotImplementedError

    def read_log(self, record, follow=False, stop=None, offset=0):
        return iter(())

    def read_file(self, record, path):
        return None


def test_observing_over_a_fake_backend_turns_observations_into_states(tmp_path):
    from launch.run.console import Console
    from launch.run.lifecycle import Lifecycle
    from launch.run.supervised import SupervisedRun
    from tests.conftest import write_spec
    from cluster.spec import load_spec
    spec = load_spec(write_spec(tmp_path, workers=3, replicas_to_aggregate=2))
    backend = FakeBackend({'ps:0': None, 'worker:0': None, 'worker:1': -9, 'worker:2': 'down'})
    run = SupervisedRun(spec, '', [], {'fake': backend})
    run.life = Lifecycle(spec, Console(stream=open(tmp_path / 'out', 'w')))
    run.state.records = [TaskRecord(t.name, t.job, t.index, t.host, t.port, 'fake', 100 + i, 'log')
                   for i, t in enumerate(spec.tasks)]
    states = {t.name: (t.state, t.exit_code) for t in run._observe()}
    assert states == {'ps:0': (R, None), 'worker:0': (R, None), 'worker:1': (F, -9), 'worker:2': (U, None)}
    # One lost backup worker is tolerated; the unreachable one is not lost yet.
    decision = decide(run.state.policy, run._observe(), frozenset(), 0, QUIET)
    assert (decision.action, decision.tasks) == (Action.TOLERATE, ('worker:1',))
    backend.script['worker:2'] = None
    assert [t.state for t in run._observe()] == [R, R, F, R]


def test_a_stall_limit_the_progress_lines_cannot_meet_is_refused(tmp_path):
    from cluster.spec import SpecError, load_spec
    from tests.conftest import write_spec
    spec = write_spec(tmp_path, supervise={'stall_secs': 2})
    with pytest.raises(SpecError, match=r'spec.yaml:\d+: supervise.stall_secs: the stall limit \(2s\) must be at '
                                        r'least 3 times train.log_every_secs \(1s\)'):
        load_spec(spec)
    with pytest.raises(SpecError, match=r'--set train.log_every_secs=30: train.log_every_secs: the stall limit'):
        load_spec(write_spec(tmp_path), ['train.log_every_secs=30'])


# -- backoff, the repeat rule, faults during recovery ------------------------------------------

def test_backoff_doubles_with_each_restart_in_a_row_up_to_its_cap():
    pol = Policy(sync=True, num_workers=2, replicas_to_aggregate=2, restart='on-failure',
                 backoff_secs=1.0, backoff_max_secs=30.0)
    assert [policy.backoff_delay(pol, n) for n in range(1, 8)] == [0, 1, 2, 4, 8, 16, 30]
    assert policy.backoff_delay(pol, 10 ** 6) == 30          # no overflow on a very long streak
    off = Policy(sync=True, num_workers=2, replicas_to_aggregate=2, backoff_secs=0)
    assert policy.backoff_delay(off, 5) == 0


def test_the_streak_starts_again_after_a_healthy_period():
    assert policy.next_streak(0, None) == 1
    assert policy.next_streak(3, 5.0) == 4
    assert policy.next_streak(3, policy.HEALTHY_SECS) == 1


def test_the_backoff_grows_in_a_crash_loop_and_starts_again_once_the_training_came_back():
    pol = Policy(sync=True, num_workers=2, replicas_to_aggregate=2, restart='on-failure',
                 backoff_secs=1.0, backoff_max_secs=30.0)
    history = FaultHistory()
    assert [history.backoff(pol) for _ in range(3)] == [0, 1, 2]      # restarts that never trained again: the first at once
    history.trained_again()
    assert [history.backoff(pol) for _ in range(2)] == [0, 1]         # a new fault, seconds later: at once again


RESTART = policy.Decision(Action.RESTART, ('worker:0',), 'worker:0 exited with code 1')


@pytest.mark.parametrize('previous, fault, repeated', [
    (None, ('worker:0', 'OSError: disk full', 30), False),                     # the first fault
    (('worker:0', 'OSError: disk full', 30), ('worker:0', 'OSError: disk full', 30), True),
    (('worker:0', 'OSError: disk full', 30), ('worker:0', 'OSError: disk full', 40), False),   # progress made
    (('worker:0', 'OSError: disk full', 30), ('ps:0', 'OSError: disk full', 30), False),       # another task
    (('worker:0', 'OSError: disk full', 30), ('worker:0', 'ValueError: nan', 30), False),      # another error
    (('worker:0', None, 30), ('worker:0', None, 30), False),       # a kill: from outside, never a repeat
    (('worker:0', 'E: at 0x7f01', None), ('worker:0', 'E: at 0x7f99', None), True),   # addresses differ
])
def test_a_fault_that_repeats_the_last_one_ends_the_run(previous, fault, repeated):
    before = policy.Fault.of(*previous) if previous else None
    decision = policy.escalate(RESTART, before, policy.Fault.of(*fault))
    assert (decision.action is Action.GIVE_UP) == repeated
    if repeated:
        assert 'the same failure as before the last restart' in decision.note


def test_escalate_leaves_other_decisions_alone():
    same = policy.Fault.of('worker:1', 'E', 1)
    tolerate = policy.Decision(Action.TOLERATE, ('worker:1',), 'lost')
    assert policy.escalate(tolerate, same, same) is tolerate


@pytest.mark.parametrize('restart, restarts, code, action', [
    ('on-failure', 1, -9, Action.RESTART),
    ('on-failure', 3, -9, Action.GIVE_UP),                          # none left
    ('never', 0, -9, Action.GIVE_UP),
    ('on-failure', 1, rundir.EXIT_NO_RESTART, Action.GIVE_UP),      # the task said a restart cannot help
])
def test_a_task_lost_during_recovery_is_one_more_fault(restart, restarts, code, action):
    pol = rules(restart=restart, max_restarts=3)
    decision = policy.during_recovery(pol, restarts, 'ps:0', 'ps:0 was killed', code)
    assert decision.action is action and decision.tasks == ('ps:0',)


def test_a_task_frozen_while_the_others_train_on_is_lost_after_stall_secs():
    """Async: a SIGSTOPped chief does not stop the global step (worker:1 trains on), and once
    worker:1 is done nothing would end the run: frozen for stall_secs, it is lost."""
    pol = rules(sync=False, restart='on-failure', stall=10.0)
    chief = TaskStatus('worker:0', 'worker', 0, R, frozen=10.0)
    tasks = [TaskStatus('ps:0', 'ps', 0, R), chief, TaskStatus('worker:1', 'worker', 1, S)]
    decision = decide(pol, tasks, frozenset(), 0, Progress(step=100, total=100, quiet_secs=0.0))
    assert decision.action is Action.RESTART and decision.tasks == ('worker:0',)
    assert 'worker:0 has been stopped (SIGSTOP, or paused) for 10s' in decision.reason
    worker = [TaskStatus('ps:0', 'ps', 0, R), TaskStatus('worker:0', 'worker', 0, R),
              TaskStatus('worker:1', 'worker', 1, R, frozen=12.0)]
    assert decide(pol, worker, frozenset(), 0, QUIET).action is Action.RESTART_TASKS     # it is stopped first
    not_yet = [TaskStatus('ps:0', 'ps', 0, R), TaskStatus('worker:0', 'worker', 0, R, frozen=9.0)]
    assert decide(pol, not_yet, frozenset(), 0, QUIET).action is Action.CONTINUE
    # When the global step stalls, the stall rule speaks (and names the frozen task).
    stalled = decide(pol, not_yet[:1] + [TaskStatus('worker:0', 'worker', 0, R, frozen=30.0)], frozenset(), 0,
                     Progress(step=10, total=100, quiet_secs=31.0))
    assert stalled.stalled and stalled.action is Action.RESTART
