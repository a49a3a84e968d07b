"""A coordinator run's supervision (TF2 ParameterServerStrategy) as a table: PSS's own recovery
rules, pure and in milliseconds. tests/system/cluster/test_coordinator.py checks on real clusters that they are
carried out."""
from __future__ import annotations

import pytest

from cluster.runtime.rundir import EXIT_NO_RESTART
from launch.run.policy import Action, Policy, Progress, TaskState, TaskStatus, decide, evaluator_only

R, S, F, U = TaskState.RUNNING, TaskState.SUCCEEDED, TaskState.FAILED, TaskState.UNKNOWN
QUIET = Progress(step=10, total=100, quiet_secs=1.0)
STALLED = Progress(step=10, total=100, quiet_secs=61.0)
NAMES = ('chief:0', 'ps:0', 'worker:0', 'worker:1', 'evaluator:0')


def tasks(chief=R, ps=R, w0=R, w1=R, ev=R, code=-9, since=0.0):
    """The five tasks of a coordinator run, each in its state (a failed one killed by `code`)."""
    out = []
    for name, state in zip(NAMES, (chief, ps, w0, w1, ev)):
        if state is None:
            continue
        job, index = name.split(':')
        out.append(TaskStatus(name, job, int(index), state, exit_code=code if state is F else 0 if state is S else None,
                              since=since if state is U else 0.0))
    return out


def policy(restart='on-failure', max_restarts=3):
    return Policy(sync=False, num_workers=2, replicas_to_aggregate=2, restart=restart, max_restarts=max_restarts,
                  stall_secs=60.0, unreachable_secs=30.0, coordinator=True)


@pytest.mark.parametrize('name, pol, seen, tolerated, restarts, progress, action, about', [
    ('all running', policy(), tasks(), (), 0, QUIET, Action.CONTINUE, ()),
    ('a worker lost: it alone again, the chief trains on', policy(), tasks(w1=F), (), 0, QUIET,
     Action.RESTART_TASKS, ('worker:1',)),
    ('worker 0 is no chief here', policy(), tasks(w0=F), (), 0, QUIET, Action.RESTART_TASKS, ('worker:0',)),
    ('a worker lost, no restarts: let go', policy(restart='never'), tasks(w1=F), (), 0, QUIET,
     Action.TOLERATE, ('worker:1',)),
    ('a worker lost, restarts used up: let go', policy(max_restarts=1), tasks(w1=F), (), 1, QUIET,
     Action.TOLERATE, ('worker:1',)),
    ('a worker unreachable: let go (a start there would fail)', policy(), tasks(w1=U, since=31), (), 0, QUIET,
     Action.TOLERATE, ('worker:1',)),
    ('the ps lost: the ps and the chief again', policy(), tasks(ps=F), (), 0, QUIET,
     Action.RESTART_TASKS, ('ps:0', 'chief:0')),
    ('the ps lost and the chief failed with it: the same two', policy(), tasks(chief=F, ps=F, code=1), (), 0, QUIET,
     Action.RESTART_TASKS, ('ps:0', 'chief:0')),
    ('the ps lost, no restarts: give up', policy(restart='never'), tasks(ps=F), (), 0, QUIET,
     Action.GIVE_UP, ('ps:0', 'chief:0')),
    ('the chief lost: it alone again', policy(), tasks(chief=F), (), 0, QUIET, Action.RESTART_TASKS, ('chief:0',)),
    ('the chief says no restart can help', policy(), tasks(chief=F, code=EXIT_NO_RESTART), (), 0, QUIET,
     Action.GIVE_UP, ('chief:0',)),
    ('the chief unreachable: give up (its host is gone)', policy(), tasks(chief=U, since=31), (), 0, QUIET,
     Action.GIVE_UP, ('chief:0',)),
    ('the evaluator lost: it alone again', policy(), tasks(ev=F), (), 0, QUIET,
     Action.RESTART_TASKS, ('evaluator:0',)),
    ('the evaluator lost, no restarts: training goes on', policy(restart='never'), tasks(ev=F), (), 0, QUIET,
     Action.TOLERATE, ('evaluator:0',)),
    ('a worker already let go: not again', policy(restart='never'), tasks(w1=F), {'worker:1'}, 0, QUIET,
     Action.CONTINUE, ()),
    ('the chief done, the evaluator still at it: wait', policy(), tasks(chief=S), (), 0, QUIET,
     Action.CONTINUE, ()),
    ('the chief and the evaluator done: stop the servers', policy(), tasks(chief=S, ev=S), (), 0, QUIET,
     Action.FINISH, ('ps:0', 'worker:0', 'worker:1')),
    ('the chief done, no evaluator: stop the servers', policy(), tasks(chief=S, ev=None), (), 0, QUIET,
     Action.FINISH, ('ps:0', 'worker:0', 'worker:1')),
    ('the chief done, the evaluator let go: stop the rest', policy(restart='never'), tasks(chief=S, ev=F),
     {'evaluator:0'}, 0, QUIET, Action.FINISH, ('ps:0', 'worker:0', 'worker:1', 'evaluator:0')),
    ('the last checkpoint saved, the chief still ending: its servers wait for it', policy(),
     tasks(ev=S), (), 0, Progress(step=100, total=100, quiet_secs=1.0, saved=100), Action.CONTINUE, ()),
    ('the last checkpoint saved, the evaluator still at it: wait', policy(), tasks(), (), 0,
     Progress(step=100, total=100, quiet_secs=1.0, saved=100), Action.CONTINUE, ()),
    ('a checkpoint short of the last: go on', policy(), tasks(ev=S), (), 0,
     Progress(step=100, total=100, quiet_secs=1.0, saved=90), Action.CONTINUE, ()),
    ('no new step: restart the cluster from its checkpoint', policy(), tasks(), (), 0, STALLED,
     Action.RESTART, ('chief:0',)),
    ('no new step, no restarts: give up', policy(restart='never'), tasks(), (), 0, STALLED,
     Action.GIVE_UP, ('chief:0',)),
    ('a command prints no progress: never stalled', policy(), tasks(), (), 0,
     Progress(step=None, total=100, quiet_secs=1e6), Action.CONTINUE, ()),
])
def test_coordinator_decision(name, pol, seen, tolerated, restarts, progress, action, about):
    d = decide(pol, seen, frozenset(tolerated), restarts, progress)
    assert (d.action, d.tasks) == (action, about), (name, d)
    if action is not Action.CONTINUE and action is not Action.FINISH:
        assert d.reason, name


def test_the_likely_cause_is_named_first():
    """The ps and the chief lost together: the ps first (the chief most often only lost its peer)."""
    d = decide(policy(), tasks(chief=F, ps=F), frozenset(), 0, QUIET)
    assert d.reason.startswith('ps:0 was killed by SIGKILL') and 'then chief:0' in d.reason
    assert 'resumes from its checkpoint' in d.reason


FULL = 'the disk under /runs/r is full: No space left on device (ENOSPC)'
ON_FULL_DISK = Progress(step=10, total=100, quiet_secs=1.0, disk=FULL)


@pytest.mark.parametrize('name, seen, action, about', [
    ('the chief lost: not started again into the full disk', tasks(chief=F, code=1), Action.GIVE_UP, ('chief:0',)),
    ('the ps lost: neither it nor the chief again', tasks(ps=F), Action.GIVE_UP, ('ps:0', 'chief:0')),
    ('a worker lost: it alone again (it writes no checkpoint)', tasks(w1=F), Action.RESTART_TASKS, ('worker:1',)),
])
def test_a_coordinator_run_on_a_full_disk(name, seen, action, about):
    """Issue 37 #2: the full-disk rule of the TF1 path (no cluster restart) holds for PSS's task
    restarts too: a chief started again on a full disk fails at its next checkpoint."""
    d = decide(policy(), seen, frozenset(), 0, ON_FULL_DISK)
    assert (d.action, d.tasks, d.disk) == (action, about, FULL), (name, d)
    if action is Action.GIVE_UP:
        assert d.note.startswith('no restart while the disk is full') and 'resumes' not in d.reason, d
    d = decide(policy(restart='never'), seen, frozenset(), 0, ON_FULL_DISK)     # no restart was possible: no note
    assert d.note == '' and d.disk == FULL, d


def test_the_evaluator_restarts_on_its_own_budget_and_never_ends_the_training():
    """Issue 37 #4: the evaluator's restarts are its own: the run's spent do not stop it, its own
    spent let it go (never giving up the run), and the run's are never asked for."""
    spent = decide(policy(max_restarts=1), tasks(ev=F, code=1), frozenset(), 1, QUIET, evaluator_restarts=0)
    assert (spent.action, spent.tasks) == (Action.RESTART_TASKS, ('evaluator:0',)), spent
    own_spent = decide(policy(max_restarts=3), tasks(ev=F, code=1), frozenset(), 0, QUIET, evaluator_restarts=3)
    assert (own_spent.action, own_spent.tasks) == (Action.TOLERATE, ('evaluator:0',)), own_spent
    assert own_spent.note == 'its own 3 restart(s) are spent (supervise.max_restarts)'
    for code in (1, EXIT_NO_RESTART):
        assert decide(policy(), tasks(ev=F, code=code), frozenset(), 3, QUIET, evaluator_restarts=3).action \
            is Action.TOLERATE
    assert decide(policy(restart='never'), tasks(ev=F), frozenset(), 0, QUIET).action is Action.TOLERATE
    # Lost with a worker: the worker is decided on (on the run's restarts), the evaluator the round after.
    both = decide(policy(), tasks(w1=F, ev=F), frozenset(), 0, QUIET)
    assert (both.action, both.tasks) == (Action.RESTART_TASKS, ('worker:1',)) and 'evaluator' not in both.reason
    assert evaluator_only(spent) and not evaluator_only(both)
