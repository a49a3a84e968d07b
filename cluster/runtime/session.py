"""The chief-session runtime both training paths share: the built-in trainer (cluster/training/train.py)
and the user's `train.program` (cluster/program.py).

What a worker owes the launcher whatever trains in it: the chief restores the newest checkpoint
that reads back (never a silent start from step 0), saves on schedule and once more when stopped,
every worker prints the progress line the supervisor reads, reports "done" to the ps tasks so they
end by themselves, and leaves its closing figures in the run directory. Kept apart from both
callers so that neither reaches into the other, and the two cannot drift.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, NoReturn

import tensorflow as tf

from cluster.runtime import messages, notice, rundir, runjson
from cluster.runtime.contract import EXIT_PREEMPTED
from cluster.runtime.pulse import PULSE

if TYPE_CHECKING:
    from cluster.spec.model import TrainConfig

v1 = tf.compat.v1
log = logging.getLogger(__name__)

DONE_QUEUE = 'tfcluster_done_%d'     # one per ps task: workers report "finished" there
READY_POLL_SECS = 0.1                # how often a non-chief checks that the chief has initialised
DONE_TIMEOUT_MS = 30_000             # a worker waits this long for the ps tasks to take its "done"
STOP_SAVE_SECS = 20.0                # a stopped chief gives its last checkpoint this long, then exits
STEP_WAIT_SECS = 5.0                 # ...of which the step under way may take this long to finish


class CheckpointError(Exception):
    """No checkpoint in train_dir can be restored: one line naming the files."""


def first_line(text: str, default: str = '') -> str:
    """The first non-empty line of an error message (TensorFlow's run to dozens of lines)."""
    return next((line.strip() for line in (text or '').splitlines() if line.strip()), default)


# -- restore ----------------------------------------------------------------------------------
def start_session(target: str, is_chief: bool, train_dir: str, saver: tf.compat.v1.train.Saver,
                  local_init_op: tf.Operation | None, ready_for_local_init_op: tf.Tensor | None,
                  config: tf.compat.v1.ConfigProto | None) -> tuple[tf.compat.v1.Session, GracefulStop | None]:
    """A session on `target` ready to train, and the chief's GracefulStop (None elsewhere). The
    chief restores the newest checkpoint that reads back, or initialises; the others poll every
    READY_POLL_SECS until the chief has done so. The stop handler is in place before
    the restore, so a SIGTERM during it ends the task at once instead of killing it mid-restore."""
    manager = v1.train.SessionManager(
        local_init_op=local_init_op, ready_op=v1.report_uninitialized_variables(),
        ready_for_local_init_op=ready_for_local_init_op, graph=v1.get_default_graph(),
        recovery_wait_secs=READY_POLL_SECS)
    stopper = GracefulStop() if is_chief else None
    if is_chief:
        remove_save_leftovers(train_dir)     # of a save that died with its chief or outlived it on a ps
        checkpoint = restorable_checkpoint(train_dir)
        sess = manager.prepare_session(target, init_op=v1.global_variables_initializer(), saver=saver,
                                       checkpoint_filename_with_path=checkpoint, config=config)
    else:
        sess = manager.wait_for_session(target, config=config)
    return sess, stopper


def restorable_checkpoint(train_dir: str) -> str | None:
    """The newest checkpoint in train_dir whose every tensor reads back, or None if there is none.
    A newer one that does not read (a truncated file, a half-written save) is skipped with one
    warning naming its files; if none reads, CheckpointError: never a silent start from step 0."""
    state = v1.train.get_checkpoint_state(train_dir)
    if state is None or not state.model_checkpoint_path:
        return None
    candidates = list(reversed(state.all_model_checkpoint_paths)) or [state.model_checkpoint_path]
    if state.model_checkpoint_path not in candidates:
        candidates.insert(0, state.model_checkpoint_path)
    bad = []
    for prefix in candidates:
        try:
            reader = v1.train.NewCheckpointReader(prefix)
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)
        except Exception as e:     # OpError, or IndexError "Read less bytes than requested", ...
            files = ', '.join(sorted(glob.glob(glob.escape(prefix) + '.*'))) or f'{prefix}.* (missing)'
            why = first_line(str(e), type(e).__name__)
            bad.append(f'{files} ({why})')
            continue
        if bad:
            log.warning('checkpoint(s) that do not restore were skipped: %s; restoring %s', '; '.join(bad), prefix)
        return prefix
    raise CheckpointError(f'no checkpoint in {train_dir} restores: {"; ".join(bad)}; move them away to '
                          'start from step 0, or restore the files')


# -- save ----------------------------------------------------------------------------------
class SaveError(tf.errors.OpError):
    """A checkpoint the disk or the OS refused (full, read-only, not permitted): one line naming
    the cause, the checkpoint and the directory, in that order (the launcher's closing line keeps
    as much of a task's error as fits: the cause must come first, a long path last), the same at
    every try (no time, pid or temporary file name), so that a run failing this way again and
    again is seen to repeat itself.

    An OpError, so whatever reports a task's TensorFlow errors in one line (cluster/task.py, a
    user's program) reports this one: `worker:0: SaveError: No space left on device (ENOSPC): cannot ...`."""

    def __init__(self, message: str, error_code: int = tf.errors.UNKNOWN) -> None:
        super().__init__(None, None, message, error_code)


def save_checkpoint(saver: tf.compat.v1.train.Saver, sess: tf.compat.v1.Session, train_dir: str, step: int) -> int:
    """Save the variables as of `step`, and say so in the chief's log: the launcher's event log
    records every checkpoint from that line.

    A save that fails leaves nothing behind (remove_save_leftovers) and never touches an earlier
    checkpoint. Refused by the disk or the OS, it raises SaveError naming the cause that
    TensorFlow's own error (`ResourceExhaustedError: Graph execution error:`, and the cause forty
    lines further down) hides; any other failure (a lost ps) is raised as it came."""
    prefix = rundir.checkpoint_prefix(train_dir)
    name = f'{rundir.CHECKPOINT_PREFIX}-{step}'
    before = set(_listdir(train_dir))
    try:
        saver.save(sess, prefix, global_step=step)
    except (tf.errors.OpError, OSError) as e:
        remove_save_leftovers(train_dir, name, before)
        cause = rundir.os_cause(e)
        if cause is None:
            raise
        raise SaveError(f'{cause}: cannot save checkpoint {name} in {train_dir}',
                        getattr(e, 'error_code', tf.errors.UNKNOWN)) from e
    messages.say(log, messages.Checkpoint(step))
    return step


_TEMP, _INDEX_TEMP = '_temp', rundir.CHECKPOINT_INDEX + '.tmp'


def remove_save_leftovers(train_dir: str, name: str | None = None, before: Collection[str] = frozenset()) -> list[str]:
    """Remove what a failed save of checkpoint `name` (`model.ckpt-300`) left in train_dir, and
    return the paths removed: the ps tasks' `<name>_temp/` folders of a sharded save (the ps on
    this machine only: a ps elsewhere writes to its own disk), a half-written `checkpoint.tmp<hex>`
    (TensorFlow writes the index beside it, then renames), and the checkpoint's own files unless
    the index names it (merged, but never recorded). A checkpoint the index names has all its data:
    only a `.meta` this save added (written last, so cut short) goes. Nothing that was there
    before the save (`before`: the names in train_dir then), nor the `checkpoint` index, nor any
    other step's files. With no `name`: every save's `_temp` and `checkpoint.tmp` leftovers (the
    chief at start-up, when no save can be under way)."""
    recorded = name is not None and name in _indexed_names(train_dir)
    removed = []
    for entry in _listdir(train_dir):
        if entry in before:
            continue
        if name is None:
            ours = (entry.startswith(rundir.CHECKPOINT_PREFIX + '-') and (_TEMP in entry or '.tempstate' in entry)
                    or entry.startswith(_INDEX_TEMP))
        elif entry.startswith(name + _TEMP) or entry.startswith(_INDEX_TEMP):
            ours = True
        else:
            ours = entry.startswith(name + '.') and (not recorded or entry == name + '.meta')
        if ours and _remove(os.path.join(train_dir, entry)):
            removed.append(os.path.join(train_dir, entry))
    if removed:
        log.info('removed what the unfinished checkpoint save left: %s', ', '.join(sorted(removed)))
    return removed


def _listdir(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _indexed_names(train_dir: str) -> set[str]:
    """The checkpoint names (`model.ckpt-300`) TensorFlow's `checkpoint` index records."""
    text = rundir.read_text(rundir.checkpoint_index_path(train_dir)) or ''
    return {os.path.basename(p) for p in re.findall(r'^\s*\w*model_checkpoint_paths?:\s*"(.*)"\s*$', text, re.M)}


def _remove(path: str) -> bool:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        log.warning('cannot remove %s: %s', path, rundir.os_cause(e))
        return False


def save_due(train: TrainConfig, step: int, last_saved_step: int, since_save: float) -> bool:
    """Whether the chief saves now. By steps: once a multiple of checkpoint_steps has been reached
    or passed since the last save (in async mode the chief sees the global step jump by as many
    updates as the other workers made, so it rarely lands on a multiple itself)."""
    if step >= train.steps:
        return False        # the final save happens after the loop
    every = train.checkpoint_steps
    by_steps = every and step // every > last_saved_step // every
    return bool(by_steps) or since_save >= train.checkpoint_secs


class GracefulStop:
    """The TF1 chief's part on a signal (cluster/runtime/notice.py): the launcher's SIGTERM, or
    SIGINT, writes a checkpoint, then exits 128 + the signal; a preemption notice writes one at
    once, then exits EXIT_PREEMPTED.

    The main thread may be blocked in a session call for as long as a sync step waits for a lost
    worker, and Python runs signal handlers only between bytecodes of the main thread. So the
    notice thread calls this, and it saves with the session the training loop uses (sessions are
    thread-safe). The launcher stops the chief first, while the ps tasks still hold the variables."""

    def __init__(self) -> None:
        self._save: Callable[[], int] | None = None
        self.lock = threading.Lock()        # one save at a time: the loop's, the final one, or ours
        self.step_lock = threading.Lock()   # held by the loop while it trains one step
        notice.NOTICES.take(notice.Role(on_stop=self._stop, on_preempted=self._preempted, interrupt=True))

    def arm(self, save: Callable[[], int]) -> None:
        self._save = save

    def _stop(self, signum: int) -> None:
        name = signal.Signals(signum).name
        code = 128 + signum
        threading.Timer(STOP_SAVE_SECS, notice.exit_now, (code, logging.WARNING, f'{name}: the checkpoint did not '
                                                          f'finish within {STOP_SAVE_SECS:.0f}s; exiting')).start()
        self._save_and_exit(code, name)

    def _preempted(self) -> None:
        """A notice: save at once (the notice's deadline bounds it), then exit EXIT_PREEMPTED."""
        self._save_and_exit(EXIT_PREEMPTED, 'preemption notice')

    def _save_and_exit(self, code: int, why: str) -> NoReturn:
        if self._save is None:
            notice.exit_now(code, logging.INFO, f'{why} received before training began; nothing to save')
        # Between two steps the global step is still (in sync mode), so the checkpoint's name
        # matches what it holds; a loop blocked in a stalled step is not waited for long. The loop
        # never gets the lock back: no step starts after the save.
        self.step_lock.acquire(timeout=STEP_WAIT_SECS)
        try:
            with self.lock:
                step = self._save()
        except Exception as e:
            notice.exit_now(code, logging.WARNING, f'{why} received, and the checkpoint failed: {type(e).__name__}: '
                                                   f'{first_line(str(e))}')
        notice.exit_now(code, logging.INFO, f'{why} received: {messages.Checkpoint(step).human()}, exiting')


# -- progress, done, result -------------------------------------------------------------------
def log_progress(step: int, total: int, loss: float, rate: str = '') -> None:
    """Log the progress line (messages.Progress) the launcher's supervisor reads, and beat
    the pulse (cluster/runtime/pulse.py), which it reads when a full disk stops the log."""
    PULSE.beat(step, total)
    messages.say(log, messages.progress(step, total, loss, rate))


def done_queue(ps_index: int, capacity: int) -> tf.compat.v1.FIFOQueue:
    """The queue on ps task `ps_index` where workers report "finished" as (worker index, its
    generation: cluster/runtime/membership.py): the ps ends by itself once every live worker has reported
    from its current start (no launcher needs to stop it). `capacity`: the pool's size, the same
    in every task (the queue is shared by name, and a second shape or size would be refused)."""
    with v1.device(f'/job:ps/task:{ps_index}'):
        return v1.FIFOQueue(capacity, [tf.int32, tf.int32], shapes=[(), ()], shared_name=DONE_QUEUE % ps_index,
                            name=f'done_queue_{ps_index}')


def done_ops(num_ps: int, pool: int, worker_index: int, generation: int | tf.Tensor) -> list[tf.Operation]:
    """This worker's "done" report, one enqueue per ps task (built into the default graph);
    `generation` a value or a tensor (fed when the worker reports)."""
    return [done_queue(p, pool).enqueue([worker_index, generation]) for p in range(num_ps)]


def report_done(sess: tf.compat.v1.Session, ops: list[tf.Operation]) -> None:
    """Tell every ps that this worker has finished. The session is not closed afterwards: each ps
    exits soon after the last worker reports, and closing a session whose ps is gone can block for
    good (seen under load). Checkpoints and summaries are written already; the process ends next.

    Training is over at this point, so a ps that cannot be reached is no reason to fail: it has
    most likely taken the report and left (the reply to the last report can be lost when the ps
    exits), and a ps that crashed is reported by its own exit code."""
    deadline = time.monotonic() + DONE_TIMEOUT_MS / 1000     # one deadline for all ps tasks together
    for ps_index, op in enumerate(ops):
        left_ms = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            sess.run(op, options=v1.RunOptions(timeout_in_ms=left_ms))
        except tf.errors.OpError as e:     # Unavailable, DeadlineExceeded, or UNKNOWN "stream removed"
            log.warning('ps:%d did not acknowledge that this worker is done (%s); '
                        'it has most likely finished already', ps_index, type(e).__name__)


def write_result(train_dir: str, worker_index: int, result: dict) -> None:
    """This worker's closing figures (rundir.result_path), for the launcher's summary."""
    rundir.write_atomically(rundir.result_path(train_dir, worker_index), runjson.dumps(result))
