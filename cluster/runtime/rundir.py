"""The run directory's layout and the protocol between a task and its launcher.

The one module both sides import: a task writes these files and lines, the launcher (any backend,
or a scheduler's logs read afterwards) reads them. Nothing here imports TensorFlow or the launcher,
so a change to a name or a line's format is made in one place and both sides follow.

A run directory (`train.train_dir`) holds:

    spec.yaml              the effective spec the tasks read (overrides applied, no SSH settings)
    logs/<job>-<index>.log each task's output
    worker-<index>.json    a worker's closing figures (global step, loss, images/s)
    checkpoint, model.ckpt-<step>.*   TensorFlow's checkpoints (the chief writes them)
    events.out.tfevents.*  TensorBoard: the chief's loss, learning rate, images/s, restarts
    worker-<index>/        TensorBoard: that worker's own steps (cluster/training/summaries.py)
    eval/                  TensorBoard: `launch eval`'s precision@1 at each checkpoint's step
    telemetry/             TensorBoard: every task's telemetry, from the launcher's `sample` events
    variables.json         where a coordinator program's variables went (cluster/runtime/placed.py)
    synthetic-data/        `train.data: synthetic`: the generated set (cluster/checks/data.py)
    launch-state.json      which tasks a running launcher started (`launch status|logs|down`)
    launch.lock            one launcher per run directory (an flock, with its holder's name)
    launcher.lease         touched by the launcher; a task whose lease goes stale stops itself
    compose.yaml           the compose backend's project file
    job.sbatch             the Slurm backend's batch script; logs/slurm-<job id>.out its output
    events.jsonl           the run's event log (launch/records/events.py): one JSON object per line
    run.json               the run's result, rewritten at the end of every attempt
    report.html            `launch report`: one self-contained page
    logs/attempt-<n>/<job>-<index>.log   every attempt's task logs, kept; logs/<job>-<index>.log
                           leads (a symbolic link) to the newest attempt's
    logs/attempt-<n>/<job>-<index>.pulse a trainer's newest step and the task's telemetry, overwritten in
                           place (cluster/runtime/pulse.py, telemetry.py)
    logs/attempt-<n>/<job>-<index>.records  the task's messages to its launcher, one tagged JSON record a
                           line, where the launcher named it a channel (cluster/runtime/messages.py)
    stops/<job>-<index>, stops/all   the launcher's stop marks: a SIGTERM to a task whose mark (or
                           `all`) is there is the launcher's stop; any other is a preemption notice
                           (cluster/runtime/notice.py)
    stacks/attempt-<n>/<job>-<index>.txt  a task's Python stacks, dumped on DUMP_SIGNAL (a stall,
                           `launch debug`, or `kill -USR1`); stacks/<job>-<index>.txt for a task
                           started without a launcher's logs (by hand, by Slurm)
"""
from __future__ import annotations

import datetime
import errno
import logging
import os
import re
import signal

from cluster.runtime import contract, messages, runjson

log = logging.getLogger(__name__)

SPEC_FILE = 'spec.yaml'
LOGS_DIR = 'logs'
STATE_FILE = 'launch-state.json'
LOCK_FILE = 'launch.lock'
LEASE_FILE = 'launcher.lease'
CHECKPOINT_INDEX = 'checkpoint'          # TensorFlow's file naming the newest checkpoints
CHECKPOINT_PREFIX = 'model.ckpt'
SYNTHETIC_DATA_DIR = 'synthetic-data'    # `train.data: synthetic`: the set the launcher writes before a run
REHEARSAL_DIR = 'rehearsal'     # `launch up --rehearse`: the rehearsal's own run, inside the train_dir
COMPOSE_FILE = 'compose.yaml'
BATCH_SCRIPT = 'job.sbatch'
EVENTS_FILE = 'events.jsonl'
RUN_FILE = 'run.json'
STOPS_DIR = 'stops'     # the launcher's stop marks (stop_mark_path)
STOP_ALL = 'all'        # the run-wide mark: every task's SIGTERM is the launcher's stop
REPORT_FILE = 'report.html'
VARIABLES_FILE = 'variables.json'     # a coordinator run's variables and their ps tasks (cluster/runtime/placed.py)

# The environment's names and the exit codes both sides use: cluster/runtime/contract.py.
LEASE_ENV, LEASE_SECS_ENV, RESTART_ENV = contract.LEASE_ENV, contract.LEASE_SECS_ENV, contract.RESTART_ENV
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_RESTART = (contract.EXIT_OK, contract.EXIT_FAILED, contract.EXIT_USAGE,
                                                     contract.EXIT_NO_RESTART)

# How a task's log lines look (logging's format, with TaskLogFormatter's time), e.g.
#   2026-11-23T21:08:43.123+00:00 I step 57/200  loss 3.1
# The launcher reads a task's own error lines back. Logs of older runs have `21:08:43 E ...`.
LOG_FORMAT = '%(asctime)s %(levelname).1s %(message)s'
_LOG_TIME = r'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?|\d\d:\d\d:\d\d)'
_LOGGED_ERROR = re.compile(rf'^{_LOG_TIME} E (.+)$')
_LOGGED = re.compile(rf'^{_LOG_TIME} [DIWEC] ')
_PY_ERROR = re.compile(r'^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)|KeyboardInterrupt)(:\s.*)?$')
_CHECKPOINT = re.compile(r'^model_checkpoint_path:\s*"(?:.*?)-(\d+)"\s*$', re.M)


# -- paths ----------------------------------------------------------------------------------
def task_name(job: str, index: int) -> str:
    """A task's name in logs, events and messages: `worker:3` (contract.TaskName)."""
    return str(contract.TaskName(job, index))


def parse_task_name(name: str) -> tuple[str, int]:
    """(job, index) of a task's name (`worker:3` -> ('worker', 3)); ValueError for anything else."""
    task = contract.TaskName.parse(name)
    return task.job, task.index


def spec_path(train_dir: str) -> str:
    return os.path.join(train_dir, SPEC_FILE)


def logs_dir(train_dir: str) -> str:
    return os.path.join(train_dir, LOGS_DIR)


def log_path(train_dir: str, job: str, index: int) -> str:
    return os.path.join(train_dir, LOGS_DIR, f'{job}-{index}.log')


def attempt_dirname(attempt: int | str) -> str:
    """The folder of logs/ that holds one attempt's task logs: of attempt N, or (a str) of the
    attempt a shell expression such as "$attempt" holds, in a script that works it out."""
    return f'attempt-{attempt}'


def attempt_log_path(train_dir: str, attempt: int, job: str, index: int) -> str:
    """Where attempt `attempt` of a run keeps a task's log (never truncated by a later attempt)."""
    return os.path.join(train_dir, LOGS_DIR, attempt_dirname(attempt), f'{job}-{index}.log')


def attempts(train_dir: str) -> list[int]:
    """The attempts whose logs this machine's train_dir keeps, in order."""
    try:
        names = os.listdir(os.path.join(train_dir, LOGS_DIR))
    except OSError:
        return []
    prefix = attempt_dirname(0)[:-1]
    return sorted(int(n[len(prefix):]) for n in names if n.startswith(prefix) and n[len(prefix):].isdigit())


def log_attempt(train_dir: str, job: str, index: int) -> int | None:
    """The attempt whose log a task's log_path leads to (the launcher points the link at the new
    attempt's file before it starts the task), or None where it is no such link."""
    try:
        target = os.readlink(log_path(train_dir, job, index))
    except OSError:
        return None
    folder = os.path.basename(os.path.dirname(target))
    prefix = attempt_dirname(0)[:-1]
    number = folder[len(prefix):]
    return int(number) if folder.startswith(prefix) and number.isdigit() else None


# -- stack dumps ----------------------------------------------------------------------------
# A task writes its Python stacks (every thread's, by the standard faulthandler module) when it
# gets this signal: the launcher sends it when the stall watchdog fires and on `launch debug`.
DUMP_SIGNAL = signal.SIGUSR1
STACKS_DIR = 'stacks'


def stacks_dir(train_dir: str, attempt: int | None) -> str:
    """Where the tasks of attempt `attempt` keep their stack dumps (None: tasks that know of no attempt)."""
    return os.path.join(train_dir, STACKS_DIR, *([attempt_dirname(attempt)] if attempt is not None else []))


def stacks_path(train_dir: str, attempt: int | None, job: str, index: int) -> str:
    return os.path.join(stacks_dir(train_dir, attempt), f'{job}-{index}.txt')


def events_path(train_dir: str) -> str:
    return os.path.join(train_dir, EVENTS_FILE)


def run_path(train_dir: str) -> str:
    return os.path.join(train_dir, RUN_FILE)


def variables_path(train_dir: str) -> str:
    return os.path.join(train_dir, VARIABLES_FILE)


def report_path(train_dir: str) -> str:
    return os.path.join(train_dir, REPORT_FILE)


def slurm_log_path(train_dir: str, job_id: str) -> str:
    return os.path.join(train_dir, LOGS_DIR, f'slurm-{job_id}.out')


def result_path(train_dir: str, worker_index: int) -> str:
    """A worker's closing figures (written by the worker, read by the launcher's summary)."""
    return os.path.join(train_dir, f'worker-{worker_index}.json')


def chief_result_path(train_dir: str) -> str:
    """A coordinator run's closing figures, written by its chief (the workers only serve)."""
    return os.path.join(train_dir, 'chief.json')


def worker_summary_dir(train_dir: str, worker_index: int) -> str:
    """Where a worker writes its own TensorBoard figures (its step count)."""
    return os.path.join(train_dir, f'worker-{worker_index}')


def eval_summary_dir(train_dir: str) -> str:
    return os.path.join(train_dir, 'eval')


def profile_path(train_dir: str, worker_index: int) -> str:
    return os.path.join(train_dir, f'profile-worker-{worker_index}.json')


def state_path(train_dir: str) -> str:
    return os.path.join(train_dir, STATE_FILE)


def lock_path(train_dir: str) -> str:
    return os.path.join(train_dir, LOCK_FILE)


def lease_path(train_dir: str) -> str:
    return os.path.join(train_dir, LEASE_FILE)


def stop_mark_path(train_dir: str, job: str, index: int) -> str:
    """The launcher's stop mark of one task, written before its SIGTERM: with it (or `stop_all_path`)
    there, the SIGTERM is the launcher's stop; without, a preemption notice (cluster/runtime/notice.py)."""
    return os.path.join(train_dir, STOPS_DIR, f'{job}-{index}')


def stop_all_path(train_dir: str) -> str:
    """The run-wide stop mark (a Slurm cancel, a whole compose project going down)."""
    return os.path.join(train_dir, STOPS_DIR, STOP_ALL)


def train_dir_of_log(log: str) -> str:
    """The train_dir of a task whose log is `log` (log_path or attempt_log_path: what a backend's
    record holds, on the task's host), so that a launcher holding only the record finds the marks."""
    folder = os.path.dirname(log)
    if os.path.basename(folder).startswith(attempt_dirname('')):
        folder = os.path.dirname(folder)
    return os.path.dirname(folder)


def checkpoint_index_path(train_dir: str) -> str:
    return os.path.join(train_dir, CHECKPOINT_INDEX)


def checkpoint_prefix(train_dir: str) -> str:
    return os.path.join(train_dir, CHECKPOINT_PREFIX)


def compose_path(train_dir: str) -> str:
    return os.path.join(train_dir, COMPOSE_FILE)


def batch_script_path(train_dir: str) -> str:
    return os.path.join(train_dir, BATCH_SCRIPT)


def read_text(path: str) -> str | None:
    """A small file of the run, or None if it cannot be read. A file of more than runjson.MAX_BYTES
    is not one (a wrong file, a device, someone's mischief): one warning, and never read whole."""
    try:
        with open(path, 'rb') as f:
            data = runjson.read_bytes(f)
    except OSError:
        return None
    if data is None:
        runjson.warn_once(log, f'{path}: {runjson.OVER}, too big for a file of the run; not read')
        return None
    return data.decode('utf-8', 'replace')


PRIVATE = 0o600     # the mode of a file that may hold a value of the tasks' environment (a secret)


def write_atomically(path: str, text: str, mode: int | None = None) -> None:
    """Write a file of the run so that a reader sees the old text or the new, never half of it.
    A write the disk refuses raises its OSError and leaves no `.tmp` file behind. With `mode`
    (PRIVATE) the file has that mode before it holds a byte, whatever the umask or an old file's."""
    try:
        with open(path + '.tmp', 'w') as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(text)
        os.replace(path + '.tmp', path)
    except BaseException:
        try:
            os.unlink(path + '.tmp')
        except OSError:
            pass
        raise


# -- lines a task writes and the launcher reads ---------------------------------------------
class TaskLogFormatter(logging.Formatter):
    """LOG_FORMAT with a full ISO-8601 time, milliseconds and the UTC offset: logs kept across
    attempts and days, and lines of hosts in other time zones, still say when they were written."""

    def __init__(self, fmt: str = LOG_FORMAT) -> None:
        super().__init__(fmt)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_time(record.created)


def iso_time(seconds: float) -> str:
    """A time since the epoch as the local time with its UTC offset, to the millisecond
    (`2026-11-23T21:08:43.123+00:00`), as log lines and the event log write it."""
    return datetime.datetime.fromtimestamp(seconds).astimezone().isoformat(timespec='milliseconds')


def logged_time(line: str) -> str | None:
    """The time at the start of a task's log line as written (ISO-8601, or `HH:MM:SS` in logs of
    older runs), or None for a line the task's logging did not write (a traceback, TF's C++)."""
    m = _LOGGED.match(line)
    return m.group(1) if m else None


# The lines of the messages a task sends its launcher, and their reading, are the messages'
# (cluster/runtime/messages.py: one writer, one reader); these say them as lines, for the
# benchmarks and the older tests that read lines.
def serving_line(name: str, address: str, pid: int) -> str:
    return messages.Serving(name, address, pid).human()


def started_line(name: str, what: str, pid: int) -> str:
    return messages.Started(name, what, pid).human()


def progress_line(step: int, total: int, loss: float, rate: str = '') -> str:
    return messages.progress(step, total, loss, rate).human()


def checkpoint_line(step: int) -> str:
    return messages.Checkpoint(step).human()


def evaluation_line(step: int, metrics: dict[str, float]) -> str:
    return messages.Evaluation(step, metrics).human()


def says_ready(line: str, name: str) -> bool:
    return messages.says_ready(messages.read(line), name)


def step_of(line: str) -> tuple[int, int] | None:
    """(global step, total) from a progress line."""
    found = messages.read(line)
    return (found.step, found.total) if isinstance(found, messages.Progress) else None


def parse_progress(line: str) -> dict | None:
    found = messages.read(line)
    return found.facts() if isinstance(found, messages.Progress) else None


def saved_step(line: str) -> int | None:
    found = messages.read(line)
    return found.step if isinstance(found, messages.Checkpoint) else None


def parse_evaluation(line: str) -> tuple[int, dict[str, float]] | None:
    found = messages.read(line)
    return (found.step, found.metrics) if isinstance(found, messages.Evaluation) else None


def evaluator_waits_line(name: str, train_dir: str) -> str:
    """What an evaluator waits for and where, said when it starts: a chief that writes its
    checkpoints elsewhere or by another name (Keras' BackupAndRestore files) leaves it nothing."""
    return (f'{name} evaluates the checkpoints named {CHECKPOINT_PREFIX}-<step> in {os.path.abspath(train_dir)} '
            f'(TensorFlow\'s `{CHECKPOINT_INDEX}` file there names the newest), and waits until the chief writes one')


# The refusals of the disk and the OS that only the machine's owner can mend, as their messages
# spell them: TensorFlow keeps strerror's words in its errors, without the number.
OS_CAUSES = {errno.ENOSPC: 'No space left on device', errno.EDQUOT: 'Disk quota exceeded',
             errno.EACCES: 'Permission denied', errno.EROFS: 'Read-only file system'}


def os_cause(error: BaseException | str) -> str | None:
    """`No space left on device (ENOSPC)`: the cause of an OSError (any errno), or the first of
    OS_CAUSES that an error's text names anywhere (a TensorFlow error names it lines deep, after
    `Graph execution error:`); None if it names none. Never a path, time or pid: the same refusal
    reads the same every time."""
    if isinstance(error, OSError) and error.errno:
        return f'{os.strerror(error.errno)} ({errno.errorcode.get(error.errno, error.errno)})'
    text = str(error)
    found = [(text.find(words), number) for number, words in OS_CAUSES.items() if words in text]
    if not found:
        return None
    number = min(found)[1]
    return f'{OS_CAUSES[number]} ({errno.errorcode[number]})'


# Less than this left for the tasks' user on a file system is a full disk: a log line may still
# fit, a checkpoint (megabytes) does not, and the next line soon will not either.
NO_ROOM_BYTES = 64 * 1024


def no_room(path: str) -> str | None:
    """`No space left on device (ENOSPC)` when the file system holding `path` has (almost) no
    block or no inode left for this user (root may use the blocks reserved for it: statvfs's
    f_bfree, others f_bavail), else None; None too when it cannot be asked (gone, not reachable).
    One statvfs: cheap enough for every poll of a supervisor."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    root = os.geteuid() == 0 if hasattr(os, 'geteuid') else False
    blocks, inodes = (st.f_bfree, st.f_ffree) if root else (st.f_bavail, st.f_favail)
    if blocks * st.f_frsize < NO_ROOM_BYTES or (st.f_files and not inodes):
        return f'{OS_CAUSES[errno.ENOSPC]} (ENOSPC)'
    return None


def checkpoint_step(checkpoint_index_text: str | None) -> int | None:
    """The global step of the newest checkpoint named in TensorFlow's `checkpoint` file."""
    m = _CHECKPOINT.search(checkpoint_index_text or '')
    return int(m.group(1)) if m else None
