"""Helpers of the tests of faults, used by
tests/system/cluster/runtime/test_task_group.py, tests/system/cluster/test_coordinator.py,
tests/system/launch/records/test_run_story.py, tests/system/launch/run/test_disk.py,
tests/system/launch/run/test_elastic.py, tests/system/launch/run/test_faults.py,
tests/system/launch/run/test_recovery.py, tests/system/launch/run/test_telemetry.py and
benchmarks/stragglers.py: here, since no test module imports another."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import threading


from tests.conftest import read_until


def task_pid(train_dir, name: str) -> int:
    with open(os.path.join(train_dir, 'launch-state.json')) as f:
        return next(t['pid'] for t in json.load(f)['tasks'] if t['name'] == name)


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return out


def until_step(proc, step: int) -> list[str]:
    """Output up to the first progress line at global step `step` or later."""
    lines = []
    while True:
        lines += read_until(proc, '  loss ')
        found = re.findall(r'step (\d+)/', lines[-1])
        if found and int(found[0]) >= step:
            return lines


def kill_when(proc, train_dir, step: int, name: str, sig=signal.SIGKILL) -> list[str]:
    lines = until_step(proc, step)
    os.kill(task_pid(train_dir, name), sig)
    return lines


def remove_while_written(path: str) -> None:
    """Remove a directory its running tasks still write into, as `rm -rf` typed again would: a file
    they make while it is being removed ("Directory not empty") is removed on the next pass."""
    while True:
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise


def half_duty(pid: int, stop: threading.Event, period: float = 1.0) -> None:
    """Stop `pid` for half of every `period` (SIGSTOP, then SIGCONT), until `stop`: a worker slowed
    on purpose. It runs on at the end, also when it is gone meanwhile."""
    try:
        while not stop.is_set():
            os.kill(pid, signal.SIGSTOP)
            stop.wait(period / 2)
            os.kill(pid, signal.SIGCONT)
            stop.wait(period / 2)
    except ProcessLookupError:
        pass
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
