"""Telemetry in `launch report`, `launch status` and TensorBoard (launch/records/telemetry_report.py,
launch/commands/status_view.py, launch/records/telemetry.py): the section's plots, its stragglers
table, each ps task's bytes measured beside the plan's; the status table of the figures; a tag per
figure and task. No process started."""
from __future__ import annotations

import datetime
import io
import json

import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cluster.runtime import rundir
from cluster.runtime.telemetry import Sample
from launch.commands.status_view import TaskRow, telemetry
from launch.records import report, telemetry_report
from launch.records.events import typed_events
from launch.records.telemetry import Board
from tests.harness.report import SPEC as HARNESS_SPEC, _event, fault_run, images

MORNING = 14 * 3600 + 10 * 60
# The harness's spec, its data a set the plan can size (the harness names a download URL).
SPEC = HARNESS_SPEC.replace('  data_url: https://example.org/cifar-10-binary.tar.gz\n', '  data: synthetic\n')
PLAN = 2 * 4_273_192 * 4.0      # ps:0's bytes in per global step (2 workers' gradients) x 4 global steps/s


@pytest.fixture(scope='module')
def sampled_run(tmp_path_factory) -> str:
    """The report harness's run with samples in its last attempt (which trains 8 global steps
    every 2 s) and worker:1 named a straggler."""
    train_dir = fault_run(tmp_path_factory.mktemp('report') / 'run')
    with open(rundir.spec_path(train_dir), 'w') as f:
        f.write(SPEC)
    path = rundir.events_path(train_dir)
    with open(path) as f:
        lines = f.readlines()
    extra = [_event(MORNING + t, 3, 'sample', tasks={
        'ps:0': {'cpu': 0.5, 'rss': 6.5e8, 'in_per_sec': PLAN * 1.1, 'out_per_sec': PLAN * 1.1},
        'worker:0': {'steps': 10 * t, 'steps_per_sec': 4.0, 'images_per_sec': 512.0, 'cpu': 0.9, 'rss': 7e8},
        'worker:1': {'steps': 5 * t, 'steps_per_sec': 2.0, 'images_per_sec': 256.0, 'cpu': 0.45, 'rss': 7e8}})
        for t in (10, 16, 22, 28)]
    extra.append(_event(MORNING + 25, 3, 'straggler', task='worker:1', steps_per_sec=2.0, median=4.0,
                        cause="it had 45% of a core against the others' 90%"))
    with open(path, 'w') as f:
        f.writelines(lines[:-1] + [json.dumps(e) + '\n' for e in extra] + lines[-1:])
    return train_dir


def test_the_section_plots_each_figure_and_names_the_straggler(sampled_run):
    page = report.render(sampled_run)
    part = page[page.index('<h2>Telemetry</h2>'):page.index('<h2>Faults and failures</h2>')]
    assert '4 sample(s)' in part
    assert len(images(part)) == 1
    assert '<td>worker:1</td>' in part and "45% of a core" in part


def test_each_ps_task_s_bytes_stand_beside_the_plan(sampled_run):
    rows = telemetry_report.ps_rows(typed_events(rundir.events_path(sampled_run)), sampled_run)
    assert rows == [('ps:0', f'{PLAN * 1.1 / 1e6:.2f}', f'{PLAN / 1e6:.2f}', '1.10')]


def test_a_run_without_samples_has_no_section(tmp_path):
    assert '<h2>Telemetry</h2>' not in report.render(fault_run(tmp_path / 'run'))


def test_status_shows_what_each_running_task_measured():
    rows = [TaskRow('worker:0', 'localhost:1', 'local', 10, True, True, '',
                    sample=Sample(1.0, 40, 3.25, 208.0, 0.97, 712_000_000, 2.5e6, 40_000.0)),
            TaskRow('ps:0', 'localhost:2', 'local', 11, True, True, '',
                    sample=Sample(1.0, None, None, None, 0.4, 650_000_000, 9.1e6, 9.2e6)),
            TaskRow('worker:1', 'localhost:3', 'local', None, False, False, '', sample=Sample(1.0, 3)),
            TaskRow('worker:2', 'localhost:4', 'local', 12, True, True, '')]
    assert telemetry(rows) == [
        'measured by each task over its last 2 s:',
        '  TASK        STEPS/S  IMAGES/S   CPU   MEMORY     NET IN    NET OUT',
        '  worker:0        3.2       208   97%   712 MB   2.5 MB/s    40 kB/s',
        '  ps:0              -         -   40%   650 MB   9.1 MB/s   9.2 MB/s']
    assert telemetry(rows[2:]) == []
    assert rows[0].to_json()['sample'] == {'steps': 40, 'steps_per_sec': 3.25, 'images_per_sec': 208.0, 'cpu': 0.97,
                                           'rss': 712_000_000, 'in_per_sec': 2.5e6, 'out_per_sec': 40_000.0,
                                           'gpu': None, 'gpu_memory': None}


def test_status_adds_the_gpu_columns_where_a_task_measured_its_gpus():
    rows = [TaskRow('worker:0', 'localhost:1', 'local', 10, True, True, '',
                    sample=Sample(1.0, 40, 3.25, 208.0, 0.97, 712_000_000, 2.5e6, 40_000.0, 0.83, 9_100_000_000)),
            TaskRow('ps:0', 'localhost:2', 'local', 11, True, True, '',
                    sample=Sample(1.0, None, None, None, 0.4, 650_000_000, 9.1e6, 9.2e6))]
    assert telemetry(rows) == [
        'measured by each task over its last 2 s:',
        '  TASK        STEPS/S  IMAGES/S   CPU   MEMORY     NET IN    NET OUT   GPU GPU MEMORY',
        '  worker:0        3.2       208   97%   712 MB   2.5 MB/s    40 kB/s   83%    9100 MB',
        '  ps:0              -         -   40%   650 MB   9.1 MB/s   9.2 MB/s     -          -']


def test_a_run_whose_tasks_measured_gpus_plots_them_too(sampled_run, tmp_path):
    events = list(typed_events(rundir.events_path(sampled_run)))
    plain = telemetry_report.section(events, datetime.timezone.utc, sampled_run, lambda head, rows: '')
    gpu = [_event(MORNING + t, 3, 'sample', tasks={'worker:0': {'gpu': 0.8, 'gpu_memory': 9.1e9}}) for t in (12, 18)]
    path = tmp_path / 'events.jsonl'
    path.write_text(''.join(json.dumps(e) + '\n' for e in gpu))
    with_gpu = telemetry_report.section(events + list(typed_events(str(path))), datetime.timezone.utc, sampled_run,
                                        lambda head, rows: '')
    assert _height(with_gpu) > _height(plain)      # a third row of plots: GPU busy and GPU memory


def _height(section: str) -> int:
    (png,) = images(section)
    return Image.open(io.BytesIO(png)).height


def test_the_samples_in_tensorboard_one_tag_per_figure_and_task(tmp_path):
    board = Board(str(tmp_path))
    board.add(1000.0, {'worker:0': {'steps_per_sec': 4.0, 'rss': None}, 'ps:0': {'in_per_sec': 2.5e6}})
    board.add(1030.0, {'worker:0': {'steps_per_sec': 3.5}})
    board.close()
    events = EventAccumulator(str(tmp_path / 'telemetry'))
    events.Reload()
    assert sorted(events.Tags()['scalars']) == ['in_per_sec/ps:0', 'steps_per_sec/worker:0']
    assert [(s.wall_time, s.step, s.value) for s in events.Scalars('steps_per_sec/worker:0')] == [
        (1000.0, 0, 4.0), (1030.0, 1, 3.5)]
