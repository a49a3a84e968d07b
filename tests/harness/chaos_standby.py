"""Warm standbys in the chaos harness (tests/harness/chaos.py `--standby N`).

- `import_seconds`: one `import tensorflow` in a fresh interpreter, the yardstick a restart is
  measured against (#41: kill -> training again at most 0.75x one import, measured in the same run);
- the faults `standby-kill` and `standby-stop`: SIGKILL or SIGSTOP to a standby that waits, read
  from the launcher's state file (`standbys`). The launcher restarts nothing for them; it must
  replace the standby, and never hand a task to one it killed or that froze;
- `standby_summary`: the line with the median kill -> training again as a share of the import.

Standbys on SSH hosts run on this machine too (the test sshd listens on loopback addresses), so
a pid in the state file can be signalled from here on every backend the harness drives.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time

from cluster.runtime import rundir
from cluster.runtime import standby as standby_contract

STANDBY_KINDS = ('standby-kill', 'standby-stop')
IMPORT_PROBE = ('import time; t = time.perf_counter(); import tensorflow; '
                'print(time.perf_counter() - t)')


def import_seconds() -> float:
    """The seconds of one `import tensorflow` in a fresh interpreter of this Python (its own
    clock, so the interpreter's start is not counted)."""
    out = subprocess.run([sys.executable, '-c', IMPORT_PROBE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'})
    return float(out.stdout.strip().splitlines()[-1])


def standbys(train_dir: str) -> list[dict]:
    """The standbys the launcher's state file lists now ([] while it has none or no file)."""
    try:
        with open(rundir.state_path(train_dir)) as f:
            return list(json.load(f).get('standbys') or [])
    except (OSError, ValueError):
        return []


def ready_pids(train_dir: str) -> list[int]:
    return [int(s['pid']) for s in standbys(train_dir) if s.get('state') == 'ready' and s.get('pid')]


def inject_standby(kind: str, train_dir: str, deadline: float) -> int:
    """SIGKILL (standby-kill) or SIGSTOP (standby-stop) one standby that waits, once there is one
    (RuntimeError if none is ready by `deadline`); its pid. The state file may list as ready a
    standby the launcher has just handed a task (it is saved about once a second), so each one
    listed is checked as it is hit (hit_waiting)."""
    passed: set[int] = set()
    while True:
        for pid in ready_pids(train_dir):
            if pid not in passed:
                if hit_waiting(pid, kind):
                    return pid
                passed.add(pid)
        if time.monotonic() > deadline:
            raise RuntimeError(f'no standby was ready to {kind} (state file: {standbys(train_dir)})')
        time.sleep(0.2)


def hit_waiting(pid: int, kind: str) -> bool:
    """Freeze `pid`; if it is a standby that still waits (neither a become nor a became file in its
    slot: the launcher has not handed it a task), leave it frozen (standby-stop) or kill it
    (standby-kill); else let it go on untouched. Whether it was hit. Once it is frozen, a task the
    launcher hands it is one it must never take (it gets no Became and starts the task cold)."""
    slot = slot_of(pid)
    if slot is None:
        return False
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    files = standby_contract.slot_files(*slot)
    if os.path.exists(files.become) or os.path.exists(files.became):
        os.kill(pid, signal.SIGCONT)
        return False
    if kind == 'standby-kill':
        os.kill(pid, signal.SIGKILL)
    return True


def slot_of(pid: int) -> tuple[str, str] | None:
    """(folder, slot) of the standby process `pid`, from its command line (standby_argv); None if
    it is gone or no standby."""
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            argv = f.read().decode(errors='replace').split('\0')
    except OSError:
        return None
    if standby_contract.STANDBY_MODULE not in argv or '--dir' not in argv or '--slot' not in argv:
        return None
    return argv[argv.index('--dir') + 1], argv[argv.index('--slot') + 1]


def replaced(train_dir: str, pid: int) -> bool:
    """The standby `pid` is no longer listed and another one is ready."""
    listed = standbys(train_dir)
    return all(int(s.get('pid') or 0) != pid for s in listed) and bool(ready_pids(train_dir))


def never_used(events: list[dict], hit: dict[int, float]) -> list[str]:
    """Broken invariants: a task started after a standby was hit (pid -> time of the hit) whose pid
    is that standby's."""
    from tests.harness.chaos import event_time
    return [f'standby: {e["task"]} started as pid {e["pid"]} at {e["time"]}, the standby killed or frozen '
            f'{event_time(e) - hit[int(e["pid"])]:.1f}s before'
            for e in events if e['event'] == 'task_started' and e.get('pid') and int(e['pid']) in hit
            and event_time(e) >= hit[int(e['pid'])]]


def mended_kills(faults: list, events: list[dict]) -> list[tuple]:
    """Per kill of a task (not one while a restart starts it, nor one followed by such a kill):
    (the fault, the seconds from the kill to the launcher's `recovered` event that mended it, that
    event). The event is written as the first global step after the restart is seen: finer than
    the harness's own look, which waits for a progress event."""
    from tests.harness.chaos import event_time
    mended = sorted(((event_time(e), e) for e in events if e['event'] == 'recovered'), key=lambda te: te[0])
    out = []
    for i, f in enumerate(faults):
        until = faults[i + 1].at if i + 1 < len(faults) else float('inf')
        if f.kind != 'kill' or f.startup or (i + 1 < len(faults) and faults[i + 1].startup):
            continue
        after = [(t, e) for t, e in mended if f.at <= t < until]
        if after:
            out.append((f, after[0][0] - f.at, after[0][1]))
    return out


def kill_to_training(faults: list, events: list[dict]) -> list[float]:
    """mended_kills' seconds alone."""
    return [secs for _, secs, _ in mended_kills(faults, events)]


def standby_summary(kills: list[float], import_secs: list[float], warm: int, started: int) -> str:
    """`kill -> training again: median 1.7s = 0.68x one import (2.5s), 28 of 30 restarted tasks from a standby`."""
    if not kills or not import_secs:
        return ''
    one = statistics.mean(import_secs)
    median = statistics.median(kills)
    return (f'kill -> training again: median {median:.2f}s = {median / one:.2f}x one import '
            f'({one:.2f}s, measured {", ".join(f"{s:.2f}s" for s in import_secs)}); '
            f'{warm} of {started} task starts after a fault from a standby')
