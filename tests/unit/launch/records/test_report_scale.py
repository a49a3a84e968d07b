"""The report of a 1,000-task run (issue 39): the timeline shows each job's quiet tasks as one
row and keeps its own row for each task with a fault, a restart or a stall; the page stays
under 100 KB."""
from __future__ import annotations

from launch.records import report
from launch.records.timeline import COLLAPSE_ABOVE, collapsed, load, story
from tests.harness.big_run import LOST, STALLED, TOLERATED, big_run


def test_a_thousand_tasks_are_a_row_per_job_and_a_row_per_task_to_look_at(tmp_path):
    big_run(str(tmp_path), 1000, ps=20)
    tale = collapsed(story(load(str(tmp_path / 'run'))))
    assert tale.rows == ['run', 'ps \u00d720', 'worker \u00d7977', LOST, STALLED, TOLERATED]
    bars = {s.task: s for s in tale.segments if s.task == 'worker \u00d7977'}
    bar = bars['worker \u00d7977']
    assert bar.start < bar.serving < bar.end      # first start, last serving, last end
    assert len([s for s in tale.segments if s.task == LOST]) == 2         # its own restart
    assert {f.row for f in tale.faults} >= {LOST}


def test_a_small_run_keeps_a_row_per_task(tmp_path):
    big_run(str(tmp_path), COLLAPSE_ABOVE, ps=2)
    tale = story(load(str(tmp_path / 'run')))
    assert collapsed(tale) is tale and len(tale.rows) == COLLAPSE_ABOVE + 1


def test_the_page_of_a_thousand_tasks_is_under_100_kb(tmp_path):
    big_run(str(tmp_path), 1000, ps=20)
    page = report.render(str(tmp_path / 'run'))
    assert len(page) < 100_000, len(page)
    assert 'worker:17 was killed by SIGKILL' in page
