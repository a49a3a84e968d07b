"""A task started again within its attempt (launch/run/supervised/channel.py, cluster/runtime/messages.py):
its log is appended to, its channel is emptied as it starts (clear_channel, what the local and the SSH
backends do), so the reader of the new start, and the reader of a launcher that resumes the run, read
the channel from byte 0 and take the new start's records alone. Fast: real files, no process."""
from __future__ import annotations

import logging
import os

from cluster.runtime import messages, rundir
from launch.backends.base import TaskRecord
from launch.backends.local import LocalBackend
from launch.run.supervised.channel import ChannelReader

# A train.command's own progress line: it writes no record, and shows what start 1's record showed.
OWN_LINE = '2026-11-28T03:00:00.000+00:00 I step 40/100  loss 0.500'
FIRST = [messages.Serving('worker:0', 'localhost:2223', 10), messages.progress(40, 100, 0.5, '  1.5 global steps/s')]
SECOND = [messages.Serving('worker:0', 'localhost:2223', 11), messages.progress(60, 100, 0.25, '  2.5 global steps/s'),
          messages.Checkpoint(60)]


def start(log_path: str, pid: int, said: list[messages.Message], own_lines: tuple[str, ...] = ()) -> TaskRecord:
    """One start of worker:0 as a backend makes it: the channel emptied, the log's offset taken, then
    the task's lines (a train.command's own first) and its messages, each said as the task says it."""
    channel = messages.channel_beside(log_path)
    messages.clear_channel(channel)
    offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    with open(log_path, 'a') as f:
        f.writelines(line + '\n' for line in own_lines)
    log = logging.getLogger(f'test-channel-restart-{pid}')
    log.propagate = False
    log.setLevel(logging.INFO)
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter(rundir.LOG_FORMAT))
    log.addHandler(handler)
    try:
        for message in said:
            messages.say(log, message, environ={messages.CHANNEL_ENV: channel})
    finally:
        log.removeHandler(handler)
        handler.close()
    return TaskRecord('worker:0', 'worker', 0, 'localhost', 2223, 'local', pid, log_path, log_offset=offset)


def taken(backend: LocalBackend, record: TaskRecord) -> list[messages.Message]:
    """The messages a launcher's reader of this start takes, following its log from its offset."""
    reader = messages.Reader(ChannelReader(backend, record))
    lines = backend.read_log(record, offset=record.log_offset)
    return [m for m in map(reader.read, lines) if m is not None]


def test_a_new_start_reads_its_own_records_and_never_the_earlier_start_s(tmp_path):
    log_path = str(tmp_path / 'logs' / 'attempt-1' / 'worker-0.log')
    os.makedirs(os.path.dirname(log_path))
    backend = LocalBackend()
    start(log_path, 10, FIRST)
    second = start(log_path, 11, SECOND, own_lines=(OWN_LINE,))
    channel = messages.channel_beside(log_path)
    assert [messages.read(r) for r in open(channel).read().splitlines()] == [messages.as_shown(m) for m in SECOND]
    assert sum('serving on' in line for line in open(log_path)) == 2       # the log keeps both starts
    # The own line is read by its words (no rate), not answered by start 1's record of the same figures.
    expected = [messages.Progress(40, 100, 0.5), *(messages.as_shown(m) for m in SECOND)]
    assert taken(backend, second) == expected
    assert taken(backend, second) == expected       # a launcher that resumes the run: a fresh reader, the same


def test_clearing_a_channel_that_is_not_there_or_cannot_go_is_no_error(tmp_path):
    messages.clear_channel(str(tmp_path / 'none.records'))
    kept = tmp_path / 'dir.records'
    kept.mkdir()        # not a file: unlink refuses it, the start goes on
    messages.clear_channel(str(kept))
    assert kept.is_dir()
