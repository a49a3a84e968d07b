"""The typed run records against what docs/runs.md documents: every event kind of its table and
every field of `run.json`, read through the types and written back byte for byte; the typed
writers against the (kind, **fields) calls they replace; the state file's entries."""
from __future__ import annotations

import json
import math
import os
import pathlib
import re
from typing import Any

import pytest

from cluster.runtime import rundir, runjson
from launch.records.event_types import (EVENT_TYPES, HEADER, EventKind, Finished, OtherEvent, Progress, TaskLost,
                                        parse_event)
from launch.records.events import EventLog, read_events
from launch.records.rehearsal import Rehearsal, RehearsedLink
from launch.records.result import MendedFault, RESULT_STATES, Failure, RunRecord, RunResult, RunState
from launch.run.state import LaunchState, StepSeen, WorkerPool
from tests.conftest import REPO

RUNS_PAGE = os.path.join(REPO, 'docs', 'runs.md')
TIME = '2026-11-23T21:08:43.123+01:00'
RUN_ID = 'local2-20261123-210843'

# A value for each documented field, as the launcher writes it (by event where the name is shared).
VALUES = {
    'spec': '/home/me/specs/local2.yaml', 'overrides': ['train.steps=200'], 'cwd': '/home/me', 'backend': 'local',
    'spec_hash': 'ab' * 32, 'train_dir': '/home/me/runs/local2', 'launcher_pid': 4242, 'resumes_from': None,
    'task': 'ps:0', 'host': 'localhost', 'pid': 5001, 'container': 'local2-ps-0-1', 'job': '1234', 'step': 40,
    'total': 200, 'loss': 2.305, 'images_per_sec': 412.5, 'cause': 'ps:0 was killed by SIGKILL', 'exit_code': -9,
    'signal': 'SIGKILL', 'error': 'UnavailableError: Socket closed', 'tasks': ['ps:0', 'worker:0'], 'from_step': 40,
    'to': 3, 'add': ['worker:2'], 'remove': [], 'state': 'done', 'workers': [0, 1, 2],
    'metrics': {'accuracy': 0.8125, 'loss': 0.5}, 'seconds': 6.25, 'steps_redone': 12,
    'phases': {'stop': 0.5, 'backoff': 1.0, 'start': 3.25, 'step': 1.5}, 'preempted': True, 'warm': True,
    'standby': 2, 'cold': 1,
    'path': '/home/me/runs/local2',
    'stacks': 'stacks/attempt-1', 'no_stacks': ['worker:1'],
    'before': '127.0.0.4:2222', 'address': '127.0.0.3:2222', 'grace': 30.0, 'checkpoint': 800,
    'steps_per_sec': 6.81, 'median': 17.0,
}
SPEC, TRAIN_DIR = '/home/me/specs/local2.yaml', '/home/me/runs/local2'
BY_EVENT = {('evaluation', 'task'): 'evaluator:0', ('failover', 'to'): 'worker:3', ('failover', 'task'): 'worker:1',
            ('stall', 'cause'): 'no new step for 60s', ('disk_full', 'cause'): 'No space left on device (ENOSPC)',
            ('sample', 'tasks'): {'ps:0': {'cpu': 0.4, 'rss': 650000000, 'in_per_sec': 9100000.0},
                                  'worker:0': {'steps': 40, 'steps_per_sec': 3.25, 'cpu': 0.97}},
            ('straggler', 'task'): 'worker:2', ('straggler', 'cause'): 'it waits, on its input or on its link'}


def _runs_page() -> str:
    with open(RUNS_PAGE, encoding='utf-8') as f:
        return f.read()


def _names(text: str) -> list[str]:
    """The `field` names of a table cell or sentence of the page, leaving out what parentheses say about them."""
    while re.search(r'\([^()]*\)', text):
        text = re.sub(r'\([^()]*\)', '', text)
    return [n for n in re.findall(r'`([^`]+)`', text) if re.fullmatch(r'[a-z_]+', n)]


def documented_events() -> dict[str, list[str]]:
    """docs/runs.md's events table: event -> the fields it names, in order."""
    text = _runs_page()
    table = text[text.index('| event | fields |'):]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith('|'):
            break
        _, event, fields, _ = line.split('|', 3)
        rows[event.strip().strip('`')] = _names(fields)
    return rows


def documented_run_json() -> tuple[list[str], list[str], list[str]]:
    """docs/runs.md's run.json paragraph: (its fields, a failure's fields, the states it names)."""
    text = _runs_page()
    start = text.index("**`run.json`** (and `finished`'s `result`):")
    paragraph = text[start:text.index('\n\n', start)].split(':', 1)[1]
    failure = re.search(r'`failures` \(each with ([^)]*)\)', paragraph)
    states = re.search(r'`state`\s*\(([^)]*)\)', paragraph)
    assert failure and states, 'docs/runs.md: the run.json paragraph no longer names the failures\' fields or the states'
    return _names(paragraph), _names(failure.group(1)), re.findall(r'`([a-z]+)`', states.group(1))


def run_json_example() -> dict:
    """A run.json as the launcher writes it: every documented field, in the launcher's order."""
    result = RunResult(state=RunState.FAILED, exit_code=1, seconds=33.4567, global_step=57, images_per_sec=421.7,
                       loss=float('nan'), restarts=1, failures=[Failure('ps:0', 'ps:0 was killed by SIGKILL',
                                                                        'localhost', 5001)],
                       recoveries=[MendedFault(['ps:0'], 6.25, 12, {'stop': 0.5, 'backoff': 1.0, 'start': 3.25,
                                                                     'step': 1.5})],
                       started=1795468123.0, ended=1795468156.5,
                       rehearsal=Rehearsal(tasks=2, links=[RehearsedLink(source='worker:0', target='ps:0', address='h:1',
                                                                         rtt_ms=0.5, mb_per_s=120.0, error='')],
                                           unreported=[]), preemptions=1, dropped_gradients=28)
    return result.to_json(RUN_ID, 2, SPEC, 'local', TRAIN_DIR)


def event_example(event: str, fields: list[str]) -> dict:
    line = {'time': TIME, 'run': RUN_ID, 'attempt': 1, 'event': event}
    for name in fields:
        line[name] = run_json_example() if name == 'result' else BY_EVENT.get((event, name), VALUES[name])
    return line


def dumped(line: dict) -> str:
    """One line as EventLog writes it."""
    return json.dumps(line, default=str) + '\n'


# -- docs/runs.md's events.jsonl --------------------------------------------------------------------
def test_every_documented_event_is_a_kind_with_a_type_and_every_kind_is_documented() -> None:
    documented = documented_events()
    assert set(documented) == {k.value for k in EventKind}
    for event, fields in documented.items():
        cls = EVENT_TYPES[event]
        assert cls.kind == EventKind(event) and fields, event
        own = cls.json_fields()
        assert set(fields) <= set(own), (event, fields, own)
        assert set(own) - set(fields) <= cls.OPTIONAL, (event, 'an undocumented field must be optional')


@pytest.mark.parametrize('event', [k.value for k in EventKind])
def test_a_documented_event_line_reads_back_and_writes_back_unchanged(event: str) -> None:
    line = event_example(event, documented_events()[event])
    text = dumped(line)
    typed = parse_event(json.loads(text))
    assert type(typed) is EVENT_TYPES[event] and typed.kind == event
    assert (typed.time, typed.run, typed.attempt) == (TIME, RUN_ID, 1)
    assert dumped(typed.to_json()) == text
    assert list(typed.to_json())[:4] == list(HEADER)


def test_typed_fields_read_as_their_types() -> None:
    lost = parse_event(event_example('task_lost', documented_events()['task_lost']))
    assert isinstance(lost, TaskLost)
    assert (lost.task, lost.cause, lost.exit_code, lost.signal) == ('ps:0', VALUES['cause'], -9, 'SIGKILL')
    done = parse_event(event_example('finished', ['result']))
    assert isinstance(done, Finished) and done.result is not None and done.result.loss is not None
    assert done.result.state is RunState.FAILED and done.result.failures == [
        Failure('ps:0', 'ps:0 was killed by SIGKILL', 'localhost', 5001)]
    assert math.isnan(done.result.loss) and done.epoch == pytest.approx(1795464523.123)


def test_a_partial_foreign_or_mistyped_line_keeps_its_keys_and_reads_what_it_can() -> None:
    line = {'time': TIME, 'run': RUN_ID, 'attempt': 2, 'event': 'progress', 'new_field': {'x': 1}, 'step': 'many',
            'loss': 1}
    typed = parse_event(line)
    assert isinstance(typed, Progress)
    assert (typed.step, typed.loss, typed.total, typed.has('total')) == (None, 1, None, False)
    assert list(typed.to_json()) == list(line) and typed.to_json()['new_field'] == {'x': 1}
    assert dumped(parse_event({**line, 'step': 7}).to_json()) == dumped({**line, 'step': 7})
    other = parse_event({'time': TIME, 'run': RUN_ID, 'attempt': 1, 'event': 'rebalanced', 'shards': [1, 2]})
    assert isinstance(other, OtherEvent) and dumped(other.to_json()) == dumped(
        {'time': TIME, 'run': RUN_ID, 'attempt': 1, 'event': 'rebalanced', 'shards': [1, 2]})
    with pytest.raises(ValueError):
        parse_event({**line, 'attempt': 'two'})
    with pytest.raises(ValueError):
        _ = parse_event({**line, 'time': 'yesterday'}).epoch


def test_a_typed_event_is_logged_as_the_same_line_as_its_kind_and_fields(tmp_path: pathlib.Path) -> None:
    """EventLog.emit(typed) and EventLog.emit(kind, **fields) write the same bytes (but the time)."""
    by_fields, by_type = EventLog(str(tmp_path / 'a.jsonl'), RUN_ID, 3), EventLog(str(tmp_path / 'b.jsonl'), RUN_ID, 3)
    where: dict[str, list[tuple[str, Any]]] = {'task_started': [('task', 'ps:0'), ('host', 'h'), ('pid', None)],
             'restart': [('cause', 'scale 2 -> 3 workers'), ('from_step', 80)]}
    for event, fields in documented_events().items():
        values: list[tuple[str, Any]] = where.get(event) or list(event_example(event, fields).items())[4:]
        with open(by_fields.path, 'a') as written:      # the line of the kind and its fields, by hand
            written.write(runjson.dumps({'time': TIME, 'run': RUN_ID, 'attempt': 3, 'event': event, **dict(values)},
                                        runjson.MAX_TEXT, default=str) + '\n')
        by_type.emit(parse_event({'time': TIME, 'event': event, **dict(values)}))
    strip = re.compile(r'^\{"time": "[^"]*", ')
    with open(by_fields.path) as a, open(by_type.path) as b:
        assert [strip.sub('', x) for x in a] == [strip.sub('', x) for x in b]
    assert len(read_events(by_type.path)) == len(EventKind)


# -- docs/runs.md's run.json -----------------------------------------------------------------------
def test_the_documented_run_json_fields_and_states_are_the_records() -> None:
    fields, failure, states = documented_run_json()
    assert set(fields) == set(RunRecord.json_fields()) and len(fields) == len(RunRecord.json_fields())
    assert failure == list(Failure.json_fields())
    assert states == [s.value for s in RESULT_STATES]


def test_run_json_reads_back_and_writes_back_unchanged() -> None:
    record = run_json_example()
    text = json.dumps(record, indent=1) + '\n'          # as the launcher writes run.json
    typed = RunRecord.from_json(json.loads(text))
    assert json.dumps(typed.to_json(), indent=1) + '\n' == text
    assert list(record) == list(RunRecord.json_fields())
    result = RunResult.from_json(json.loads(text))
    assert (result.state, result.exit_code, result.global_step, result.restarts) == (RunState.FAILED, 1, 57, 1)
    assert result.started == 1795468123.0 and result.ended == 1795468156.5
    assert result.to_json(RUN_ID, 2, SPEC, 'local', TRAIN_DIR) == {**record, 'loss': result.loss}


def test_a_partial_run_json_says_which_fields_it_has() -> None:
    typed = RunRecord.from_json({'id': RUN_ID, 'state': 'interrupted', 'exit_code': 130, 'global_step': None})
    assert typed.state is RunState.INTERRUPTED and typed.has('global_step') and not typed.has('loss')
    assert list(typed.to_json()) == ['id', 'state', 'exit_code', 'global_step']
    assert RunRecord.from_json({}).is_empty() and RunRecord.from_json({'state': 'paused'}).state == 'paused'


def test_run_states_are_strings_and_say_which_end_a_run() -> None:
    assert [s for s in RunState if s.is_terminal()] == [RunState.DONE, RunState.FAILED, RunState.INTERRUPTED]
    assert RunState('done') == 'done' and f'{RunState.SCALED}' == 'scaled'
    assert json.dumps({'state': RunState.UNKNOWN}) == '{"state": "unknown"}'
    assert RunResult(state='scaled', exit_code=0).state is RunState.SCALED     # type: ignore[arg-type]


# -- the state file and task names -----------------------------------------------------------------
def test_the_state_files_entries_are_dataclasses_and_the_file_is_unchanged(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / 'launch-state.json')
    state = LaunchState(spec='s.yaml', launcher_pid=1, launcher_ident='x', started=1.5,
                        progress=StepSeen(global_step=40, steps=200, at=2.5),
                        workers=WorkerPool(pool=3, live=[0, 2], scaling=None), restarts=1)
    state.save(path)
    with open(path) as f:
        text = f.read()
    assert json.loads(text)['progress'] == {'global_step': 40, 'steps': 200, 'at': 2.5}
    assert list(json.loads(text)['workers']) == ['pool', 'live', 'scaling']
    loaded = LaunchState.load(path)
    assert loaded is not None and loaded.progress is not None and loaded.workers is not None
    assert loaded.progress == StepSeen(40, 200, 2.5) and loaded.workers.live == [0, 2]
    assert loaded.workers.to_json()['live'] == [0, 2] and loaded.progress.to_json() == json.loads(text)['progress']
    loaded.save(path)
    with open(path) as f:
        assert f.read() == text
    state.progress = StepSeen.from_json({'global_step': 40, 'steps': 200, 'at': 2.5})
    state.save(path)
    with open(path) as f:
        assert f.read() == text


def test_task_names_are_parsed_in_one_place() -> None:
    assert rundir.parse_task_name('worker:12') == ('worker', 12) and rundir.task_name('ps', 0) == 'ps:0'
    for bad in ('evaluator', 'worker:', 'worker:x', 'worker:1:2', ':1', 'worker:-1', 'worker:\u00b2'):
        with pytest.raises(ValueError):
            rundir.parse_task_name(bad)
