"""A task's log followed with its channel (Lifecycle.follow with a ChannelReader over the local
backend's files): the events are the ones its lines alone gave, in the same order, and the
messages taken are the records. Fast: real files, the real follower thread; no process."""
from __future__ import annotations

import io
import logging
import os

from cluster.runtime import messages, rundir
from cluster.spec import load_spec
from launch.backends.local import LocalBackend
from launch.planning.plan import plan_cluster
from launch.records.events import EventLog, read_events
from launch.run.console import Console
from launch.run.lifecycle import Lifecycle
from launch.run.supervised.channel import ChannelReader
from tests.conftest import write_spec

SAID: list[messages.Message] = [
    messages.Serving('worker:0', 'localhost:2223', 77),
    messages.progress(10, 100, 2.5, '  40 images/s'),
    messages.Checkpoint(10),
    messages.progress(20, 100, 2.25, '  41 images/s'),
]


def follow(tmp_path, name: str, channel: bool) -> tuple[list[tuple], list[messages.Message | None]]:
    """worker:0's log (what SAID says, with a line of its own) followed to its end: the events
    written (without their times) and the messages the Reader took, line by line."""
    (tmp_path / name).mkdir()
    spec = load_spec(write_spec(tmp_path / name))
    backend = LocalBackend()
    record = backend.log_record(next(p for p in plan_cluster(spec) if p.name == 'worker:0'))
    os.makedirs(os.path.dirname(record.log), exist_ok=True)
    log = logging.getLogger(f'test-follow-{name}')
    log.propagate = False
    log.setLevel(logging.INFO)
    handler = logging.FileHandler(record.log)
    handler.setFormatter(logging.Formatter(rundir.LOG_FORMAT))
    log.addHandler(handler)
    environ = messages.channel_env(record.log) if channel else {}
    for message in SAID:
        messages.say(log, message, environ=environ)
    log.info('a line of its own')
    handler.close()
    life = Lifecycle(spec, Console(stream=io.StringIO()), report=False)
    life.events = EventLog(rundir.events_path(spec.train.train_dir), 'run-1', 1)
    taken: list[messages.Message | None] = []

    def seen(line: str) -> None:
        taken.append(life.said('worker:0', line))
        life.saw_line('worker:0', line, worker=True, chief=True)
    life.follow('worker:0', lambda stop: backend.read_log(record, follow=True, stop=stop), seen,
                ChannelReader(backend, record) if channel else None)
    life.unfollow(["worker:0"])
    events = [tuple((k, v) for k, v in sorted(e.items()) if k != 'time')
              for e in read_events(rundir.events_path(spec.train.train_dir))]
    return events, taken


def test_a_followed_channel_gives_the_events_the_lines_gave(tmp_path):
    with_records, taken = follow(tmp_path, 'channel', channel=True)
    from_lines, heard = follow(tmp_path, 'lines', channel=False)
    assert with_records == from_lines and [e[1] for e in from_lines] == [
        ('event', 'serving'), ('event', 'first_step'), ('event', 'progress'), ('event', 'checkpoint'),
        ('event', 'progress')]
    assert taken == [messages.as_shown(m) for m in SAID] + [None]          # the records, rate and all
    assert [m.rate for m in taken if isinstance(m, messages.Progress)] == ['  40 images/s', '  41 images/s']
    assert [m.rate for m in heard if isinstance(m, messages.Progress)] == ['', '']     # a line does not read it back
