"""Helpers of the tests of report, used by tests/system/docs/test_docs_site.py,
tests/system/launch/records/test_report.py, tests/system/launch/records/test_run_story.py,
tests/unit/launch/records/test_report.py: here, since no test module imports another."""
from __future__ import annotations

import base64
import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess


from cluster.runtime import rundir
from tests.harness.parts import unavailable
from tests.harness.parts import REPO

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


def images(html: str) -> list[bytes]:
    """Every <img>'s bytes; fails on one that is not an embedded PNG."""
    out = []
    for src in re.findall(r'<img\b[^>]*\bsrc="([^"]*)"', html):
        assert src.startswith('data:image/png;base64,'), src[:80]
        out.append(base64.b64decode(src.split(',', 1)[1], validate=True))
    return out


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
