"""The launcher's stop marks (launch/backends/marks.py): where each backend finds a task's mark
from what it holds (a record, a plan), and that the SSH scripts write it before the SIGTERM and
clear it at the start."""
from __future__ import annotations

import os

from cluster.runtime import rundir
from cluster.spec import TaskSpec
from launch.backends import marks
from launch.backends.base import TaskRecord
from launch.backends.ssh.scripts import TaskFiles, TaskProcess, start_script, stop_script, undo_start_script
from launch.planning.plan import TaskPlan


def record(log: str, cwd: str = '/home/u/tfcluster') -> TaskRecord:
    return TaskRecord(name='worker:1', job='worker', index=1, host='h', port=1, backend='ssh', pid=7, log=log, cwd=cwd)


def test_a_records_mark_lies_in_the_train_dir_its_log_lies_in():
    assert marks.of_record(record('/r/run/logs/attempt-2/worker-1.log')) == '/r/run/stops/worker-1'
    assert marks.of_record(record('run/logs/attempt-2/worker-1.log')) == '/home/u/tfcluster/run/stops/worker-1'


def test_a_plans_mark_is_under_its_cwd_or_the_root_given():
    task = TaskSpec('worker', 1, 'localhost', 2222)
    plan = TaskPlan(task, 'local', ('python',), {}, '/w', 'run/spec.yaml', rundir.log_path('run', 'worker', 1))
    assert marks.of_plan(plan) == '/w/run/stops/worker-1'
    assert marks.of_plan(plan, '/project') == '/project/run/stops/worker-1'


def test_written_then_cleared(tmp_path):
    path = str(tmp_path / 'run' / 'stops' / 'ps-0')
    marks.write([path])
    assert os.path.exists(path)
    marks.clear(path)
    marks.clear(path)       # twice: nothing there is no error
    assert not os.path.exists(path)
    marks.write([rundir.stop_all_path(str(tmp_path / 'run'))])
    marks.clear_all(str(tmp_path / 'run'))
    assert os.listdir(tmp_path / 'run' / 'stops') == []


def test_the_ssh_stop_script_marks_before_it_signals_and_a_start_clears_the_mark():
    script = stop_script([TaskProcess(10, 'a', 9, 'b')], 5.0, ['/w/run/stops/worker-1'])
    assert script.index(": > /w/run/stops/worker-1") < script.index('kill -TERM')
    assert 'stops' not in stop_script([TaskProcess(10, 'a', 9, 'b')], 5.0)
    start = start_script('python -m cluster.task', '/w', '/w/run/logs/worker-1.log',
                         '/w/run/logs/attempt-1/worker-1.log', '/w/run/logs/attempt-0', None, '/w/run/stops/worker-1')
    assert 'rm -f' in start and '/w/run/stops/worker-1' in start
    assert start.index('/w/run/stops/worker-1') < start.index('setsid')


def test_undoing_a_half_done_ssh_start_marks_what_it_stops():
    files = TaskFiles.beside('/w/run/logs/worker-1.log')
    script = undo_start_script(files, '/w/run/stops/worker-1')
    assert script.index(': > /w/run/stops/worker-1') < script.index('kill -TERM')
    assert 'stops' not in undo_start_script(files)
