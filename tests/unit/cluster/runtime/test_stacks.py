"""Stack dumps: a task's handler (cluster/runtime/stacks.py), installed in this test's own process
and signalled for real; the launcher's request for them (launch/run/stacks.py) over backends whose
"tasks" are this process and plain files; the words, the event, the report's links and `launch
debug` without a running run. The real-cluster path is in tests/system/launch/run/test_faults.py (a stall of a
stopped worker)."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from cluster.runtime import rundir, stacks
from launch.backends.base import ENDED, RUNNING, Backend, Observation, TaskRecord
from launch.backends.ssh.scripts import TaskProcess, parse_signalled, signal_script
from launch.cli import main
from launch.records import report
from launch.run import stacks as dumps
from tests.conftest import write_spec


@pytest.fixture
def installed():
    """The handler is this process's for the test: back to the signal's default afterwards."""
    yield
    stacks.uninstall()


def attempt_log(train_dir: str, attempt: int, job: str, index: int) -> None:
    """What a launcher leaves before it starts a task: its log_path leading to this attempt's log."""
    target = rundir.attempt_log_path(train_dir, attempt, job, index)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    open(target, 'a').close()
    os.symlink(os.path.relpath(target, rundir.logs_dir(train_dir)), rundir.log_path(train_dir, job, index))


def waiting_in_a_lock(started: threading.Event, release: threading.Event) -> None:
    started.set()
    release.wait(10)


def test_the_signal_appends_every_threads_stack_to_the_tasks_file_of_its_attempt(tmp_path, installed):
    train_dir = str(tmp_path / 'run')
    attempt_log(train_dir, 3, 'worker', 1)
    path = stacks.install(train_dir, 'worker', 1, time.time())
    assert path == os.path.join(train_dir, 'stacks', 'attempt-3', 'worker-1.txt')
    started, release = threading.Event(), threading.Event()
    helper = threading.Thread(target=waiting_in_a_lock, args=(started, release))
    helper.start()
    started.wait(5)
    try:
        os.kill(os.getpid(), rundir.DUMP_SIGNAL)
    finally:
        release.set()
        helper.join()
    with open(path) as f:
        text = f.read()
    first, rest = text.split('\n', 1)
    assert first.startswith(f'# worker:1 (pid {os.getpid()}, attempt 3) started ') and 'kill -USR1' in first
    assert 'in test_the_signal_appends_every_threads_stack_to_the_tasks_file_of_its_attempt' in rest
    assert 'in waiting_in_a_lock' in rest, rest         # every thread, not only the one signalled
    assert rest.count('(most recent call first)') >= 2


def test_the_dump_never_reaches_a_wakeup_fd(tmp_path, installed):
    """The chief's GracefulStop reads any signal number from the wakeup fd as "save and stop":
    a dump must not write one."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    old = signal.set_wakeup_fd(write)
    try:
        stacks.install(str(tmp_path / 'run'), 'worker', 0, time.time())
        os.kill(os.getpid(), rundir.DUMP_SIGNAL)
        with pytest.raises(BlockingIOError):
            os.read(read, 16)
    finally:
        signal.set_wakeup_fd(old)
        os.close(read)
        os.close(write)
    assert signal.getsignal(rundir.DUMP_SIGNAL) == signal.SIG_DFL     # no Python-level handler


def test_a_task_without_a_launchers_log_keeps_its_stacks_straight_under_stacks(tmp_path, installed):
    train_dir = str(tmp_path / 'run')
    assert rundir.log_attempt(train_dir, 'ps', 0) is None
    os.makedirs(rundir.logs_dir(train_dir))
    open(rundir.log_path(train_dir, 'ps', 0), 'w').close()      # a plain file: no attempt
    assert rundir.log_attempt(train_dir, 'ps', 0) is None
    assert stacks.install(train_dir, 'ps', 0, time.time()) == os.path.join(train_dir, 'stacks', 'ps-0.txt')


def test_a_train_dir_that_cannot_be_written_sends_the_dumps_to_the_log(tmp_path, installed, caplog):
    blocked = tmp_path / 'run'
    blocked.write_text('a file where the train_dir should be')
    assert stacks.install(str(blocked), 'worker', 0, time.time()) is None
    assert 'stack dumps go to this log' in caplog.text


# -- the launcher's side -------------------------------------------------------------------------------
class FilesBackend(Backend):
    """Tasks whose host is a directory (`root`, their working directory), seen through files only:
    `answers` says what a signal does to each task ('dump': this process's real handler writes,
    'nothing': a task that never answers); `stopped` tasks say so."""
    name = 'files'

    def __init__(self, root, answers, stopped=(), ended=()):
        self.root, self.answers, self.stopped, self.ended = root, answers, set(stopped), set(ended)
        self.signalled: list[str] = []

    def check(self, plans, imports=False):
        return []

    def start(self, plan):
        raise NotImplementedError

    def status(self, record):
        if record.name in self.ended:
            return Observation(ENDED, 0)
        return Observation(RUNNING, stopped='is stopped (SIGSTOP, or a debugger)' if record.name in self.stopped
                           else None)

    def stop(self, records, grace=0):
        raise NotImplementedError

    def log_record(self, plan):
        raise NotImplementedError

    def read_log(self, record, follow=False, stop=None, offset=0):
        return iter(())

    def read_file(self, record, path):
        return rundir.read_text(os.path.join(self.root, path))

    def send_signal(self, records, signum):
        assert signum == rundir.DUMP_SIGNAL
        for r in records:
            self.signalled.append(r.name)
            if self.answers.get(r.name) == 'dump':
                os.kill(os.getpid(), signum)
        return {r.name: None for r in records}


def record(name: str) -> TaskRecord:
    job, index = rundir.parse_task_name(name)
    return TaskRecord(name, job, index, 'node1', 2222 + index, 'files', 4000 + index, 'log')


def test_a_remote_tasks_stacks_are_copied_here_and_the_silent_are_named(tmp_path, monkeypatch, installed):
    """worker:0 answers (this process, for real) on a "host" whose train_dir is elsewhere; ps:0 is
    stopped, worker:1 has no file yet (still starting: never signalled, the signal would end it),
    worker:2 has ended. Only the stopped and the answering are signalled, and nothing is waited for
    beyond worker:0's answer."""
    remote, here = tmp_path / 'remote', tmp_path / 'here'
    here.mkdir()
    monkeypatch.chdir(here)
    attempt_log(str(remote / 'run'), 2, 'worker', 0)
    stacks.install(str(remote / 'run'), 'worker', 0, time.time())
    ps_file = remote / 'run' / 'stacks' / 'attempt-2' / 'ps-0.txt'
    ps_file.write_text('# ps:0 (pid 1, attempt 2) started ...\n')
    backend = FilesBackend(str(remote), {'worker:0': 'dump'}, stopped={'ps:0'}, ended={'worker:2'})
    records = [record(n) for n in ('ps:0', 'worker:0', 'worker:1', 'worker:2')]
    t0 = time.monotonic()
    found = dumps.dump(records, {'files': backend}, 'run', 2, wait=5)
    assert time.monotonic() - t0 < 2
    assert backend.signalled == ['ps:0', 'worker:0']
    assert found.written == ('worker:0',)
    assert dict(found.silent) == {'ps:0': 'is stopped (SIGSTOP, or a debugger)',
                                  'worker:1': 'has no stacks file yet (it is starting, or cannot write to its '
                                              'train_dir)',
                                  'worker:2': 'has ended'}
    assert found.words() == 'stacks of worker:0 in run/stacks/attempt-2 (ps:0, worker:1, worker:2 did not answer)'
    assert found.relative('run') == os.path.join('stacks', 'attempt-2')
    copied = here / 'run' / 'stacks' / 'attempt-2' / 'worker-0.txt'
    assert 'in test_a_remote_tasks_stacks_are_copied_here' in copied.read_text()
    assert not (here / 'run' / 'stacks' / 'attempt-2' / 'ps-0.txt').exists()
    assert found.lines()[0] == f'worker:0: {os.path.join("run", "stacks", "attempt-2", "worker-0.txt")}'
    dumps.dump(records[1:2], {'files': backend}, 'run', 2)        # a second dump: added to the copy
    assert copied.read_text() == (remote / 'run' / 'stacks' / 'attempt-2' / 'worker-0.txt').read_text()
    assert copied.read_text().count('in test_a_remote_tasks_stacks_are_copied_here') == 2


def test_a_task_on_this_machine_keeps_its_own_file(tmp_path, installed):
    """Where the task's file is the one here, it is never replaced (the task writes on through
    the file it opened at its start)."""
    train_dir = str(tmp_path / 'run')
    stacks.install(train_dir, 'worker', 0, time.time())
    path = rundir.stacks_path(train_dir, None, 'worker', 0)
    inode = os.stat(path).st_ino
    backend = FilesBackend('/', {'worker:0': 'dump'})
    found = dumps.dump([record('worker:0')], {'files': backend}, os.path.abspath(train_dir), None)
    assert found.written == ('worker:0',) and os.stat(path).st_ino == inode
    os.kill(os.getpid(), rundir.DUMP_SIGNAL)            # the task's own handle still writes to it
    with open(path) as f:
        assert f.read().count('(most recent call first)') >= 2


def test_a_task_that_does_not_answer_is_waited_for_briefly_and_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / 'host'
    (root / 'run' / 'stacks' / 'attempt-1').mkdir(parents=True)
    (root / 'run' / 'stacks' / 'attempt-1' / 'worker-1.txt').write_text('# header\n')
    backend = FilesBackend(str(root), {'worker:1': 'nothing'})
    t0 = time.monotonic()
    found = dumps.dump([record('worker:1')], {'files': backend}, 'run', 1, wait=0.3)
    assert 0.3 <= time.monotonic() - t0 < 2
    assert backend.signalled == ['worker:1'] and not (tmp_path / 'run').exists()
    assert found.written == () and found.words() == 'no task wrote its stacks (worker:1 did not answer)'
    assert found.lines() == ['worker:1: no stacks: it did not answer within 0.3s']


def test_the_ssh_script_signals_each_tasks_own_process_only_while_it_is_the_task():
    script = signal_script([('worker:1', TaskProcess(4242, '987', 4240, '986'))], 'USR1')
    assert 'kill -s USR1 4242 ' in script and '-4240' not in script and ' 4240' not in script
    assert '/proc/4242/stat' in script and "= 987 ]" in script
    assert parse_signalled('noise\ntfcluster-signalled worker:1\n') == {'worker:1'}


# -- what the launcher tells -------------------------------------------------------------------------
def test_the_report_links_the_dumps_and_leaves_out_files_without_one(tmp_path):
    train_dir = tmp_path / 'run'
    folder = train_dir / 'stacks' / 'attempt-2'
    folder.mkdir(parents=True)
    (folder / 'worker-0.txt').write_text('# worker:0 ...\nThread 0x00007f (most recent call first):\n'
                                         '  File "/src/cluster/training/train.py", line 9 in run_worker\n')
    (folder / 'ps-0.txt').write_text('# ps:0 ...\n')
    stall = {'time': '2026-11-23T12:00:40.000+00:00', 'run': 'r', 'attempt': 2, 'event': 'stall',
             'tasks': ['worker:1'], 'cause': 'no new global step for 6s', 'stacks': 'stacks/attempt-2',
             'no_stacks': ['ps:0']}
    (train_dir / 'events.jsonl').write_text(json.dumps(stall) + '\n')
    page = report.render(str(train_dir))
    assert '<h2>Stack dumps</h2>' in page
    assert '<a href="stacks/attempt-2/worker-0.txt">stacks/attempt-2/worker-0.txt</a>' in page
    assert 'ps-0.txt' not in page and 'stacks/attempt-2.</p>' in page
    elsewhere = report.render(str(train_dir), str(tmp_path / 'pages'))
    assert 'href="../run/stacks/attempt-2/worker-0.txt"' in elsewhere


def test_debug_of_a_run_that_is_not_running_is_one_line_exit_2(tmp_path, capsys):
    spec = write_spec(tmp_path)
    assert main(['debug', spec]) == 2
    out, err = capsys.readouterr()
    assert out == '' and err.count('\n') == 1
    assert err.startswith(f'launch: error: {spec}: no run of it is running'), err
    assert not os.path.exists(tmp_path / 'run')
    assert main(['debug', spec, '--backend', 'slurm']) == 2
    assert 'kill -USR1 PID' in capsys.readouterr().err
