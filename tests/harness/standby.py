"""Warm standbys started by hand (`python -m cluster.standby`, no launcher), handed a Become as
the launcher would, and waited for: used by tests/system/cluster/test_standby.py and to measure."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from cluster.runtime import rundir
from cluster.runtime.standby import Became, Become, Ready, SlotFiles, slot_files, standby_argv
from tests.harness.parts import REPO

T = TypeVar('T')
SLOW_SECS = 240     # a deadline for what takes seconds alone: TensorFlow's import on a busy shared host


def wait_for(what: str, look: Callable[[], T | None], timeout: float = SLOW_SECS) -> T:
    """`look()`'s first true answer, polled; fails naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        found = look()
        if found:
            return found
        assert time.monotonic() < deadline, f'no {what} within {timeout}s'
        time.sleep(0.05)


def start_standby(folder: str, slot: str, lease: str, lease_secs: float = 600, run: str = 'run-1',
                  keras: bool = False) -> tuple[subprocess.Popen, SlotFiles]:
    """A standby in `slot` of `folder`, its output in the slot's log, as the launcher starts one."""
    files = slot_files(folder, slot)
    env = {**os.environ, 'PYTHONPATH': REPO}
    argv = standby_argv(sys.executable, folder, slot, run, 'key', keras, lease, lease_secs)
    with open(files.log, 'ab') as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, files


def ready(proc: subprocess.Popen, files: SlotFiles) -> Ready:
    """The standby's Ready, once it has imported (it must not have exited first)."""
    def look() -> Ready | None:
        assert proc.poll() is None, f'the standby exited ({proc.returncode}): {rundir.read_text(files.log)}'
        text = rundir.read_text(files.ready)
        return Ready.parse(text) if text else None
    return wait_for(f'ready file {files.ready}', look)


def task_become(spec: str, job: str, index: int, log: str, env: Mapping[str, str]) -> Become:
    """What a launcher hands a standby to become `job:index` of `spec`, its output appended to `log`."""
    argv = (sys.executable, '-m', 'cluster.task', '--spec', spec, '--job', job, '--index', str(index))
    return Become(argv, dict(env), REPO, log)


def hand(files: SlotFiles, become: Become) -> None:
    """Write the become file whole, mode 0600, as the launcher does."""
    rundir.write_atomically(files.become, become.to_json(), mode=0o600)


def became(files: SlotFiles) -> Became:
    return wait_for(f'became file {files.became}',
                    lambda: Became.parse(text) if (text := rundir.read_text(files.became)) else None)


def stop_all(procs: Sequence[subprocess.Popen]) -> None:
    """SIGKILL whatever is left of `procs` (each its own session) and reap them; assert they are gone."""
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=60)
    for proc in procs:
        assert not os.path.exists(f'/proc/{proc.pid}'), f'pid {proc.pid} is still there'
