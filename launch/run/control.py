"""`launch scale` talks to the running launcher of a run through two small files in its
train_dir: the request (`scale.request`: which worker count, from whom, to which launcher) and
the reply (`scale.reply`: done, refused or failed, with the lines the launcher said about it). A
flock on `scale.lock` lets one `scale` at a time through. Files, not a socket: a unix socket's
path is limited to 108 bytes (train_dirs are often longer), and a killed launcher would leave it
behind; whether a launcher runs at all is told by its lock on the train_dir
(launch/records/lock.py TrainDirLock).

A request is addressed to one launcher: its pid and that process's start time, as its state
file (launch/run/state.py) names them. A launcher killed before it answered leaves its request
behind; the next launcher of the run answers it "refused" instead of carrying out a change
nobody asked it for (a `launch up --workers 2` must not scale itself to 3).
"""
from __future__ import annotations

import enum
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Mapping

from cluster.runtime import runjson
from cluster.runtime.rundir import read_text, write_atomically
from launch.backends.procstat import process_ident
from launch.run.state import LaunchState

REQUEST_FILE, REPLY_FILE, LOCK_FILE = 'scale.request', 'scale.reply', 'scale.lock'


class Reply(str, enum.Enum):
    """The launcher's final word on a request, spelled as `scale.reply` holds it."""
    DONE = 'done'
    REFUSED = 'refused'
    FAILED = 'failed'

    def __str__(self) -> str:
        return self.value


DONE, REFUSED, FAILED = Reply.DONE, Reply.REFUSED, Reply.FAILED


@dataclass(frozen=True)
class ScaleRequest:
    """`scale.request`: `workers` running workers, asked by the `launch scale` of pid `pid`, of
    the launcher `launcher` (this_launcher(): its pid and start time; None in a request of a
    version that named none)."""
    id: str
    workers: int
    pid: Any = None         # as sent (an int)
    launcher: Any = None

    def to_json(self) -> dict[str, Any]:
        return {'id': self.id, 'workers': self.workers, 'pid': self.pid, 'launcher': self.launcher}

    @classmethod
    def from_json(cls, data: Any) -> ScaleRequest:
        """ValueError if it is no request (no whole `workers`, no text `id`)."""
        if not isinstance(data, dict) or not isinstance(data.get('workers'), int) \
                or not isinstance(data.get('id'), str):
            raise ValueError('not a scale request')
        return cls(data['id'], data['workers'], data.get('pid'), data.get('launcher'))


@dataclass(frozen=True)
class ScaleReply:
    """`scale.reply`: the launcher's final word on the request `id`, and what it said of it."""
    id: str
    state: Reply | str
    lines: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {'id': self.id, 'state': str(self.state), 'lines': list(self.lines)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScaleReply:
        return cls(str(data.get('id')), str(data.get('state')), [str(line) for line in data.get('lines') or []])


def path(train_dir: str, name: str) -> str:
    return os.path.join(train_dir, name)


def this_launcher() -> dict:
    """This process as a request's addressee: its pid and its start time (launch/backends/procstat.py)."""
    return {'pid': os.getpid(), 'ident': process_ident(os.getpid()) or ''}


def addressee(state: LaunchState | None) -> dict | None:
    """The launcher a state file names, as a request's addressee, if that process still lives
    (a state file outlives a launcher killed hard); else None."""
    if state is None or not state.launcher_ident or process_ident(state.launcher_pid) != state.launcher_ident:
        return None
    return {'pid': state.launcher_pid, 'ident': state.launcher_ident}


def send(train_dir: str, workers: int, launcher: dict) -> str:
    """Ask the launcher `launcher` (addressee()) for `workers` running workers; returns the request's id."""
    ident = uuid.uuid4().hex[:12]
    try:
        os.remove(path(train_dir, REPLY_FILE))
    except FileNotFoundError:
        pass
    write_atomically(path(train_dir, REQUEST_FILE),
                     runjson.dumps(ScaleRequest(ident, workers, os.getpid(), launcher).to_json()))
    return ident


def take(train_dir: str, launcher: dict) -> ScaleRequest | None:
    """The launcher's side (`launcher`: this_launcher()): a request to it waiting, or None. One
    that cannot be read is removed, so it is never read again. One sent to another launcher (an
    earlier one of the run, or a request of a version that named none) is answered "refused" and
    removed: a `scale` that still waits on it learns why, and nothing is changed."""
    text = read_text(path(train_dir, REQUEST_FILE))
    if text is None:
        return None
    try:
        request = ScaleRequest.from_json(runjson.loads(text))
    except (ValueError, RecursionError):
        _remove(train_dir, text)
        return None
    sent_to = request.launcher
    if sent_to != launcher:
        pid = sent_to.get('pid') if isinstance(sent_to, dict) else None
        answer(train_dir, request, Reply.REFUSED,
               [f'this request was sent to {f"launcher pid {pid}" if isinstance(pid, int) else "another launcher"} '
                f'of the run, which has ended; launcher pid {launcher["pid"]} runs it now and changed nothing: '
                'ask again if the change is still wanted'])
        return None
    return request


def answer(train_dir: str, request: ScaleRequest, state: Reply, lines: list[str]) -> None:
    """The launcher's final word on `request` (the request is then gone)."""
    write_atomically(path(train_dir, REPLY_FILE), runjson.dumps(ScaleReply(request.id, state, lines).to_json()))
    _remove(train_dir, request)


def _remove(train_dir: str, request: ScaleRequest | str) -> None:
    """Remove the request file if it still holds `request` (a dict, or the text read): a `scale`
    may have sent a new one since it was read (an earlier launcher's request being refused)."""
    text = read_text(path(train_dir, REQUEST_FILE))
    if text is None:
        return
    if isinstance(request, ScaleRequest):
        try:
            now = runjson.loads(text)
        except ValueError:
            now = None
        if not isinstance(now, dict) or now.get('id') != request.id:
            return
    elif text != request:
        return
    try:
        os.remove(path(train_dir, REQUEST_FILE))
    except FileNotFoundError:
        pass


def wait(train_dir: str, ident: str, running: Callable[[], bool], poll: float = 0.2) -> ScaleReply | None:
    """The reply to request `ident`, or None once `running()` says the launcher is gone."""
    while True:
        text = read_text(path(train_dir, REPLY_FILE))
        if text:
            try:
                reply = runjson.loads(text)
            except ValueError:
                reply = None
            if isinstance(reply, dict) and reply.get('id') == ident:
                return ScaleReply.from_json(reply)
        if not running():
            return None
        time.sleep(poll)
