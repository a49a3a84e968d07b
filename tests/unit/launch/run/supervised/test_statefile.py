"""The state file as the supervisor writes it (launch/run/supervised/statefile.py): rewritten once a
second only when what it says changed, and a write that fails said once."""
from __future__ import annotations

import os

from cluster.spec import load_spec
from launch.backends.base import TaskRecord
from launch.planning.plan import plan_cluster, state_path
from launch.run.supervised.state import SupervisorState
from launch.run.supervised.statefile import StateFile
from tests.conftest import write_spec


def _state(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    state = SupervisorState.new(spec, plan_cluster(spec), None)
    state.started(TaskRecord('ps:0', 'ps', 0, 'localhost', 2222, 'local', 7, '/l'))
    return spec, state


def test_the_once_a_second_save_writes_only_what_changed(tmp_path):
    spec, state = _state(tmp_path)
    said: list[str] = []
    written = StateFile(spec, said.append, lambda: False)
    written.save(state, None)
    os.unlink(state_path(spec))
    written.save(state, None, changed_only=True)           # the same: not written again
    assert not os.path.exists(state_path(spec))
    state.started(TaskRecord('ps:0', 'ps', 0, 'localhost', 2222, 'local', 8, '/l'))     # started again
    written.save(state, None, changed_only=True)
    assert os.path.exists(state_path(spec)) and said == []


def test_a_write_that_fails_is_said_once_unless_the_disk_watch_named_it(tmp_path):
    spec, state = _state(tmp_path)
    said: list[str] = []
    os.makedirs(os.path.dirname(state_path(spec)), exist_ok=True)
    os.makedirs(state_path(spec))                  # a folder where the file goes: every write fails
    written = StateFile(spec, said.append, lambda: False)
    written.save(state, None)
    written.save(state, None)
    assert len(said) == 1 and said[0].startswith(f'warning: cannot write {state_path(spec)}: '), said
    quiet: list[str] = []
    StateFile(spec, quiet.append, lambda: True).save(state, None)
    assert quiet == []


def test_a_newer_step_alone_is_written_at_the_pace_the_run_size_allows(tmp_path, monkeypatch):
    from launch.run.supervised import statefile
    spec, state = _state(tmp_path)
    written = StateFile(spec, [].append, lambda: False)
    written.save(state, None)
    os.unlink(state_path(spec))
    state.attempt.saw_step(10)
    written.save(state, None, changed_only=True)           # a step alone, within the second: not yet
    assert not os.path.exists(state_path(spec))
    written._saved_at -= statefile.PROGRESS_SECS
    written.save(state, None, changed_only=True)
    assert '"global_step": 10' in open(state_path(spec)).read()
    monkeypatch.setattr(statefile, 'TASKS_PER_PROGRESS_SEC', 0.1)     # as if 10 times the tasks: 10 s
    state.attempt.saw_step(20)
    written._saved_at -= statefile.PROGRESS_SECS
    written.save(state, None, changed_only=True)
    assert '"global_step": 10' in open(state_path(spec)).read()
    state.started(TaskRecord('ps:0', 'ps', 0, 'localhost', 2222, 'local', 8, '/l'))     # a task's change: at once
    written.save(state, None, changed_only=True)
    assert '"global_step": 20' in open(state_path(spec)).read()
