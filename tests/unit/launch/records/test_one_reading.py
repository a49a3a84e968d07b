"""Every reader of a run's records reads them one way, the typed one (event_types.parse_event,
result.RunRecord): `launch list`, the next `launch up`'s identity, `launch debug` and `launch
report` agree on the attempt of a hand-edited line, and skip the same damaged ones."""
from __future__ import annotations

import json
import logging
import types

import pytest

from cluster.runtime import rundir
from launch.commands.debug import current_attempt
from launch.records import timeline
from launch.records.event_types import Finished, Progress, RunStarted
from launch.records.events import read_events, typed_events, typed_run_record
from launch.records.runs import describe
from launch.run.lifecycle import identify

TIME = '2026-11-23T21:08:43.000+00:00'
RUN = 'local2-20261123-210843'


def _line(attempt: object = None, event: str = 'progress', **fields: object) -> str:
    line: dict[str, object] = {'time': TIME, 'run': RUN}
    if attempt is not None:
        line['attempt'] = attempt
    return json.dumps({**line, 'event': event, **fields})


def _run(tmp_path, *lines: str) -> str:
    train_dir = tmp_path / 'run'
    train_dir.mkdir()
    (train_dir / rundir.EVENTS_FILE).write_text(''.join(f'{line}\n' for line in lines))
    return str(train_dir)


def _identify(train_dir: str) -> tuple[str, int]:
    spec = types.SimpleNamespace(path='/specs/local2.yaml', train=types.SimpleNamespace(train_dir=train_dir))
    return identify(spec)   # type: ignore[arg-type]   # identify reads only these two


def _readers(train_dir: str) -> dict[str, int | None]:
    """The attempt each reader takes the run to be at (identify: the one before the next)."""
    info = describe(train_dir)
    assert info is not None
    return {'list': info.attempts, 'up': _identify(train_dir)[1] - 1, 'debug': current_attempt(train_dir),
            'report': max((a.number for a in timeline.attempts(timeline.load(train_dir))), default=None)}


@pytest.mark.parametrize('attempt, read', [
    (3, 3),                 # as tfcluster writes it
    (True, 1),              # a hand-edited line: what read_attempt makes of it
    (None, 1),              # no attempt: a line of the first attempt
    (2.0, 2),               # a whole number written as a float
])
def test_every_reader_takes_an_odd_attempt_the_same_way(tmp_path, attempt, read):
    train_dir = _run(tmp_path, _line(1, 'run_started', spec='/specs/local2.yaml'), _line(attempt, step=5))
    assert _readers(train_dir) == dict.fromkeys(('list', 'up', 'debug', 'report'), read)


def test_a_line_whose_attempt_is_no_number_is_skipped_by_every_reader_with_one_warning(tmp_path, caplog):
    train_dir = _run(tmp_path, _line(1, 'run_started'), _line('many', step=5), _line(2, step=7))
    with caplog.at_level(logging.WARNING):
        assert _readers(train_dir) == {'list': 2, 'up': 2, 'debug': 2, 'report': 2}
        assert [type(e) for e in typed_events(rundir.events_path(train_dir))] == [RunStarted, Progress]
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == [f'{rundir.events_path(train_dir)}: skipped 1 line(s) damaged (line 2)'], warned
    assert len(read_events(rundir.events_path(train_dir))) == 3        # the raw objects: the file as written


def test_a_header_that_is_no_text_reads_as_none_given(tmp_path):
    """`time` or `run` of another type is '' (not its str()): `launch list` shows no start and no id
    from it, as before, and the next `launch up` takes no id from it."""
    train_dir = _run(tmp_path, json.dumps({'time': None, 'run': 5, 'attempt': 1, 'event': 'progress', 'step': 3}))
    [event] = typed_events(rundir.events_path(train_dir))
    assert (event.time, event.run) == ('', '')
    info = describe(train_dir)
    assert info is not None and (info.id, info.started, info.global_step) == ('run', '', 3)
    assert _identify(train_dir)[1] == 1 and _identify(train_dir)[0] != '5'


def test_run_json_typed_is_empty_where_missing_or_damaged(tmp_path):
    path = tmp_path / rundir.RUN_FILE
    assert typed_run_record(str(path)).is_empty()
    path.write_text('["a list"]')
    assert typed_run_record(str(path)).is_empty()
    path.write_text(json.dumps({'state': 'done', 'attempt': 2, 'id': RUN}))
    record = typed_run_record(str(path))
    assert (record.state, record.attempt, record.id) == ('done', 2, RUN)


def test_a_finished_event_of_a_newer_attempt_outranks_an_older_run_json(tmp_path):
    train_dir = _run(tmp_path, _line(1, 'run_started'), _line(2, 'run_started'),
                     _line(2, 'finished', result={'state': 'failed', 'exit_code': 1, 'global_step': 9, 'attempt': 2}))
    (tmp_path / 'run' / rundir.RUN_FILE).write_text(json.dumps({'state': 'done', 'exit_code': 0, 'attempt': 1,
                                                                'global_step': 4}))
    info = describe(train_dir)
    assert info is not None and (info.state, info.exit_code, info.global_step, info.attempts) == ('failed', 1, 9, 2)
    assert isinstance(typed_events(rundir.events_path(train_dir))[-1], Finished)
