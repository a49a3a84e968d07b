"""/proc/PID/stat read on the launcher's side: the one parser of a stat line, for the local
backend (which reads the file itself) and the SSH backend (whose hosts send the line back, as they
may have no Python packages to read it with)."""
from __future__ import annotations

import os
from collections.abc import Sequence

import psutil

STATE, UTIME, STIME, STARTTIME = 0, 11, 12, 19     # indexes into stat_fields (fields 3, 14, 15, 22)


def stat_fields(line: str) -> list[str]:
    """The fields of a /proc/PID/stat line after the command name, state first; [] for no line.

    The command name is in parentheses and may itself hold spaces and ')': it ends at the last one."""
    end = line.rfind(')')
    return line[end + 2:].split() if end >= 0 else []


def read_stat_fields(pid: int) -> list[str] | None:
    """stat_fields of this machine's process `pid`, or None if it is gone."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return stat_fields(f.read())
    except OSError:
        return None


def start_time(fields: Sequence[str]) -> str | None:
    """The kernel's start time of a live process (field 22), None for a zombie or a short line.

    A pid is reused once its process is gone; the pid with its start time names one process."""
    if len(fields) > STARTTIME and fields[STATE] not in ('Z', 'X'):
        return fields[STARTTIME]
    return None


def process_ident(pid: int) -> str | None:
    """What names this machine's process `pid` for good (a reused pid has another): the kernel's
    start time in clock ticks where /proc exists (the form the state file and the SSH hosts use),
    else psutil's creation time; None if it is gone or a zombie."""
    if os.path.isdir('/proc'):
        fields = read_stat_fields(pid)
        return None if fields is None else start_time(fields)
    try:
        process = psutil.Process(pid)
        return None if process.status() == psutil.STATUS_ZOMBIE else f'{process.create_time():.2f}'
    except psutil.Error:
        return None
