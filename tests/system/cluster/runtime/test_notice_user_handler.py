"""A user's own SIGTERM handler beside the task's signal handling (cluster/runtime/notice.py, plan C.3.1),
in a real process with no TensorFlow, signalled for real. The task installs its handling first (task.main,
before the import); a `train.program` that then calls signal.signal(SIGTERM, h) replaces only the
Python-level handler: the signal still reaches the notice thread through the wakeup fd, so a notice is
still said and acted on, and h is called too; the launcher's marked SIGTERM still ends the task (-15).
A handler that was there before the task's (a sitecustomize's) is chained: called on every SIGTERM.
A program that sets SIG_DFL makes a notice a plain death by SIGTERM (a fault), as docs/preemption.md
says. Slow only because it starts processes."""
from __future__ import annotations

import signal
import subprocess

import pytest

from cluster.runtime import rundir
from cluster.runtime.contract import EXIT_PREEMPTED
from tests.conftest import read_until
from tests.harness.notice_child import ended
from tests.harness.notice_child import start as start_child

pytestmark = pytest.mark.slow

# worker:1 with no role of its own (a ps, a non-chief worker); argv: train_dir, grace, and where the
# user's handler goes: 'after' the task's install (a train.program's), 'before' it, or 'default'
# (the program puts SIG_DFL back). The main thread sleeps in short steps, as a training loop does.
CHILD = '''
import logging, signal, sys, time
from cluster.runtime import notice
logging.basicConfig(level=logging.INFO, format='%(message)s', stream=sys.stdout)
def users(signum, frame):
    print(f'user handler: signal {signum}', flush=True)
where = sys.argv[3]
if where == 'before':
    signal.signal(signal.SIGTERM, users)
notice.install('worker:1', sys.argv[1], 'worker', 1, float(sys.argv[2]))
if where == 'after':
    signal.signal(signal.SIGTERM, users)
elif where == 'default':
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
print('ready', flush=True)
while True:
    time.sleep(0.05)
'''
NOTICE = 'worker:1: preemption notice (SIGTERM from outside the launcher)'


def start(train_dir: str, grace: float, where: str) -> subprocess.Popen:
    return start_child(CHILD, train_dir, str(grace), where)


@pytest.mark.parametrize('where', ['after', 'before'])
def test_a_notice_still_works_and_the_users_handler_is_called_too(tmp_path, where):
    train_dir = str(tmp_path / 'run')
    proc = start(train_dir, 600, where)     # a deadline far beyond the test's wait: the stop below ends it
    proc.send_signal(signal.SIGTERM)
    seen = ''.join(read_until(proc, NOTICE, timeout=60))
    if 'user handler' not in seen:
        seen += ''.join(read_until(proc, 'user handler', timeout=60))
    assert f'user handler: signal {int(signal.SIGTERM)}' in seen, seen
    open(rundir.stop_mark_path(train_dir, 'worker', 1), 'w').close()
    proc.send_signal(signal.SIGTERM)        # the launcher's marked stop, after the notice
    code, out = ended(proc)
    assert code == EXIT_PREEMPTED and 'stopped after the preemption notice' in out, seen + out


@pytest.mark.parametrize('where', ['after', 'before'])
def test_the_launchers_marked_sigterm_still_ends_a_task_with_a_users_handler(tmp_path, where):
    train_dir = str(tmp_path / 'run')
    proc = start(train_dir, 30, where)
    open(rundir.stop_mark_path(train_dir, 'worker', 1), 'w').close()
    proc.send_signal(signal.SIGTERM)
    code, out = ended(proc)
    assert code == -signal.SIGTERM and 'preemption' not in out, out


def test_a_program_that_puts_the_default_back_dies_of_a_notice_as_of_a_fault(tmp_path):
    proc = start(str(tmp_path / 'run'), 30, 'default')
    proc.send_signal(signal.SIGTERM)
    code, out = ended(proc)
    assert code == -signal.SIGTERM and 'preemption' not in out, out
