"""run.json's `rehearsal` (launch/records/rehearsal.py): its round trip, its absence from every
other run's record, and the console's summary of it."""
from __future__ import annotations

import json

from launch.records.rehearsal import SHOWN_UNREACHABLE, Rehearsal, RehearsedLink, summary_lines
from launch.records.result import RunRecord, RunResult, RunState


def link(source, target, rtt=0.5, rate=None, error=''):
    return RehearsedLink(source=source, target=target, address=f'{target}.host:1', rtt_ms=None if error else rtt,
                         mb_per_s=rate, error=error)


FOUND = Rehearsal(tasks=5, links=[link('worker:0', 'ps:0', 0.4, 100.0), link('worker:1', 'ps:0', 0.6, 300.0),
                                  link('worker:2', 'ps:0', 0.5, 200.0), link('worker:0', 'ps:1', error='no connection within 30s')],
                  unreported=['worker:3'])


def test_a_rehearsal_record_round_trips_in_run_json():
    data = RunResult(RunState.DONE, 0, rehearsal=FOUND).to_json('r-1', 1, '/s.yaml', 'local', '/t')
    assert list(data)[-1] == 'rehearsal'
    assert data['rehearsal']['links'][3] == {'source': 'worker:0', 'target': 'ps:1', 'address': 'ps:1.host:1',
                                             'rtt_ms': None, 'mb_per_s': None, 'error': 'no connection within 30s'}
    again = RunRecord.from_json(data)
    assert again.to_json() == data
    assert again.rehearsal == FOUND and again.result().rehearsal == FOUND


def test_a_run_that_is_no_rehearsal_writes_no_such_key():
    data = RunResult(RunState.DONE, 0).to_json('r-1', 1, '/s.yaml', 'local', '/t')
    assert 'rehearsal' not in data


def test_the_summary_names_who_cannot_reach_whom_and_a_row_per_peer():
    lines = summary_lines(FOUND)
    assert lines[0] == 'rehearsal: 5 stand-in task(s); 3 of 4 link(s) reached'
    assert '  worker:0 cannot reach ps:1 (ps:1.host:1): no connection within 30s' in lines
    assert any('no report from worker:3' in line for line in lines)
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith('  ps:')}
    assert rows == {'ps:0': ['3/3', '0.50', 'ms', '200'], 'ps:1': ['0/1', '-', '-']}


def test_many_unreachable_pairs_are_counted_past_the_first():
    many = Rehearsal(tasks=100, links=[link(f'worker:{i}', 'ps:0', error='refused') for i in range(SHOWN_UNREACHABLE + 5)],
                     unreported=[])
    lines = summary_lines(many)
    assert sum('cannot reach' in line for line in lines) == SHOWN_UNREACHABLE
    assert any('and 5 more unreachable' in line for line in lines)


def test_the_report_shows_a_rehearsal_and_only_a_rehearsal(tmp_path):
    from launch.records import report
    run_json = tmp_path / 'run.json'
    run_json.write_text(json.dumps(RunResult(RunState.DONE, 0, rehearsal=FOUND).to_json('r-1', 1, '/s', 'local', str(tmp_path))))
    page = report.render(str(tmp_path))
    assert '<h2>Rehearsal</h2>' in page and 'worker:0 cannot reach ps:1' in page
    run_json.write_text(json.dumps(RunResult(RunState.DONE, 0).to_json('r-1', 1, '/s', 'local', str(tmp_path))))
    assert '<h2>Rehearsal</h2>' not in report.render(str(tmp_path))
