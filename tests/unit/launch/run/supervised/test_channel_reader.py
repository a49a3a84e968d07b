"""The supervisor's reading of a task's channel (launch/run/supervised/channel.py): the new complete
records at each call, through the backend's read_log, from a file that grows while it is read."""
from __future__ import annotations

import threading
from collections.abc import Iterator

from cluster.runtime import messages
from launch.backends.base import TaskRecord
from launch.backends.tail import follow_file
from launch.run.supervised.channel import ChannelReader

RECORDS = [messages.to_record(m) for m in (messages.Checkpoint(1), messages.Checkpoint(2), messages.Checkpoint(3))]


class FileBackend:
    """What ChannelReader asks of a backend: read_log of a record's file, as the local one reads it."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.paths = fail, []

    def read_log(self, record: TaskRecord, follow: bool = False, stop: threading.Event | None = None,
                 offset: int = 0) -> Iterator[str]:
        self.paths.append(record.log)
        if self.fail:
            raise OSError('the host is gone')
        return follow_file(record.log, None, offset=offset)


def reader(tmp_path, backend: FileBackend) -> ChannelReader:
    log = str(tmp_path / 'worker-0.log')
    return ChannelReader(backend, TaskRecord('worker:0', 'worker', 0, 'localhost', 2223, 'local', 9, log))


def test_each_record_is_read_once_and_a_half_written_one_at_the_next_call(tmp_path):
    backend = FileBackend()
    read = reader(tmp_path, backend)
    assert read() == []         # no channel yet: no records
    channel = tmp_path / 'worker-0.records'
    channel.write_text(RECORDS[0] + '\n' + RECORDS[1][:12])
    assert read() == [RECORDS[0]]
    with open(channel, 'a') as f:
        f.write(RECORDS[1][12:] + '\n' + RECORDS[2] + '\n')
    assert read() == RECORDS[1:]
    assert read() == []
    assert backend.paths == [str(channel)] * 4


def test_a_line_that_is_no_record_is_passed_once_more_come(tmp_path):
    read = reader(tmp_path, FileBackend())
    (tmp_path / 'worker-0.records').write_text('garbage\n' + RECORDS[0] + '\n')
    assert read() == ['garbage', RECORDS[0]]      # the Reader passes what is no record by
    assert read() == []


def test_a_channel_that_cannot_be_read_has_no_records(tmp_path):
    assert reader(tmp_path, FileBackend(fail=True))() == []
