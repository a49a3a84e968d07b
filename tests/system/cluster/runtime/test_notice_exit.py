"""A real process with the task's signal handling (cluster/runtime/notice.py) and no TensorFlow,
signalled for real: the launcher's marked SIGTERM still kills it (-15, as before notices existed);
an unmarked one is a preemption notice, said at once, and the process exits EXIT_PREEMPTED by its
deadline, or at once when the launcher's marked stop follows. Slow only because it starts
processes (the fast tier may not); each case takes about a second."""
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

# worker:1 with no role (a ps or a non-chief worker): a stop kills it, a notice leaves it running
# until its deadline or the launcher's marked stop.
CHILD = '''
import logging, sys, threading
from cluster.runtime import notice
logging.basicConfig(level=logging.INFO, format='%(message)s', stream=sys.stdout)
notice.install('worker:1', sys.argv[1], 'worker', 1, float(sys.argv[2]))
print('ready', flush=True)
threading.Event().wait()
'''


def start(train_dir: str, grace: float) -> subprocess.Popen:
    return start_child(CHILD, train_dir, str(grace))


@pytest.mark.parametrize('which', ['own', 'all'])
def test_the_launchers_marked_sigterm_kills_as_before(tmp_path, which):
    train_dir = str(tmp_path / 'run')
    proc = start(train_dir, 30)
    mark = rundir.stop_mark_path(train_dir, 'worker', 1) if which == 'own' else rundir.stop_all_path(train_dir)
    open(mark, 'w').close()
    proc.send_signal(signal.SIGTERM)
    code, out = ended(proc)
    assert code == -signal.SIGTERM and 'preemption' not in out, out


def test_with_no_grace_every_sigterm_kills_as_before(tmp_path):
    proc = start(str(tmp_path / 'run'), 0)
    proc.send_signal(signal.SIGTERM)
    code, out = ended(proc)
    assert code == -signal.SIGTERM and 'preemption' not in out, out


def test_an_unmarked_sigterm_is_a_notice_and_the_task_goes_preempted_by_its_deadline(tmp_path):
    proc = start(str(tmp_path / 'run'), 3)
    proc.send_signal(signal.SIGTERM)
    code, out = ended(proc)
    assert 'worker:1: preemption notice (SIGTERM from outside the launcher): 3s to save and go' in out, out
    assert 'the preemption grace is ending; exiting' in out, out
    assert code == EXIT_PREEMPTED, out


def test_the_launchers_stop_after_a_notice_ends_it_at_once_preempted(tmp_path):
    train_dir = str(tmp_path / 'run')
    proc = start(train_dir, 600)        # a deadline far beyond the test's wait
    proc.send_signal(signal.SIGTERM)
    read_until(proc, 'preemption notice', timeout=60)
    open(rundir.stop_mark_path(train_dir, 'worker', 1), 'w').close()
    proc.send_signal(signal.SIGTERM)
    code, out = ended(proc)
    assert code == EXIT_PREEMPTED and 'stopped after the preemption notice' in out, out
