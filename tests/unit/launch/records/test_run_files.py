"""Hostile and damaged run files, and standard JSON (issue 31, findings 6 and 9).

Every reader of a run's files is bounded: a line or file over runjson.MAX_BYTES is read past,
never held; nesting deeper than runjson.MAX_DEPTH is damage, never a RecursionError; what a
command skipped is one warning per file; the report cuts a long field as the console does.
Nothing the project writes holds NaN or Infinity (RFC 8259), and the NaN older versions wrote
still reads. Real files in tmp dirs and the real command line, run in this process (fast tier).
"""
from __future__ import annotations

import ast
import json
import logging
import math
import os
import sys
import time
import tracemalloc

import pytest

from cluster.runtime import rundir, runjson
from cluster.runtime.membership import Members
from launch.cli import main
from launch.records import report, runs
from launch.records.event_types import (Finished, Progress, RunStarted, Serving, TaskLost, TaskStarted, parse_event,
                                        read_metrics)
from launch.records.events import EventLog, read_events, read_run_record
from launch.records.jsonrecord import read_real, read_whole
from launch.records.result import RunResult, RunState
from launch.run.state import LaunchState, StateError, StepSeen, WorkerPool
from tests.conftest import REPO

NESTED = '[' * 100_000 + ']' * 100_000           # valid JSON, deeper than CPython's parser goes
SPEC = """cluster:
  ps: [localhost:1]
  worker: [localhost:2, localhost:3]
train:
  steps: 200
  train_dir: elsewhere
"""


def make_run(root, name: str, loss: float = 0.5) -> str:
    """A finished run's files, written by the launcher's own writers (EventLog, run.json as the
    lifecycle writes it), with the effective spec a `launch report RUN` loads."""
    train_dir = str(root / name)
    os.makedirs(train_dir)
    with open(rundir.spec_path(train_dir), 'w') as f:
        f.write(SPEC)
    events = EventLog(rundir.events_path(train_dir), f'{name}-1', 1)
    events.emit(RunStarted(spec=rundir.spec_path(train_dir), backend='local', train_dir=train_dir, resumes_from=None))
    for pid, task in enumerate(('ps:0', 'worker:0', 'worker:1'), 100):
        events.emit(TaskStarted(task=task, host='localhost', pid=pid))
        events.emit(Serving(task=task))
    events.emit(Progress(step=100, total=200, loss=loss, images_per_sec=400.0))
    now = time.time()
    result = RunResult(RunState.DONE, 0, seconds=9.5, global_step=200, images_per_sec=400.0, loss=loss,
                       started=now - 10, ended=now)
    record = result.to_json(f'{name}-1', 1, rundir.spec_path(train_dir), 'local', train_dir)
    events.emit(Finished(result=result.record(f'{name}-1', 1, rundir.spec_path(train_dir), 'local', train_dir)))
    with open(rundir.run_path(train_dir), 'w') as f:
        f.write(runjson.dumps(record, indent=1) + '\n')
    return train_dir


@pytest.fixture
def cli(capsys, caplog, monkeypatch):
    """`launch ARGS...` as the command line runs it: (exit code, stdout, the warnings). Each call
    is a command of its own (its warnings fresh), and none may import TensorFlow: reading files
    never needs it (it takes seconds to load)."""
    monkeypatch.setitem(sys.modules, 'tensorflow', None)

    def run(*argv: str) -> tuple[int, str, list[str]]:
        runjson.forget_warnings()
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            code = main(list(argv))
        out = capsys.readouterr().out
        return code, out, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    return run


def strict(text: str):
    """JSON as RFC 8259 has it: NaN, Infinity and -Infinity are errors."""
    def refuse(constant: str):
        raise ValueError(f'{constant} is not JSON')
    return json.loads(text, parse_constant=refuse)


# -- finding 6: hostile run files ---------------------------------------------------------------------
@pytest.mark.parametrize('where', [rundir.EVENTS_FILE, rundir.RUN_FILE])
def test_a_line_of_100000_nested_arrays_costs_one_warning_in_list_status_and_report(tmp_path, cli, where,
                                                                                    monkeypatch):
    make_run(tmp_path, 'healthy')
    hostile = make_run(tmp_path, 'hostile')
    path = os.path.join(hostile, where)
    with open(path, 'a' if where == rundir.EVENTS_FILE else 'w') as f:
        f.write(NESTED + '\n')
    monkeypatch.chdir(tmp_path)

    code, out, warned = cli('list', str(tmp_path))
    assert code == 0 and 'healthy-1' in out and 'hostile-1' in out      # one such run no longer breaks the tree
    assert len(warned) == 1 and path in warned[0] and 'damaged' in warned[0], warned
    code, out, warned = cli('list', str(tmp_path), '--json')
    assert code == 0 and {r['id'] for r in strict(out)} == {'healthy-1', 'hostile-1'} and len(warned) == 1

    for argv in (['status', hostile], ['status', hostile, '--json'], ['status', 'hostile-1'],
                 ['report', hostile, '-o', str(tmp_path / 'report.html')]):
        code, out, warned = cli(*argv)
        assert code in (0, 1), (argv, code)          # 1: a run whose run.json is gone is "unknown", not done
        assert len(warned) == 1 and path in warned[0], (argv, warned)
    with open(tmp_path / 'report.html') as f:
        page = f.read()
    assert 'hostile-1' in page and page.count('<img') == 2 and os.path.getsize(tmp_path / 'report.html') < 1_000_000


def test_a_50_mb_event_is_read_past_and_the_report_stays_small(tmp_path, cli):
    """The issue's case: one valid 50 MB event made a 100 MB page (the field twice, never cut) and
    took 536 MB. Now the line is skipped unread, in one warning, and the page is a normal one."""
    train_dir = make_run(tmp_path, 'run')
    big = {'time': rundir.iso_time(time.time()), 'run': 'run-1', 'attempt': 1, 'event': 'task_lost',
           'task': 'worker:1', 'cause': 'worker:1 exited with code 1', 'exit_code': 1, 'signal': None,
           'error': 'ValueError: ' + 'x' * (50 << 20)}
    with open(rundir.events_path(train_dir), 'a') as f:
        f.write(json.dumps(big) + '\n')
    out = str(tmp_path / 'report.html')

    tracemalloc.start()
    try:
        code, _, warned = cli('report', train_dir, '-o', out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 0 and os.path.getsize(out) < 2_000_000
    assert warned == [f'{rundir.events_path(train_dir)}: skipped 1 line(s) {runjson.OVER} (line 10)'], warned
    assert peak < 40 << 20, f'{peak / 2 ** 20:.0f} MiB'         # not a copy of the line, let alone several
    code, out, warned = cli('status', train_dir)
    assert code == 0 and 'run run-1: done' in out and len(warned) == 1


def test_a_long_field_is_cut_once_where_the_report_shows_it(tmp_path, caplog):
    """A field under the line limit is read, and shown cut as the console cuts a task's last error."""
    train_dir = make_run(tmp_path, 'run')
    cause, error = 'C' * (1 << 20), 'E' * (1 << 20)
    with open(rundir.events_path(train_dir), 'a') as f:          # as a foreign tool or an older launcher wrote it
        f.write(json.dumps({'time': rundir.iso_time(time.time()), 'run': 'run-1', 'attempt': 1,
                            'event': 'task_lost', 'task': 'T' * 5000, 'cause': cause, 'exit_code': 1,
                            'signal': None, 'error': error}) + '\n')
    with caplog.at_level(logging.WARNING):
        page = report.render(train_dir)
    assert not caplog.records and len(page) < 1_000_000
    cut = 'E' * (report.CELL_CHARS - 1) + '&#8230;'        # the ellipsis, as the page writes it in ASCII
    assert page.count(cut) == 1 and 'E' * report.CELL_CHARS not in page     # the error once, cut
    assert 'C' * report.CELL_CHARS not in page and 'C' * (report.CELL_CHARS - 1) + '&#8230;' in page
    assert 'T' * report.CELL_CHARS not in page


def test_the_event_log_never_writes_a_line_its_readers_skip(tmp_path):
    """A task's last error line may be any length (a tensor printed in an exception): the event
    keeps the first runjson.MAX_TEXT characters of it, so the run's story keeps the event."""
    path = str(tmp_path / 'events.jsonl')
    EventLog(path, 'r', 1).emit(TaskLost(task='worker:0', cause='worker:0 exited with code 1', exit_code=1,
                                         error='ValueError: ' + 'x' * (8 << 20)))
    assert os.path.getsize(path) < runjson.MAX_BYTES
    (lost,) = [parse_event(e) for e in read_events(path)]
    assert isinstance(lost, TaskLost) and lost.error is not None
    assert len(lost.error) == runjson.MAX_TEXT and lost.error.startswith('ValueError: xxx') and lost.error[-1] == '\u2026'


def test_depth_and_size_are_bounded_and_the_lines_after_a_long_one_still_read(tmp_path):
    ok = '[' * runjson.MAX_DEPTH + ']' * runjson.MAX_DEPTH
    assert runjson.loads(ok) is not None and runjson.loads('{"a": ' * 32 + '1' + '}' * 32)
    for deep in ('[' + ok + ']', '{"a": ' * 33 + '1' + '}' * 33, NESTED, '[' * 900 + ']' * 900):
        with pytest.raises(ValueError, match='nested more than 32 deep'):
            runjson.loads(deep)
    with pytest.raises(ValueError, match='too long'):
        runjson.loads(' ' * (runjson.MAX_BYTES + 1))
    assert runjson.loads('["\\ud800", "\\ud83d\\ude00"]') == ['?', '\U0001F600']   # a lone surrogate is no text

    path = tmp_path / 'events.jsonl'
    good = json.dumps({'event': 'serving', 'task': 'ps:0'})
    path.write_text('\n'.join([good, 'x' * (runjson.MAX_BYTES + 1), good, 'y' * runjson.MAX_BYTES, good]) + '\n')
    with open(path, 'rb') as f:
        lines = list(runjson.lines(f))
    assert [n for n, line in lines if line is None] == [2]
    assert len(read_events(str(path))) == 3


def test_numbers_no_float_holds_are_no_numbers():
    """JSON numbers have no bound; a 400-digit step or an infinite attempt must not overflow the
    first float() or int() downstream (plots, durations)."""
    assert read_whole(10 ** 400) is None and read_real(10 ** 400) is None and read_whole(float('inf')) is None
    assert read_whole(200) == 200 and read_real(2.5) == 2.5 and math.isnan(read_real(float('nan')))
    assert read_metrics({'accuracy': 0.5, 'huge': 10 ** 400, 'no': 'x'}) == {'accuracy': 0.5}
    with pytest.raises(ValueError, match='not an attempt number'):
        parse_event({'time': '2026-01-01T00:00:00+00:00', 'event': 'serving', 'attempt': float('inf')})


@pytest.mark.parametrize('text', [
    NESTED,
    '{"format": 2, "spec": "s", "launcher_pid": 1, "launcher_ident": "x", "started": 1.0, '
    '"progress": {"global_step": 1, "steps": 2, "at": "noon"}}',
    '{"format": 2, "spec": "s", "launcher_pid": "1", "launcher_ident": "x", "started": 1}',
    '{"format": "' + 'f' * 100_000 + '"}'], ids=['nested', 'a-time-of-words', 'a-pid-of-text', 'a-long-format'])
def test_a_hostile_state_file_is_one_line_naming_it(tmp_path, text):
    path = tmp_path / 'launch-state.json'
    path.write_text(text)
    with pytest.raises(StateError) as caught:
        LaunchState.load(str(path))
    assert str(path) in str(caught.value) and len(str(caught.value)) < 500


# -- finding 9: no NaN or Infinity in any JSON the project writes ------------------------------------------
def test_the_run_files_written_hold_no_nan_or_infinity(tmp_path, cli):
    """A diverged loss and an infinite rate are written null: JavaScript's JSON.parse and jq
    read every file; the launcher's own readers still read the NaN an older version wrote."""
    nan, inf = float('nan'), float('inf')
    train_dir = make_run(tmp_path, 'run', loss=nan)
    EventLog(rundir.events_path(train_dir), 'run-1', 1).emit(Progress(step=120, total=200, loss=nan,
                                                                       images_per_sec=inf))
    with open(rundir.events_path(train_dir)) as f:
        lines = [strict(line) for line in f]
    assert lines[-1]['loss'] is None and lines[-1]['images_per_sec'] is None
    assert lines[-2]['event'] == 'finished' and lines[-2]['result']['loss'] is None
    with open(rundir.run_path(train_dir)) as f:
        assert strict(f.read())['loss'] is None

    state = str(tmp_path / 'launch-state.json')
    LaunchState(spec='s.yaml', launcher_pid=1, launcher_ident='x', started=inf,
                progress=StepSeen(global_step=4, steps=8, at=nan), workers=WorkerPool(3, [0, 1])).save(state)
    with open(state) as f:
        assert strict(f.read())['progress']['at'] is None
    assert strict(Members(1, {0: 1}).to_text()) == {'epoch': 1, 'workers': {'0': 1}}


def test_an_older_run_json_with_nan_still_reads_and_the_json_printed_is_standard(tmp_path, cli):
    train_dir = make_run(tmp_path, 'run')
    with open(rundir.run_path(train_dir)) as f:
        record = json.load(f)
    record.update(loss=float('nan'), images_per_sec=float('inf'), seconds=float('-inf'))
    with open(rundir.run_path(train_dir), 'w') as f:
        json.dump(record, f)                    # as an older version wrote it: NaN, Infinity, -Infinity
    assert math.isnan(read_run_record(rundir.run_path(train_dir))['loss'])
    assert runs.describe(train_dir).state == 'done'
    code, out, warned = cli('status', train_dir, '--json')
    assert code == 0 and strict(out)['run']['state'] == 'done' and not warned
    code, out, warned = cli('list', str(tmp_path), '--json')
    assert code == 0 and strict(out)[0]['global_step'] == 200 and not warned
    assert 'nan' in report.render(train_dir)       # the page says the loss diverged rather than drop it


def test_every_json_writer_refuses_nan():
    """Each json.dump(s) in the project's code goes through runjson.dumps (NaN and Infinity
    written null) or says allow_nan=False (a value that cannot be one): a new writer must too."""
    offenders = []
    for top in ('cluster', 'launch', 'benchmarks'):
        for folder, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                path = os.path.join(folder, name)
                if not name.endswith('.py') or path.endswith(os.path.join('runtime', 'runjson.py')):
                    continue
                with open(path, encoding='utf-8') as f:
                    text = f.read()
                trees = [ast.parse(text)] + [ast.parse(c.value) for c in ast.walk(ast.parse(text))
                                             if isinstance(c, ast.Constant) and isinstance(c.value, str)
                                             and 'json.dump' in c.value and _parses(c.value)]
                for tree in trees:      # the scripts a module runs elsewhere (a remote probe) count too
                    for call in ast.walk(tree):
                        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                                and call.func.attr in ('dump', 'dumps') and isinstance(call.func.value, ast.Name)
                                and call.func.value.id == 'json'
                                and not any(k.arg == 'allow_nan' and isinstance(k.value, ast.Constant)
                                            and k.value.value is False for k in call.keywords)):
                            offenders.append(f'{os.path.relpath(path, REPO)}:{call.lineno}')
    assert not offenders, f'write JSON with runjson.dumps (or allow_nan=False): {offenders}'


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True
