"""run.json's `rehearsal` (launch/records/rehearsal.py): a bounded summary that round-trips, its
absence from every other run's record, the link file beside it, and the console's and the report's
account of it (who cannot reach whom, grouped; one row per ps)."""
from __future__ import annotations

import json

from launch.records.rehearsal import (KEPT_LINKS, LINKS_FILE, NAMED, SHOWN_GROUPS, Rehearsal, RehearsedLink,
                                      percentile, read_links_file, section_html, summarise, summary_lines,
                                      write_links)
from launch.records.result import RunRecord, RunResult, RunState


def link(source, target, rtt=0.5, rate=None, error=''):
    return RehearsedLink(source=source, target=target, address=f'{target}.host:1', rtt_ms=None if error else rtt,
                         mb_per_s=rate, error=error)


LINKS = [link('worker:0', 'ps:0', 0.4, 100.0), link('worker:1', 'ps:0', 0.6, 300.0),
         link('worker:2', 'ps:0', 0.5, 200.0), link('worker:0', 'ps:1', error='no connection within 30s')]
FOUND = summarise(5, LINKS, ['worker:3'])


def test_a_rehearsal_record_round_trips_in_run_json():
    data = RunResult(RunState.DONE, 0, rehearsal=FOUND).to_json('r-1', 1, '/s.yaml', 'local', '/t')
    assert list(data)[-1] == 'rehearsal'
    assert data['rehearsal']['unreachable'] == [{'source': 'worker:0', 'target': 'ps:1', 'address': 'ps:1.host:1',
                                                 'rtt_ms': None, 'mb_per_s': None, 'error': 'no connection within 30s'}]
    assert data['rehearsal']['links_tried'] == 4 and data['rehearsal']['links_file'] == LINKS_FILE
    assert len(data['rehearsal']['links']) == 4      # a small table is kept whole
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
    assert rows == {'ps:0': ['3/3', '0.50', 'ms', '0.60', 'ms', '200', '100'], 'ps:1': ['0/1', '-', '-', '-', '-']}
    assert lines[-1].startswith(f'  every link: {LINKS_FILE}')


def test_an_older_record_with_only_its_table_is_summarised_as_it_is_read():
    old = Rehearsal.from_json({'tasks': 5, 'links': [x.to_json() for x in LINKS], 'unreported': ['worker:3']})
    assert summary_lines(old)[:2] == summary_lines(FOUND)[:2]


def test_the_sources_of_one_unreachable_peer_are_one_line():
    many = summarise(300, [link(f'worker:{i}', 'ps:0', error='refused') for i in range(290)], [])
    lines = summary_lines(many)
    assert [line for line in lines if 'cannot reach' in line] == \
        ['  worker:0, worker:1, worker:2, worker:3, worker:4 and 95 more cannot reach ps:0 (ps:0.host:1): refused']
    assert f'  ... and 190 more unreachable link(s) ({LINKS_FILE})' in lines      # past the 100 run.json names


def test_the_summary_is_bounded_past_a_hundred_unreachable_pairs_and_a_big_table():
    bad = [link(f'worker:{i}', f'ps:{i % 40}', error=f'refused {i % 40}') for i in range(NAMED + 50)]
    good = [link(f'worker:{i}', 'ps:0', 0.2 + i / 1000, 50.0 + i) for i in range(KEPT_LINKS)]
    found = summarise(1000, bad + good, [f'worker:{i}' for i in range(NAMED + 7)])
    assert found.links is None and found.links_tried == len(bad) + len(good)
    assert len(found.unreachable or ()) == NAMED and found.unreachable_count == NAMED + 50
    assert len(found.unreported or ()) == NAMED and found.unreported_count == NAMED + 7
    lines = summary_lines(found)
    assert sum('cannot reach' in line for line in lines) == SHOWN_GROUPS
    shown = sum(len([w for w in line.split(' cannot')[0].split(',')]) for line in lines if 'cannot reach' in line)
    assert any(f'and {NAMED + 50 - shown} more unreachable link(s) ({LINKS_FILE})' in line for line in lines)
    assert any('and 7 more (ended or lost' in line for line in lines)
    assert len(json.dumps(found.to_json())) < 64_000


def test_percentiles_are_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([5.0], 1) == 5.0


def test_the_link_file_round_trips_and_passes_over_damage(tmp_path):
    path = str(tmp_path / LINKS_FILE)
    write_links(path, LINKS)
    assert read_links_file(path) == LINKS
    with open(path, 'a') as f:
        f.write('not json\n[1]\n')
    assert read_links_file(path) == LINKS
    assert len(open(path).read().splitlines()) == len(LINKS) + 2


def test_the_report_shows_a_rehearsal_and_only_a_rehearsal(tmp_path):
    from launch.records import report
    run_json = tmp_path / 'run.json'
    run_json.write_text(json.dumps(RunResult(RunState.DONE, 0, rehearsal=FOUND).to_json('r-1', 1, '/s', 'local', str(tmp_path))))
    page = report.render(str(tmp_path))
    assert '<h2>Rehearsal</h2>' in page and 'worker:0 cannot reach ps:1' in page
    assert f'<a href="{LINKS_FILE}">' in page and '<td>ps:0</td><td>3/3</td>' in page
    run_json.write_text(json.dumps(RunResult(RunState.DONE, 0).to_json('r-1', 1, '/s', 'local', str(tmp_path))))
    assert '<h2>Rehearsal</h2>' not in report.render(str(tmp_path))
    assert section_html(None) == ''
