"""The straggler judge (launch/run/supervised/telemetry.py): a worker below 0.67x the other
workers' median steps/s for three looks in a row is named once, with the likely cause from its
CPU; one that catches up may be named again; the others, a ps, a worker that has not stepped yet
and a lone worker never are. And the `sample` and `straggler` events it writes."""
from __future__ import annotations

from cluster.runtime.telemetry import Sample
from launch.records.event_types import parse_event
from launch.backends.base import TaskRecord
from launch.run.supervised import telemetry
from launch.run.supervised.telemetry import Judge, cause


def looks(rates: dict[str, float], cpu: dict[str, float] | None = None) -> dict[str, Sample]:
    return {task: Sample(1.0, 10, rate, rate * 64, (cpu or {}).get(task, 1.0)) for task, rate in rates.items()}


def test_a_slow_worker_is_named_after_three_looks_and_only_once():
    judge = Judge()
    seen = [judge.judge(looks({'worker:0': 10.0, 'worker:1': 10.5, 'worker:2': 4.0})) for _ in range(5)]
    assert [len(s) for s in seen] == [0, 0, 1, 0, 0]
    straggler = seen[2][0]
    assert (straggler.task, straggler.rate, straggler.median) == ('worker:2', 4.0, 10.25)
    assert straggler.line().startswith("straggler: worker:2 trains 4.00 steps/s, 39% of the other workers' median")


def test_a_look_at_the_usual_pace_starts_the_count_again():
    judge = Judge()
    slow, fast = {'worker:0': 10.0, 'worker:1': 3.0}, {'worker:0': 10.0, 'worker:1': 9.0}
    for rates in (slow, slow, fast, slow, slow):
        assert judge.judge(looks(rates)) == []
    assert [s.task for s in judge.judge(looks(slow))] == ['worker:1']


def test_one_that_caught_up_may_be_named_again():
    judge = Judge()
    slow, fast = {'worker:0': 10.0, 'worker:1': 3.0}, {'worker:0': 10.0, 'worker:1': 10.0}
    named = [len(judge.judge(looks(r))) for r in [slow] * 3 + [fast] + [slow] * 3]
    assert named == [0, 0, 1, 0, 0, 0, 1]


def test_a_look_without_its_sample_does_not_clear_the_count():
    """A worker stopped part of the time writes no sample while it is stopped."""
    judge = Judge()
    slow, silent = {'worker:0': 10.0, 'worker:1': 3.0}, {'worker:0': 10.0}
    assert [len(judge.judge(looks(r))) for r in (slow, silent, slow, silent, slow)] == [0, 0, 0, 0, 1]


def test_none_is_named_where_all_keep_pace_or_one_trains_alone():
    judge = Judge()
    for _ in range(5):
        assert judge.judge(looks({'worker:0': 10.0, 'worker:1': 7.0, 'worker:2': 9.0})) == []
        assert judge.judge(looks({'worker:0': 1.0})) == []


def test_a_ps_and_a_worker_not_started_are_never_stragglers():
    judge = Judge()
    samples = {**looks({'worker:0': 10.0, 'worker:1': 10.0}), 'ps:0': Sample(1.0, None, None, None, 0.1),
               'worker:2': Sample(1.0, 0, 0.0, 0.0, 0.0)}
    for _ in range(5):
        assert judge.judge(samples) == []


def test_the_cause_tells_a_worker_short_of_cpu_from_one_that_waits():
    short = looks({'worker:0': 10.0, 'worker:1': 10.0, 'worker:2': 4.0}, {'worker:0': 0.9, 'worker:1': 1.0, 'worker:2': 0.4})
    assert cause('worker:2', short).startswith("it had 40% of a core against the others' 95%")
    waits = looks({'worker:0': 10.0, 'worker:1': 4.0}, {'worker:0': 0.9, 'worker:1': 0.8})
    assert cause('worker:1', waits).startswith("its CPU is like the others' (80% against 90%)")
    unknown = {'worker:0': Sample(1.0, 5, 1.0), 'worker:1': Sample(1.0, 5, 9.0)}
    assert cause('worker:0', unknown) == 'its CPU is not measured'


def test_the_events_read_back():
    sample = parse_event({'event': 'sample', 'tasks': {'worker:0': {'steps_per_sec': 3.5, 'cpu': 0.9, 'rss': None},
                                                       'ps:0': 'junk'}})
    assert sample.name == 'sample' and sample.tasks == {'worker:0': {'steps_per_sec': 3.5, 'cpu': 0.9, 'rss': None}}
    straggler = parse_event({'event': 'straggler', 'task': 'worker:2', 'steps_per_sec': 4.0, 'median': 10.25,
                             'cause': 'it waits'})
    assert (straggler.task, straggler.steps_per_sec, straggler.median) == ('worker:2', 4.0, 10.25)


def test_a_sample_event_holds_the_ps_tasks_then_the_slowest_workers_first():
    samples = {**looks({'worker:0': 5.0, 'worker:1': 2.0, 'worker:2': 9.0}), 'ps:1': Sample(1.0, cpu=0.2),
               'ps:0': Sample(1.0, cpu=0.3), 'chief:0': Sample(1.0, cpu=0.1)}
    assert telemetry.shown(samples) == ['ps:0', 'ps:1', 'worker:1', 'worker:0', 'worker:2', 'chief:0']


def test_a_look_at_many_tasks_reads_a_share_of_them_in_turn(tmp_path):
    """1,000 tasks: 64 pulses read a look, the next 64 at the next look."""
    read: list[str] = []

    class Files:
        def read_file(self, record, path):
            read.append(record.name)
            return None
    records = [TaskRecord(f'worker:{i}', 'worker', i, 'localhost', 2000 + i, 'local', 1, str(tmp_path / f'{i}.log'))
               for i in range(1000)]
    watch = telemetry.Watch(lambda: records, {'local': Files()}, print, print)
    watch.fresh()
    watch.fresh()
    assert read == [f'worker:{i}' for i in range(128)]
