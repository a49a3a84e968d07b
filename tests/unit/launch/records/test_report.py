"""`launch report`: the page for a run with an injected fault (ps:0 killed by SIGKILL, a cluster
restart, a Ctrl-C, a resume the next morning), for a run with no events yet and for damaged input;
then the same page opened in a real headless Chromium, which must decode every plot."""
from __future__ import annotations

import json
import logging
import os
import re
import shutil

import pytest

from cluster.runtime import rundir
from launch.records import report     # at collection: a fresh matplotlib font cache runs fc-list once, here
from tests.harness.report import PNG_SIGNATURE, REPO, RUN_ID, SPEC, _attempt, _event, fault_run, images


@pytest.fixture(scope='module')
def page(tmp_path_factory) -> tuple[str, str]:
    """(train_dir, its page), rendered once: matplotlib takes a second or two."""
    train_dir = fault_run(tmp_path_factory.mktemp('report') / 'run')
    return train_dir, report.render(train_dir)


# -- fast: the page itself ------------------------------------------------------------------------
def test_page_embeds_every_plot_as_png_and_links_nothing(page):
    _, html = page
    assert html.startswith('<!DOCTYPE html>') and html.rstrip().endswith('</html>')
    pngs = images(html)
    assert len(pngs) == 2 and all(p.startswith(PNG_SIGNATURE) for p in pngs)
    spec = re.search(r'<pre>(.*?)</pre>', html, re.S)
    assert 'https://example.org/cifar-10-binary.tar.gz' in spec.group(1)      # the spec, shown verbatim
    outside = html[:spec.start()] + html[spec.end():]
    assert 'http://' not in outside and 'https://' not in outside
    assert '<link' not in html and '@import' not in html and 'src="data:image/png;base64,' in html


def test_page_tells_the_fault_the_restart_and_every_attempt(page):
    _, html = page
    assert RUN_ID in html and 'ps:0 was killed by SIGKILL' in html and 'interrupted by SIGINT' in html
    for text in ('attempt 1', 'attempt 2', 'attempt 3', 'restarted: ps:0 was killed by SIGKILL', 'finished: done',
                 'local', '421.7', '0.5610'):
        assert text in html, text


def test_page_tells_how_long_the_fault_took_to_mend_phase_by_phase(page):
    _, html = page
    section = html[html.index('<h2>Recoveries</h2>'):]
    section = section[:section.index('</table>')]
    assert 'training again 10.8s after the fault seen (median; longest 10.8s), 17 step(s) trained again' in section
    cells = re.findall(r'<td[^>]*>([^<]*)</td>', section)
    assert cells[-7:] == ['ps:0', '10.8', '17', '0.3', '2.2', '3.3', '5.0'], cells


def test_timeline_marks_the_lost_task_and_cuts_the_idle_night(page):
    run = report.load(page[0])
    tale = report.story(run)
    assert tale.rows == ['run', 'ps:0', 'worker:0', 'worker:1']
    lost = [(row, kind) for row, _, kind in tale.marks if kind in ('lost', 'restart', 'interrupted')]
    assert lost == [('ps:0', 'lost'), ('run', 'restart'), ('run', 'interrupted')]
    assert [f.text for f in tale.faults] == ['ps:0 was killed by SIGKILL']     # a Ctrl-C is no fault
    # the supervisor's restart (attempt 2) restarts ps:0; the next morning's `launch up` starts it
    assert [kind for row, _, kind in tale.marks if row == 'ps:0' and kind in ('started', 'restarted')] == \
        ['started', 'restarted', 'started']
    assert [kind for row, _, kind in tale.marks if row == 'run' and kind == 'resumed'] == ['resumed']
    axis = report.TimeAxis([e.epoch for e in run.events], run.tz)
    assert len(axis.cuts) == 1 and axis.cuts[0][1] - axis.cuts[0][0] > 13 * 3600
    xs, labels = axis.ticks(1100)
    assert len(xs) >= 4 and xs == sorted(xs) and all(re.fullmatch(r'(Nov 2[34] )?\d\d:\d\d(:\d\d)?', t) for t in labels)


def test_attempts_say_how_each_ended_and_where_the_next_resumed(page):
    runs = report.attempts(report.load(page[0]))
    assert [(a.number, a.resumed_from, a.step, a.lost) for a in runs] == \
        [(1, None, 57, ['ps:0']), (2, 40, 113, []), (3, 113, 200, [])]
    assert [a.ended for a in runs] == ['restarted: ps:0 was killed by SIGKILL', 'interrupted by SIGINT',
                                       'finished: done']


def test_a_run_with_no_events_gets_a_page_that_says_so(tmp_path):
    (tmp_path / 'spec.yaml').write_text(SPEC)
    html = report.render(str(tmp_path))
    assert html.startswith('<!DOCTYPE html>') and html.rstrip().endswith('</html>')
    assert 'No events yet' in html and '<img' not in html and 'data_url: https://example.org' in html


def test_damaged_events_line_is_skipped_with_one_warning(tmp_path, caplog):
    train_dir = fault_run(tmp_path / 'run')
    with open(rundir.events_path(train_dir), 'a') as f:
        f.write('{"time": "2026-11-24T11:20:00+01:00", "run": "loc')        # a launcher killed mid-write
    with caplog.at_level(logging.WARNING):
        html = report.render(train_dir)
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and 'damaged' in caplog.records[0].getMessage()
    assert 'ps:0 was killed by SIGKILL' in html and len(images(html)) == 2


def test_damaged_run_json_falls_back_to_the_event_log_with_one_warning(tmp_path, caplog):
    train_dir = fault_run(tmp_path / 'run')
    with open(rundir.run_path(train_dir), 'w') as f:
        f.write('{"id": "local2-2026')
    with caplog.at_level(logging.WARNING):
        html = report.render(train_dir)
    assert len(caplog.records) == 1 and 'run.json' in caplog.records[0].getMessage()
    assert 'Result from the last finished event' in html and '<span class="state done">done</span>' in html


def test_odd_fields_and_a_run_still_going_render_without_a_traceback(tmp_path, caplog):
    """A hand-edited or foreign event log: wrong types, no time, no result; a task restarted on
    its own, a tolerated worker, a stall, and an attempt with no end yet."""
    events = _attempt(0, 1, 1, 41, None, True) + [
        _event(12, 1, 'task_lost', task='worker:1', cause='worker:1 exited with code 1', exit_code=1, signal=None,
               error='UnavailableError: Socket closed'),
        _event(12.5, 1, 'restart', cause='worker:1 exited with code 1', from_step=None, tasks=['worker:1']),
        _event(13, 1, 'task_started', task='worker:1', host='localhost', pid=6001),
        _event(20, 1, 'task_lost', task='worker:1', cause='worker:1 was killed by SIGTERM', exit_code=-15,
               signal='SIGTERM', error=None),
        _event(20.2, 1, 'tolerated', task='worker:1', cause='worker:1 was killed by SIGTERM'),
        _event(40, 1, 'stall', tasks=['ps:0', 'worker:0'], cause='no new global step for 60s'),
        {'time': 'yesterday', 'run': RUN_ID, 'attempt': 1, 'event': 'progress', 'step': 3},
        _event(41, 'two', 'progress', step=3),
        _event(42, 1, 'progress', step='abc', total=None, loss='nan', images_per_sec=[1]),
        _event(43, 1, 'progress', step=45, total=200, loss=float('nan'), images_per_sec=None),
        _event(44, 1, 'finished', result={'state': 'failed', 'failures': ['junk', {'task': 'ps:0'}]}),
        _event(50, 2, 'task_started', task='chief:0'), _event(51, 2, 'task_started', task='evaluator')]
    (tmp_path / 'events.jsonl').write_text(''.join(json.dumps(e) + '\n' for e in events))
    (tmp_path / 'run.json').write_text('[1, 2]')
    with caplog.at_level(logging.WARNING):
        html = report.render(str(tmp_path))
    # the line whose attempt is no number is damaged to every reader now (the typed reading: one warning of the
    # event log's); the event without a readable time (the report's); run.json not an object
    assert len(caplog.records) == 3
    assert len(images(html)) == 2 and 'worker:1 exited with code 1' in html and 'still running' in html
    tale = report.story(report.load(str(tmp_path)))
    assert tale.rows == ['run', 'ps:0', 'chief:0', 'worker:0', 'worker:1', 'evaluator']
    assert [row for row, _, kind in tale.marks if kind == 'restarted'] == ['worker:1']
    assert [f.text for f in tale.faults] == ['worker:1 exited with code 1', 'worker:1 was killed by SIGTERM',
                                                'stall of ps:0, worker:0: no new global step for 60s']


def test_write_replaces_the_report_whole(tmp_path):
    train_dir = fault_run(tmp_path / 'run')
    assert report.write(train_dir) == rundir.report_path(train_dir)
    out = str(tmp_path / 'elsewhere.html')
    assert report.write(train_dir, out) == out
    with open(out) as f:
        assert f.read().startswith('<!DOCTYPE html>')
    assert sorted(os.listdir(tmp_path)) == ['elsewhere.html', 'run']
    assert 'report.html.tmp' not in os.listdir(train_dir)


def test_a_pss_command_run_reports_its_checkpoints_step_and_its_own_settings(tmp_path):
    """A coordinator run whose chief runs a train.command (tests/data/pss-command: real files of
    a run that checkpointed to step 300 and printed no progress line of ours): the page gives the
    global step its checkpoints reached, says why there is no training plot in the words of what
    ran, and shows no TF1 trainer setting (sync, towers) of a run that has none."""
    train_dir = tmp_path / 'run'
    shutil.copytree(os.path.join(REPO, 'tests', 'data', 'pss-command'), train_dir)
    page = report.render(str(train_dir))
    assert re.search(r'<td>global step</td><td>300 \(its newest checkpoint\)</td>', page), page[:3000]
    assert 'no worker reported a step' not in page
    assert "No progress events: the chief&#x27;s train.command prints its own lines" in page, page
    spec = page[page.index('<h2>Effective spec'):]
    for key in ('sync', 'replicas_to_aggregate', 'devices', 'transfer_dtype', 'deterministic'):
        assert f'\n  {key}:' not in spec, key
    assert 'train.sync' in spec and 'always asynchronous' in spec and '\n  steps: 300' in spec, spec
