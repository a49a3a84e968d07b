"""What the tasks and `launch eval` add to TensorBoard besides the graph's loss and learning rate.

Built as Summary protos in Python, not as graph ops: a figure the trainer already has in hand (the
images/s of its progress line, a worker's local step count, a restart's cause, a precision) costs
no session call and no change to the graph every worker must build alike.

    <train_dir>/             the chief's loss, learning_rate, images_per_sec; restarts (text)
    <train_dir>/worker-<i>/  worker i's worker_steps (its own steps so far)
    <train_dir>/eval/        precision_at_1 at each evaluated checkpoint's global step

Not fatal: a disk that is full, read-only or not writable turns a task's summaries off with one
warning naming the folder and the cause (Writer); training goes on.
"""
from __future__ import annotations

import errno
import glob
import itertools
import logging
import os
import threading
from collections.abc import Mapping

import tensorflow as tf

from cluster.runtime import rundir

v1 = tf.compat.v1
log = logging.getLogger(__name__)

FLUSH_SECS = 10     # a task killed without a chance to flush loses at most this much
_SERIAL = itertools.count()

IMAGES_PER_SEC, WORKER_STEPS, RESTARTS, PRECISION_AT_1 = 'images_per_sec', 'worker_steps', 'restarts', 'precision_at_1'


def scalar(tag: str, value: float) -> tf.compat.v1.Summary:
    return v1.Summary(value=[v1.Summary.Value(tag=tag, simple_value=float(value))])


def text(tag: str, value: str) -> tf.compat.v1.Summary:
    """A text summary (TensorBoard's Text tab) without the graph op tf.summary.text would add."""
    metadata = v1.SummaryMetadata(plugin_data=v1.SummaryMetadata.PluginData(plugin_name='text'))
    return v1.Summary(value=[v1.Summary.Value(tag=tag, metadata=metadata,
                                              tensor=v1.make_tensor_proto(value, dtype=tf.string))])


def writer(logdir: str, graph: tf.Graph | None = None) -> Writer:
    """A FileWriter on `logdir` (in a Writer: see there for a disk that refuses it). Its file's
    name gets this process's id and a serial number: the default name has only the second and the
    host, so two writers opened in one second (two evaluations, a restart note beside a program's
    own writer) would truncate each other's file. FileWriter refuses eager mode, which `launch
    eval`'s process is in outside a graph; the writer itself needs no graph, so it is made inside
    a throwaway one."""
    suffix = f'.{os.getpid()}.{next(_SERIAL)}'
    try:
        os.makedirs(logdir, exist_ok=True)
        if graph is not None:
            file_writer = v1.summary.FileWriter(logdir, graph, flush_secs=FLUSH_SECS, filename_suffix=suffix)
        else:
            with tf.Graph().as_default():
                file_writer = v1.summary.FileWriter(logdir, flush_secs=FLUSH_SECS, filename_suffix=suffix)
    except (OSError, RuntimeError, tf.errors.OpError) as e:     # RuntimeError: the event file's creation
        _warn_off(logdir, rundir.os_cause(e) or _first_line(e))
        return Writer(logdir, None, '')
    return Writer(logdir, file_writer, suffix, pending=int(graph is not None))


class Writer:
    """A FileWriter that a full, read-only or forbidden disk cannot end a task with: TensorBoard's
    figures are a convenience, not the training, so a refusal is one warning naming the folder and
    the cause, once, after which this writer drops what it is given and training goes on. A full
    disk is still named by the checkpoint it refuses next (cluster/runtime/session.py), which ends the task.

    TensorFlow's event writer itself drops events on a full disk without a word (checked with 2.21):
    a flush after which its file has not grown, though summaries were added, is taken as that."""

    def __init__(self, logdir: str, file_writer: tf.compat.v1.summary.FileWriter | None, suffix: str,
                 pending: int = 0) -> None:
        self.logdir, self._writer = logdir, file_writer
        self._file = next(iter(glob.glob(os.path.join(glob.escape(logdir), f'events.out.tfevents.*{suffix}'))), None) \
            if file_writer else None
        self._size = self._file_size()
        self._pending = pending         # summaries added since the last flush's check
        self._lock = threading.Lock()   # the training loop adds while the stop handler's thread flushes

    def add_summary(self, summary: tf.compat.v1.Summary, step: int | None = None) -> None:
        file_writer = self._writer
        if file_writer is None:
            return
        try:
            file_writer.add_summary(summary, step)
        except Exception as e:      # the event writer's thread died of an error: raised again here
            self._off(rundir.os_cause(e) or _first_line(e))
            return
        with self._lock:
            self._pending += 1

    def flush(self) -> None:
        file_writer = self._writer
        if file_writer is None:
            return
        with self._lock:
            pending, self._pending = self._pending, 0
        try:
            file_writer.flush()
        except Exception as e:
            self._off(rundir.os_cause(e) or _first_line(e))
            return
        size = self._file_size()
        if pending and self._file and size is not None and self._size is not None and size <= self._size:
            self._off(_why_not_growing(self.logdir, self._file))
            return
        self._size = size if size is not None else self._size

    def close(self) -> None:
        self.flush()
        self._off(None)

    def _off(self, cause: str | None) -> None:
        """Close the FileWriter (quietly: a disk that refused the events refuses their last flush
        too) and drop whatever comes next; with a cause, say so once."""
        with self._lock:
            file_writer, self._writer = self._writer, None
        if file_writer is None:
            return
        if cause:
            _warn_off(self.logdir, cause)
        try:
            file_writer.close()
        except Exception:
            pass

    def _file_size(self) -> int | None:
        try:
            return os.path.getsize(self._file) if self._file else None
        except OSError:
            return None


def _warn_off(logdir: str, cause: str) -> None:
    log.warning('TensorBoard summaries in %s are off: %s; training goes on without them', logdir, cause)


def _why_not_growing(logdir: str, path: str) -> str:
    try:
        full = os.statvfs(logdir).f_bavail == 0
    except OSError:
        full = False
    return f'{rundir.OS_CAUSES[errno.ENOSPC]} (ENOSPC)' if full else f'{os.path.basename(path)} stopped growing'


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)


def restart_cause(environ: Mapping[str, str] | None = None) -> str | None:
    """The launcher's one-line reason this task was started again (rundir.RESTART_ENV), if it was."""
    return (environ if environ is not None else os.environ).get(rundir.RESTART_ENV) or None


def note_restart(file_writer: Writer, step: int, environ: Mapping[str, str] | None = None) -> str | None:
    """The chief, once per start: a restart's cause as a text summary at the global step it
    restored, so that TensorBoard shows where a run was cut and resumed. Returns the cause."""
    cause = restart_cause(environ)
    if cause:
        file_writer.add_summary(text(RESTARTS, cause), step)
        file_writer.flush()
    return cause


def write_precision(train_dir: str, precision: float, step: int) -> None:
    """`launch eval`'s precision@1 at the checkpoint's global step, under <train_dir>/eval."""
    w = writer(rundir.eval_summary_dir(train_dir))
    try:
        w.add_summary(scalar(PRECISION_AT_1, precision), step)
    finally:
        w.close()
