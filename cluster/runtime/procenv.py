"""What /proc/PID/environ shows of a task forked from a start-up zygote (cluster/zygote.py).

The kernel shows the environment block a process was exec'd with, not the one it runs with now:
a forked task shows its zygote's, without the task's TF_CONFIG or run id, where the launcher and
`launch down` look for them (a port's holder named by task and run: ports.py; what a task left in
its session: sessions.py). So the zygote is exec'd with room at the end of its block, one variable
(ROOM_ENV) of spaces, and a forked task writes its own environment over that room: readers take
the last value of a name, so they read the task's. The zygote's own entries before the room stay
as they were (a library may hold a pointer into them).

Linux only; a task whose environment does not fit, or any failure, leaves the block as it was.
"""
from __future__ import annotations

import ctypes
from collections.abc import Mapping

ROOM_ENV = 'TFCLUSTER_ENV_ROOM'
ROOM_MARGIN = 4096          # bytes of room beyond the largest task environment the launcher knows


def room(size: int) -> str:
    """ROOM_ENV's value: `size` bytes of room (spaces)."""
    return ' ' * size


def block(env: Mapping[str, str]) -> bytes:
    """`env` as an environment block: NAME=VALUE, each ended by a NUL."""
    return b''.join(f'{name}={value}'.encode(errors='surrogateescape') + b'\0' for name, value in env.items())


def _span() -> tuple[int, int] | None:
    """The process's first environment block: (start, end) addresses, from /proc/self/stat."""
    try:
        with open('/proc/self/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
        start, end = int(fields[47]), int(fields[48])     # env_start, env_end: fields 50 and 51
    except (OSError, IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None


def _writable(start: int, end: int) -> bool:
    """Whether [start, end) lies in one writable mapping of this process."""
    try:
        with open('/proc/self/maps') as f:
            for line in f:
                low, high = (int(x, 16) for x in line.split()[0].split('-'))
                if low <= start and end <= high:
                    return line.split()[1].startswith('rw')
    except (OSError, ValueError, IndexError):
        pass
    return False


def show(env: Mapping[str, str]) -> bool:
    """Write `env` over the room at the end of this process's environment block, so that
    /proc/self/environ shows it; whether it did."""
    span = _span()
    if span is None:
        return False
    start, end = span
    try:
        with open('/proc/self/environ', 'rb') as f:
            current = f.read()
    except OSError:
        return False
    at = current.find(b'\0' + ROOM_ENV.encode() + b'=')
    if at < 0 or len(current) != end - start:
        return False
    at += 1
    text = block(env)
    size = end - start - at
    if len(text) + 1 > size or not _writable(start + at, end):
        return False
    ctypes.memmove(start + at, text + b'\0' * (size - len(text)), size)
    return True
