"""Preemptions in `launch report` and `launch status` (launch/records/preemptions.py): each notice paired
with the recovery that timed the training back after it, in a table of their own apart from the faults,
with the save, the seconds to training again and the steps redone; `status` says them in a line (and
`--json`: `preempted`). No process started."""
from __future__ import annotations

import json
import re

import pytest

from cluster.runtime import rundir
from launch.cli import main
from launch.records import preemptions, report
from launch.records.event_types import parse_event
from tests.conftest import write_spec
from tests.harness.report import _event, fault_run

MORNING = 14 * 3600 + 10 * 60


@pytest.fixture(scope='module')
def preempted_run(tmp_path_factory) -> str:
    """The report harness's run, whose last attempt has worker:1 preempted at step 150 and back
    11.5 s after its notice, and a requeue (a notice naming no task) that was never timed."""
    train_dir = fault_run(tmp_path_factory.mktemp('report') / 'run')
    path = rundir.events_path(train_dir)
    with open(path) as f:
        lines = f.readlines()
    extra = [_event(MORNING + 20, 3, 'preempted', task='worker:1', cause='a SIGTERM from outside the launcher',
                    grace=30.0, step=150, checkpoint=113),
             {**_event(MORNING + 31.5, 3, 'recovered'), 'tasks': ['worker:1'], 'seconds': 11.5, 'steps_redone': 4,
              'phases': {'save': 2.5, 'backoff': 1.0, 'start': 3.0, 'step': 5.0}, 'preempted': True},
             _event(MORNING + 32, 3, 'preempted', task=None, cause='job 7 requeued by Slurm', grace=30.0)]
    with open(path, 'w') as f:
        f.writelines(lines[:-1] + [json.dumps(e) + '\n' for e in extra] + lines[-1:])
    return train_dir


def section(html: str, title: str) -> str:
    part = html[html.index(f'<h2>{title}</h2>'):]
    return part[:part.index('</table>')]


def cells(html: str) -> list[str]:
    return re.findall(r'<td[^>]*>([^<]*)</td>', html)


def test_each_notice_is_paired_with_the_recovery_after_it():
    log = [parse_event(_event(0, 1, 'preempted', task='ps:0', grace=30.0, step=10)),
           parse_event({**_event(5, 2, 'recovered'), 'tasks': ['worker:0'], 'seconds': 3.0, 'preempted': True}),
           parse_event({**_event(6, 2, 'recovered'), 'tasks': ['ps:0', 'worker:0'], 'seconds': 9.0,
                        'steps_redone': 2, 'phases': {'save': 1.5}}),      # a fault's: not this one's
           parse_event({**_event(7, 2, 'recovered'), 'tasks': ['ps:0', 'worker:0'], 'seconds': 7.0,
                        'steps_redone': 1, 'phases': {'save': 1.25}, 'preempted': True}),
           parse_event(_event(8, 2, 'preempted', task='ps:0', grace=30.0, step=20))]
    first, second = preemptions.preemptions(log)
    assert (first.task, first.save, first.seconds, first.redone) == ('ps:0', 1.25, 7.0, 1)
    assert second.recovered is None and second.seconds is None       # not back yet
    assert preemptions.summary([first, second]) == (
        'preemptions: 2 (ps:0 at step 10, ps:0 at step 20), 1 step(s) trained again after them; '
        'not faults: no restart spent')
    assert preemptions.summary([]) == ''


def test_the_report_has_a_preemptions_table_apart_from_the_faults(preempted_run):
    html = report.render(preempted_run)
    table = section(html, 'Preemptions')
    rows = cells(table)
    assert rows[2:8] == ['worker:1', '150', '30', '2.5', '11.5', '4'], rows
    assert rows[10:16] == [preemptions.REQUEUED, '-', '30', '-', '-', '-'], rows
    faults = section(html, 'Faults and failures')
    assert 'worker:1' not in faults and 'preempt' not in faults        # the one fault is ps:0's SIGKILL
    head = html[:html.index('</table>')]
    assert 'preemptions</td><td>2 (not faults, no restart spent' in head, head


def test_the_recoveries_table_shows_the_save_phase_only_with_a_preemption(preempted_run):
    table = section(report.render(preempted_run), 'Recoveries')
    assert '<th>save (s)</th><th>stop (s)</th>' in table
    assert cells(table)[-8:] == ['worker:1 (preempted)', '11.5', '4', '2.5', '-', '1.0', '3.0', '5.0'], cells(table)


def test_status_tells_the_preemptions_and_the_steps_redone(preempted_run, tmp_path, capsys):
    spec = write_spec(tmp_path, train_dir=preempted_run)
    assert main(['status', spec]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert ('preemptions: 2 (worker:1 at step 150, the job (requeued)), 4 step(s) trained again after them; '
            'not faults: no restart spent') in out, out
    assert main(['status', '--json', spec]) == 0
    said = json.loads(capsys.readouterr().out)['preempted']
    assert [(p['task'], p['step'], p['save_secs'], p['seconds'], p['steps_redone']) for p in said] == \
        [('worker:1', 150, 2.5, 11.5, 4), (preemptions.REQUEUED, None, None, None, None)]
