"""What one supervisor round and one start-up poll cost, counted on the fake backend: each backend
is asked once per round for all of its tasks (status_many), the disk under the tasks once per log
folder, a task's gRPC channel opened only once it reported serving and closed once ready, and the
state file's fingerprint moves only with what the file says."""
from __future__ import annotations

import threading

import pytest

from launch.backends.base import TaskRecord
from launch.run.state import LaunchState, StepSeen
from launch.run.supervised import startup
from launch.run.supervised.attempt import Attempt
from launch.run.supervised.faults import TaskFailed
from tests.conftest import write_spec
from tests.harness.fake_backend import FakeBackend, fake_cluster, record_of


class Counting(FakeBackend):
    """The fake backend, counting how it is asked."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.many: list[int] = []
        self.disks: list[str] = []

    def status_many(self, records):
        self.many.append(len(records))
        return {r.name: self.status(r) for r in records}

    def disk_full(self, record: TaskRecord) -> str | None:
        self.disks.append(record.name)
        return None


def cluster(tmp_path, workers=6, script=None):
    _, plans = fake_cluster(write_spec(tmp_path, workers=workers))
    backend = Counting({p.name: None for p in plans} | (script or {}))
    return [record_of(p) for p in plans], {'fake': backend}, backend


def test_a_round_asks_each_backend_once_for_all_its_tasks(tmp_path):
    records, backends, backend = cluster(tmp_path, script={'worker:3': -9})
    statuses = Attempt().observe(records, backends, lambda line: None)
    assert backend.many == [len(records)]
    assert [t.name for t in statuses if t.exit_code == -9] == ['worker:3']


def test_the_disk_is_looked_at_once_per_log_folder(tmp_path):
    records, backends, backend = cluster(tmp_path)
    Attempt().observe(records, backends, lambda line: None)     # the first round reads the pulses and disks
    assert len(backend.disks) == 1          # every fake task logs under logs/


class Channel:
    def __init__(self, opened: list[Channel], target: str) -> None:
        self.target, self.closed = target, False
        opened.append(self)

    def close(self) -> None:
        self.closed = True


class Ready:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def done(self) -> bool:
        return True

    def cancel(self) -> bool:
        return True


@pytest.fixture
def channels(monkeypatch):
    opened: list[Channel] = []
    monkeypatch.setattr(startup.grpc, 'insecure_channel', lambda target, options=None: Channel(opened, target))
    monkeypatch.setattr(startup.grpc, 'channel_ready_future', Ready)
    monkeypatch.setattr(startup, 'CLOSE_AFTER_SECS', 0.0)      # closed at once, not by a timer
    return opened


def test_a_channel_is_opened_only_for_a_task_that_reported_serving(tmp_path, channels):
    records, backends, _ = cluster(tmp_path, workers=3)
    with pytest.raises(TaskFailed):
        startup.wait_for_servers(records, backends, 0.0, threading.Event(), reported=lambda name: name != 'worker:1')
    by_name = {r.endpoint: r.name for r in records}
    assert sorted(by_name[c.target] for c in channels) == sorted(r.name for r in records if r.name != 'worker:1')
    assert all(c.closed for c in channels)


def test_every_channel_is_closed_once_all_are_up(tmp_path, channels):
    records, backends, backend = cluster(tmp_path, workers=3)
    startup.wait_for_servers(records, backends, float('inf'), threading.Event())
    assert len(channels) == len(records) and all(c.closed for c in channels)
    assert backend.many and set(backend.many) == {len(records)}


def test_the_fingerprint_moves_with_what_the_state_file_says():
    state = LaunchState('spec.yaml', 1, 'x', 0.0, [TaskRecord('ps:0', 'ps', 0, 'localhost', 2222, 'local', 7, '/l')])
    state.progress = StepSeen(10, 100, 1000.0)
    before = state.fingerprint()
    state.progress = StepSeen(10, 100, 1000.000001)     # the same step, its time computed again
    assert state.fingerprint() == before
    state.progress = StepSeen(11, 100, 1001.0)
    assert state.fingerprint() != before
    moved = state.fingerprint()
    state.tasks = [TaskRecord('ps:0', 'ps', 0, 'localhost', 2222, 'local', 8, '/l')]    # started again
    assert state.fingerprint() != moved


def test_the_state_file_is_written_again_only_when_it_changed(tmp_path):
    path = str(tmp_path / 'launch-state.json')
    state = LaunchState('spec.yaml', 1, 'x', 0.0, [TaskRecord('ps:0', 'ps', 0, 'localhost', 2222, 'local', 7, '/l')])
    state.save(path)
    (tmp_path / 'launch-state.json').unlink()
    state.save(path, changed_only=True)
    assert not (tmp_path / 'launch-state.json').exists()
    state.progress = StepSeen(3, 100, 1000.0)
    state.save(path, changed_only=True)
    assert LaunchState.load(path).progress == state.progress
