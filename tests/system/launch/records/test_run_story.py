"""A run's whole story on a real local cluster: its ps killed with SIGKILL (the supervisor restarts
the cluster), the launcher interrupted with SIGINT, then a second `launch up` that resumes and
finishes. Afterwards the run is one run with every attempt's logs intact, an event log that
tells what happened, and `launch list`, `launch status` and `run.json` that agree."""
from __future__ import annotations

import json
import os
import re
import signal

import pytest

from cluster.runtime import rundir
from launch.records.events import read_events
from tests.conftest import launch, launch_bg, read_until, write_spec
from tests.harness.faults import finish, kill_when, until_step
from tests.harness.report import ARTIFACTS, chromium, refresh_docs_image

pytestmark = pytest.mark.slow     # real local clusters


def restart_notes(logdir: str) -> list[tuple[int, str]]:
    """The `restarts` texts of the event files in `logdir`. A task killed mid-write leaves a torn
    last record, which TensorBoard skips: so do we."""
    import glob
    import tensorflow as tf
    notes = []
    for path in glob.glob(os.path.join(logdir, 'events.out.tfevents.*')):
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                notes += [(event.step, tf.make_ndarray(v.tensor).item().decode())
                          for v in event.summary.value if v.tag == 'restarts']
        except tf.errors.DataLossError:
            pass
    return notes


def test_a_killed_interrupted_and_resumed_run_is_one_run_with_every_attempt_kept(tmp_path):
    spec = write_spec(tmp_path, steps=400, checkpoint_steps=5, checkpoint_secs=600,
                      supervise={'restart': 'on-failure', 'max_restarts': 2})
    run = str(tmp_path / 'run')
    where = str(tmp_path)

    # Attempt 1: ps:0 is killed; attempt 2: the restarted cluster, interrupted with Ctrl-C.
    proc = launch_bg('up', spec, cwd=where)
    first_lines = read_until(proc, ', attempt 1: ')       # the first launcher line (a warning may come before)
    run_id = re.match(r'\[launch\] +run (\S+), attempt 1: ', first_lines[-1])
    assert run_id and not any(line.startswith('[') for line in first_lines[:-1]), first_lines
    run_id = run_id.group(1)
    lines = kill_when(proc, run, 3, 'ps:0')
    lines += read_until(proc, 'resuming from')
    lines += until_step(proc, 12)
    proc.send_signal(signal.SIGINT)
    out = ''.join(first_lines + lines) + finish(proc, 180)
    assert proc.returncode == 130, out
    assert 'restart 1/2: ps:0 was killed by SIGKILL' in out

    # Attempt 3: a second `launch up` of the same train_dir resumes and finishes.
    resumed = launch('up', spec, cwd=where)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f'run {run_id}, attempt 3: ' in resumed.stdout.splitlines()[0], resumed.stdout

    # Once more: the run is at its last step, so nothing starts (no TensorFlow, no attempt 4) and
    # its result stays, byte for byte; the line says how to train on. `launch eval` of it shows
    # the figure without TensorFlow's C++ start-up chatter, as `launch up` does.
    kept = {path: open(path, 'rb').read() for path in (rundir.run_path(run), rundir.events_path(run),
                                                        rundir.report_path(run))}
    again = launch('up', spec, cwd=where)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.startswith(f'[launch]   run {run_id} is already at step 400 of 400 (train.steps): nothing '
                                   'started, its result kept; to train on, raise train.steps, e.g. `launch up '), \
        again.stdout
    assert {path: open(path, 'rb').read() for path in kept} == kept
    assert not os.path.exists(os.path.join(rundir.logs_dir(run), 'attempt-4'))
    evaluation = launch('eval', run_id, cwd=where)
    assert evaluation.returncode == 0 and 'precision @ 1 = ' in evaluation.stdout, evaluation.stderr
    assert not re.search(r'oneDNN|cuInit|cuda|absl|^[IWE]\d{4} ', evaluation.stderr, re.M), evaluation.stderr

    # Every attempt's logs are kept; the first still holds its steps; logs/<task>.log is the newest.
    logs = rundir.logs_dir(run)
    for attempt in (1, 2, 3):
        for task in ('ps-0', 'worker-0', 'worker-1'):
            assert os.path.getsize(os.path.join(logs, f'attempt-{attempt}', f'{task}.log')) > 0, (attempt, task)
    first = open(os.path.join(logs, 'attempt-1', 'worker-0.log')).read()
    assert re.search(r' step \d+/400 ', first) and ' worker:0 serving on ' in first, first
    assert os.path.realpath(os.path.join(logs, 'worker-0.log')) == \
        os.path.realpath(os.path.join(logs, 'attempt-3', 'worker-0.log'))
    assert re.search(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d I step \d+/400 ', first, re.M), first[-300:]

    # The event log tells the story, in order, for one run id.
    events = read_events(rundir.events_path(run))
    assert {e['run'] for e in events} == {run_id}
    story = []
    for e in events:        # tasks lost together (the ps, then the workers that lost it) count once
        if e['event'] in ('run_started', 'task_lost', 'restart', 'interrupted', 'finished') and \
                (not story or story[-1] != (e['attempt'], e['event'])):
            story.append((e['attempt'], e['event']))
    assert story == [(1, 'run_started'), (1, 'task_lost'), (1, 'restart'), (2, 'interrupted'), (2, 'finished'),
                     (3, 'run_started'), (3, 'finished')], story
    lost = next(e for e in events if e['event'] == 'task_lost')
    assert (lost['task'], lost['signal'], lost['exit_code']) == ('ps:0', 'SIGKILL', -9), lost
    resume = [e for e in events if e['event'] == 'run_started'][-1]
    assert resume['resumes_from'] is not None and resume['resumes_from'] >= 10, resume
    assert any(e['event'] == 'progress' and e['attempt'] == 3 for e in events)
    assert {e['step'] for e in events if e['event'] == 'checkpoint'} >= {resume['resumes_from'], 400}
    assert {e['task'] for e in events if e['event'] == 'serving' and e['attempt'] == 2} == {'ps:0', 'worker:0',
                                                                                          'worker:1'}

    # TensorBoard has the restart the launcher made, as a text at the step the chief restored.
    notes = restart_notes(run)
    assert len(notes) == 1 and notes[0][1].startswith('restart 1/2: ps:0 was killed by SIGKILL'), notes

    # `launch list --json`, `launch status RUN --json` and run.json agree.
    record = json.load(open(rundir.run_path(run)))
    assert (record['id'], record['state'], record['attempt'], record['global_step']) == (run_id, 'done', 3, 400)
    listed = launch('list', '--json', cwd=where)
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)
    assert len(runs) == 1, runs
    assert (runs[0]['id'], runs[0]['state'], runs[0]['attempts'], runs[0]['global_step']) == (run_id, 'done', 3, 400)
    status = launch('status', run_id, '--json', cwd=where)
    assert status.returncode == 0, status.stdout + status.stderr
    shown = json.loads(status.stdout)
    assert shown['run'] == runs[0], (shown['run'], runs[0])
    assert len(shown['tasks']) == 3 and not any(t['alive'] for t in shown['tasks'])

    # The same run by its train_dir, from anywhere; an unknown id is exit 3 for status, 2 elsewhere.
    assert json.loads(launch('status', run, '--json').stdout)['run']['id'] == run_id
    missing = launch('status', 'no-such-run', cwd=where)
    assert missing.returncode == 3 and missing.stderr.count('\n') == 1, missing.stderr
    assert launch('logs', 'no-such-run', cwd=where).returncode == 2
    older = launch('logs', run_id, 'worker:0', '--attempt', '1', cwd=where)
    assert older.returncode == 0 and older.stdout == first, older.stderr

    # The report: written at the end of every attempt, and on demand.
    report = launch('report', run_id, '-o', str(tmp_path / 'story.html'), cwd=where)
    assert report.returncode == 0, report.stdout + report.stderr
    page = (tmp_path / 'story.html').read_text()
    assert 'ps:0 was killed by SIGKILL' in page and 'attempt 3' in page      # the timeline's fault list
    assert os.path.exists(rundir.report_path(run))

    # It renders in a real browser: every plot decodes; the screenshot is kept as a test artifact.
    url = 'file://' + str(tmp_path / 'story.html')
    dom = chromium('--virtual-time-budget=5000', '--dump-dom', url, profile=str(tmp_path / 'profile'))
    found = re.search(r'<title>images-ok (\d+)/(\d+)', dom)
    assert found and found.group(1) == found.group(2) != '0', dom[:500]
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, 'run-story-report.png')
    chromium(f'--screenshot={shot}', '--window-size=1280,2400', '--hide-scrollbars', url,
             profile=str(tmp_path / 'profile'))
    assert os.path.getsize(shot) > 50_000
    print(f'report screenshot: {shot}')
    docs = refresh_docs_image(shot)       # TFCLUSTER_DOCS_IMAGES=1: the documentation's picture of a real run
    if docs:
        assert 50_000 < os.path.getsize(docs) < 300_000, os.path.getsize(docs)
        print(f'documentation picture: {docs}')
