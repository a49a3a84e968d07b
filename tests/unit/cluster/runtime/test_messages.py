"""What a task tells its launcher (cluster/runtime/messages.py) as tables: every message through its
record and its human line, and what the reader refuses."""
from __future__ import annotations

import logging

import pytest

from cluster.runtime import messages
from cluster.runtime.messages import Checkpoint, Evaluation, Progress, Reader, Serving, Started

MESSAGES: list[messages.Message] = [
    Serving('ps:0', 'localhost:2222', 4242),
    Serving('worker:12', '[::1]:2223', 1),
    Started('chief:0', 'the program examples.pss_loop:main', 77),
    Started('chief:0', 'python train.py --flag "a (b)"', 78),
    Started('evaluator:0', 'the evaluator examples.pss_keras:evaluate', 79),
    messages.progress(57, 200, 3.14159),
    messages.progress(57, 200, 3.1, '  400 images/s'),
    messages.progress(10, 20, 0.5, '  400 images/s  2 of 3 workers'),
    messages.progress(10, 20, 0.5, '  1.5 global steps/s'),
    messages.progress(1, 2, float('inf')),
    messages.progress(1, 2, float('-inf')),
    messages.progress(1, 2, float('nan'), '  5 images/s'),
    Checkpoint(0),
    Checkpoint(40),
    Evaluation(120, {'accuracy': 0.8125, 'loss': 0.43}),
    Evaluation(5, {}),
    Evaluation(6, {'loss': float('nan'), 'x': float('inf')}),
]
STAMP = '2026-11-28T03:00:00.000+00:00 I '


def same(a, b) -> bool:
    """Equal, NaN included."""
    return a == b or repr(a) == repr(b)


@pytest.mark.parametrize('message', MESSAGES, ids=lambda m: m.human())
def test_every_message_round_trips_through_its_record(message):
    record = messages.to_record(message)
    assert '\n' not in record and record.startswith(messages.RECORD_TAG)
    assert same(messages.read(record), message)
    assert same(messages.read(STAMP + record), message)      # as the task's logging writes it
    assert messages.is_record(STAMP + record) and not messages.is_record(STAMP + message.human())


@pytest.mark.parametrize('message', MESSAGES, ids=lambda m: m.human())
def test_every_human_line_reads_back_as_its_message(message):
    heard = messages.read(STAMP + message.human())
    assert type(heard) is type(message)
    if isinstance(message, Progress):
        assert isinstance(heard, Progress) and same(heard.facts(), message.facts())
    else:
        assert same(heard, message)


@pytest.mark.parametrize('message', MESSAGES, ids=lambda m: m.human())
def test_the_human_lines_are_the_ones_people_read_today(message):
    """The words are rundir's, unchanged: the old functions are the messages'."""
    old = {Serving: lambda m: f'{m.task} serving on {m.address} (pid {m.pid})',
           Started: lambda m: f'{m.task} started: {m.what} (pid {m.pid})',
           Checkpoint: lambda m: f'saved a checkpoint at global step {m.step}',
           Evaluation: lambda m: f'evaluation at global step {m.step}: '
                                 + ' '.join(f'{k}={v:.6g}' for k, v in sorted(m.metrics.items()))}
    if isinstance(message, Progress):
        assert message.human().startswith(f'step {message.step}/{message.total}  loss ')
        assert message.human().endswith(message.rate)
    else:
        assert message.human() == old[type(message)](message)


@pytest.mark.parametrize('line, facts', [
    ('step 57/200  loss 3.100', {'step': 57, 'total': 200, 'loss': 3.1, 'images_per_sec': None}),
    ('step 57/200  loss 3.100  400 images/s', {'step': 57, 'total': 200, 'loss': 3.1, 'images_per_sec': 400.0}),
    ('step 5/9  loss 1.000  80 images/s  2 of 3 workers',
     {'step': 5, 'total': 9, 'loss': 1.0, 'images_per_sec': 80.0, 'workers': 2}),
    ('worker:0: step 3/10  loss 0.1234', {'step': 3, 'total': 10, 'loss': 0.1234, 'images_per_sec': None}),
    ('step 1/2  loss nan', {'step': 1, 'total': 2, 'loss': None, 'images_per_sec': None}),
])
def test_progress_facts_are_what_the_line_shows(line, facts):
    heard = messages.read(line)
    assert isinstance(heard, Progress)
    got = heard.facts()
    assert same(got, facts) or (line.endswith('nan') and got['loss'] != got['loss'])


def test_a_written_progress_says_in_its_record_what_its_line_shows():
    message = messages.progress(7, 10, 0.123456, '  99 images/s')
    heard = messages.read(message.human())
    assert isinstance(heard, Progress)
    assert message.facts() == heard.facts() == {'step': 7, 'total': 10, 'loss': 0.123, 'images_per_sec': 99.0}


@pytest.mark.parametrize('line', [
    '', 'hello', 'worker:0 serving on', 'session ready after 1.0s at global step 0',
    'worker:1 leaves at global step 5: the launcher took it out of the live workers',
    'Traceback (most recent call last):', 'RuntimeError: step 5 failed',
    '@tfcluster ', '@tfcluster {', '@tfcluster []', '@tfcluster "serving"', '@tfcluster 7',
    '@tfcluster {"kind": "nope"}', '@tfcluster {"step": 4}',
    '@tfcluster {"kind": "checkpoint"}', '@tfcluster {"kind": "checkpoint", "step": "4"}',
    '@tfcluster {"kind": "checkpoint", "step": true}', '@tfcluster {"kind": "checkpoint", "step": 4, "x": 1}',
    '@tfcluster {"kind": "serving", "task": "ps:0", "address": "h:1", "pid": 1.5}',
    '@tfcluster {"kind": "evaluation", "step": 1, "metrics": {"a": "b"}}',
    '@tfcluster {"kind": "evaluation", "step": 1, "metrics": [1]}',
])
def test_the_reader_refuses_garbage_and_other_lines(line):
    assert messages.read(line) is None and messages.read(STAMP + line) is None
    assert not messages.is_record(line)


def test_a_reader_takes_a_message_once_from_its_record_and_its_line():
    """A channel that carries a message's record and its human line gives the message once."""
    reader = Reader()
    lines = [line for m in MESSAGES[:4] for line in (STAMP + messages.to_record(m), STAMP + m.human())]
    heard = [reader.read(line) for line in lines]
    assert heard == [MESSAGES[0], None, MESSAGES[1], None, MESSAGES[2], None, MESSAGES[3], None]
    assert [reader.read(line) for line in lines] == heard       # reading a line again: the same answer


def test_a_reader_reads_the_human_lines_of_kinds_that_never_come_as_records():
    """A `train.command` prints its own progress lines; its task says Serving as a record."""
    reader = Reader()
    assert reader.read(messages.to_record(Serving('worker:0', 'h:1', 5))) == Serving('worker:0', 'h:1', 5)
    assert reader.read('worker:0 serving on h:1 (pid 5)') is None
    assert isinstance(reader.read('worker:0: step 3/10  loss 0.5'), Progress)


def test_the_writer_logs_the_human_line_alone(caplog):
    """The log holds what people read, byte for byte as before: no record in it."""
    log = logging.getLogger('test-messages')
    with caplog.at_level(logging.INFO, logger='test-messages'):
        for message in MESSAGES:
            messages.say(log, message)
    assert [r.getMessage() for r in caplog.records] == [m.human() for m in MESSAGES]
    assert [Reader().read(r.getMessage()) is not None for r in caplog.records] == [True] * len(MESSAGES)


def test_says_ready_names_the_task():
    assert messages.says_ready(Serving('ps:0', 'h:1', 2), 'ps:0')
    assert messages.says_ready(Started('chief:0', 'x', 2), 'chief:0')
    assert not messages.says_ready(Serving('ps:0', 'h:1', 2), 'ps:1')
    assert not messages.says_ready(Checkpoint(3), 'chief:0') and not messages.says_ready(None, 'ps:0')
