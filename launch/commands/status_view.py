"""What `launch status` prints of a run's tasks: each task asked (its backend's status and a probe
of its port) in parallel, then shown as one table row per task (a small run, or `--all`) or one
line per job (a large run), where the tasks in an ordinary state are counted and only the others
are named: at 1,000 tasks a table of 1,000 rows hides the two that matter."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from cluster.runtime.contract import job_of
from cluster.runtime.telemetry import Sample
from launch.backends.base import Observation

GROUP_ABOVE = 12        # tasks: a run of more is shown one line per job (the table, with `--all`)
NAMED = 20              # tasks that need a look, named on a job's line at most
ASKERS = 32             # tasks asked at once: a frozen host's 0.5 s probe then costs 0.5 s per 32 tasks, not per task

T = TypeVar('T')
R = TypeVar('R')


def ask_all(ask: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`ask` of each item, ASKERS at a time, in the items' order: status and a probe wait on a
    host (a process table, a connect), not on this process's CPU."""
    if len(items) <= 1:
        return [ask(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(ASKERS, len(items)), thread_name_prefix='status') as pool:
        return list(pool.map(ask, items))


@dataclass(frozen=True)
class TaskRow:
    """One task as `launch status` shows it. `alive`: None where its host cannot tell;
    `exit_code`: how it ended, when it did (not in the JSON, which keeps its keys)."""
    task: str
    address: str
    backend: str
    pid: int | None
    alive: bool | None
    listening: bool
    note: str
    left: tuple[int, ...] = ()
    exit_code: int | None = None
    sample: Sample | None = None        # its newest telemetry, while it runs (cluster/runtime/telemetry.py)

    def to_json(self) -> dict:
        return {'task': self.task, 'address': self.address, 'backend': self.backend, 'pid': self.pid,
                'alive': self.alive, 'listening': self.listening, 'note': self.note, 'left': list(self.left),
                'sample': self.sample.facts() if self.sample else None}


def seen_words(seen: Observation | None) -> tuple[bool | None, str]:
    """Whether a task is alive (None: cannot tell) and what to note about it, from what its
    backend observed (None: it was never started)."""
    if seen is None:
        return False, ''
    alive = {'running': True, 'ended': False, 'unknown': None}[seen.state]
    if seen.left:       # the task is gone, what it started is not (and may hold its port)
        return alive, (f'ended, but its process group still runs (pid {", ".join(map(str, seen.left))}): '
                       '`launch down` stops it')
    return alive, (seen.stopped or '') if alive else f'unknown: {seen.error}' if alive is None else ''


def table(rows: Iterable[TaskRow]) -> list[str]:
    """One line per task (the table `launch status` always printed)."""
    rows = list(rows)
    width = max([10] + [len(t.task) for t in rows])      # evaluator:0 is 11
    out = [f'{"TASK":<{width}} {"ADDRESS":<22} {"BACKEND":<7} {"PID":>7}  {"ALIVE":<5}  {"LISTENING":<9}  NOTE']
    for t in rows:
        shown = {True: 'yes', False: 'no', None: '?'}[t.alive]
        # An evaluator serves no port: its LISTENING means nothing.
        listening = '-' if job_of(t.task) == 'evaluator' else 'yes' if t.listening else 'no'
        out.append(f'{t.task:<{width}} {t.address:<22} {t.backend:<7} {t.pid or "-":>7}  '
                   f'{shown:<5}  {listening:<9}  {t.note}'.rstrip())
    return out


# The states a task is counted in, not named: what a run that goes well (or ended well) shows.
ORDINARY = ('running', 'ended', 'spare', 'not started')


def state_of(row: TaskRow) -> str:
    """A task's state in a few words: one of ORDINARY, or what is wrong with it."""
    if row.alive is None:
        return row.note or 'unknown'
    if row.left:
        return f'ended, its process group still runs (pid {", ".join(map(str, row.left))})'
    if row.alive:
        if row.note:
            return row.note
        return 'running' if row.listening or job_of(row.task) == 'evaluator' else 'running, not listening'
    if row.note.startswith('spare'):
        return 'spare'
    if row.pid is None:
        return 'not started'
    return 'ended' if not row.exit_code else f'ended, exit {row.exit_code}'


def grouped(rows: Iterable[TaskRow]) -> list[str]:
    """One line per job, in the order jobs come: its tasks counted by ordinary state, then the
    others named with their state ('worker 980: 978 running; 2 to look at: worker:17 (ended,
    exit -9), worker:402 (is stopped (SIGSTOP, or a debugger))')."""
    jobs: dict[str, list[TaskRow]] = {}
    for row in rows:
        jobs.setdefault(job_of(row.task) or row.task, []).append(row)
    return [_job_line(job, members) for job, members in jobs.items()]


def _job_line(job: str, rows: list[TaskRow]) -> str:
    states = [(row.task, state_of(row)) for row in rows]
    counts = Counter(state for _, state in states if state in ORDINARY)
    odd = [(task, state) for task, state in states if state not in ORDINARY]
    parts = [f'{counts[s]} {s}' for s in ORDINARY if counts[s]]
    if odd:
        named = ', '.join(f'{task} ({state})' for task, state in odd[:NAMED])
        more = f', and {len(odd) - NAMED} more (`launch status --all`)' if len(odd) > NAMED else ''
        parts.append(f'{len(odd)} to look at: {named}{more}')
    return f'{job} {len(rows)}: ' + '; '.join(parts)


def _figure(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return '-' if value is None else format(value * scale, fmt)


def _per_sec(value: float | None) -> str:
    if value is None:
        return '-'
    return f'{value / 1e6:.1f} MB/s' if value >= 1e5 else f'{value / 1e3:.0f} kB/s'


def telemetry(rows: Iterable[TaskRow]) -> list[str]:
    """What each running task measured of itself over its last few seconds (its pulse's sample):
    its steps and images per second (a built-in worker's), CPU (100% is one core), resident
    memory, its TCP bytes in and out per second, and, where a task measured its GPUs, how busy
    they were and its memory on them. Nothing where no task has a sample. Its rows
    are indented under a line of their own: a line that starts with a task's name is the task
    table's (scripts read it so)."""
    measured = [t for t in rows if t.sample is not None and t.alive]
    if not measured:
        return []
    width = max([10] + [len(t.task) for t in measured])
    gpus = any(s.gpu is not None or s.gpu_memory is not None for s in (t.sample for t in measured) if s is not None)
    out = ['measured by each task over its last 2 s:',
           f'  {"TASK":<{width}} {"STEPS/S":>8} {"IMAGES/S":>9} {"CPU":>5} {"MEMORY":>8} {"NET IN":>10} {"NET OUT":>10}'
           + (f' {"GPU":>5} {"GPU MEMORY":>10}' if gpus else '')]
    for t in measured:
        s = t.sample
        assert s is not None
        out.append(f'  {t.task:<{width}} {_figure(s.steps_per_sec, ".1f"):>8} {_figure(s.images_per_sec, ".0f"):>9} '
                   f'{_share(s.cpu):>5} {_megabytes(s.rss):>8} {_per_sec(s.in_per_sec):>10} {_per_sec(s.out_per_sec):>10}'
                   + (f' {_share(s.gpu):>5} {_megabytes(s.gpu_memory):>10}' if gpus else ''))
    return out


def _share(value: float | None) -> str:
    return _figure(value, '.0f', 100) + ('%' if value is not None else '')


def _megabytes(value: int | None) -> str:
    return _figure(value, '.0f', 1e-6) + (' MB' if value is not None else '')
