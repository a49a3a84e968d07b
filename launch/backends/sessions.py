"""A local task's processes beyond its own: the session it leads (the local backend starts every
task with start_new_session), where its `train.command` and whatever that started run too.

A task killed hard cannot stop them; the launcher does: it ends the whole session of a task it
sees ended (`end_session`, while the task's pid is still held by its unreaped zombie, so the ids
cannot name anything else), and `launch status`, `launch down` and a take-over find what is left
of a task started by another launcher (`left_behind`), each process proven the task's by its
session and by the TF_CONFIG in its environment, which names the same task.
"""
from __future__ import annotations

import json
import logging
import os
import signal

import psutil

log = logging.getLogger(__name__)


def _placed(environ: dict[str, str]) -> tuple[str, int] | None:
    """The (job, index) TF_CONFIG names in a process's environment, or None."""
    try:
        task = json.loads(environ.get('TF_CONFIG') or '{}').get('task') or {}
        return str(task['type']), int(task.get('index', 0))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def members(sid: int) -> list[int]:
    """The live processes of session `sid` other than its leader, from /proc."""
    out: list[int] = []
    if not os.path.isdir('/proc'):
        return out
    for entry in os.listdir('/proc'):
        if not entry.isdigit() or int(entry) == sid:
            continue
        try:
            if os.getsid(int(entry)) == sid and psutil.Process(int(entry)).status() != psutil.STATUS_ZOMBIE:
                out.append(int(entry))
        except (OSError, psutil.Error):
            continue
    return out


def left_behind(leader: int, job: str, index: int) -> list[psutil.Process]:
    """The processes still running in the session of a task (pid `leader`, `job`:`index`) that
    has ended: a session's id stays the leader's pid while any of its processes lives, and the
    task's TF_CONFIG in each one's environment rules out a session that merely reuses the pid."""
    found = []
    for pid in members(leader) if leader > 0 else []:
        try:
            process = psutil.Process(pid)
            if _placed(process.environ()) == (job, index):
                found.append(process)
        except psutil.Error:
            continue
    return found


def end_session(leader: int, wait: float = 5.0) -> list[int]:
    """SIGKILL every process of the session (and process group) `leader` leads, but the leader,
    and wait up to `wait` seconds for them to be gone (their sockets closed): for a task that has
    ended and is not reaped yet, so that `leader` names nothing else. Returns the pids killed."""
    left = []
    for pid in members(leader):
        try:
            left.append(psutil.Process(pid))
        except psutil.Error:
            continue
    signal_all(left, signal.SIGKILL)
    if left:
        psutil.wait_procs(left, timeout=wait)
        log.info('killed what task pid %d left running: %s', leader, ', '.join(str(p.pid) for p in left))
    return [p.pid for p in left]


def signal_all(processes: list[psutil.Process], signum: int) -> None:
    """Send `signum` to each process that is still the one found (psutil checks its start time)."""
    for process in processes:
        try:
            process.send_signal(signum)
        except psutil.Error:
            pass
