"""The stand-in's pure parts: its command line, which peers each task reaches, its checkpoint
steps, and the Links record (cluster/rehearsal/)."""
from __future__ import annotations

import pytest

from cluster.rehearsal.argv import REHEARSAL_MODULE, rehearsal_argv
from cluster.rehearsal.messages import Link, Links, last_links, read_links, say_links
from cluster.rehearsal.parts import Part, part_of, peers
from cluster.rehearsal.standin import checkpoints_between, fake_loss
from cluster.rehearsal.wire import median_ms, rate_mb_per_s
from cluster.runtime import messages
from cluster.runtime.contract import TaskName, parse_task_argv, task_argv
from cluster.spec import load_spec
from tests.conftest import write_coordinator_spec, write_spec


def test_the_stand_in_runs_the_task_argv_but_for_its_module():
    argv = task_argv('/usr/bin/python3', 'runs/x/spec.yaml', TaskName('worker', 3))
    swapped = rehearsal_argv(argv)
    assert swapped[:3] == ('/usr/bin/python3', '-m', REHEARSAL_MODULE)
    assert swapped[3:] == argv[3:]
    parsed = parse_task_argv(swapped[3:])       # the one parser reads it
    assert parsed.task == TaskName('worker', 3) and parsed.spec == 'runs/x/spec.yaml'


def test_a_command_line_that_runs_no_task_is_refused():
    with pytest.raises(ValueError, match='cluster.task'):
        rehearsal_argv(('python', 'train.py'))


def test_tf1_workers_reach_every_ps_and_the_ps_none(tmp_path):
    spec = load_spec(write_spec(tmp_path, workers=3, ps=2))
    for task in spec.tasks:
        want = ('ps:0', 'ps:1') if task.job == 'worker' else ()
        assert tuple(t.name for t in peers(spec, task)) == want, task.name
    assert {part_of(spec, t) for t in spec.tasks} == {Part.SERVE, Part.TRAIN}


def test_a_coordinator_reaches_every_ps_and_worker_its_workers_and_evaluator_none(tmp_path):
    spec = load_spec(write_coordinator_spec(tmp_path))
    reached = {t.name: tuple(p.name for p in peers(spec, t)) for t in spec.tasks}
    assert reached == {'chief:0': ('ps:0', 'worker:0', 'worker:1'), 'ps:0': (), 'worker:0': (), 'worker:1': (),
                       'evaluator:0': ()}
    assert part_of(spec, spec.task('worker', 0)) is Part.SERVE
    assert part_of(spec, spec.task('evaluator', 0)) is Part.EVALUATE


@pytest.mark.parametrize('before, now, every, want', [
    (0, 250, 100, [100, 200]), (100, 100, 100, []), (99, 100, 100, [100]), (0, 500, 0, []), (150, 420, 100, [200, 300, 400]),
])
def test_checkpoint_steps_come_where_the_chief_would_save(before, now, every, want):
    assert checkpoints_between(before, now, every) == want


def test_the_loss_falls():
    assert fake_loss(0, 100) > fake_loss(50, 100) > fake_loss(100, 100) > 0


def test_link_figures():
    assert median_ms([0.003, 0.001, 0.002]) == 2.0
    assert rate_mb_per_s(1 << 20, 0.01) == 104.9
    assert rate_mb_per_s(10, 0.0) == 10.0       # too quick to time: a microsecond


LINKS = Links('worker:1', (Link('ps:0', 'localhost:2222', 0.42, 310.5), Link('ps:1', 'node2:2222', error='no connection within 30s')))


def test_a_links_record_round_trips_and_says_who_was_not_reached():
    line = LINKS.to_record()
    assert line.startswith(messages.RECORD_TAG)
    assert read_links(line) == LINKS
    assert 'ps:1 (node2:2222) unreachable: no connection within 30s' in LINKS.human()
    assert 'ps:0 rtt 0.42 ms, 310 MB/s' in LINKS.human()


def test_the_contract_reader_passes_over_a_links_record():
    assert messages.read(LINKS.to_record()) is None
    assert not messages.is_record(LINKS.to_record())


@pytest.mark.parametrize('line', ['', 'step 3/10  loss 1.000', messages.to_record(messages.Checkpoint(4)),
                                  messages.RECORD_TAG + '{"kind": "links"', messages.RECORD_TAG + '{"kind": "links", "task": 3}',
                                  messages.RECORD_TAG + '[1]'])
def test_anything_else_is_no_links(line):
    assert read_links(line) is None


def test_a_damaged_link_is_dropped_not_the_record():
    line = messages.RECORD_TAG + '{"kind":"links","task":"worker:0","links":[{"peer":"ps:0","address":"h:1","rtt_ms":"x"},7]}'
    assert read_links(line) == Links('worker:0', (Link('ps:0', 'h:1'),))


def test_the_newest_links_of_a_channel_count():
    again = Links('worker:1', (Link('ps:0', 'localhost:2222', 0.5, 200.0),))
    lines = [LINKS.to_record(), messages.to_record(messages.Checkpoint(3)), again.to_record(), 'half a rec']
    assert last_links(lines) == again
    assert last_links([]) is None


def test_say_links_writes_the_record_to_the_channel_then_the_line(tmp_path):
    said = []

    class Log:
        def info(self, fmt, *args):
            said.append(fmt % args)

    channel = tmp_path / 'worker-1.records'
    say_links(Log(), LINKS, {messages.CHANNEL_ENV: str(channel)})
    assert read_links(channel.read_text().strip()) == LINKS and said == [LINKS.human()]
    say_links(Log(), LINKS, {})         # no channel: the line only
    assert len(said) == 2
