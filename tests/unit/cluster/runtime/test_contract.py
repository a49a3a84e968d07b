"""The launcher<->task contract (cluster/runtime/contract.py) as tables: names, the task's command
line both ways, every message through its record and its human line, and what the reader refuses."""
from __future__ import annotations

import logging

import pytest

from cluster.env import places
from cluster.runtime import contract, rundir
from cluster.runtime.contract import (Checkpoint, Evaluation, Progress, Reader, Serving, Started, TaskArgs, TaskName,
                                      parse_task_argv, task_argv)
from cluster.spec import JOBS

MESSAGES: list[contract.Message] = [
    Serving('ps:0', 'localhost:2222', 4242),
    Serving('worker:12', '[::1]:2223', 1),
    Started('chief:0', 'the program examples.pss_loop:main', 77),
    Started('chief:0', 'python train.py --flag "a (b)"', 78),
    Started('evaluator:0', 'the evaluator examples.pss_keras:evaluate', 79),
    contract.progress(57, 200, 3.14159),
    contract.progress(57, 200, 3.1, '  400 images/s'),
    contract.progress(10, 20, 0.5, '  400 images/s  2 of 3 workers'),
    contract.progress(10, 20, 0.5, '  1.5 global steps/s'),
    contract.progress(1, 2, float('inf')),
    contract.progress(1, 2, float('-inf')),
    contract.progress(1, 2, float('nan'), '  5 images/s'),
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
    record = contract.to_record(message)
    assert '\n' not in record and record.startswith(contract.RECORD_TAG)
    assert same(contract.read(record), message)
    assert same(contract.read(STAMP + record), message)      # as the task's logging writes it
    assert contract.is_record(STAMP + record) and not contract.is_record(STAMP + message.human())


@pytest.mark.parametrize('message', MESSAGES, ids=lambda m: m.human())
def test_every_human_line_reads_back_as_its_message(message):
    heard = contract.read(STAMP + message.human())
    assert type(heard) is type(message)
    if isinstance(message, Progress):
        assert isinstance(heard, Progress) and same(heard.facts(), message.facts())
    else:
        assert same(heard, message)


@pytest.mark.parametrize('message', MESSAGES, ids=lambda m: m.human())
def test_the_human_lines_are_the_ones_people_read_today(message):
    """The words are rundir's, unchanged: the old functions are the contract's messages."""
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
    heard = contract.read(line)
    assert isinstance(heard, Progress)
    got = heard.facts()
    assert same(got, facts) or (line.endswith('nan') and got['loss'] != got['loss'])


def test_a_written_progress_says_in_its_record_what_its_line_shows():
    message = contract.progress(7, 10, 0.123456, '  99 images/s')
    heard = contract.read(message.human())
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
    assert contract.read(line) is None and contract.read(STAMP + line) is None
    assert not contract.is_record(line)


def test_a_reader_takes_a_message_once_from_its_record_and_its_line():
    """A channel that carries a message's record and its human line gives the message once."""
    reader = Reader()
    lines = [line for m in MESSAGES[:4] for line in (STAMP + contract.to_record(m), STAMP + m.human())]
    heard = [reader.read(line) for line in lines]
    assert heard == [MESSAGES[0], None, MESSAGES[1], None, MESSAGES[2], None, MESSAGES[3], None]
    assert [reader.read(line) for line in lines] == heard       # reading a line again: the same answer


def test_a_reader_reads_the_human_lines_of_kinds_that_never_come_as_records():
    """A `train.command` prints its own progress lines; its task says Serving as a record."""
    reader = Reader()
    assert reader.read(contract.to_record(Serving('worker:0', 'h:1', 5))) == Serving('worker:0', 'h:1', 5)
    assert reader.read('worker:0 serving on h:1 (pid 5)') is None
    assert isinstance(reader.read('worker:0: step 3/10  loss 0.5'), Progress)


def test_the_writer_logs_the_human_line_alone(caplog):
    """The log holds what people read, byte for byte as before: no record in it."""
    log = logging.getLogger('test-contract')
    with caplog.at_level(logging.INFO, logger='test-contract'):
        for message in MESSAGES:
            contract.say(log, message)
    assert [r.getMessage() for r in caplog.records] == [m.human() for m in MESSAGES]
    assert [Reader().read(r.getMessage()) is not None for r in caplog.records] == [True] * len(MESSAGES)


def test_says_ready_names_the_task():
    assert contract.says_ready(Serving('ps:0', 'h:1', 2), 'ps:0')
    assert contract.says_ready(Started('chief:0', 'x', 2), 'chief:0')
    assert not contract.says_ready(Serving('ps:0', 'h:1', 2), 'ps:1')
    assert not contract.says_ready(Checkpoint(3), 'chief:0') and not contract.says_ready(None, 'ps:0')


@pytest.mark.parametrize('job', JOBS)
@pytest.mark.parametrize('index', [0, 1, 17])
def test_task_names_round_trip(job, index):
    name = TaskName(job, index)
    assert str(name) == f'{job}:{index}' == rundir.task_name(job, index)
    assert TaskName.parse(str(name)) == name and contract.job_of(str(name)) == job
    assert rundir.parse_task_name(str(name)) == (job, index)


@pytest.mark.parametrize('bad', ['', 'ps', 'ps:', ':0', 'ps:-1', 'ps:1:2', 'ps :1', '1ps:0', 'ps:a', ' ps:0'])
def test_bad_task_names_are_refused(bad):
    with pytest.raises(ValueError, match='not a task name'):
        TaskName.parse(bad)
    assert contract.job_of(bad) is None


def test_task_names_sort_by_job_then_index():
    assert sorted([TaskName('worker', 10), TaskName('worker', 2), TaskName('ps', 3)]) == \
        [TaskName('ps', 3), TaskName('worker', 2), TaskName('worker', 10)]


@pytest.mark.parametrize('job', JOBS)
@pytest.mark.parametrize('index', [0, 3])
def test_the_argv_the_launcher_builds_is_the_one_the_task_parses(job, index):
    argv = task_argv('/usr/bin/python3', 'runs/x/spec.yaml', TaskName(job, index))
    assert argv == ('/usr/bin/python3', '-m', 'cluster.task', '--spec', 'runs/x/spec.yaml',
                    '--job', job, '--index', str(index))
    assert parse_task_argv(argv[3:], environ={}) == TaskArgs('runs/x/spec.yaml', (), TaskName(job, index), None)


@pytest.mark.parametrize('argv, args', [
    (['--job', 'ps', '--index', '0', '--set', 'train.steps=5', '--set=train.sync=false'],
     TaskArgs(None, ('train.steps=5', 'train.sync=false'), TaskName('ps', 0), None)),
    (['--slurm'], TaskArgs(None, (), None, places.SLURM)),
    (['--slurm', '--port-base', '3000'], TaskArgs(None, (), None, places.SLURM, 3000)),
    (['--place', 'slurm'], TaskArgs(None, (), None, places.SLURM)),
    (['--place', 'slurm', '--slurm'], TaskArgs(None, (), None, places.SLURM)),
    (['--jobset', '--spec', 's.yaml'], TaskArgs('s.yaml', (), None, places.JOBSET)),
    (['--place', 'jobset'], TaskArgs(None, (), None, places.JOBSET)),
    (['--place', 'tf_config', '--job', 'worker', '--index', '1'], TaskArgs(None, (), TaskName('worker', 1), None)),
])
def test_every_option_parses(argv, args):
    assert parse_task_argv(argv, environ={}) == args


def test_tf_config_places_a_task_without_job_and_index():
    environ = {'TF_CONFIG': '{}'}
    assert parse_task_argv([], environ=environ) == TaskArgs(None, (), None, None)
    assert parse_task_argv(['--place', 'tf_config'], environ=environ) == TaskArgs(None, (), None, places.TF_CONFIG)


@pytest.mark.parametrize('argv, error', [
    (['--slurm', '--jobset'], 'give --slurm or --jobset, not both'),
    (['--place', 'jobset', '--slurm'], 'give --place jobset or --slurm, not both'),
    (['--slurm', '--job', 'ps', '--index', '0'], "--slurm takes the task from Slurm's environment: drop --job and --index"),
    (['--jobset', '--index', '0'], "--jobset takes the task from the JobSet pod's environment: drop --job and --index"),
    (['--place', 'slurm', '--job', 'ps', '--index', '0'],
     "--place slurm takes the task from Slurm's environment: drop --job and --index"),
    (['--job', 'ps'], 'give --job and --index together'),
    ([], '--job and --index are required unless $TF_CONFIG names the task'),
    (['--place', 'tf_config'], '--job and --index are required unless $TF_CONFIG names the task'),
    (['--place', 'ray'], "argument --place: invalid choice: 'ray'"),
])
def test_bad_command_lines_exit_2_with_one_line(argv, error, capsys):
    with pytest.raises(SystemExit) as raised:
        parse_task_argv(argv, environ={})
    assert raised.value.code == 2
    assert error in capsys.readouterr().err


def test_place_stays_out_of_the_help(capsys):
    with pytest.raises(SystemExit):
        parse_task_argv(['--help'], environ={})
    assert '--place' not in capsys.readouterr().out


def test_every_placement_source_has_its_words():
    assert list(places.SOURCES) == [places.TF_CONFIG, places.SLURM, places.JOBSET]
    assert all(s.what and s.where and callable(s.resolve) for s in places.SOURCES.values())
