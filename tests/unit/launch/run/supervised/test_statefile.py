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
