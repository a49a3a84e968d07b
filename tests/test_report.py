"""`launch report`: the page for a run with an injected fault (ps:0 killed by SIGKILL, a cluster
restart, a Ctrl-C, a resume the next morning), for a run with no events yet and for damaged input;
then the same page opened in a real headless Chromium, which must decode every plot."""
from __future__ import annotations

import base64
import datetime
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess

import pytest

from cluster.runtime import rundir
from launch.records import report     # at collection: a fresh matplotlib font cache runs fc-list once, here
from tests.harness.parts import unavailable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARTIFACTS = os.path.join(REPO, 'test-artifacts')
DOCS_REPORT = os.path.join(REPO, 'docs', 'images', 'report.png')     # the documentation's picture of a report
PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
T0 = datetime.datetime(2026, 11, 23, 21, 8, 43, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
RUN_ID = 'local2-20261123-210843'
SPEC = """cluster:
  ps: [localhost:24211]
  worker: [localhost:24212, localhost:24213]
train:
  sync: true
  steps: 200
  data_url: https://example.org/cifar-10-binary.tar.gz
  train_dir: /tmp/r/run
supervise:
  restart: on-failure
"""


def _event(seconds: float, attempt: int, event: str, **fields) -> dict:
    when = (T0 + datetime.timedelta(seconds=seconds)).isoformat(timespec='milliseconds')
    return {'time': when, 'run': RUN_ID, 'attempt': attempt, 'event': event, **fields}


def _attempt(t: float, attempt: int, first: int, last: int, resumes: int | None, started: bool) -> list[dict]:
    """Three tasks start and serve, the chief reports progress from step `first` to `last`."""
    out = [_event(t, attempt, 'run_started', spec='/tmp/r/spec.yaml', backend='local', spec_hash='ab' * 32,
                  train_dir='/tmp/r/run', launcher_pid=4242, resumes_from=resumes)] if started else []
    for i, task in enumerate(('ps:0', 'worker:0', 'worker:1')):
        out.append(_event(t + 0.3 + 0.1 * i, attempt, 'task_started', task=task, host='localhost', pid=5000 + i))
        out.append(_event(t + 3 + 0.8 * i, attempt, 'serving', task=task))
    out.append(_event(t + 8, attempt, 'first_step', step=first))
    for n, step in enumerate(range(first, last + 1, 8)):
        out.append(_event(t + 8 + 2 * n, attempt, 'progress', step=step, total=200,
                          loss=round(2.3 * 0.993 ** step + 0.03 * math.sin(n), 3),
                          images_per_sec=round(380 + 40 * (1 - 0.7 ** n) + 6 * math.sin(1.7 * n), 1)))
    return out


def fault_run(train_dir) -> str:
    """A run's files as the launcher leaves them: attempt 1 loses ps:0 to SIGKILL and restarts,
    attempt 2 is interrupted with SIGINT, attempt 3 (the next morning) resumes and finishes."""
    events = _attempt(0, 1, 1, 57, None, True)
    events += [_event(25, 1, 'checkpoint', step=40),
               _event(33.2, 1, 'task_lost', task='ps:0', cause='ps:0 was killed by SIGKILL', exit_code=-9,
                      signal='SIGKILL', error=None),
               _event(33.5, 1, 'restart', cause='ps:0 was killed by SIGKILL', from_step=40)]
    events += _attempt(36, 2, 41, 113, 40, False)
    events += [{**_event(44, 2, 'recovered'), 'tasks': ['ps:0'], 'seconds': 10.8, 'steps_redone': 17,
                'phases': {'stop': 0.3, 'backoff': 2.2, 'start': 3.3, 'step': 5.0}},
               _event(60, 2, 'checkpoint', step=80), _event(66.1, 2, 'interrupted', signal='SIGINT'),
               _event(70, 2, 'checkpoint', step=113),
               _event(71, 2, 'finished', result={'id': RUN_ID, 'state': 'interrupted', 'exit_code': 130})]
    morning = 14 * 3600 + 10 * 60
    events += _attempt(morning, 3, 114, 200, 113, True)
    events += [_event(morning + 31, 3, 'checkpoint', step=200),
               _event(morning + 33, 3, 'finished', result={'id': RUN_ID, 'state': 'done', 'exit_code': 0})]
    os.makedirs(train_dir, exist_ok=True)
    with open(rundir.events_path(train_dir), 'w') as f:
        f.writelines(json.dumps(e) + '\n' for e in events)
    result = {'id': RUN_ID, 'spec': '/tmp/r/spec.yaml', 'backend': 'local', 'train_dir': '/tmp/r/run',
              'attempt': 3, 'state': 'done', 'exit_code': 0, 'global_step': 200, 'images_per_sec': 421.7,
              'loss': 0.561, 'restarts': 0, 'failures': [],
              'started': (T0 + datetime.timedelta(seconds=morning)).isoformat(timespec='seconds'),
              'ended': (T0 + datetime.timedelta(seconds=morning + 33)).isoformat(timespec='seconds'),
              'seconds': 33.4}
    with open(rundir.run_path(train_dir), 'w') as f:
        json.dump(result, f, indent=1)
    with open(rundir.spec_path(train_dir), 'w') as f:
        f.write(SPEC)
    return str(train_dir)


@pytest.fixture(scope='module')
def page(tmp_path_factory) -> tuple[str, str]:
    """(train_dir, its page), rendered once: matplotlib takes a second or two."""
    train_dir = fault_run(tmp_path_factory.mktemp('report') / 'run')
    return train_dir, report.render(train_dir)


def images(html: str) -> list[bytes]:
    """Every <img>'s bytes; fails on one that is not an embedded PNG."""
    out = []
    for src in re.findall(r'<img\b[^>]*\bsrc="([^"]*)"', html):
        assert src.startswith('data:image/png;base64,'), src[:80]
        out.append(base64.b64decode(src.split(',', 1)[1], validate=True))
    return out


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


# -- slow: a real browser -------------------------------------------------------------------------
def chromium(*args: str, profile: str, timeout: float = 90) -> str:
    """Run headless Chromium to the end; its helpers (a process group of its own) go with it."""
    binary = next((b for b in ('chromium', 'chromium-browser') if shutil.which(b)), None)
    if binary is None:
        unavailable('no chromium binary found (Debian: apt-get install -y chromium)',
                    'the report must be checked in a real browser')
    proc = subprocess.Popen([binary, '--headless', '--no-sandbox', '--disable-gpu', f'--user-data-dir={profile}',
                             '--no-first-run', *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert proc.returncode == 0, f'chromium exited {proc.returncode}:\n{err[-3000:]}'
    return out


def refresh_docs_image(shot: str, out: str = DOCS_REPORT, height: int = 1900) -> str | None:
    """With TFCLUSTER_DOCS_IMAGES=1, a report's screenshot becomes the documentation's picture
    (docs/images/report.png; `git diff --stat` shows whether it changed): cut at the last blank
    band above `height` pixels, so at a gap between two sections and never through a table or a
    plot, and stored as a 256-colour PNG (the page's few flat colours survive; under 300 KB).
    The path written, or None when not asked."""
    if os.environ.get('TFCLUSTER_DOCS_IMAGES') != '1':
        return None
    import numpy
    from PIL import Image
    with Image.open(shot) as im:
        page = im.convert('RGB')
    end = min(height, page.height)
    white = numpy.asarray(page)[:end].min(axis=(1, 2)) == 255      # rows with nothing drawn on them
    cut = next((row + 1 for row in range(end - 1, 11, -1) if white[row - 11:row + 1].all()), end)
    page = page.crop((0, 0, page.width, cut))
    page.quantize(256, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    return out


@pytest.mark.slow
def test_report_opens_in_headless_chromium_with_every_image_decoded(tmp_path):
    train_dir = fault_run(tmp_path / 'run')
    url = 'file://' + report.write(train_dir)
    dom = chromium('--virtual-time-budget=5000', '--dump-dom', url, profile=str(tmp_path / 'profile'))
    found = re.search(r'<title>images-ok (\d+)/(\d+)', dom)
    assert found, f'the page\'s check never ran: {dom[:500]}'
    ok, total = map(int, found.groups())
    assert ok == total == 2, f'{ok} of {total} images decoded'
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, 'report.png')
    chromium(f'--screenshot={shot}', '--window-size=1280,2400', '--hide-scrollbars', url,
             profile=str(tmp_path / 'profile'))
    with open(shot, 'rb') as f:
        data = f.read()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 50_000, len(data)
    print(f'report screenshot: {shot}')


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
