"""What a task does once its server is up: a ps serves until every worker is done; a worker
builds per-device towers under `replica_device_setter` (cluster/training/graph.py) and trains,
synchronously or not.

Why not MonitoredTrainingSession: its SyncReplicas hook hands out `replicas_to_aggregate` initial
tokens (so the chief can fill a global step alone), its chief queue runner stays blocked after the
last step (so closing waits out a 120 s grace period) and its non-chiefs poll every 30 s. Here the
chief drives the aggregation itself in a thread that stops at the last step, no initial tokens are
handed out, and non-chiefs poll for the chief's initialisation ten times a second.

What any trainer owes the launcher (restore, saves, a graceful stop, the "done" report, the result
file, the progress line) is in cluster/runtime/session.py, shared with the user's `train.program`.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from cluster.runtime import causes, rundir, session, telemetry
from cluster.runtime.membership import LIVE, DoneTracker
from cluster.spec import ClusterSpec, TaskSpec
from cluster.checks import memory
from cluster.training import summaries
from cluster.checks.data import DataSet
from cluster.training.graph import TrainGraph, build_graph, ps_bytes
from cluster.training.placement import cpu_device_count, tower_devices
from cluster.training.profiler import StepProfiler

v1 = tf.compat.v1
log = logging.getLogger(__name__)

# build_graph, ps_bytes and tower_devices are imported from here too (tests, benchmarks, program.py)
__all__ = ['ABORT_RETRIES', 'PS_LINGER_SECS', 'PS_POLL_MS', 'build_graph', 'check_memory', 'cpu_device_count',
           'make_server', 'ps_bytes', 'run_ps', 'run_retrying', 'run_worker', 'tower_devices']

PS_LINGER_SECS = 0.2                 # a ps stays this long after the last "done", so that reply arrives (it takes ms)
PS_POLL_MS = 1000                    # a ps waiting for "done" reports reads the live workers this often


def make_server(spec: ClusterSpec, task: TaskSpec) -> tf.compat.v1.train.Server:
    """This task's gRPC server, started; a worker's has a logical CPU device per CPU tower."""
    config = v1.ConfigProto()
    if task.job == 'worker':
        config.device_count['CPU'] = cpu_device_count(spec)
    return v1.train.Server(v1.train.ClusterSpec(spec.cluster_def()), job_name=task.job,
                           task_index=task.index, config=config, start=True)


def run_ps(server: tf.compat.v1.train.Server, spec: ClusterSpec, task: TaskSpec) -> None:
    """Serve variables until every live worker has reported that it finished, then return. The
    live set may change meanwhile (`launch scale`): it is read again at least every second."""
    pool = spec.num_workers
    tracker = DoneTracker()
    with tf.Graph().as_default():
        dequeue = session.done_queue(task.index, pool).dequeue()
        config = v1.ConfigProto(device_filters=[f'/job:ps/task:{task.index}'])
        with v1.Session(server.target, config=config) as sess:
            members = LIVE.current(pool)
            log.info('serving variables; exits once all %d live workers are done', members.count)
            while not tracker.finished(members):
                try:
                    worker, generation = sess.run(dequeue, options=v1.RunOptions(timeout_in_ms=PS_POLL_MS))
                except tf.errors.DeadlineExceededError:
                    members = LIVE.current(pool)
                    continue
                tracker.report(int(worker), int(generation))
                members = LIVE.current(pool)
                left = tracker.waiting_for(members)
                log.info('worker:%d is done; %d to go', worker, len(left))
    # The last worker's enqueue has completed, but its reply may still be on the wire: leaving at
    # once closes the socket under it, and that worker would see "Socket closed" for a report the
    # ps did get. (Workers also tolerate that; this keeps the common case clean.)
    time.sleep(PS_LINGER_SECS)


class _Aggregator(threading.Thread):
    """The chief's side of sync training: aggregate each step and hand out the next tokens,
    and stop by itself once the last step has been aggregated (no blocked thread to wait out)."""

    def __init__(self, sess: tf.compat.v1.Session, g: TrainGraph, steps: int) -> None:
        super().__init__(name='aggregator', daemon=True)
        self.sess, self.g, self.steps = sess, g, steps

    def run(self) -> None:
        try:
            while self.sess.run(self.g.global_step) < self.steps:
                self.sess.run(self.g.sync_op)
        except Exception as e:
            # Only this thread hands out tokens: without it the training loop would wait for one
            # for ever. End the task instead, so the launcher sees a lost chief and acts.
            log.error('the sync aggregator failed, so this chief cannot go on: %s: %s', type(e).__name__,
                      causes.cause_line(getattr(e, 'message', str(e)), '(no message)'))
            logging.shutdown()
            os._exit(rundir.EXIT_FAILED)


def check_memory(spec: ClusterSpec, task: TaskSpec, data_set: DataSet) -> None:
    """SpecError (one line, about train.batch_size) if this worker's CPU towers cannot hold one
    batch of the model on `data_set`'s images in this host's memory: refused here, on the worker's own host (the
    launcher checks workers on its machine before anything starts), not after a minute of
    silence and a ResourceExhaustedError. No restart can help."""
    towers = sum(1 for d in tower_devices(spec, task) if '/device:CPU:' in d)
    refusal = memory.batch_memory_refusal(spec.train.batch_size, towers, memory.host_memory_bytes(),
                                         host=f'{task.name}\'s host ({socket.gethostname()})',
                                         shape=data_set.image_shape)
    if refusal:
        raise spec.error('train.batch_size', refusal)


def run_worker(server: tf.compat.v1.train.Server, spec: ClusterSpec, task: TaskSpec, data_set: DataSet) -> dict:
    """Train to `train.steps` global steps on `data_set`; returns this worker's figures (also written as JSON)."""
    train = spec.train
    check_memory(spec, task, data_set)
    os.makedirs(train.train_dir, exist_ok=True)
    with tf.Graph().as_default():
        if train.seed is not None:
            v1.set_random_seed(train.seed)
        g = build_graph(spec, task, data_set)
        config = v1.ConfigProto(device_filters=['/job:ps', f'/job:worker/task:{task.index}'],
                                allow_soft_placement=True)
        start = time.monotonic()
        sess, stopper = session.start_session(server.target, task.is_chief, train.train_dir, g.saver,
                                              g.local_init_op, g.ready_for_local_init_op, config)
        result = _train_loop(sess, spec, task, g, start, stopper)
        session.report_done(sess, g.done_ops)
    session.write_result(train.train_dir, task.index, result)
    return result


def _train_loop(sess: tf.compat.v1.Session, spec: ClusterSpec, task: TaskSpec, g: TrainGraph, start: float,
                stopper: session.GracefulStop | None = None) -> dict:
    """Train from the session's global step to `train.steps` (or until this worker is taken out
    of the live ones); returns this worker's figures."""
    first = sess.run(g.global_step)
    log.info('session ready after %.1fs at global step %d', time.monotonic() - start, first)
    loop = _TrainLoop(sess, spec, task, g, first, stopper)
    while loop.step < spec.train.steps:
        if LIVE.leaving(task.index, spec.num_workers):
            log.info('%s leaves at global step %d: the launcher took it out of the live workers', task.name,
                     loop.step)
            break
        loop.one_step()
    return loop.finish()


class _TrainLoop:
    """One worker's training, step by step: its input shard kept to the live workers, progress
    lines and summaries, the chief's checkpoints (by time, by step, and when the launcher asks).
    Made at the session's first global step `first`: it opens the summary writers, arms the
    chief's graceful stop and starts the chief's sync aggregator."""

    def __init__(self, sess: tf.compat.v1.Session, spec: ClusterSpec, task: TaskSpec, g: TrainGraph, first: Any,
                 stopper: session.GracefulStop | None) -> None:
        self.sess, self.spec, self.task, self.g, self.first = sess, spec, task, g, first
        self.train = train = spec.train
        self.writer = summaries.writer(train.train_dir, sess.graph) if task.is_chief else None
        self.own_writer = summaries.writer(rundir.worker_summary_dir(train.train_dir, task.index))
        if self.writer and summaries.note_restart(self.writer, int(first)):
            log.info('recorded the restart in TensorBoard at global step %d', first)
        self.save_lock = stopper.lock if stopper else threading.Lock()
        self.step_lock = stopper.step_lock if stopper else threading.Lock()
        if stopper:
            stopper.arm(self.save)
        self.aggregator = None
        if train.sync and task.is_chief and first < train.steps:
            self.aggregator = _Aggregator(sess, g, train.steps)
            self.aggregator.start()
        self.step, self.local_steps = int(first), 0
        self.applied: list[int] = []     # the global steps this worker trained on
        self.profiler = StepProfiler.of_env(train.train_dir, task)
        self.t0 = time.monotonic()
        self.last_log, self.last_log_step, self.last_save, self.last_saved_step = self.t0, first, self.t0, int(first)
        self.log_every = train.log_every_secs if task.is_chief else max(10.0, train.log_every_secs)
        self.loss = float('nan')
        self.shard: tuple[int, int] | None = None
        self.saves_asked = LIVE.save_requests()     # a request made before this start was for the last cluster

    def save(self) -> int:
        """Save a checkpoint at the global step now and flush the summaries: the graceful stop's
        save, run with the save lock held. Returns the step saved."""
        step_now = int(self.sess.run(self.g.global_step))
        session.save_checkpoint(self.g.saver, self.sess, self.train.train_dir, step_now)
        if self.writer:
            self.writer.flush()
        self.own_writer.flush()
        return step_now

    def one_step(self) -> None:
        """Train one step, then log and save if it is time."""
        g, train = self.g, self.train
        if g.reshard is not None and (self.shard is None or LIVE.changed.is_set()):
            self._reshard(g.reshard)
        due = time.monotonic() - self.last_log >= self.log_every or self.local_steps == 0
        fetches = [g.step_after, g.loss] + ([g.summary] if due and self.writer else [])
        out = run_retrying(lambda: self._run(fetches), 'the step after global step %d', self.step)
        self.applied.append(self.step)
        token, self.loss, self.local_steps = int(out[0]), float(out[1]), self.local_steps + 1
        telemetry.STEPS.count(self.g.examples_per_run)
        if train.sync and token <= self.step:
            token = _skip_to_next_step(self.sess, g, self.step, train.steps)
        self.step = token
        now = time.monotonic()
        if due or self.step >= train.steps:
            self._report(out, now)
        self._save_if_due(now)

    def _run(self, fetches: list) -> list:
        with self.step_lock:
            if self.profiler and self.profiler.wants(self.local_steps):
                return self.profiler.run(self.sess, fetches)
            return self.sess.run(fetches)

    def _reshard(self, reshard: Callable) -> None:
        """Read the input shard of this worker's rank among the live workers (async: they may
        have changed since the last step)."""
        LIVE.changed.clear()
        members = LIVE.current(self.spec.num_workers)
        now = (members.rank(self.task.index) or 0, members.count)
        if now != self.shard:
            reshard(self.sess, *now)
            if self.shard is not None:
                log.info('reading input shard %d of %d now (%d live workers)', now[0] + 1, now[1], now[1])
            self.shard = now

    def _report(self, out: list, now: float) -> None:
        """The progress line and the summaries since the last one."""
        spec, step = self.spec, self.step
        rate = (step - self.last_log_step) * self.g.examples_per_run * _per_step(spec) / max(now - self.last_log, 1e-9)
        live = LIVE.current(spec.num_workers).count      # said when part of the pool runs
        session.log_progress(step, self.train.steps, self.loss, f'  {rate:.0f} images/s'
                             + (f'  {live} of {spec.num_workers} workers' if live != spec.num_workers else ''))
        if self.writer:      # the chief: its summary ops, if fetched, and the images of every worker
            if len(out) > 2:
                self.writer.add_summary(out[2], step)
            self.writer.add_summary(summaries.scalar(summaries.IMAGES_PER_SEC, rate), step)
        self.own_writer.add_summary(summaries.scalar(summaries.WORKER_STEPS, self.local_steps), step)
        self.last_log, self.last_log_step = now, step

    def _save_if_due(self, now: float) -> None:
        """The chief saves when the launcher asks, and by train.checkpoint_steps/_secs."""
        asked = LIVE.save_requests() if self.task.is_chief else 0
        if asked > self.saves_asked:
            log.info('saving a checkpoint at global step %d: the launcher asked for one', self.step)
        if self.task.is_chief and (asked > self.saves_asked or session.save_due(
                self.train, self.step, self.last_saved_step, now - self.last_save)):
            self.saves_asked = max(self.saves_asked, asked)
            with self.save_lock:
                session.save_checkpoint(self.g.saver, self.sess, self.train.train_dir, self.step)
            self.last_save, self.last_saved_step = now, self.step

    def finish(self) -> dict:
        """Stop the profiler and the aggregator, save the last checkpoint (the chief), close the
        summaries; this worker's figures."""
        elapsed = time.monotonic() - self.t0
        if self.profiler:
            self.profiler.write()
        if self.aggregator:
            self.aggregator.join()
        final = int(self.sess.run(self.g.global_step))
        if self.task.is_chief:
            with self.save_lock:
                session.save_checkpoint(self.g.saver, self.sess, self.train.train_dir, final)
        if self.writer:
            self.writer.close()
        self.own_writer.close()
        local_steps, images = self.local_steps, self.local_steps * self.g.examples_per_run
        log.info('done: %d local steps, global step %d, loss %.3f, %.0f images/s from this worker',
                 local_steps, final, self.loss, images / max(elapsed, 1e-9))
        return {'task': self.task.name, 'local_steps': local_steps, 'first_global_step': int(self.first),
                'global_step': final, 'loss': self.loss, 'seconds': elapsed,
                'images_per_sec': images / max(elapsed, 1e-9), 'applied_at': _runs(self.applied)}


ABORT_RETRIES = 3       # TensorFlow's AbortedError in a row before a step's failure is the task's


def run_retrying(run: Callable[[], Any], what: str, *args: Any, tries: int = ABORT_RETRIES) -> Any:
    """run(), once more after each AbortedError, up to `tries` times, each with one warning line
    naming `what % args` (formatted only then: this wraps every training step).
    TensorFlow documents Aborted as a conflict to retry (its MonitoredSession retries it too); a
    worker of an async pool saw one, rarely, in the seconds after another worker left."""
    for attempt in range(tries + 1):
        try:
            return run()
        except tf.errors.AbortedError as e:
            if attempt == tries:
                raise
            log.warning('%s was aborted (%s); trying it again (%d of %d)', what % args if args else what,
                        causes.cause_line(e.message, '(no message)'), attempt + 1, tries)


def _skip_to_next_step(sess: tf.compat.v1.Session, g: TrainGraph, step: int, steps: int) -> int:
    """This worker just took a token for a step it has already contributed to (tokens are left over
    when backup workers are slower than the rest). SyncReplicasOptimizer would let it contribute
    to that step again, so that one global step holds two gradients of one worker; instead wait
    for the next global step, and train on that one."""
    while True:
        current = int(sess.run(g.global_step))
        if current > step or current >= steps:
            return int(sess.run(g.resync))
        time.sleep(0.02)


def _per_step(spec: ClusterSpec) -> int:
    """Worker batches in one global step: every aggregated worker in sync mode, one in async."""
    return spec.replicas_to_aggregate if spec.train.sync else 1


def _runs(values: list[int]) -> list[list[int]]:
    """[0,1,2,3,7,8] -> [[0,3],[7,8]]: the global steps a worker trained on, compactly."""
    out: list[list[int]] = []
    for v in values:
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out
