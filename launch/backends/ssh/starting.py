"""Starting tasks over SSH, many at once: one script per host starts all of that host's tasks (their
env files written from here-documents in the same script), over the host's one connection, hosts
START_HOSTS_AT_ONCE at a time. A task by task start took two round trips per task (an SFTP upload,
then a command) in series across every host: some 20 s at 1,000 tasks where this takes a round
trip or two per host.

A host's tasks go in scripts of at most SCRIPT_BYTES (a command over SSH is one argument of
`sh -c`, within Linux's MAX_ARG_STRLEN); a task whose part alone is larger has its env file
uploaded over SFTP, as before. A script that fails half way (the connection lost) has what it may
have started stopped through the pidfiles (undo_start_script): the launcher keeps no task it has no
record of.
"""
from __future__ import annotations

import posixpath
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import invoke
import paramiko

from cluster.runtime import rundir
from cluster.runtime.messages import channel_env
from launch.backends import marks
from launch.backends.base import STOP_GRACE_SECS, TaskRecord
from launch.backends.ssh.connections import COMMAND_TIMEOUT, SSHError, parallel
from launch.backends.ssh.scripts import (Started, TaskFiles, TaskProcess, env_file_text, start_script, task_command, host_script, parse_host_script, parse_started,
                                         spec_made_absolute, undo_start_script, write_env_file)
from launch.planning.plan import LEASE_SECS, TaskPlan

R = TypeVar('R')


class SSHBackend(Protocol):
    """What a start needs of the backend (backend.py's SSHBackend)."""

    def _connect(self, name: str) -> object: ...
    def _run(self, name: str, script: str, timeout: float = ...) -> invoke.Result: ...
    def _sftp_call(self, name: str, fn: Callable[[paramiko.SFTPClient], R]) -> R: ...
    def _upload(self, sftp: paramiko.SFTPClient, text: str, target: str) -> None: ...
    def _workdir(self, name: str, cwd: str) -> str: ...
    def _earlier(self, plan: TaskPlan) -> TaskProcess | None: ...
    def _note_started(self, record: TaskRecord) -> None: ...
    def _started_record(self, plan: TaskPlan, started: Started, workdir: str, log_file: str,
                        files: TaskFiles) -> TaskRecord: ...
    def _warm_starts(self, name: str, plans: list[TaskPlan]) -> tuple[list[TaskRecord], list[TaskPlan]]: ...


START_HOSTS_AT_ONCE = 32      # hosts started at once (50 hosts: two rounds of a script each)
SCRIPT_BYTES = 96 * 1024      # a host script's size at most (MAX_ARG_STRLEN is 128 KiB)


@dataclass(frozen=True)
class _Part:
    """One task's share of its host's start: its plan, where it runs, its files and its script."""
    plan: TaskPlan
    workdir: str
    log_file: str
    files: TaskFiles
    env_text: str
    start: str

    @property
    def text(self) -> str:
        """The task's part of a host script: its env file written, then its start script."""
        return write_env_file(self.env_text, self.files.envfile) + '\n' + self.start


def start_many(backend: SSHBackend, plans: Sequence[TaskPlan], stop: threading.Event) -> Iterator[TaskRecord]:
    """Every host's tasks at once (a script per host); yields the record of every task that started,
    then raises one SSHError naming every host that failed."""
    groups: dict[str, list[TaskPlan]] = {}
    for plan in plans:
        groups.setdefault(plan.task.host, []).append(plan)
    results = parallel(lambda item: _start_host(backend, item[0], item[1], stop), groups.items(),
                       START_HOSTS_AT_ONCE)
    errors = []
    for records, error in results:
        yield from records
        if error is not None:
            errors.append(error)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise SSHError(errors[0].host, '; '.join([errors[0].cause] + [str(e) for e in errors[1:]]))


def _start_host(backend: SSHBackend, name: str, plans: list[TaskPlan],
                stop: threading.Event) -> tuple[list[TaskRecord], SSHError | None]:
    """A host's tasks, a script at a time; stops at the first failure (the run then stops all)."""
    records: list[TaskRecord] = []
    try:
        backend._connect(name)      # an unreachable host fails here, before anything can start
        records, plans = backend._warm_starts(name, plans)     # those a standby takes (ssh/standby.py)
        parts = [_part(backend, name, plan) for plan in plans]
    except SSHError as e:
        return records, e
    for batch in _batches(parts):
        if stop.is_set():
            break
        got, error = _run_batch(backend, name, batch)
        records += got
        if error is not None:
            return records, error
    return records, None


def _start_script(plan: TaskPlan, workdir: str, earlier: TaskProcess | None) -> str:
    """The script that starts `plan`'s task in `workdir` (its absolute path on the host)."""
    link = posixpath.join(workdir, plan.log_path)
    # Each attempt logs to a file of its own (a task restarted within one appends); log_path
    # leads to the newest, and a plain file left there by an older version becomes attempt-0's.
    legacy = posixpath.join(posixpath.dirname(link), rundir.attempt_dirname(0))
    command = task_command(spec_made_absolute(plan.argv, workdir), TaskFiles.beside(link).envfile)
    return start_script(command, workdir, link, posixpath.join(workdir, plan.attempt_log_path), legacy, earlier,
                        marks.of_plan(plan, workdir))


def _part(backend: SSHBackend, name: str, plan: TaskPlan) -> _Part:
    workdir = backend._workdir(name, plan.cwd)
    log_file = posixpath.join(workdir, plan.attempt_log_path)
    files = TaskFiles.beside(posixpath.join(workdir, plan.log_path))
    start = _start_script(plan, workdir, backend._earlier(plan))
    env_text = env_file_text({**plan.env, **channel_env(log_file)})     # its records beside its log
    return _Part(plan, workdir, log_file, files, env_text, start)


def _batches(parts: list[_Part]) -> Iterator[list[_Part]]:
    """The parts in order, in groups whose host script stays within SCRIPT_BYTES."""
    batch: list[_Part] = []
    size = 0
    for part in parts:
        cost = len(part.text.encode()) + 100
        if batch and size + cost > SCRIPT_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(part)
        size += cost
    if batch:
        yield batch


def _run_batch(backend: SSHBackend, name: str, batch: list[_Part]) -> tuple[list[TaskRecord], SSHError | None]:
    """One host script for these tasks: the records of those that started, and what failed."""
    try:
        if len(batch) == 1 and len(batch[0].text.encode()) > SCRIPT_BYTES:
            part = batch[0]         # its env alone is too large for a command: uploaded
            backend._sftp_call(name, lambda sftp: backend._upload(sftp, part.env_text, part.files.envfile))
            result = backend._run(name, host_script([(part.plan.name, part.start)]))
        else:
            result = backend._run(name, host_script([(p.plan.name, p.text) for p in batch]))
    except SSHError as e:
        # Tasks may have started before the answer was lost: stop them, or the launcher would leave
        # behind tasks it has no record of (not in the state file, never stopped).
        return [], SSHError(name, f'{e.cause}; {_undo(backend, name, batch)}')
    answers = parse_host_script(result.stdout)
    records, failed = [], []
    for part in batch:
        said = answers.get(part.plan.name, '')
        started = parse_started(said)
        if started is None:
            last = ([x for x in said.splitlines() if x.strip()] or result.stderr.strip().splitlines() or ['no output'])[-1]
            failed.append(f'could not start {part.plan.name} (exit {result.exited}): {last}')
            continue
        record = backend._started_record(part.plan, started, part.workdir, part.log_file, part.files)
        backend._note_started(record)
        records.append(record)
    return records, SSHError(name, '; '.join(failed)) if failed else None


def _undo(backend: SSHBackend, name: str, batch: list[_Part]) -> str:
    """Stop whatever these tasks' starts launched (undo_start_script); says what came of it."""
    tasks = [p.plan.name for p in batch]
    try:
        undo = [(p.plan.name, undo_start_script(p.files, marks.of_plan(p.plan, p.workdir))) for p in batch]
        result = backend._run(name, host_script(undo),
                              timeout=COMMAND_TIMEOUT + STOP_GRACE_SECS * len(batch))
    except SSHError as e:
        which = f'{tasks[0]} may be running there' if len(tasks) == 1 else f'{", ".join(tasks)} may be running there'
        return (f'{which} ({e.cause}); it stops itself within {LEASE_SECS["ssh"]}s, once its lease is no '
                'longer renewed')
    said = parse_host_script(result.stdout)
    return '; '.join(f'stopped {t}, which had started' if 'stopped' in said.get(t, '') else f'{t} did not start'
                     for t in tasks)
