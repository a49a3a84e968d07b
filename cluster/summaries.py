"""What the tasks and `launch eval` add to TensorBoard besides the graph's loss and learning rate.

Built as Summary protos in Python, not as graph ops: a figure the trainer already has in hand (the
images/s of its progress line, a worker's local step count, a restart's cause, a precision) costs
no session call and no change to the graph every worker must build alike.

    <train_dir>/             the chief's loss, learning_rate, images_per_sec; restarts (text)
    <train_dir>/worker-<i>/  worker i's worker_steps (its own steps so far)
    <train_dir>/eval/        precision_at_1 at each evaluated checkpoint's global step
"""
from __future__ import annotations

import itertools
import logging
import os

import tensorflow as tf

from cluster import rundir

v1 = tf.compat.v1
log = logging.getLogger(__name__)

FLUSH_SECS = 10     # a task killed without a chance to flush loses at most this much
_SERIAL = itertools.count()

IMAGES_PER_SEC, WORKER_STEPS, RESTARTS, PRECISION_AT_1 = 'images_per_sec', 'worker_steps', 'restarts', 'precision_at_1'


def scalar(tag: str, value: float):
    return v1.Summary(value=[v1.Summary.Value(tag=tag, simple_value=float(value))])


def text(tag: str, value: str):
    """A text summary (TensorBoard's Text tab) without the graph op tf.summary.text would add."""
    metadata = v1.SummaryMetadata(plugin_data=v1.SummaryMetadata.PluginData(plugin_name='text'))
    return v1.Summary(value=[v1.Summary.Value(tag=tag, metadata=metadata,
                                              tensor=v1.make_tensor_proto(value, dtype=tf.string))])


def writer(logdir: str, graph=None):
    """A FileWriter on `logdir`. Its file's name gets this process's id and a serial number: the
    default name has only the second and the host, so two writers opened in one second (two
    evaluations, a restart note beside a program's own writer) would truncate each other's file.
    FileWriter refuses eager mode, which `launch eval`'s process is in outside a graph; the writer
    itself needs no graph, so it is made inside a throwaway one."""
    os.makedirs(logdir, exist_ok=True)
    suffix = f'.{os.getpid()}.{next(_SERIAL)}'
    if graph is not None:
        return v1.summary.FileWriter(logdir, graph, flush_secs=FLUSH_SECS, filename_suffix=suffix)
    with tf.Graph().as_default():
        return v1.summary.FileWriter(logdir, flush_secs=FLUSH_SECS, filename_suffix=suffix)


def restart_cause(environ=None) -> str | None:
    """The launcher's one-line reason this task was started again (rundir.RESTART_ENV), if it was."""
    return (environ if environ is not None else os.environ).get(rundir.RESTART_ENV) or None


def note_restart(file_writer, step: int, environ=None) -> str | None:
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
