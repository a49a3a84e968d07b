"""Every task's log followed from one thread (launch/run/pump.py through Lifecycle.follow): each
task's lines in its log's order, all read before unfollow returns, a restart read from its offset,
and a line a parser trips on neither silences its task nor the others. Fast: real files, the
real pump thread; no process."""
from __future__ import annotations

import io
import threading
import time

import pytest

from cluster.spec import load_spec
from launch.backends.tail import FileTail
from launch.run.console import Console
from launch.run.lifecycle import Lifecycle
from launch.run.changes import Changes
from launch.run.pump import SWEEP_SECS, Pump
from tests.conftest import write_spec

TASKS = 40


def lifecycle(tmp_path) -> tuple[Lifecycle, io.StringIO]:
    stream = io.StringIO()
    return Lifecycle(load_spec(write_spec(tmp_path)), Console(stream=stream), report=False), stream


def pump_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith('-pump')]


@pytest.mark.parametrize('written_here', [False, True], ids=['polled', 'inotify'])
def test_many_logs_are_followed_by_one_thread_each_in_its_order(tmp_path, written_here):
    life, _ = lifecycle(tmp_path)
    seen: dict[str, list[str]] = {}
    names = [f'worker:{i}' for i in range(TASKS)]
    for i, name in enumerate(names):
        (tmp_path / f'{i}.log').write_text(''.join(f'{name} line {n}\n' for n in range(5)))
        life.follow(name, FileTail(str(tmp_path / f'{i}.log'), written_here=written_here),
                    seen.setdefault(name, []).append, group='local')
    threads = [t.name for t in threading.enumerate()]
    assert threads.count('follow-local-pump') == 1      # one thread, not one per task
    assert not [t for t in threads if t.startswith('follow-worker:')]
    for i, name in enumerate(names):
        with open(tmp_path / f'{i}.log', 'a') as f:
            f.write(f'{name} line 5\n{name} unfinished')
    life.unfollow(names)
    for name in names:      # every line, the one with no newline too, in order
        assert seen[name] == [f'{name} line {n}' for n in range(6)] + [f'{name} unfinished']


def test_unfollow_returns_once_a_log_is_read_to_its_end(tmp_path):
    """What a restart relies on: the earlier start's lines are all read before the next one writes."""
    life, stream = lifecycle(tmp_path)
    path = tmp_path / 'worker-0.log'
    seen: list[str] = []
    life.follow('worker:0', FileTail(str(path)), seen.append)
    path.write_text('written just before the stop\n')
    life.unfollow(['worker:0'])
    assert seen == ['written just before the stop']
    assert 'written just before the stop' in stream.getvalue()


def test_a_restart_is_followed_from_its_offset(tmp_path):
    life, _ = lifecycle(tmp_path)
    path = tmp_path / 'worker-0.log'
    path.write_text('first start\n')
    seen: list[str] = []
    life.follow('worker:0', FileTail(str(path)), seen.append)
    offset = path.stat().st_size
    with open(path, 'a') as f:
        f.write('second start\n')
    life.follow('worker:0', FileTail(str(path), offset), seen.append)     # follow again: the first drained
    life.unfollow(['worker:0'])
    assert seen == ['first start', 'second start', 'second start']


def test_a_log_not_there_is_followed_as_empty(tmp_path):
    life, _ = lifecycle(tmp_path)
    seen: list[str] = []
    life.follow('worker:0', FileTail(str(tmp_path / 'not-yet.log')), seen.append)
    life.unfollow(['worker:0'])
    assert seen == []


def test_a_line_a_parser_trips_on_silences_neither_its_task_nor_the_others(tmp_path):
    life, stream = lifecycle(tmp_path)
    seen: list[str] = []

    def parse(line: str) -> None:
        if line == 'bad':
            raise ValueError('no such message')
        seen.append(line)
    for name in ('worker:0', 'worker:1'):
        path = tmp_path / f'{name}.log'
        path.write_text(f'{name} before\nbad\n{name} after\n')
        life.follow(name, FileTail(str(path)), parse)
    life.unfollow(['worker:0', 'worker:1'])
    assert sorted(seen) == ['worker:0 after', 'worker:0 before', 'worker:1 after', 'worker:1 before']
    assert stream.getvalue().count('bad') == 2      # shown all the same


def test_a_generator_of_lines_is_still_followed(tmp_path):
    """What Slurm's own log and the backends that do not override log_tail give: a generator."""
    life, _ = lifecycle(tmp_path)
    seen: list[str] = []
    when_asked: list[list[str]] = []

    def lines(stop: threading.Event):
        yield 'one'
        when_asked.append(list(seen))       # asked for more only once its line was handled
        stop.wait()
        yield 'the last'
    life.follow('slurm', lines, seen.append)
    life.unfollow(['slurm'])
    assert seen == ['one', 'the last'] and when_asked == [['one']]


def test_the_pump_thread_ends_once_nothing_is_followed(tmp_path):
    pump = Pump('alone')
    path = tmp_path / 'worker-0.log'
    path.write_text('one\n')
    seen: list[str] = []
    pump.add('worker:0', FileTail(str(path)), seen.append)
    pump.drain(['worker:0'])
    assert seen == ['one'] and pump.following() == []
    thread = next((t for t in pump_threads() if t.name == 'alone-pump'), None)
    if thread is not None:
        thread.join(5)
        assert not thread.is_alive()


class CountedTail(FileTail):
    """A FileTail that counts its polls."""
    polls = 0

    def poll(self) -> list[str]:
        self.polls += 1
        return super().poll()


def test_a_quiet_log_written_here_is_read_only_when_written(tmp_path):
    """inotify: 40 quiet logs cost no poll each tenth of a second; a line written to one is seen at
    the next poll, not at the next sweep; one written elsewhere (a network file system) is polled."""
    if not Changes().works:
        pytest.skip('no inotify on this machine: every log is polled (launch/run/changes.py)')
    pump = Pump('test')
    tails, seen = [], []
    for i in range(TASKS):
        (tmp_path / f'{i}.log').write_text('')
        tails.append(CountedTail(str(tmp_path / f'{i}.log'), written_here=i > 0))
        pump.add(f'worker:{i}', tails[-1], seen.append)
    time.sleep(1.0)
    sweeps = 1 / SWEEP_SECS + 1
    assert all(t.polls <= 2 + sweeps for t in tails[1:]), [t.polls for t in tails]
    assert tails[0].polls >= 5         # not written here: polled at every tick
    t0 = time.monotonic()
    with open(tmp_path / '7.log', 'a') as f:
        f.write('heard\n')
    while 'heard' not in seen and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    assert seen == ['heard'] and time.monotonic() - t0 < SWEEP_SECS
    pump.drain([f'worker:{i}' for i in range(TASKS)])
    assert all(t.ended for t in tails)


def test_a_watch_is_shared_by_the_followers_of_one_file_and_goes_with_the_last(tmp_path):
    changes = Changes()
    if not changes.works:
        pytest.skip('no inotify on this machine: every log is polled (launch/run/changes.py)')
    path = str(tmp_path / 'worker-0.log')
    assert not changes.watch(path)          # not there yet: polled
    open(path, 'w').close()
    assert changes.watch(path) and changes.watch(path)      # a restart's follower: the same watch
    assert changes.changed() == set()
    with open(path, 'a') as f:
        f.write('a line\n')
    assert changes.changed() == {path} and changes.changed() == set()
    changes.unwatch(path)
    with open(path, 'a') as f:
        f.write('still watched\n')
    assert changes.changed() == {path}
    changes.unwatch(path)
    with open(path, 'a') as f:
        f.write('no longer\n')
    assert changes.changed() == set()
    changes.close()
