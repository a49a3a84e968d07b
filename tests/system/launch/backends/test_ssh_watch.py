"""The SSH task watcher's host-side loop (launch/backends/ssh/watch.py WATCH_SCRIPT), run here as
a host runs it, with a real process to watch (the whole watcher over a real sshd:
test_ssh.py)."""
from __future__ import annotations

import json
import select
import subprocess
import sys
import time

import pytest

from launch.backends.ssh.watch import BEAT_SECS, WATCH_SCRIPT, key

pytestmark = pytest.mark.slow     # real processes


def _next(watcher: subprocess.Popen, timeout: float = 5.0) -> dict:
    ready, _, _ = select.select([watcher.stdout], [], [], timeout)
    assert ready, 'the watcher wrote nothing'
    return json.loads(watcher.stdout.readline())


def test_the_watcher_writes_a_task_s_end_with_its_rc_and_leaves_when_its_stdin_closes(tmp_path):
    task = subprocess.Popen(['sleep', '60'])
    rcfile = tmp_path / 'task.rc'
    watcher = subprocess.Popen([sys.executable, '-u', '-c', WATCH_SCRIPT], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE)
    try:
        watched = {key('worker:0', task.pid): [task.pid, str(rcfile), task.pid]}
        watcher.stdin.write((json.dumps({'gen': 1, 'tasks': watched}) + '\n').encode())
        watcher.stdin.flush()
        said = _next(watcher)
        while said['gen'] != 1:
            said = _next(watcher)
        rc, stat, wrapper = said['seen'][key('worker:0', task.pid)]
        assert rc == '' and stat.startswith(f'{task.pid} (sleep) S') and wrapper == stat

        # Nothing changes: it says so again only at its heartbeat, not at every look.
        began = time.monotonic()
        assert _next(watcher)['seen'] == said['seen']
        assert time.monotonic() - began >= BEAT_SECS / 2

        task.kill()
        task.wait()
        rcfile.write_text('137\n')
        said = _next(watcher)
        rc, stat, wrapper = said['seen'][key('worker:0', task.pid)]
        assert (rc, stat, wrapper) == ('137', '', '')
    finally:
        task.kill()
        watcher.stdin.close()
    assert watcher.wait(timeout=5) == 0
