"""A train_dir is tfcluster's or refused (launch/records/ownership.py): `launch up` on a directory
of someone else's files is one line and exit code 2, and leaves every byte of it as it was; a new
directory, an empty one and an earlier run's (to resume it) are taken. Real files, no process."""
from __future__ import annotations

import json
import os

import pytest

from cluster.runtime import rundir
from launch.records import ownership
from launch.records.event_types import OtherEvent
from launch.records.events import EventLog
from launch.records.result import RunResult, RunState
from tests.conftest import write_spec
from tests.harness.ownership import snapshot, someone_elses


def test_up_on_a_directory_of_someone_elses_files_is_refused_and_touches_nothing(tmp_path, capsys):
    from launch.cli import main
    spec = write_spec(tmp_path, workers=1)
    train_dir = tmp_path / 'run'
    someone_elses(train_dir)
    before = snapshot(train_dir)
    assert main(['up', spec]) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1, err
    assert 'spec.yaml:' in err and 'train.train_dir: ' in err, err
    assert f'{train_dir} holds files tfcluster did not write (checkpoint, events.jsonl, logs and 4 more)' in err
    assert 'nothing there was touched: name a new or empty directory (--set train.train_dir=DIR)' in err
    assert snapshot(train_dir) == before        # no lock file, no event, nothing removed or rewritten


def _earlier_run(train_dir) -> None:
    """What a tfcluster run leaves: its event log, its result, its tasks' files."""
    os.makedirs(train_dir / 'logs' / 'attempt-1')
    EventLog(rundir.events_path(str(train_dir)), 'spec-20260101-000000', 1).emit(OtherEvent(event='run_started', extra={'launcher_pid': 1}))
    (train_dir / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-40"\n')
    (train_dir / 'worker-0.json').write_text(json.dumps({'task': 'worker:0', 'global_step': 40}))


def _result_only(train_dir) -> None:
    """An earlier run whose event log is gone: run.json still says it was tfcluster's."""
    os.makedirs(train_dir)
    record = RunResult(RunState.INTERRUPTED, 130).to_json('spec-1', 2, '/x/spec.yaml', 'local', str(train_dir))
    (train_dir / 'run.json').write_text(json.dumps(record))
    (train_dir / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-40"\n')


def _state_only(train_dir) -> None:
    """A launcher killed hard after its first task started, its event log since removed."""
    from launch.run.state import LaunchState
    os.makedirs(train_dir)
    LaunchState.new('/x/spec.yaml', '123').save(rundir.state_path(str(train_dir)))


def _before_its_first_event(train_dir) -> None:
    """A `launch up` that ended before its run began: its lock file and the synthetic data set."""
    os.makedirs(train_dir / rundir.SYNTHETIC_DATA_DIR)
    (train_dir / rundir.LOCK_FILE).write_text('')
    (train_dir / rundir.SYNTHETIC_DATA_DIR / 'data_batch_1.bin').write_bytes(b'\x01' * 16)
    (train_dir / rundir.EVENTS_FILE).write_text('')


def _rehearsed_only(train_dir) -> None:
    """What `launch up --rehearse` leaves before the real run: its own run in rehearsal/."""
    _earlier_run(train_dir / rundir.REHEARSAL_DIR)


@pytest.mark.parametrize('make', [None, os.makedirs, _earlier_run, _result_only, _state_only,
                                  _before_its_first_event, _rehearsed_only])
def test_new_empty_and_earlier_tfcluster_directories_are_taken(tmp_path, make):
    train_dir = tmp_path / 'run'
    if make is not None:
        make(train_dir)
    assert ownership.foreign_files(str(train_dir)) == []


def test_a_rehearsal_folder_that_is_no_run_of_tfclusters_is_someone_elses(tmp_path):
    """Only a rehearsal that is a tfcluster run passes: a user's own folder named rehearsal/, or
    a file of that name, is named as foreign."""
    train_dir = tmp_path / 'run'
    os.makedirs(train_dir / rundir.REHEARSAL_DIR)
    (train_dir / rundir.REHEARSAL_DIR / 'notes.txt').write_text('mine')
    assert ownership.foreign_files(str(train_dir)) == [rundir.REHEARSAL_DIR]
    other = tmp_path / 'other'
    os.makedirs(other)
    (other / rundir.REHEARSAL_DIR).write_text('a file')
    assert ownership.foreign_files(str(other)) == [rundir.REHEARSAL_DIR]


def test_markers_that_are_not_tfclusters_format_mark_nothing(tmp_path):
    """A hostile or damaged event log (one line of 100,000 nested arrays, a line over the size a
    marker may have, a run id that is not a string) marks nothing: a checkpoint beside it is
    someone else's. Never a RecursionError."""
    train_dir = tmp_path / 'run'
    os.makedirs(train_dir)
    event = {'time': '2026-01-01T00:00:00+00:00', 'run': 5, 'attempt': 1, 'event': 'run_started'}
    (train_dir / 'events.jsonl').write_text('[' * 100_000 + ']' * 100_000 + '\n'
                                            + json.dumps({**event, 'pad': 'x' * ownership.MARKER_BYTES}) + '\n'
                                            + json.dumps(event) + '\n')
    (train_dir / 'run.json').write_text('[' * 100_000 + ']' * 100_000)
    (train_dir / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-1"\n')
    assert ownership.foreign_files(str(train_dir)) == ['checkpoint', 'events.jsonl', 'run.json']
    with open(train_dir / 'events.jsonl', 'a') as f:      # a launcher's event after all: the run is tfcluster's
        f.write(json.dumps({**event, 'run': 'spec-1'}) + '\n')
    assert ownership.foreign_files(str(train_dir)) == []


def test_only_a_tasks_own_closing_figures_are_removed_as_stale(tmp_path):
    """Lifecycle.up removes an earlier run's worker-N.json so it cannot pass for this run's; a
    file there that no task of tfcluster wrote is not removed."""
    ours, theirs, torn = tmp_path / 'worker-0.json', tmp_path / 'worker-1.json', tmp_path / 'worker-2.json'
    ours.write_text(json.dumps({'task': 'worker:0', 'global_step': 40, 'loss': 1.5}))
    theirs.write_text(json.dumps({'their': 'figures'}))
    torn.write_text('{"task": "wor')
    assert ownership.written_by_task(str(ours))
    assert not ownership.written_by_task(str(theirs)) and not ownership.written_by_task(str(torn))
    assert not ownership.written_by_task(str(tmp_path / 'worker-3.json'))
