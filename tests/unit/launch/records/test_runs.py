"""Finding and describing runs (launch/records/runs.py): run directories written by hand, as a launcher
leaves them, and a real TrainDirLock for "running". Fast: no process is started."""
from __future__ import annotations

import datetime
import json
import logging
import os

import pytest

from cluster.runtime import rundir
from launch.errors import UsageError
from launch.records.runs import (AmbiguousRun, RunInfo, RunNotFound, describe, duration_text, find_runs, local_minutes,
                         resolve, table)
from launch.records.lock import TrainDirLock

JSON_FIELDS = ['id', 'train_dir', 'spec', 'backend', 'state', 'global_step', 'attempts', 'started',
               'duration_secs', 'exit_code']
BASE = datetime.datetime.now().astimezone().replace(microsecond=0) - datetime.timedelta(hours=3)


def at(secs: float) -> str:
    """An event time `secs` after BASE, as events.py writes it."""
    return (BASE + datetime.timedelta(seconds=secs)).isoformat(timespec='milliseconds')


def write_events(train_dir, run_id: str, events: list[tuple], extra_lines: str = '') -> None:
    """events: (seconds after BASE, attempt, event, fields)."""
    os.makedirs(train_dir, exist_ok=True)
    with open(rundir.events_path(str(train_dir)), 'a', encoding='utf-8') as f:
        for secs, attempt, event, fields in events:
            f.write(json.dumps({'time': at(secs), 'run': run_id, 'attempt': attempt, 'event': event, **fields}) + '\n')
        f.write(extra_lines)


def result(run_id, train_dir, attempt, state, exit_code, step, start, end, spec='/specs/local2.yaml', **more):
    """run.json's record (and a `finished` event's result), as Lifecycle writes it."""
    return {'state': state, 'exit_code': exit_code, 'seconds': float(end - start), 'global_step': step,
            'images_per_sec': 120.5, 'loss': 0.25, 'restarts': 1 if attempt == 1 else 0, 'failures': [],
            'started': at(start)[:19] + at(start)[23:], 'ended': at(end)[:19] + at(end)[23:], 'id': run_id,
            'attempt': attempt, 'spec': spec, 'backend': 'local', 'train_dir': str(train_dir), **more}


def make_run(train_dir, run_id='local2-20261123-210843', t0=0.0, spec='/specs/local2.yaml', run_json=True) -> str:
    """A run of three attempts: attempt 1 loses its ps to SIGKILL and the supervisor restarts the
    cluster (attempt 2), which is interrupted; a second `launch up` resumes it as attempt 3, which
    finishes at step 200. run.json holds attempt 3's result."""
    train_dir = str(train_dir)
    started = {'spec': spec, 'backend': 'local', 'spec_hash': 'ab' * 32, 'train_dir': train_dir}
    tasks = [('task_started', {'task': t, 'host': 'localhost', 'pid': 1000 + i})
             for i, t in enumerate(('ps:0', 'worker:0', 'worker:1'))]
    a1 = [(t0, 1, 'run_started', {**started, 'launcher_pid': 11, 'resumes_from': None})] + \
        [(t0 + 1, 1, e, f) for e, f in tasks] + [
        (t0 + 5, 1, 'serving', {'task': 'ps:0'}),
        (t0 + 10, 1, 'first_step', {'step': 1}),
        (t0 + 40, 1, 'progress', {'step': 50, 'total': 200, 'loss': 1.5, 'images_per_sec': 100.0}),
        (t0 + 45, 1, 'checkpoint', {'step': 40}),
        (t0 + 50, 1, 'task_lost', {'task': 'ps:0', 'cause': 'killed by SIGKILL', 'exit_code': None,
                                   'signal': 'SIGKILL', 'error': None}),
        (t0 + 51, 1, 'restart', {'cause': 'ps:0 lost', 'from_step': 40})]
    a2 = [(t0 + 52, 2, e, f) for e, f in tasks] + [
        (t0 + 60, 2, 'first_step', {'step': 41}),
        (t0 + 90, 2, 'progress', {'step': 80, 'total': 200, 'loss': 1.0, 'images_per_sec': 110.0}),
        (t0 + 95, 2, 'interrupted', {'signal': 'SIGINT'}),
        (t0 + 100, 2, 'finished', {'result': result(run_id, train_dir, 2, 'interrupted', 130, 80, t0, t0 + 100)})]
    a3 = [(t0 + 600, 3, 'run_started', {**started, 'launcher_pid': 12, 'resumes_from': 80})] + \
        [(t0 + 601, 3, e, f) for e, f in tasks] + [
        (t0 + 610, 3, 'first_step', {'step': 81}),
        (t0 + 700, 3, 'progress', {'step': 190, 'total': 200, 'loss': 0.3, 'images_per_sec': 120.0}),
        (t0 + 725, 3, 'finished', {'result': result(run_id, train_dir, 3, 'done', 0, 200, t0 + 600, t0 + 725)})]
    write_events(train_dir, run_id, a1 + a2 + a3)
    if run_json:
        with open(rundir.run_path(train_dir), 'w') as f:
            json.dump(result(run_id, train_dir, 3, 'done', 0, 200, t0 + 600, t0 + 725), f, indent=1)
    return train_dir


def epoch(secs: float) -> float:
    return (BASE + datetime.timedelta(seconds=secs)).timestamp()


# -- describe -----------------------------------------------------------------------------------
def test_describe_tells_a_run_of_three_attempts(tmp_path):
    train_dir = make_run(tmp_path / 'run')
    info = describe(train_dir)
    assert info == RunInfo(id='local2-20261123-210843', train_dir=train_dir, spec='/specs/local2.yaml',
                           backend='local', state='done', global_step=200, attempts=3, started=at(0),
                           duration_secs=725.0, exit_code=0)


def test_to_json_has_exactly_the_documented_fields(tmp_path):
    info = describe(make_run(tmp_path / 'run'))
    data = info.to_json()
    assert list(data) == JSON_FIELDS
    assert json.loads(json.dumps(data)) == data
    for field in JSON_FIELDS:       # every field is documented where users look: the docstring
        assert f'\n        {field} ' in RunInfo.__doc__, field


def test_a_directory_without_events_or_run_json_holds_no_run(tmp_path):
    (tmp_path / 'logs').mkdir()
    (tmp_path / 'launch-state.json').write_text('{}')
    assert describe(str(tmp_path)) is None
    assert describe(str(tmp_path / 'missing')) is None


def test_run_json_wins_for_the_result_and_the_events_for_attempts_and_start(tmp_path):
    train_dir = make_run(tmp_path / 'run', run_json=False)
    with open(rundir.run_path(train_dir), 'w') as f:     # disagrees with the `finished` event of attempt 3
        json.dump(result('local2-20261123-210843', train_dir, 3, 'failed', 1, 205, 650, 800), f)
    info = describe(train_dir)
    assert (info.state, info.exit_code, info.global_step) == ('failed', 1, 205)
    assert (info.attempts, info.started, info.duration_secs) == (3, at(0), 800.0)


def test_the_events_alone_describe_a_run_whose_run_json_is_missing(tmp_path):
    info = describe(make_run(tmp_path / 'run', run_json=False))
    assert (info.state, info.exit_code, info.global_step, info.attempts) == ('done', 0, 200, 3)


def test_run_json_alone_describes_a_run_whose_events_are_gone(tmp_path):
    train_dir = make_run(tmp_path / 'run')
    os.remove(rundir.events_path(train_dir))
    info = describe(train_dir)
    assert (info.id, info.state, info.global_step, info.attempts, info.exit_code) == \
        ('local2-20261123-210843', 'done', 200, 3, 0)
    assert (info.spec, info.backend, info.duration_secs) == ('/specs/local2.yaml', 'local', 125.0)
    assert local_minutes(info.started) == local_minutes(at(600))


def test_an_attempt_that_left_no_result_is_unknown_not_the_previous_result(tmp_path):
    """A launcher killed with SIGKILL in attempt 4: run.json still says attempt 3 was done."""
    train_dir = make_run(tmp_path / 'run')
    write_events(train_dir, 'local2-20261123-210843', [(900, 4, 'run_started', {'spec': '/specs/local2.yaml'}),
                                                       (950, 4, 'progress', {'step': 230, 'total': 300})])
    info = describe(train_dir)
    assert (info.state, info.exit_code, info.global_step, info.attempts, info.duration_secs) == \
        ('unknown', None, 230, 4, 950.0)


# -- running: the launcher's lock, never a file -------------------------------------------------
def test_a_run_is_running_while_a_launcher_holds_its_lock(tmp_path):
    train_dir = make_run(tmp_path / 'run')
    write_events(train_dir, 'local2-20261123-210843', [(900, 4, 'run_started', {'spec': '/specs/local2.yaml'}),
                                                       (950, 4, 'progress', {'step': 230, 'total': 300})])
    lock = TrainDirLock(train_dir)
    lock.acquire('launch up (pid 4242 on testhost)')
    try:
        assert TrainDirLock.held(train_dir) == 'launch up (pid 4242 on testhost)'
        info = describe(train_dir)
        assert (info.state, info.exit_code, info.global_step, info.attempts) == ('running', None, 230, 4)
        assert info.duration_secs >= datetime.datetime.now().timestamp() - epoch(0) - 5
    finally:
        lock.release()
    assert TrainDirLock.held(train_dir) is None
    assert describe(train_dir).state == 'unknown'       # released without a result: killed


def test_a_run_is_what_run_json_says_once_its_launcher_released_the_lock(tmp_path):
    train_dir = make_run(tmp_path / 'run')
    lock = TrainDirLock(train_dir)
    lock.acquire('launch up (pid 4242 on testhost)')
    try:
        assert describe(train_dir).state == 'running'
    finally:
        lock.release(remove=True)
    info = describe(train_dir)
    assert (info.state, info.exit_code, info.duration_secs) == ('done', 0, 725.0)


def test_a_stale_state_file_or_lock_file_without_a_live_holder_is_not_running(tmp_path):
    train_dir = str(tmp_path / 'run')
    write_events(train_dir, 'r-1', [(0, 1, 'run_started', {'spec': '/s.yaml', 'launcher_pid': os.getpid()}),
                                    (5, 1, 'progress', {'step': 7, 'total': 10})])
    with open(rundir.state_path(train_dir), 'w') as f:     # as a launcher killed by SIGKILL leaves it
        json.dump({'format': 2, 'spec': '/s.yaml', 'launcher_pid': os.getpid(), 'launcher_ident': 'x',
                   'started': 0, 'tasks': [], 'progress': None, 'restarts': 0}, f)
    with open(rundir.lock_path(train_dir), 'w') as f:
        f.write(f'launch up (pid {os.getpid()})\n')
    assert TrainDirLock.held(train_dir) is None
    assert describe(train_dir).state == 'unknown'


def test_the_lock_probe_creates_no_lock_file(tmp_path):
    assert TrainDirLock.held(str(tmp_path)) is None
    assert not os.path.exists(rundir.lock_path(str(tmp_path)))


# -- damaged files ------------------------------------------------------------------------------
def test_a_torn_events_line_is_skipped_with_one_warning(tmp_path, caplog):
    train_dir = str(tmp_path / 'run')
    make_run(train_dir, run_json=False)
    torn = '{"time": "2026-11-23T21:08:43", "run": "local2-2'     # a launcher killed mid-write
    write_events(train_dir, 'x', [], extra_lines=torn)
    with caplog.at_level(logging.WARNING):
        info = describe(train_dir)
    assert (info.state, info.global_step, info.attempts) == ('done', 200, 3)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and 'events.jsonl' in warnings[0].getMessage(), caplog.text


def test_a_damaged_run_json_is_skipped_with_one_warning(tmp_path, caplog):
    train_dir = make_run(tmp_path / 'run')
    with open(rundir.run_path(train_dir), 'w') as f:
        f.write('{"id": "local2-20261123-210843", "state": "do')
    with caplog.at_level(logging.WARNING):
        info = describe(train_dir)
    assert (info.state, info.global_step, info.exit_code) == ('done', 200, 0)     # from the `finished` event
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and 'run.json' in warnings[0].getMessage(), caplog.text


def test_garbage_everywhere_still_describes_a_run(tmp_path, caplog):
    train_dir = tmp_path / 'run'
    train_dir.mkdir()
    (train_dir / 'events.jsonl').write_text('not json\n[1, 2]\n'
                                            '{"event": "progress", "step": "many", "attempt": true}\n')
    (train_dir / 'run.json').write_text('["a list"]')
    with caplog.at_level(logging.WARNING):
        info = describe(str(train_dir))
    # attempts 1, not 0: `"attempt": true` reads as every reader reads it now, the typed way (read_attempt)
    assert (info.id, info.state, info.global_step, info.attempts, info.duration_secs) == \
        ('run', 'unknown', None, 1, None)
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 2, caplog.text
    assert 'run  ' in table([info])


# -- find_runs -----------------------------------------------------------------------------------
def test_find_runs_searches_a_few_levels_oldest_first(tmp_path):
    make_run(tmp_path, run_id='root-1', t0=-50)                   # the root itself is a run
    make_run(tmp_path / 'a' / 'run', run_id='a-1', t0=100)
    make_run(tmp_path / 'b' / 'c', run_id='c-1', t0=0)
    make_run(tmp_path / 'd1' / 'd2' / 'd3' / 'd4', run_id='too-deep', t0=-10)
    for skipped in ('.hidden/run', 'node_modules/run', '__pycache__/run', 'logs/run', 'a/run/logs/attempt-1',
                    'a/run/checkpoints/x'):
        make_run(tmp_path / skipped, run_id='skipped')
    (tmp_path / 'link').symlink_to(tmp_path / 'b' / 'c')         # never followed: c-1 once
    assert [r.id for r in find_runs(str(tmp_path))] == ['root-1', 'c-1', 'a-1']
    assert [r.id for r in find_runs(str(tmp_path), depth=1)] == ['root-1']
    assert [r.id for r in find_runs(str(tmp_path), depth=2)] == ['root-1', 'c-1', 'a-1']
    assert [r.id for r in find_runs(str(tmp_path), depth=4)] == ['root-1', 'too-deep', 'c-1', 'a-1']
    assert [r.id for r in find_runs(str(tmp_path / '.hidden'))] == ['skipped']     # a hidden root named: searched
    assert find_runs(str(tmp_path / 'empty-or-missing')) == []


def test_find_runs_skips_an_unreadable_directory(tmp_path, monkeypatch):
    make_run(tmp_path / 'ok', run_id='ok-1')
    closed = tmp_path / 'closed'
    make_run(closed / 'run', run_id='closed-1')
    scandir = os.scandir

    def refusing(path='.'):     # as for a directory of another user (root reads any: chmod cannot show it)
        if os.fspath(path) == str(closed):
            raise PermissionError(13, 'Permission denied', os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, 'scandir', refusing)
    assert [r.id for r in find_runs(str(tmp_path))] == ['ok-1']


# -- resolve --------------------------------------------------------------------------------------
def test_resolve_takes_a_train_dir_or_a_run_id_from_anywhere(tmp_path, monkeypatch):
    train_dir = make_run(tmp_path / 'exp' / 'run')
    make_run(tmp_path / 'other', run_id='other-1')
    monkeypatch.chdir(tmp_path / 'exp')
    assert resolve('run') == train_dir
    assert resolve(train_dir) == train_dir
    assert resolve('local2-20261123-210843', root=str(tmp_path)) == train_dir
    monkeypatch.chdir(tmp_path)
    assert resolve('local2-20261123-210843') == train_dir
    assert resolve('other-1') == str(tmp_path / 'other')


def test_an_unknown_run_id_is_one_line_naming_the_root(tmp_path, monkeypatch):
    make_run(tmp_path / 'run')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunNotFound) as caught:
        resolve('local2-20991231-000000')
    message = str(caught.value)
    assert message == (f'no run local2-20991231-000000 under {tmp_path}, nor among the runs you started '
                       '(`launch list` shows them)')
    assert isinstance(caught.value, UsageError) and '\n' not in message


def test_a_directory_without_a_run_is_one_line(tmp_path):
    (tmp_path / 'empty').mkdir()
    for ref in (str(tmp_path / 'empty'), str(tmp_path / 'missing' / 'dir')):
        with pytest.raises(RunNotFound) as caught:
            resolve(ref, root=str(tmp_path))
        assert '\n' not in str(caught.value) and ref in str(caught.value)
    with pytest.raises(RunNotFound, match='holds no run'):
        resolve(str(tmp_path / 'empty'))


def test_an_id_two_runs_share_asks_for_the_directory(tmp_path):
    make_run(tmp_path / 'a', run_id='same-1')
    make_run(tmp_path / 'b', run_id='same-1')
    with pytest.raises(AmbiguousRun) as caught:
        resolve('same-1', root=str(tmp_path))
    assert isinstance(caught.value, UsageError) and '\n' not in str(caught.value)
    assert str(tmp_path / 'a') in str(caught.value) and str(tmp_path / 'b') in str(caught.value)


# -- table ----------------------------------------------------------------------------------------
def test_table_lists_runs_with_a_header(tmp_path, monkeypatch):
    make_run(tmp_path / 'run', run_id='local2-1')
    make_run(tmp_path / 'deeper' / 'run', run_id='local2-2', t0=30)
    monkeypatch.chdir(tmp_path)
    lines = table(find_runs()).splitlines()
    assert lines[0].split() == ['ID', 'SPEC', 'BACKEND', 'STATE', 'STEP', 'ATTEMPTS', 'STARTED', 'DURATION',
                                'TRAIN_DIR']
    started = datetime.datetime.fromtimestamp(epoch(0)).strftime('%Y-%m-%d %H:%M')
    assert lines[1].split() == ['local2-1', '/specs/local2.yaml', 'local', 'done', '200', '3', *started.split(),
                                '12m05s', 'run']
    assert lines[2].split()[0] == 'local2-2' and lines[2].split()[-1] == os.path.join('deeper', 'run')
    assert len({line.index('STATE') if i == 0 else line.index('done') for i, line in enumerate(lines)}) == 1


def test_table_of_no_runs_says_so(tmp_path):
    assert table([], root=str(tmp_path)) == f'no runs under {tmp_path}'


def test_durations_read_at_a_glance():
    assert [duration_text(s) for s in (None, 0, 42.4, 65, 3599, 7380, 90000)] == \
        ['-', '0s', '42s', '1m05s', '59m59s', '2h03m', '1d01h']
