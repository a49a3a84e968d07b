"""A watcher per SSH host that tells the launcher at once when one of the host's tasks ends.

Without it, the backend learns of an end by asking: a status snapshot (scripts.py snapshot_script)
costs a command over SSH, so it is asked at most every SNAPSHOT_TTL, and a task killed was seen
half a second late on average. The watcher is one long-lived command on the host, a small Python
loop (WATCH_SCRIPT) started once over the host's connection: the launcher writes the set of tasks
to watch to its stdin (the whole set, a JSON line, whenever it changes), and it reads each task's
/proc stat, its wrapper's and its rc file every WATCH_SECS, exactly as the snapshot does, and
writes a JSON line with all of them whenever what matters changed (an rc written, a state letter,
a process gone or replaced) and at least every BEAT_SECS.

What it wrote answers `status` while it is fresh and of the newest set the launcher wrote (its
`gen`); else the backend asks with a snapshot as before, so a lost connection or a host without
the watcher costs only speed, never a wrong answer. The loop leaves when its stdin closes: when the
launcher closes the channel, or sshd ends the session with the connection.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping

import paramiko

from cluster.runtime import runjson
from launch.backends.ssh.scripts import Seen, Watched, q

log = logging.getLogger(__name__)

WATCH_SECS = 0.05      # how often the host's loop looks at its tasks
BEAT_SECS = 0.5        # the loop writes at least this often, so silence means trouble
FRESH_SECS = 2.0       # what it wrote answers status this long; older, the backend asks itself
RETRY_SECS = 2.0       # a watcher that failed to start or was cut is started again after this
GIVE_UP_AFTER = 3      # starts in a row that never answered (no Python 3 there): snapshots only

# The host's side: Python 3 with nothing beyond the standard library. Each task is read in the
# snapshot's order (`look`: its stat, its wrapper's, then its rc). The wrapper writes the rc before
# it leaves, so a wrapper seen gone wrote the rc read after it; the rc read first left a window
# where a task that ended well read as killed hard (CI saw a finished worker "killed by SIGKILL").
WATCH_SCRIPT = r'''
import json, os, select, sys, time
def text(path):
    try:
        with open(path) as f:
            return f.read().rstrip("\n")
    except (OSError, ValueError):
        return ""
def look(pid, rcfile, group):
    stat = text("/proc/%%d/stat" %% pid)
    wrapper = text("/proc/%%d/stat" %% group)
    return [text(rcfile or "/dev/null"), stat, wrapper]
def gist(s):
    f = s[s.rfind(")") + 2:].split() if ")" in s else []
    return (f[0], f[19]) if len(f) > 19 else ()
gen, tasks, buf, last, beat = -1, {}, b"", None, 0.0
while True:
    if select.select([0], [], [], %(period)r)[0]:
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            msg = json.loads(line.decode())
            gen, tasks = msg["gen"], msg["tasks"]
    seen = {key: look(*task) for key, task in tasks.items()}
    now = time.monotonic()
    digest = (gen, {k: (v[0], gist(v[1]), gist(v[2])) for k, v in seen.items()})
    if digest != last or now - beat >= %(beat)r:
        try:
            sys.stdout.write(json.dumps({"gen": gen, "seen": seen}) + "\n")
            sys.stdout.flush()
        except OSError:
            break
        last, beat = digest, now
''' % {'period': WATCH_SECS, 'beat': BEAT_SECS}


def key(name: str, pid: int) -> str:
    """A watched task's key: its name and pid, so a new start of the task is never judged by its
    earlier copy's process."""
    return f'{name}#{pid}'


class HostWatch:
    """The watcher of one host: a thread that keeps its command running and reads what it writes."""

    def __init__(self, host: str, python: str, connect: Callable[[], paramiko.Transport]) -> None:
        self.host = host
        self._command = f'exec {python} -u -c {q(WATCH_SCRIPT)}'
        self._connect = connect
        self._lock = threading.Lock()
        self._tasks: dict[str, list] = {}
        self._gen = 0
        self._seen: dict[str, Seen] = {}
        self._seen_gen = -1
        self._seen_at = 0.0
        self._channel: paramiko.Channel | None = None
        self.given: Mapping[str, Watched] | None = None      # the mapping last watched (Watches.seen)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f'ssh-watch-{host}', daemon=True)
        self._thread.start()

    def watch(self, tasks: list[Watched]) -> None:
        """Watch exactly these tasks from now on (sent only when the set changed)."""
        wanted = {key(t.name, t.pid): [int(t.pid), t.rcfile, int(t.group)] for t in tasks}
        with self._lock:
            if wanted == self._tasks:
                return
            self._tasks, self._gen = wanted, self._gen + 1
            self._send_locked()

    def seen(self, name: str, pid: int) -> Seen | None:
        """What the watcher last saw of the task, if that is fresh and of the newest set; else None."""
        with self._lock:
            if self._seen_gen != self._gen or time.monotonic() - self._seen_at > FRESH_SECS:
                return None
            return self._seen.get(key(name, pid))

    def invalidate(self) -> None:
        """Trust nothing the watcher wrote before it is told this (a stop just ended tasks)."""
        with self._lock:
            self._gen += 1
            self._send_locked()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()          # the loop reads the end of its stdin and leaves
        self._thread.join(timeout=5)

    def _send_locked(self) -> None:
        if self._channel is None:
            return
        try:
            self._channel.sendall((runjson.dumps({'gen': self._gen, 'tasks': self._tasks}) + '\n').encode())
        except (OSError, EOFError, paramiko.SSHException) as e:
            log.debug('%s: the task watcher cannot be told: %s', self.host, e)

    def _run(self) -> None:
        failed = 0
        while not self._closed.is_set() and failed < GIVE_UP_AFTER:
            try:
                heard = self._serve()
            except Exception as e:        # a connection that failed or was cut: ask with snapshots
                log.debug('%s: the task watcher stopped: %s', self.host, e)
                heard = False
            failed = 0 if heard else failed + 1
            with self._lock:
                self._channel = None
                self._seen_gen = -1
            self._closed.wait(RETRY_SECS)
        if failed >= GIVE_UP_AFTER:
            log.debug('%s: no task watcher (it never answered); status asks with snapshots', self.host)

    def _serve(self) -> bool:
        """Run the host's loop until its channel ends; whether it ever answered."""
        channel = self._connect().open_session()
        channel.exec_command(self._command)
        with self._lock:
            if self._closed.is_set():
                channel.close()
                return True
            self._channel = channel
            self._send_locked()
        heard = False
        for line in channel.makefile('rb'):
            if not line.endswith(b'\n'):
                break                    # cut short: trust nothing of it
            said = json.loads(line)
            heard = True
            with self._lock:
                self._seen = {k: Seen(*v) for k, v in said['seen'].items()}
                self._seen_gen, self._seen_at = said['gen'], time.monotonic()
        channel.close()
        return heard


class Watches:
    """The backend's watchers, one per host, started on the first status asked of the host by a
    backend that started tasks (the launcher that runs them)."""

    def __init__(self, python_of: Callable[[str], str], transport_of: Callable[[str], paramiko.Transport]) -> None:
        self._python_of = python_of
        self._transport_of = transport_of
        self._lock = threading.Lock()
        self._hosts: dict[str, HostWatch] = {}
        self.enabled = False    # set once the backend starts a task: a `launch status` or `down` asks once

    def seen(self, host: str, tasks: Mapping[str, Watched], name: str, pid: int) -> Seen | None:
        """What the host's watcher saw of task `name`'s process `pid`, `tasks` being all the host's
        to watch; None while it cannot say (starting, cut, not yet told of a new start)."""
        if not self.enabled:
            return None
        with self._lock:
            watch = self._hosts.get(host)
            if watch is None:
                watch = self._hosts[host] = HostWatch(host, self._python_of(host),
                                                      lambda: self._transport_of(host))
        if tasks is not watch.given:        # the backend makes the mapping anew when its tasks change
            watch.given = tasks
            watch.watch(list(tasks.values()))
        return watch.seen(name, pid)

    def invalidate(self, host: str) -> None:
        with self._lock:
            watch = self._hosts.get(host)
        if watch is not None:
            watch.invalidate()

    def close(self) -> None:
        with self._lock:
            watches, self._hosts = list(self._hosts.values()), {}
        for w in watches:
            w.close()
