"""Who listens on a TCP port of this host, read from /proc (stdlib only: a task's host may lack
psutil), and how to name it in one line.

A task serves on a port the spec gives it, and another run's task (or any program) may hold that
port. A bind test says only *that* the port is taken; a task that must prove the port is its own
(before it says it serves) or name whoever took it (the line a collision ends with) asks here:
the kernel's table of sockets (/proc/net/tcp, tcp6) gives the listening sockets' inodes, and
/proc/PID/fd maps each inode to the process that holds it. Another user's processes cannot be
looked into without root: their sockets are counted, their pids unknown (None).
"""
from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Iterable

# Set by the launcher in every task's environment (and so in everything a task starts): the run's
# id, which names the run of a process found holding a port.
RUN_ENV = 'TFCLUSTER_RUN'

LISTEN = '0A'       # TCP_LISTEN, as /proc/net/tcp writes a socket's state
TABLES = ('/proc/net/tcp', '/proc/net/tcp6')


def port_in_use(port: int) -> bool:
    """True when something already listens on `port` (TF's server binds every interface): the bind
    test, which the launcher runs for its local tasks before it starts them and a task again."""
    try:
        s = socket.socket(socket.AF_INET6)      # dual-stack: sees a listener on either family
    except OSError:                             # IPv6 disabled on this host (EAFNOSUPPORT)
        s = socket.socket(socket.AF_INET)
    with s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(('', port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def listening_inodes(port: int, tables: Iterable[str] = TABLES) -> set[int]:
    """The inodes of the sockets listening on `port` (any address, IPv4 or IPv6); empty where
    /proc has no such table (not Linux)."""
    found: set[int] = set()
    for table in tables:
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(':', 1)[1], 16) == port:
                found.add(int(fields[9]))
    return found


def socket_owners(inodes: set[int]) -> dict[int, int]:
    """inode -> the pid of a process holding that socket, for those this user may look into."""
    wanted = {f'socket:[{inode}]': inode for inode in inodes}
    owners: dict[int, int] = {}
    if not wanted:
        return owners
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f'/proc/{entry}/fd')
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f'/proc/{entry}/fd/{fd}')
            except OSError:
                continue
            if target in wanted:
                owners.setdefault(wanted[target], int(entry))
        if len(owners) == len(wanted):
            break
    return owners


def holders(port: int) -> list[int | None]:
    """The processes listening on `port`: one entry per listening socket, its pid or None where
    it cannot be known (another user's process); empty when nothing listens."""
    inodes = listening_inodes(port)
    owners = socket_owners(inodes)
    return sorted((owners.get(inode) for inode in inodes), key=lambda pid: (pid is None, pid or 0))


def process_tree(pid: int) -> set[int]:
    """`pid` and every process below it (its children, theirs, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open(f'/proc/{entry}/stat') as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = {pid}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return tree


def foreign_holders(port: int, ours: set[int]) -> list[int | None]:
    """The processes other than `ours` that listen on `port` (None: one whose pid is unknown)."""
    return [pid for pid in holders(port) if pid is None or pid not in ours]


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f'/proc/{pid}/environ', 'rb') as f:
            items = f.read().split(b'\0')
    except OSError:
        return {}
    out = {}
    for item in items:
        name, sep, value = item.decode(errors='replace').partition('=')
        if sep:
            out[name] = value
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return ' '.join(f.read().replace(b'\0', b' ').decode(errors='replace').split())
    except OSError:
        return ''


def describe(pid: int | None, limit: int = 80) -> str:
    """One process holding a port, in words: the task and run it belongs to where its environment
    says (a task's and everything it starts: TF_CONFIG and RUN_ENV), else its command line."""
    if pid is None:
        return 'a process of another user'
    env = _environ(pid)
    run = env.get(RUN_ENV)
    task = ''
    try:
        placed = json.loads(env.get('TF_CONFIG') or '{}').get('task') or {}
        if placed.get('type') is not None:
            task = f'{placed["type"]}:{placed.get("index", 0)}'
    except (ValueError, AttributeError):
        pass
    if run:
        return f'{task + " of " if task else ""}run {run} (pid {pid})'
    command = _cmdline(pid)
    if len(command) > limit:
        command = command[:limit - 3] + '...'
    return f'pid {pid} ({command})' if command else f'pid {pid}'


def held_by(port: int, ours: Iterable[int] = ()) -> str:
    """` by WHO[, WHO...]` naming the processes other than `ours` listening on `port` (WHO as
    `describe` says it), or '' when none can be seen."""
    who = ', '.join(dict.fromkeys(describe(pid) for pid in foreign_holders(port, set(ours))))
    return f' by {who}' if who else ''


def in_use_line(task: str, port: int, ours: Iterable[int] = ()) -> str:
    """`TASK: port P is already in use[ by WHO]`: what a task that cannot have its port says."""
    return f'{task}: port {port} is already in use{held_by(port, ours)}'


def taken_from(task: str, port: int, pid: int) -> str | None:
    """The line naming whoever else listens on `port` (another run's task, say), or None when
    every listener there is process `pid`'s or its descendants' (a command and what it started
    serve for their task), or none is yet."""
    ours = process_tree(pid)
    return in_use_line(task, port, ours) if foreign_holders(port, ours) else None
