"""A task's channel (cluster/runtime/messages.py): `say` appends each message's record beside the
log where the launcher named a channel, and the Reader takes each message once, at its line, from
its record where the channel has it, else from the line (a `train.command`'s own words)."""
from __future__ import annotations

import logging
import os

import pytest

from cluster.runtime import messages
from cluster.runtime.messages import Checkpoint, Evaluation, Progress, Reader, Serving, Started

STAMP = '2026-11-28T03:00:00.000+00:00 I '
SAID: list[messages.Message] = [
    Serving('ps:0', 'localhost:2222', 4242),
    Started('chief:0', 'python train.py --flag "a (b)"', 78),
    messages.progress(57, 200, 3.14159, '  400 images/s'),
    messages.progress(10, 20, 0.5, '  400 images/s  2 of 3 workers'),
    Checkpoint(40),
    Evaluation(120, {'accuracy': 0.81254321, 'loss': 0.43}),
]


class Channel:
    """A channel as the launcher reads it: what was written since the last call; counts its calls."""

    def __init__(self, lines: list[str] = ()) -> None:
        self.lines, self.calls = list(lines), 0

    def __call__(self) -> list[str]:
        self.calls += 1
        out, self.lines = self.lines, []
        return out


def written(*said: messages.Message) -> list[str]:
    """The record lines `say` writes for these messages."""
    return [messages.to_record(messages.as_shown(m)) for m in said]


def test_say_appends_the_record_before_the_line_where_a_channel_is_named(tmp_path, caplog):
    channel = str(tmp_path / 'worker-0.records')
    log = logging.getLogger('test-channel')
    seen_first: list[bool] = []

    class Spy(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen_first.append(os.path.exists(channel) and bool(open(channel).read()))
    log.addHandler(Spy())
    try:
        with caplog.at_level(logging.INFO, logger='test-channel'):
            for message in SAID:
                messages.say(log, message, environ={messages.CHANNEL_ENV: channel})
    finally:
        log.handlers.clear()
    assert [r.getMessage() for r in caplog.records] == [m.human() for m in SAID]     # the log as before
    assert open(channel).read().splitlines() == written(*SAID)
    assert seen_first == [True] * len(SAID)


def test_say_writes_no_channel_unless_one_is_named(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger='test-channel'):
        messages.say(logging.getLogger('test-channel'), Checkpoint(3), environ={})
    assert os.listdir(tmp_path) == [] and [r.getMessage() for r in caplog.records] == [Checkpoint(3).human()]


def test_a_channel_the_disk_refuses_loses_the_record_not_the_line(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger='test-channel'):
        messages.say(logging.getLogger('test-channel'), Checkpoint(3),
                     environ={messages.CHANNEL_ENV: str(tmp_path / 'no-such-dir' / 'w.records')})
    assert [r.getMessage() for r in caplog.records] == [Checkpoint(3).human()]


@pytest.mark.parametrize('log_path, channel', [
    ('/w/run/logs/attempt-1/worker-0.log', '/w/run/logs/attempt-1/worker-0.records'),
    ('logs/attempt-2/ps-1.log', 'logs/attempt-2/ps-1.records'),
    ('/w/odd-output', '/w/odd-output.records'),
])
def test_the_channel_lies_beside_the_log(log_path, channel):
    assert messages.channel_beside(log_path) == channel
    assert messages.channel_env(log_path) == {messages.CHANNEL_ENV: channel}


@pytest.mark.parametrize('message', SAID, ids=lambda m: m.human())
def test_a_record_says_what_its_line_shows(message):
    """The events a launcher writes from a record are the ones it wrote from the line."""
    shown = messages.as_shown(message)
    heard = messages.read(STAMP + message.human())
    assert messages.read(messages.to_record(shown)) == shown
    if isinstance(message, Progress):
        assert shown.facts() == heard.facts() and shown.rate == message.rate
    else:
        assert shown == heard
    assert messages.as_shown(Evaluation(1, {'a': 0.123456789})) == Evaluation(1, {'a': 0.123457})


def test_a_reader_takes_each_message_from_its_record_at_its_line():
    channel = Channel(written(*SAID))
    reader = Reader(channel)
    lines = [STAMP + m.human() for m in SAID]
    taken = [reader.read(line) for line in lines]
    assert taken == [messages.as_shown(m) for m in SAID]
    assert [m.rate for m in taken if isinstance(m, Progress)] == ['  400 images/s', '  400 images/s  2 of 3 workers']
    assert [reader.read(line) for line in lines[-1:]] == taken[-1:]       # a line read again: the same answer
    assert channel.calls == 1       # the records were there by the first line


def test_the_channel_is_read_only_at_a_line_that_shows_a_message():
    channel = Channel()
    reader = Reader(channel)
    assert [reader.read(line) for line in ('Traceback (most recent call last):', STAMP + 'restoring x', '')] \
        == [None, None, None]
    assert channel.calls == 0
    assert reader.read(STAMP + Checkpoint(4).human()) == Checkpoint(4) and channel.calls == 1


@pytest.mark.parametrize('records, lines, expected', [
    # a train.command prints its own progress lines: no record, the line says it
    ([], ['step 3/10  loss 0.5'], [Progress(3, 10, 0.5)]),
    # its own line before the line of a record already written: each its own, in the log's order
    (written(messages.progress(4, 10, 0.25, '  9 images/s')), ['step 3/10  loss 0.5', STAMP + 'step 4/10  loss 0.250  9 images/s'],
     [Progress(3, 10, 0.5), Progress(4, 10, 0.25, 9.0, None, '  9 images/s')]),
    # a line lost (a full disk): the records before the next line's go with it
    (written(Checkpoint(1), Checkpoint(2), Checkpoint(3)), [STAMP + Checkpoint(2).human(), STAMP + Checkpoint(3).human()],
     [Checkpoint(2), Checkpoint(3)]),
    # a hidden value masked in the line: the line's words, never the record's
    (written(Started('chief:0', 'train --token s3cret', 5)), [STAMP + 'chief:0 started: train --token *** (pid 5)'],
     [Started('chief:0', 'train --token ***', 5)]),
    # a record half written, or not a record: passed by
    (['@tfcluster {"kind": "checkpoint"', 'garbage'], [STAMP + Checkpoint(7).human()], [Checkpoint(7)]),
])
def test_a_reader_with_a_channel_gives_what_the_lines_gave(records, lines, expected):
    reader = Reader(Channel(records))
    assert [reader.read(line) for line in lines] == expected
    assert [messages.read(line) for line in lines] == [e if not isinstance(e, Progress) else messages.read(line)
                                                       for e, line in zip(expected, lines, strict=True)]


def test_records_of_an_earlier_start_pass_by():
    """A channel its launcher could not empty as the task started again keeps the earlier start's
    records: they match no line of the new start."""
    reader = Reader(Channel(written(Serving('ps:0', 'h:1', 10), Checkpoint(5))))
    assert reader.read(STAMP + Serving('ps:0', 'h:1', 11).human()) == Serving('ps:0', 'h:1', 11)
    assert reader.read(STAMP + Checkpoint(5).human()) == Checkpoint(5)


def test_a_reader_holds_a_bounded_number_of_records():
    reader = Reader(Channel(written(*(Checkpoint(i) for i in range(messages.PENDING_RECORDS + 10)))))
    assert reader.read(STAMP + Checkpoint(3).human()) == Checkpoint(3)        # gone from the channel: its line's words
    assert len(reader._pending) == messages.PENDING_RECORDS


def test_a_line_asked_for_again_is_answered_without_a_second_look_at_the_channel():
    """The launcher asks once whether a line says ready and once what it tells the event log."""
    channel = Channel()
    reader = Reader(channel)
    line = 'step 3/10  loss 0.5'        # a train.command's own line: no record
    assert reader.read(line) == reader.read(line) == Progress(3, 10, 0.5) and channel.calls == 1
