"""A real process with the task's signal handling (cluster/runtime/notice.py) and no TensorFlow,
for the tests that signal one for real (tests/system/cluster/runtime/test_notice_*.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from cluster.runtime import rundir
from tests.conftest import REPO, read_until


def start(code: str, train_dir: str, *args: str) -> subprocess.Popen:
    """Run `code` (python -c) with the run's train_dir and `args` on its command line, once it
    printed 'ready' (its handlers are in place)."""
    os.makedirs(os.path.join(train_dir, rundir.STOPS_DIR), exist_ok=True)
    proc = subprocess.Popen([sys.executable, '-c', code, train_dir, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, 'PYTHONPATH': REPO})
    read_until(proc, 'ready', timeout=60)
    return proc


def ended(proc: subprocess.Popen) -> tuple[int, str]:
    """Its exit code and output, once it ended (killed if it has not within a minute)."""
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode, out
