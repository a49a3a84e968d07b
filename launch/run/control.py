"""`launch scale` talks to the running launcher of a run through two small files in its
train_dir: the request (`scale.request`: which worker count, from whom) and the reply
(`scale.reply`: done, refused or failed, with the lines the launcher said about it). A flock on
`scale.lock` lets one `scale` at a time through. Files, not a socket: a unix socket's path is
limited to 108 bytes (train_dirs are often longer), and a killed launcher would leave it behind;
whether a launcher runs at all is told by its lock on the train_dir (launch/run/state.py TrainDirLock).
"""
from __future__ import annotations

import enum
import os
import time
import uuid
from collections.abc import Callable

from cluster.runtime import runjson
from cluster.runtime.rundir import read_text, write_atomically

REQUEST_FILE, REPLY_FILE, LOCK_FILE = 'scale.request', 'scale.reply', 'scale.lock'


class Reply(str, enum.Enum):
    """The launcher's final word on a request, spelled as `scale.reply` holds it."""
    DONE = 'done'
    REFUSED = 'refused'
    FAILED = 'failed'

    def __str__(self) -> str:
        return self.value


DONE, REFUSED, FAILED = Reply.DONE, Reply.REFUSED, Reply.FAILED


def path(train_dir: str, name: str) -> str:
    return os.path.join(train_dir, name)


def send(train_dir: str, workers: int) -> str:
    """Ask for `workers` running workers; returns the request's id."""
    ident = uuid.uuid4().hex[:12]
    try:
        os.remove(path(train_dir, REPLY_FILE))
    except FileNotFoundError:
        pass
    write_atomically(path(train_dir, REQUEST_FILE), runjson.dumps({'id': ident, 'workers': workers, 'pid': os.getpid()}))
    return ident


def take(train_dir: str) -> dict | None:
    """The launcher's side: a request waiting, or None. One that cannot be read is answered
    (refused) and removed, so a `scale` never waits for ever on a torn file."""
    text = read_text(path(train_dir, REQUEST_FILE))
    if text is None:
        return None
    try:
        request = runjson.loads(text)
        if not isinstance(request.get('workers'), int) or not isinstance(request.get('id'), str):
            raise ValueError
    except (ValueError, AttributeError):
        os.remove(path(train_dir, REQUEST_FILE))
        return None
    return request


def answer(train_dir: str, request: dict, state: Reply, lines: list[str]) -> None:
    """The launcher's final word on `request` (the request is then gone)."""
    write_atomically(path(train_dir, REPLY_FILE), runjson.dumps({'id': request['id'], 'state': state, 'lines': lines}))
    try:
        os.remove(path(train_dir, REQUEST_FILE))
    except FileNotFoundError:
        pass


def wait(train_dir: str, ident: str, running: Callable[[], bool], poll: float = 0.2) -> dict | None:
    """The reply to request `ident`, or None once `running()` says the launcher is gone."""
    while True:
        text = read_text(path(train_dir, REPLY_FILE))
        if text:
            try:
                reply = runjson.loads(text)
            except ValueError:
                reply = None
            if isinstance(reply, dict) and reply.get('id') == ident:
                return reply
        if not running():
            return None
        time.sleep(poll)
