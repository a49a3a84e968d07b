"""A task's log read a little at each poll (launch/backends/tail.py): the local FileTail gives
complete lines only, from its offset, a missing file as empty, and holds no file open between
polls; ThreadTail gives a generator's lines and ends once closed and read. Fast: real files."""
from __future__ import annotations

import os
import threading

from launch.backends.tail import FileTail, ThreadTail


def open_on(path) -> list[str]:
    """This process's open file descriptors that point at `path`."""
    found = []
    for fd in os.listdir('/proc/self/fd'):
        try:
            if os.readlink(f'/proc/self/fd/{fd}') == str(path):
                found.append(fd)
        except OSError:     # the listing's own fd, closed by now
            pass
    return found


def test_a_missing_file_is_empty_until_it_appears(tmp_path):
    path = tmp_path / 'worker-0.log'
    tail = FileTail(str(path))
    assert tail.poll() == [] and not tail.ended
    path.write_text('one\ntwo\n')
    assert tail.poll() == ['one', 'two']
    assert tail.poll() == []


def test_only_complete_lines_until_closed_then_the_rest(tmp_path):
    path = tmp_path / 'worker-0.log'
    path.write_text('one\ntw')
    tail = FileTail(str(path))
    assert tail.poll() == ['one']
    with open(path, 'a') as f:
        f.write('o\nthr')
    assert tail.poll() == ['two']
    tail.close()
    assert not tail.ended       # closed, but the rest is not read yet
    assert tail.poll() == ['thr'] and tail.ended
    assert tail.poll() == []


def test_a_closed_missing_file_ends_empty(tmp_path):
    tail = FileTail(str(tmp_path / 'never.log'))
    tail.close()
    assert tail.poll() == [] and tail.ended


def test_a_restart_is_read_from_its_offset(tmp_path):
    path = tmp_path / 'worker-0.log'
    path.write_text('first start\nits last line\n')
    offset = path.stat().st_size
    with open(path, 'a') as f:
        f.write('second start\n')
    tail = FileTail(str(path), offset)
    assert tail.poll() == ['second start']


def test_no_file_is_held_open_between_polls(tmp_path):
    path = tmp_path / 'worker-0.log'
    path.write_text('one\n')
    tail = FileTail(str(path))
    assert tail.poll() == ['one']
    assert open_on(path) == []


def test_text_is_read_as_follow_file_reads_it(tmp_path):
    """UTF-8 (a character split between two polls is whole; a bad byte replaced) and any line end a newline."""
    path = tmp_path / 'worker-0.log'
    word = 'Grüße'.encode()
    path.write_bytes(b'a\r\nb\rc\n' + word[:3])
    tail = FileTail(str(path))
    assert tail.poll() == ['a', 'b', 'c']
    with open(path, 'ab') as f:
        f.write(word[3:] + b'\n\xff\n')
    assert tail.poll() == ['Grüße', '\ufffd']


def take(tail: ThreadTail, close_after: int | None = None) -> list[str]:
    """Every line the tail gives until it has ended, polled as the pump polls it (at once again
    after lines, else at its wake-up); closed once `close_after` lines came."""
    woken = threading.Event()
    tail.wake = woken.set
    seen: list[str] = []
    while True:
        woken.clear()
        lines = tail.poll()
        seen += lines
        if close_after is not None and len(seen) >= close_after:
            tail.close()
        if tail.ended:
            return seen
        if not lines:
            assert woken.wait(5), 'the tail neither gave lines nor ended'


def test_a_thread_tail_gives_a_generators_lines_and_ends_once_closed():
    def lines(stop: threading.Event):
        yield 'one'
        stop.wait()
        yield 'last'
    assert take(ThreadTail(lines, 'worker:0'), close_after=1) == ['one', 'last']


def test_a_thread_tail_asks_for_the_next_line_only_once_this_one_was_handled():
    handled: list[str] = []
    when_asked: list[list[str]] = []

    def lines(stop: threading.Event):
        for line in ('one', 'two', 'three'):
            yield line
            when_asked.append(list(handled))
    tail = ThreadTail(lines, 'worker:0')
    woken = threading.Event()
    tail.wake = woken.set
    while not tail.ended:
        woken.clear()
        given = tail.poll()
        handled += given
        if not given:
            assert woken.wait(5)
    assert when_asked == [['one'], ['one', 'two'], ['one', 'two', 'three']]


def test_a_thread_tail_whose_reading_fails_ends_with_what_it_read():
    def lines(stop: threading.Event):
        yield 'one'
        raise OSError('the host is gone')
    assert take(ThreadTail(lines, 'worker:0')) == ['one']
