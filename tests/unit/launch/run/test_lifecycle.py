"""The run lifecycle and the supervised strategy over a scripted backend: tolerate, restart, stall,
give up and Ctrl-C, each carried out end to end in well under a second, with no process started.
The real-cluster tests (tests/system/launch/run/test_faults.py, tests/system/launch/run/test_races.py) check the same paths on
TensorFlow servers; these pin down the decisions' consequences: what is stopped, restarted and
reported, and the RunResult."""
from __future__ import annotations

import io
import json
import math
import os
import signal
import threading
import time

import pytest

from cluster.runtime import rundir
from cluster.spec import load_spec
from launch.run.supervised import loop as supervised
from launch.backends.base import ENDED, RUNNING, Observation, TaskRecord
from launch.run.console import Console
from launch.run.lifecycle import Lifecycle, resume_hint
from launch.records.result import steps_note
from launch.planning.plan import plan_cluster
from launch.backends.ssh import SSHBackend, SSHError
from launch.run.supervised import SupervisedRun
from tests.conftest import write_spec
from tests.harness.lifecycle import DONE, NOW, ScriptedBackend, step


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setattr(supervised, 'SUPERVISE_SECS', 0.01)


def run(tmp_path, backend, workers=2, sync=True, supervise=None, interrupt_after=None, live=None, **train):
    """`live`: the workers started of the pool of `workers` (`launch up --workers`)."""
    train.setdefault('steps', 100)       # as the scripted progress lines count (step())
    spec = load_spec(write_spec(tmp_path, workers=workers, sync=sync, supervise=supervise, **train))
    plans = [p.__class__(**{**p.__dict__, 'backend': backend.name}) for p in plan_cluster(spec)]
    out = io.StringIO()
    life = Lifecycle(spec, Console(stream=out), report=False)     # the report has tests of its own
    strategy = SupervisedRun(spec, '', plans, {backend.name: backend}, start_timeout=5, finish_timeout=5,
                             workers=live)
    timers = []
    for after in interrupt_after or ():
        timers.append(threading.Timer(after, os.kill, (os.getpid(), signal.SIGINT)))
        timers[-1].start()
    t0 = time.monotonic()
    try:
        result = life.up(strategy)
    finally:
        for t in timers:
            t.cancel()
    return result, out.getvalue(), time.monotonic() - t0


def test_a_run_where_every_task_finishes_is_done(tmp_path):
    backend = ScriptedBackend({'ps:0': {'*': [(0.6, 'exit', 0)]}, 'worker:0': {'*': DONE}, 'worker:1': {'*': DONE}})
    result, out, seconds = run(tmp_path, backend)
    assert (result.state, result.exit_code, result.restarts, result.failures) == ('done', 0, 0, []), out
    assert (result.global_step, result.images_per_sec, result.loss) == (100, 100.0, 1.5)
    assert out.rstrip().splitlines()[-1].endswith(': global step 100, 100 images/s in all, final loss 1.500'), out
    assert seconds < 3


class DivergedBackend(ScriptedBackend):
    """Workers whose closing figures an older worker wrote: a diverged loss as NaN (not JSON), an
    infinite rate; and a foreign file's step of words."""

    def read_file(self, record, path):
        for i, step in ((0, 100), (1, 'many')):     # noqa: F402 (a local step, not the helper)
            if path == rundir.result_path(os.path.dirname(path), i):
                return json.dumps({'task': f'worker:{i}', 'global_step': step, 'loss': float('nan'),
                                   'images_per_sec': float('inf')})
        return super().read_file(record, path)


def test_a_diverged_loss_is_said_and_written_null_never_nan(tmp_path):
    backend = DivergedBackend({'ps:0': {'*': [(0.6, 'exit', 0)]}, 'worker:0': {'*': DONE}, 'worker:1': {'*': DONE}})
    result, out, _ = run(tmp_path, backend)
    assert (result.state, result.global_step) == ('done', 100) and math.isnan(result.loss), out
    assert 'final loss nan' in out.rstrip().splitlines()[-1], out

    def strict(text):       # RFC 8259: NaN and Infinity are errors (JavaScript's JSON.parse, jq)
        return json.loads(text, parse_constant=lambda name: pytest.fail(f'{name} written'))
    train_dir = str(tmp_path / 'run')
    with open(rundir.run_path(train_dir)) as f:
        written = strict(f.read())
    assert (written['loss'], written['images_per_sec'], written['global_step']) == (None, None, 100)
    with open(rundir.events_path(train_dir)) as f:
        assert [strict(line)['result']['loss'] for line in f if '"finished"' in line] == [None]


class OvershotBackend(ScriptedBackend):
    """An async run's end: the chief (worker:0) stopped at step 108 and saved there; worker:1 still
    pushed updates until it saw step 115."""

    def read_file(self, record, path):
        ended = 'worker:0' in self.starts and \
            self.status(TaskRecord('worker:0', 'worker', 0, '', 0, self.name, 0, '')).state == ENDED
        if path.endswith(rundir.CHECKPOINT_INDEX):
            return 'model_checkpoint_path: "model.ckpt-108"\n' if ended else None
        for i, step in ((0, 108), (1, 115)):     # noqa: F402 (a local step, not the helper)
            if path == rundir.result_path(os.path.dirname(path), i):
                return json.dumps({'task': f'worker:{i}', 'global_step': step, 'loss': 1.5, 'images_per_sec': 50.0})
        return super().read_file(record, path)


def test_the_closing_line_says_the_steps_asked_reached_and_saved_where_they_differ(tmp_path):
    """An async run goes past train.steps and its last checkpoint is older than the step reached:
    the closing line says all three, so nobody takes 115 for what a resumed run starts from."""
    script = {'ps:0': {'*': [(0.6, 'exit', 0)]}, 'worker:0': {'*': DONE}, 'worker:1': {'*': DONE}}
    result, out, _ = run(tmp_path, OvershotBackend(script), sync=False)
    assert (result.state, result.global_step) == ('done', 115), out
    assert out.rstrip().splitlines()[-1].endswith(
        ': global step 115 (100 asked; last checkpoint at step 108), 100 images/s in all, final loss 1.500'), out


@pytest.mark.parametrize('reached, asked, saved, note', [
    (100, 100, 100, ''),                                            # sync: all agree
    (100, 100, None, ''),                                           # no checkpoint in the train_dir
    (115, 100, 108, ' (100 asked; last checkpoint at step 108)'),   # async: past the goal, saved before
    (115, 100, 115, ' (100 asked)'),
    (100, 100, 90, ' (last checkpoint at step 90)'),
    (60, 100, None, ' (100 asked)'),                                # a user's command stopped early
])
def test_steps_note_names_what_differs_from_the_step_reached(reached, asked, saved, note):
    assert steps_note(reached, asked, saved) == note


def test_a_finished_run_started_again_starts_nothing_and_keeps_its_result(tmp_path):
    """`launch up` once more of a run whose checkpoint is at train.steps: no task starts (the
    chief would train 0 steps and overwrite the result with 0 images/s), one line says where the
    run stands and how to train on, exit 0, and run.json and events.jsonl stay byte for byte."""
    backend = ScriptedBackend({'ps:0': {1: [(0.6, 'exit', 0)]}, 'worker:0': {1: DONE}, 'worker:1': {1: DONE}})
    first, _, _ = run(tmp_path, backend)
    assert first.exit_code == 0
    train_dir = str(tmp_path / 'run')
    kept = {path: open(path, 'rb').read() for path in (rundir.run_path(train_dir), rundir.events_path(train_dir))}
    run_id = json.loads(kept[rundir.run_path(train_dir)])['id']
    backend.checkpoint_step = 100       # the chief's final checkpoint
    starts = {name: len(times) for name, times in backend.starts.items()}
    again, out, _ = run(tmp_path, backend)
    assert (again.state, again.exit_code, again.global_step) == ('done', 0, 100), out
    assert {name: len(times) for name, times in backend.starts.items()} == starts
    assert out == (f'[launch]   run {run_id} is already at step 100 of 100 (train.steps): nothing started, its '
                   f'result kept; to train on, raise train.steps, e.g. `launch up {tmp_path / "spec.yaml"} --set '
                   'train.steps=200`\n'), out
    assert {path: open(path, 'rb').read() for path in kept} == kept


def test_a_lost_backup_worker_is_tolerated_and_named_at_the_end(tmp_path):
    backend = ScriptedBackend({'ps:0': {'*': []}, 'worker:0': {'*': DONE}, 'worker:1': {'*': DONE},
                               'worker:2': {'*': [(0.3, 'exit', 1)]}})
    result, out, _ = run(tmp_path, backend, workers=3, sync=False)
    assert (result.state, result.exit_code) == ('done', 0), out
    assert 'worker:2 exited with code 1; training goes on with 2 worker(s)' in out
    assert 'every worker is done; stopping ps:0' in out          # it would wait for worker:2's report
    assert [f.task for f in result.failures] == ['worker:2']
    assert out.rstrip().endswith('(lost worker:2)'), out
    assert backend.stopped['ps:0'] == -signal.SIGTERM


def test_a_lost_ps_restarts_the_whole_cluster_from_its_checkpoint(tmp_path):
    backend = ScriptedBackend({'ps:0': {1: [(0.4, 'exit', -9)], 2: [(0.6, 'exit', 0)]},
                               'worker:0': {1: [(0.3, *step(40))], 2: DONE},
                               'worker:1': {1: [], 2: DONE}}, checkpoint_step=40)
    result, out, _ = run(tmp_path, backend, supervise={'restart': 'on-failure', 'max_restarts': 2})
    assert (result.state, result.exit_code, result.restarts) == ('done', 0, 1), out
    assert 'restart 1/2: ps:0 was killed by SIGKILL; stopping every task' in out
    assert 'restart 1/2: resuming from the checkpoint at global step 40' in out
    assert {name: len(times) for name, times in backend.starts.items()} == {'ps:0': 2, 'worker:0': 2, 'worker:1': 2}
    assert out.rstrip().endswith('(1 restart(s))'), out


def test_restarts_run_out_and_the_run_gives_up_naming_the_task(tmp_path):
    backend = ScriptedBackend({'ps:0': {'*': [(0.3, 'exit', -9)]}, 'worker:0': {'*': []}, 'worker:1': {'*': []}},
                              checkpoint_step=12)
    result, out, _ = run(tmp_path, backend, supervise={'restart': 'on-failure', 'max_restarts': 1})
    assert (result.state, result.exit_code, result.restarts) == ('failed', 1, 1), out
    last = [line for line in out.splitlines() if 'error:' in line][-1]
    assert 'ps:0 (pid ' in last and 'was killed by SIGKILL' in last, last
    assert '1 restart(s) made, the most supervise.max_restarts allows' in last
    assert last.endswith(resume_hint(12)), last
    assert [(f.task, f.pid is not None) for f in result.failures] == [('ps:0', True)]
    assert all(code == -signal.SIGTERM for name, code in backend.stopped.items() if name != 'ps:0')


def test_a_stall_is_explained_and_ends_the_run(tmp_path):
    stuck = [(0.3, *step(5))]
    backend = ScriptedBackend({'ps:0': {'*': []}, 'worker:0': {'*': stuck}, 'worker:1': {'*': stuck}})
    result, out, seconds = run(tmp_path, backend, supervise={'stall_secs': 0.4}, log_every_secs=0.1,
                               steps=100)
    assert (result.state, result.exit_code) == ('failed', 1), out
    assert 'stall: no new global step for' in out and '(stuck at 5/100)' in out, out
    assert 'every task answers on its port, so none is frozen' in out, out
    assert resume_hint(None) in out
    assert seconds < 5


def test_ctrl_c_stops_every_task(tmp_path):
    backend = ScriptedBackend({'ps:0': {'*': []}, 'worker:0': {'*': []}, 'worker:1': {'*': []}})
    result, out, _ = run(tmp_path, backend, interrupt_after=(0.3,))
    assert (result.state, result.exit_code) == ('interrupted', 130), out
    assert 'SIGINT received: stopping every task (the chief saves a checkpoint first)' in out
    assert backend.stopped == {'ps:0': -15, 'worker:0': -15, 'worker:1': -15}
    assert not os.path.exists(rundir.state_path(str(tmp_path / 'run')))     # nothing left to find


def test_the_lock_refuses_a_second_lifecycle_and_a_failed_prepare_leaves_no_trace(tmp_path):
    from launch.errors import UsageError
    spec = load_spec(write_spec(tmp_path))
    holder = Lifecycle(spec, Console(stream=io.StringIO()))
    lock, _ = holder._lock()
    try:
        with pytest.raises(UsageError, match=rf'train_dir .* is in use by launcher pid {os.getpid()}'):
            Lifecycle(spec, Console(stream=io.StringIO()))._lock()
    finally:
        lock.release(remove=True)
    os.rmdir(spec.train.train_dir)

    class Refused(ScriptedBackend):
        def check(self, plans, imports=False):
            raise UsageError('bad input')
    strategy = SupervisedRun(spec, '', [], {}, checks=lambda: Refused({}).check([]))
    with pytest.raises(UsageError):
        Lifecycle(spec, Console(stream=io.StringIO())).up(strategy)
    assert not os.path.exists(spec.train.train_dir)       # made for this launch, removed again


def test_a_multi_host_operation_names_every_host_that_failed():
    def fail(host):
        if host != 'good':
            raise SSHError(host, 'cannot create the workdir x: Permission denied')
        return host
    with pytest.raises(SSHError) as e:
        SSHBackend._parallel(fail, ['a', 'good', 'b'])
    assert str(e.value) == ('a: cannot create the workdir x: Permission denied; '
                            'b: cannot create the workdir x: Permission denied')
    assert SSHBackend._parallel(lambda h: h, ['x', 'y']) == ['x', 'y']


def test_the_event_log_and_run_json_tell_a_restart(tmp_path):
    from launch.records.events import read_events
    saved = ('log', f'{NOW} I {rundir.checkpoint_line(40)}')
    backend = ScriptedBackend({'ps:0': {1: [(0.4, 'exit', -9)], 2: [(0.6, 'exit', 0)]},
                               'worker:0': {1: [(0.3, *step(40)), (0.35, *saved)], 2: DONE},
                               'worker:1': {1: [], 2: DONE}}, checkpoint_step=40)
    result, out, _ = run(tmp_path, backend, supervise={'restart': 'on-failure', 'max_restarts': 2})
    train_dir = str(tmp_path / 'run')
    events = read_events(rundir.events_path(train_dir))
    kinds = [(e['attempt'], e['event']) for e in events]
    assert kinds[0] == (1, 'run_started') and kinds[-1] == (2, 'finished'), kinds
    assert (1, 'task_lost') in kinds and (1, 'restart') in kinds and (2, 'first_step') in kinds, kinds
    assert kinds.index((1, 'restart')) < kinds.index((2, 'task_started'))
    lost = next(e for e in events if e['event'] == 'task_lost')
    assert (lost['task'], lost['signal'], lost['exit_code']) == ('ps:0', 'SIGKILL', -9)
    assert [(e['attempt'], e['step']) for e in events if e['event'] == 'checkpoint'] == [(1, 40)]
    restart = next(e for e in events if e['event'] == 'restart')
    assert restart['from_step'] == 40 and 'ps:0 was killed by SIGKILL' in restart['cause']
    assert [e['step'] for e in events if e['event'] == 'progress' and e['attempt'] == 2] == [50, 100]
    assert sum(e['event'] == 'serving' for e in events) == 6
    record = json.load(open(rundir.run_path(train_dir)))
    assert (record['state'], record['attempt'], record['restarts'], record['global_step']) == ('done', 2, 1, 100)
    assert record['id'] == events[0]['run'] and out.splitlines()[0].startswith(f'[launch]   run {record["id"]}, ')


def test_checkpoints_that_do_not_restore_are_named_even_when_the_chief_dies_during_start_up(tmp_path):
    """The chief may find that no checkpoint restores before every other server is up (a slow
    ps): the start-up's line then says so as the supervisor's does, not only `exited with code 3`."""
    cause = 'no checkpoint in /r/run restores: model.ckpt-6: DataLossError; move them away to start afresh'
    backend = ScriptedBackend({'ps:0': {'*': []}, 'worker:1': {'*': []},
                               'worker:0': {'*': [(0.0, 'log', f'{NOW} E worker:0: {cause}'), (0.0, 'exit', 3)]}},
                              clock='spawn')
    result, out, _ = run(tmp_path, backend, supervise={'restart': 'on-failure'})
    assert (result.state, result.exit_code, result.restarts) == ('failed', 1, 0), out
    [error] = [line for line in out.splitlines() if 'error:' in line]
    assert 'worker:0 exited with code 3 during start-up; its last error: no checkpoint in /r/run restores' in error
    assert error.endswith('no checkpoint restores, so a new `launch up` fails the same way until they are moved '
                          'away'), error


# -- launch scale against a running launcher (the real command line, in a process of its own) --------

class HeldBackend(ScriptedBackend):
    """A ScriptedBackend whose tasks named in `held` keep running, whatever their script says,
    until `release` is set: a run that lasts exactly as long as a test needs it."""

    def __init__(self, script, held):
        super().__init__(script)
        self.held, self.release = set(held), threading.Event()

    def status(self, record):
        seen = super().status(record)
        if record.name in self.held and not self.release.is_set() and record.name not in self.stopped:
            return Observation(RUNNING)
        return seen


def scale_while_running(tmp_path, backend, counts, **kw):
    """Run a pool of 3 with 2 live async workers; meanwhile `launch scale --workers N` for each N
    of `counts` (its command, on a thread: the launcher's signal handlers need the main one),
    one after the other, then let the held tasks end. (result, the launcher's output, [(each
    scale's exit code, what it printed)])."""
    from contextlib import redirect_stdout
    from launch.commands import cmd_scale
    from launch.commands.flags import ScaleFlags
    from launch.commands.request import Request
    from launch.errors import LaunchError
    from launch.run.registry import Options
    scales = []

    def scaler():
        from launch.records.lock import TrainDirLock
        deadline = time.monotonic() + 10
        while TrainDirLock.held(str(tmp_path / 'run')) is None and time.monotonic() < deadline:
            time.sleep(0.01)        # `launch scale` before a launcher runs is refused
        try:
            for n in counts:
                printed = io.StringIO()
                spec = load_spec(str(tmp_path / 'spec.yaml'))
                try:
                    with redirect_stdout(printed):
                        code = cmd_scale(spec, Request('scale', None, Options(), ScaleFlags(n)))
                except LaunchError as e:
                    code, printed = e.exit_code, io.StringIO(str(e))
                scales.append((code, printed.getvalue()))
        finally:
            backend.release.set()
    helper = threading.Thread(target=scaler)
    helper.start()
    try:
        result, out, _ = run(tmp_path, backend, workers=3, sync=False, live=2, steps=100, **kw)
    finally:
        backend.release.set()
        helper.join()
    return result, out, scales


TRAINING = [(0.1, *step(10)), (0.2, *step(20)), (0.5, 'exit', 0)]     # held: short of the last step
SERVING = {'ps:0': {'*': [(0.3, 'exit', 0)]}, 'worker:0': {'*': TRAINING}, 'worker:1': {'*': TRAINING}}
HELD = ('ps:0', 'worker:0', 'worker:1')


def test_a_joiner_lost_and_let_go_leaves_the_live_set_and_scale_says_so(tmp_path):
    """restart: never, and worker:2 dies while it joins: the change failed, and the launcher,
    the reply and the state agree that 2 workers train; a second scale to 3 starts it again."""
    backend = HeldBackend({**SERVING, 'worker:2': {1: [(0.2, 'exit', -9)], 2: DONE}}, HELD)
    result, out, ((code, said), (again, said_again)) = scale_while_running(tmp_path, backend, [3, 3])
    assert 'worker:2 was killed by SIGKILL; training goes on with 2 worker(s)' in out, (out, said, said_again)
    assert code == 1, said
    assert said.splitlines()[-1] == ('worker:2 ended while joining the training and is not started again; '
                                     '2 worker(s) train now (worker:0, worker:1)'), said
    assert again == 0, said_again
    assert 'starting worker:2' in said_again and said_again.splitlines()[-1] == \
        '3 worker(s) train now (worker:0, worker:1, worker:2)', said_again
    assert len(backend.starts['worker:2']) == 2
    assert (result.state, result.exit_code) == ('done', 0), out
    assert '(async, 3 workers)' in out and 'lost worker:2' not in out, out


def test_a_joiner_lost_and_started_again_is_a_change_done_and_scale_says_so(tmp_path):
    """restart: on-failure, and worker:2 dies while it joins: the supervisor starts it again and
    it trains, so the scale is done (exit 0), its reply naming the restart."""
    backend = HeldBackend({**SERVING, 'worker:2': {1: [(0.2, 'exit', -9)], 2: DONE}}, HELD)
    result, out, ((code, said),) = scale_while_running(tmp_path, backend, [3], supervise={
        'restart': 'on-failure', 'max_restarts': 3, 'backoff_secs': 0})
    assert code == 0, said
    lines = said.splitlines()
    assert lines[-2] == ('worker:2 ended while joining the training (worker:2 was killed by SIGKILL); '
                         'restart 1/3 starts it again'), lines
    assert lines[-1] == '3 worker(s) train now (worker:0, worker:1, worker:2)', lines
    assert len(backend.starts['worker:2']) == 2
    assert (result.state, result.exit_code, result.restarts) == ('done', 0, 1), out


def test_a_scale_request_left_by_an_earlier_launcher_is_refused_not_carried_out(tmp_path):
    """A launcher killed before it answered leaves `scale.request` behind: the next launcher of
    the run answers it "refused" and starts no worker nobody asked it for."""
    from launch.records.event_types import OtherEvent
    from launch.records.events import EventLog
    from launch.run import control
    train_dir = tmp_path / 'run'
    train_dir.mkdir()
    EventLog(str(train_dir / rundir.EVENTS_FILE), 'spec-1', 1).emit(OtherEvent(event='run_started', extra={'launcher_pid': 4242}))
    stale = 'e0a1b2c3d4e5'        # as `launch scale` wrote it for the launcher pid 4242
    (train_dir / control.REQUEST_FILE).write_text(json.dumps({'id': stale, 'workers': 3, 'pid': 4343,
                                                              'launcher': {'pid': 4242, 'ident': '12345'}}))
    backend = ScriptedBackend({**SERVING, 'worker:2': {'*': DONE}})
    result, out, _ = run(tmp_path, backend, workers=3, sync=False, live=2, steps=100)
    assert (result.state, result.exit_code) == ('done', 0), out
    assert 'worker:2' not in backend.starts and 'scaling' not in out, out
    reply = json.loads((train_dir / control.REPLY_FILE).read_text())
    assert (reply['id'], reply['state']) == (stale, 'refused'), reply
    assert 'sent to launcher pid 4242 of the run, which has ended' in reply['lines'][0], reply
    assert not (train_dir / control.REQUEST_FILE).exists()
