"""The SSH watcher reads a task as the status snapshot does: the task's /proc stat, its wrapper's,
and only then the rc file. The wrapper writes the rc before it leaves, so a wrapper seen gone wrote
the rc that is read after it; read the other way round, a task that ended well could read as gone
with no exit code, which the launcher takes for a group killed hard (CI saw a finished worker
restarted as "killed by SIGKILL")."""
from __future__ import annotations

from launch.backends.ssh.watch import WATCH_SCRIPT


def _look_with(reads: list[str]):
    """The script's own `look`, with its file reads recorded instead of made."""
    defs = WATCH_SCRIPT[:WATCH_SCRIPT.index('\ngen, tasks')]
    space: dict = {}
    exec(defs, space)                                    # noqa: S102 - our own script's functions
    space['text'] = lambda path: reads.append(path) or f'<{path}>'
    return space['look']


def test_the_watcher_reads_the_task_then_its_wrapper_then_the_rc():
    reads: list[str] = []
    seen = _look_with(reads)(12, '/w/ps-0.rc', 11)
    assert reads == ['/proc/12/stat', '/proc/11/stat', '/w/ps-0.rc']
    assert seen == ['</w/ps-0.rc>', '</proc/12/stat>', '</proc/11/stat>']     # rc, stat, wrapper


def test_a_task_without_an_rc_file_reads_dev_null_last():
    reads: list[str] = []
    _look_with(reads)(20, '', 20)
    assert reads == ['/proc/20/stat', '/proc/20/stat', '/dev/null']
