"""Processes by /proc: the descendants of a process, alive by pid and start time (a recycled pid
is not the process), signalled and waited for; used by tests/harness/sshd.py and hosts.py."""
from __future__ import annotations

import contextlib
import os
import subprocess
import time


def _run(argv, **kwargs):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


# -- processes --------------------------------------------------------------

def _stat(pid: int):
    """(ppid, starttime, state) of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:  # gone (ENOENT, ESRCH)
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return int(fields[1]), int(fields[19]), fields[0].decode()


def _descendants(root: int) -> dict[int, int]:
    """{pid: starttime} of every live descendant of ``root`` (not root itself)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st and st[2] != "Z":
                children.setdefault(st[0], []).append(int(entry))
                starts[int(entry)] = st[1]
    found: dict[int, int] = {}
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in starts and pid not in found:
            found[pid] = starts[pid]
            todo.extend(children.get(pid, ()))
    return found


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] == start and st[2] != "Z"


def _signal(procs: dict[int, int], sig: int) -> None:
    for pid, start in procs.items():
        if _alive(pid, start):  # guards against a recycled pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _wait_gone(procs: dict[int, int], deadline: float) -> dict[int, int]:
    """Wait until every process is gone or ``deadline``; return the survivors."""
    while True:
        alive = {p: s for p, s in procs.items() if _alive(p, s)}
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.01)


def process_table() -> list[tuple[int, str]]:
    """(pid, args) of every process, from ``ps -eo pid,args``."""
    out = _run(["ps", "-eo", "pid=,args="]).stdout
    rows = []
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        rows.append((int(pid), args.strip()))
    return rows
