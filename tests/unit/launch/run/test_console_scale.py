"""The console of a large run (issue 39): while more than 50 tasks start, one 'serving N/M'
line a second instead of one serving line per task; only the chief's progress lines unless -v;
a run of 50 tasks or fewer shows every line as it always did."""
from __future__ import annotations

import io

from cluster.runtime.messages import Serving, progress
from launch.run.console import QUIET_ABOVE, Console


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _serving(n: int) -> tuple[str, str]:
    task = f'worker:{n}'
    return task, '2026-11-28 10:00:00 INFO ' + Serving(task, f'localhost:{3000 + n}', 4000 + n).human()


def _shown(console: Console, stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_a_thousand_tasks_serving_are_a_line_a_second():
    stream, clock = io.StringIO(), Clock()
    console = Console(stream, tasks=1000, chief='worker:0', clock=clock)
    for n in range(1000):
        clock.now += 0.004          # 1,000 tasks in 4 s
        console.line(*_serving(n))
    lines = _shown(console, stream)
    assert [line.split()[0] for line in lines] == ['[launch]'] * len(lines)
    assert lines[0] == '[launch]   serving 1/1000' and lines[-1] == '[launch]   serving 1000/1000'
    assert 4 <= len(lines) <= 6
    console.line(*_serving(17))     # after the start: a task's serving line (its restart) as it is
    assert _shown(console, stream)[-1].startswith('[worker:17] 2026-11-28 10:00:00 INFO worker:17 serving on')


def test_the_cluster_restart_counts_again():
    stream, clock = io.StringIO(), Clock()
    console = Console(stream, tasks=60, clock=clock)
    for n in range(60):
        console.line(*_serving(n))
    console.starting()
    clock.now += 5
    console.line(*_serving(3))
    assert _shown(console, stream)[-1] == '[launch]   serving 1/60'


def test_only_the_chiefs_progress_unless_verbose():
    line = progress(10, 100, 1.5).human()
    for verbose, shown in ((False, ['worker:0']), (True, ['worker:0', 'worker:5'])):
        stream = io.StringIO()
        console = Console(stream, verbose=verbose, tasks=QUIET_ABOVE + 1, chief='worker:0')
        console.line('worker:0', line)
        console.line('worker:5', line)
        console.line('worker:5', 'a line of its own')       # any other line is shown
        assert [x.split()[0].strip('[]') for x in _shown(console, stream)] == [*shown, 'worker:5']


def test_a_run_of_fifty_shows_every_line():
    stream = io.StringIO()
    console = Console(stream, tasks=QUIET_ABOVE, chief='worker:0')
    for n in range(QUIET_ABOVE):
        console.line(*_serving(n))
    console.line('worker:5', progress(10, 100, 1.5).human())
    assert len(_shown(console, stream)) == QUIET_ABOVE + 1
