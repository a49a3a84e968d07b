"""Stack dumps of a run's tasks: ask every task that runs for its Python stacks (rundir.DUMP_SIGNAL,
written by cluster/runtime/stacks.py), wait a moment for them and keep them in this machine's
train_dir, under stacks/attempt-N/. The stall watchdog asks before anything is stopped (so the
stacks show where each task was stuck, not how it was stopped), and so does `launch debug`.

A task answers by appending to its stacks file, which it opens when it starts. A task whose file
is not there yet is not signalled: it has not installed its handler yet (it is still starting),
and the signal's default action would end it. A stopped task (SIGSTOP, `docker pause`) cannot
answer; it is signalled all the same (it writes its stacks once it runs again) but not waited for.
A remote task's file is copied here; a task's file on this machine is already here.
"""
from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cluster.runtime import rundir
from cluster.runtime.rundir import read_text, write_atomically
from launch.backends.base import ENDED, UNKNOWN, Backend, Observation, TaskRecord
from launch.system import poll_until

DUMP_WAIT_SECS = 2.5        # how long the tasks have to write their stacks (they take milliseconds)
POLL_SECS = 0.1             # a dump is complete once its file has not grown for this long


@dataclass(frozen=True)
class StackDump:
    """What one request for stacks came to: where they are, which tasks wrote them, and why each
    of the others did not."""
    directory: str                          # on this machine: <train_dir>/stacks/attempt-N
    written: tuple[str, ...]                # the tasks whose stacks are there
    silent: tuple[tuple[str, str], ...]     # (task, why it wrote none)

    def relative(self, train_dir: str) -> str:
        """The directory as the event log names it: relative to the train_dir (which may move)."""
        return os.path.relpath(self.directory, train_dir)

    def words(self) -> str:
        """For the stall line: where the stacks are, and the tasks that did not answer."""
        quiet = ', '.join(name for name, _ in self.silent)
        if not self.written:
            return f'no task wrote its stacks ({quiet} did not answer)' if quiet else 'no task to ask for its stacks'
        where = f'stacks of {", ".join(self.written)} in {self.directory}'
        return f'{where} ({quiet} did not answer)' if quiet else where

    def lines(self) -> list[str]:
        """For `launch debug`: one line per task."""
        return ([f'{name}: {os.path.join(self.directory, _file_name(name))}' for name in self.written]
                + [f'{name}: no stacks: it {why}' for name, why in self.silent])


def _file_name(task: str) -> str:
    job, index = rundir.parse_task_name(task)
    return os.path.basename(rundir.stacks_path('', None, job, index))


def dump(records: Sequence[TaskRecord], backends: Mapping[str, Backend], train_dir: str, attempt: int | None,
         wait: float = DUMP_WAIT_SECS, starting: Collection[str] = ()) -> StackDump:
    """Ask these tasks (attempt `attempt` of the run in `train_dir`) for their stacks; wait up to
    `wait` seconds for those that can answer; keep what they wrote under this machine's train_dir.
    `starting`: tasks started again that have not said they serve: an earlier start's stacks file
    is there, but the new process may not handle the signal yet (it would end it), so they are not
    asked."""
    paths = {r.name: rundir.stacks_path(train_dir, attempt, r.job, r.index) for r in records}

    def read(r: TaskRecord) -> str | None:
        try:
            return backends[r.backend].read_file(r, paths[r.name])
        except Exception:   # whatever a backend raises reading it: the task counts as silent
            return None

    with ThreadPoolExecutor(max_workers=max(1, len(records))) as pool:
        before = dict(zip(paths, pool.map(read, records)))
        states = dict(zip(paths, pool.map(lambda r: backends[r.backend].status(r), records)))
        silent = _signal(records, backends, before, states, starting)
        waiting = [r for r in records if r.name not in silent and not states[r.name].stopped]
        latest: dict[str, str | None] = dict(before)
        done: set[str] = set()

        def answered() -> bool:
            left = [r for r in waiting if r.name not in done]
            for r, text in zip(left, pool.map(read, left)):
                if _grown(text, before[r.name]) and text == latest[r.name]:    # and not since the last look
                    done.add(r.name)
                latest[r.name] = text
            return len(done) == len(waiting)
        if waiting:
            poll_until(answered, time.monotonic() + wait, POLL_SECS)
    written = []
    for r in records:
        text = latest[r.name]
        if r.name not in silent and text is not None and _grown(text, before[r.name]):
            try:
                keep(paths[r.name], text)
            except OSError as e:        # a full disk here: the task answered, its stacks cannot be kept
                silent[r.name] = f'answered, but its stacks cannot be kept here ({rundir.os_cause(e)})'
                continue
            written.append(r.name)
        elif r.name not in silent:
            silent[r.name] = states[r.name].stopped or f'did not answer within {wait:g}s'
    return StackDump(rundir.stacks_dir(train_dir, attempt), tuple(written),
                     tuple((r.name, silent[r.name]) for r in records if r.name in silent))


def _grown(text: str | None, before: str | None) -> bool:
    return text is not None and len(text) > len(before or '')


def _signal(records: Sequence[TaskRecord], backends: Mapping[str, Backend], before: Mapping[str, str | None],
            states: Mapping[str, Observation], starting: Collection[str] = ()) -> dict[str, str]:
    """Send the dump signal to every task that can take it; returns why each of the others was not
    (or could not be) sent it."""
    silent: dict[str, str] = {}
    asked = []
    for r in records:
        if states[r.name].state == ENDED:
            silent[r.name] = 'has ended'
        elif states[r.name].state == UNKNOWN:
            silent[r.name] = f'cannot be asked ({states[r.name].error})'
        elif before[r.name] is None:
            silent[r.name] = 'has no stacks file yet (it is starting, or cannot write to its train_dir)'
        elif r.name in starting:
            silent[r.name] = 'is starting again (not asked: it may not take the signal yet)'
        else:
            asked.append(r)
    for name, backend in backends.items():
        mine = [r for r in asked if r.backend == name]
        if mine:
            sent = backend.send_signal(mine, rundir.DUMP_SIGNAL)
            silent.update((task, why) for task, why in sent.items() if why is not None)
    return silent


def keep(path: str, text: str) -> None:
    """`text`, a task's stacks file as read from its host, at `path` on this machine. Only ever
    added to: where `path` is the task's own file (a task on this machine, or a shared file
    system), it already holds the text, and the task may be writing to it."""
    have = read_text(path)
    if have is not None and have.startswith(text):
        return
    if have is not None and text.startswith(have):
        with open(path, 'a', encoding='utf-8') as f:
            f.write(text[len(have):])
        return
    os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
    write_atomically(path, text)
