"""What a task does once its server is up: a ps serves until every worker is done; a worker
builds per-device towers under `replica_device_setter` and trains, synchronously or not.

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
from dataclasses import dataclass

import tensorflow as tf

from cluster.training import data
from cluster.training import model
from cluster.runtime import rundir
from cluster.runtime import session
from cluster.training import summaries
from cluster.training.profiler import StepProfiler
from cluster.runtime.membership import LIVE, DoneTracker
from cluster.spec import ClusterSpec, TaskSpec

v1 = tf.compat.v1
log = logging.getLogger(__name__)

PS_LINGER_SECS = 0.5                 # a ps stays this long after the last "done", so that reply arrives
PS_POLL_MS = 1000                    # a ps waiting for "done" reports reads the live workers this often


def tower_devices(spec: ClusterSpec, task: TaskSpec) -> list[str]:
    """The devices a worker builds its towers on, as TF device names of that worker."""
    devices = spec.train.devices
    prefix = f'/job:worker/task:{task.index}'
    if devices == 'auto':
        gpus = tf.config.list_physical_devices('GPU')
        return [f'{prefix}/device:GPU:{i}' for i in range(len(gpus))] or [f'{prefix}/device:CPU:0']
    if isinstance(devices, int):
        return [f'{prefix}/device:CPU:{i}' for i in range(devices)]
    # A list: GPUs are renumbered from 0 because the task only sees its own (CUDA_VISIBLE_DEVICES).
    out, gpu = [], 0
    for d in devices:
        kind, _ = d.split(':')
        if kind == 'gpu':
            out.append(f'{prefix}/device:GPU:{gpu}')
            gpu += 1
        else:
            out.append(f'{prefix}/device:CPU:{d.split(":")[1]}')
    return out


def cpu_device_count(spec: ClusterSpec) -> int:
    """Logical CPU devices a worker's server must create for its CPU towers."""
    devices = spec.train.devices
    if isinstance(devices, int):
        return devices
    if isinstance(devices, tuple):
        return 1 + max([int(d.split(':')[1]) for d in devices if d.startswith('cpu:')], default=0)
    return 1


def make_server(spec: ClusterSpec, task: TaskSpec):
    config = v1.ConfigProto()
    if task.job == 'worker':
        config.device_count['CPU'] = cpu_device_count(spec)
    return v1.train.Server(v1.train.ClusterSpec(spec.cluster_def()), job_name=task.job,
                           task_index=task.index, config=config, start=True)


def run_ps(server, spec: ClusterSpec, task: TaskSpec) -> None:
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


@dataclass
class _Graph:
    global_step: object
    step_after: object          # the global step a worker trains on next, after its update
    loss: object
    lr: object
    train_op: object
    local_init_op: object
    ready_for_local_init_op: object
    resync: object | None       # sync only: local step := global step; returns it
    sync_op: object | None      # chief only, sync only: aggregate one step, hand out tokens
    summary: object
    reshard: object | None      # async: (sess, rank, count) -> chooses this worker's input shard
    saver: object
    done_ops: list
    examples_per_run: int


def build_graph(spec: ClusterSpec, task: TaskSpec, data_dir: str | None) -> _Graph:
    train = spec.train
    cluster = v1.train.ClusterSpec(spec.cluster_def())
    worker_device = f'/job:worker/task:{task.index}'
    devices = tower_devices(spec, task)
    n = len(devices)
    examples_per_run = train.batch_size * n
    examples_per_step = examples_per_run * (spec.replicas_to_aggregate if train.sync else 1)

    # One placement for the whole graph, by bytes: every variable (and so its accumulator, its
    # moving average) goes to the ps task holding the fewest bytes so far. Every worker builds the
    # same variables in the same order, so all of them agree where each one lives.
    strategy = ByteBalance(spec.num_ps)

    def setter(device):
        return v1.train.replica_device_setter(cluster=cluster, worker_device=device, ps_strategy=strategy)

    with v1.device(setter(worker_device)):
        global_step = v1.train.get_or_create_global_step()
        lr = model.learning_rate(global_step, train.learning_rate or model.default_learning_rate(examples_per_step),
                                 examples_per_step)
        opt = v1.train.GradientDescentOptimizer(lr)
        ema = v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY, global_step)
        if train.sync:
            # The moving averages are applied below, each on its variable's ps task: given to the
            # optimizer, every one would be computed on the global step's ps task (ps:0), so with
            # 2 ps tasks half the model crossed from ps to ps twice on every step.
            opt = v1.train.SyncReplicasOptimizer(
                opt, replicas_to_aggregate=spec.replicas_to_aggregate, total_num_replicas=spec.live_workers)

    # Input shards: the live workers split the records among them, by their rank in index order
    # (a sync scale restarts the cluster; an async worker switches shards at its next step).
    members = LIVE.current(spec.num_workers)
    shard, shards = members.rank(task.index) or 0, members.count
    reshard = None
    with v1.device(f'{worker_device}/device:CPU:0'):
        if data_dir is None:        # only the graph's shape is wanted (ps_bytes): no data is read
            images = tf.zeros([examples_per_run, data.IMAGE_SIZE, data.IMAGE_SIZE, 3])
            labels = tf.zeros([examples_per_run], tf.int32)
        elif train.deterministic:     # worker w reads batches w, w+W, ...: together one big batch a step
            images, labels = data.deterministic_inputs(data_dir, examples_per_run, shard * examples_per_run,
                                                       stride=shards * examples_per_run)
        elif train.sync:     # a scale restarts a sync cluster: the shard is fixed for this start
            images, labels = data.train_inputs(data_dir, examples_per_run, shard_index=shard,
                                               num_shards=shards, seed=train.seed)
        else:                # async: the live workers can change while it runs (launch scale)
            (images, labels), reshard = data.train_inputs(data_dir, examples_per_run, seed=train.seed,
                                                          reshardable=True)
        image_parts, label_parts = tf.split(images, n), tf.split(labels, n)

    tower_grads, tower_losses = [], []
    reads = WeightReads(f'{worker_device}/device:CPU:0', train.transfer_dtype)
    for k, device in enumerate(devices):
        with v1.device(setter(device)), tf.name_scope(f'tower_{k}'):
            # The largest weights come in one block per ps task, for the placement to spread.
            logits, decay = model.inference(image_parts[k], seed=train.seed, partitions=spec.num_ps, read=reads)
            tower_loss = model.loss(logits, label_parts[k], decay)
            tower_losses.append(tower_loss)
            tower_grads.append(opt.compute_gradients(tower_loss))

    with v1.device(setter(worker_device)):
        grads = reads.send_gradients(_average(tower_grads))
        loss = tf.add_n(tower_losses) / n
        if train.sync:
            train_op = opt.apply_gradients(grads, global_step=global_step)
            step_after = tf.identity(train_op)   # the token: the global step to train on next
            local_init_op = opt.chief_init_op if task.is_chief else opt.local_step_init_op
            ready_for_local_init_op = opt.ready_for_local_init_op
            resync = opt.local_step_init_op
            sync_op = _averaged(ema, opt.get_chief_queue_runner().enqueue_ops[0]) if task.is_chief else None
        else:
            apply = opt.apply_gradients(grads, global_step=global_step)
            averages = _averaged(ema, apply)
            # The moving averages move with the chief's updates only: every worker applying them on
            # every update did W times the work for averages that move no better (each apply is one
            # more read-modify-write of every variable on the ps). Every worker builds them, so all
            # place the same variables alike.
            train_op = averages if task.is_chief else apply
            with tf.control_dependencies([train_op]):
                step_after = global_step.read_value()
            local_init_op = v1.local_variables_initializer()
            ready_for_local_init_op = v1.report_uninitialized_variables(v1.global_variables())
            sync_op = resync = None
        summary = v1.summary.merge([_scalar_summary('loss', loss), _scalar_summary('learning_rate', lr)])

    done_ops = session.done_ops(spec.num_ps, spec.num_workers, task.index, LIVE.generation(task.index, spec.num_workers))
    saver = v1.train.Saver(max_to_keep=5, sharded=True)
    return _Graph(global_step, step_after, loss, lr, train_op, local_init_op, ready_for_local_init_op,
                  resync, sync_op, summary, reshard, saver, done_ops, examples_per_run)


def _averaged(ema, after):
    """The moving average of every trainable variable, applied once `after` has run, each where
    its variable lives: under a worker's device function, (v - average) * decay would pull both
    to the worker and push the result back, three times the model's bytes per apply; under one
    fixed device, every variable of another ps task would cross to it and back."""
    averages = []
    with tf.control_dependencies([after]):
        for var in v1.trainable_variables():
            with v1.device(var.device):
                averages.append(ema.apply([var]))
    return tf.group(*averages)


def _scalar_summary(tag: str, tensor):
    """A scalar summary op tagged exactly `tag`: tf.summary.scalar makes its tag unique like an op
    name, and `learning_rate` is the schedule's own name, so it wrote `learning_rate_1`."""
    return tf.raw_ops.ScalarSummary(tags=tag, values=tensor, name=f'{tag}_summary')


class WeightReads:
    """How a worker's towers read the variables, and how its gradients go back (`read` is the
    `read` of model.inference, `send_gradients` wraps what is applied).

    Each variable is read once per step on the worker's CPU and that value is shared by every
    tower: a read per tower would pull the model from the ps tasks once per tower. With
    `transfer_dtype: bfloat16` the read is cast to bfloat16 on the variable's ps task and back to
    float32 on the worker, and each gradient is cast to bfloat16 on the worker and back to
    float32 on its variable's ps task: the bytes on the wire halve both ways, while the variables,
    the accumulators of sync mode, the updates and the moving averages stay float32 on the ps (so
    rounding never accumulates in the weights; each step's forward pass and gradient carry
    bfloat16's 8 bits of precision)."""

    def __init__(self, device: str, transfer_dtype: str):
        self.device, self.half = device, transfer_dtype == 'bfloat16'
        self.values: dict[str, object] = {}

    def __call__(self, var):
        if var.name not in self.values:
            parts = [var] if isinstance(var, tf.Variable) else list(var)     # a partitioned one: its parts
            with v1.device(self.device):
                values = [self._pull(part) for part in parts]
                self.values[var.name] = values[0] if len(values) == 1 else tf.concat(values, axis=0)
        return self.values[var.name]

    def _pull(self, part):
        if not self.half:
            return tf.identity(part)
        with v1.device(part.device):
            half = tf.cast(part, tf.bfloat16)
        return tf.cast(half, tf.float32)

    def send_gradients(self, grads):
        if not self.half:
            return grads
        out = []
        for grad, var in grads:
            if isinstance(grad, tf.Tensor):
                half = tf.cast(grad, tf.bfloat16)
                with v1.device(var.device):
                    grad = tf.cast(half, tf.float32)
            out.append((grad, var))
        return out


class ByteBalance:
    """A replica_device_setter ps strategy: each variable to the ps task holding the fewest bytes
    so far (greedy), instead of round-robin, which puts the model's few large weights wherever
    their turn falls. A variable colocated with another (a moving average, a slot) counts there."""

    def __init__(self, num_ps: int):
        self.loads = [0] * num_ps

    def __call__(self, op) -> int:
        colocated = _ps_index(op)
        if colocated is not None:
            return colocated
        index = min(range(len(self.loads)), key=self.loads.__getitem__)
        self.loads[index] += _variable_bytes(op)
        return index


def _ps_index(op) -> int | None:
    """The ps task of the op `op` is colocated with (a moving average with its variable), if any."""
    mine = b'loc:@' + op.name.encode()
    other = [g[5:].decode() for g in op.colocation_groups() if g != mine]
    return tf.DeviceSpec.from_string(op.graph.get_operation_by_name(other[0]).device).task if other else None


def _variable_bytes(op) -> int:
    try:
        shape, dtype = tf.TensorShape(op.get_attr('shape')), tf.as_dtype(op.get_attr('dtype'))
    except ValueError:      # a hash table or another stateful op without a static shape
        return 0
    return (shape.num_elements() or 0) * dtype.size


def ps_bytes(spec: ClusterSpec) -> list[int]:
    """The bytes of variables each ps task holds for this spec: its graph is built, nothing runs."""
    task = spec.task('worker', 0)
    with tf.Graph().as_default() as graph:
        build_graph(spec, task, data_dir=None)
        out = [0] * spec.num_ps
        for var in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES):
            index = _ps_index(var.op)       # a moving average lives where its variable does
            if index is None:
                index = tf.DeviceSpec.from_string(var.device).task
            out[index] += var.dtype.size * var.shape.num_elements()
    return out


def _average(tower_grads):
    if len(tower_grads) == 1:
        return tower_grads[0]
    out = []
    for pairs in zip(*tower_grads):
        grads = [g for g, _ in pairs if g is not None]
        out.append((tf.add_n(grads) / len(grads) if grads else None, pairs[0][1]))
    return out


class _Aggregator(threading.Thread):
    """The chief's side of sync training: aggregate each step and hand out the next tokens,
    and stop by itself once the last step has been aggregated (no blocked thread to wait out)."""

    def __init__(self, sess, g: _Graph, steps: int):
        super().__init__(name='aggregator', daemon=True)
        self.sess, self.g, self.steps = sess, g, steps

    def run(self):
        try:
            while self.sess.run(self.g.global_step) < self.steps:
                self.sess.run(self.g.sync_op)
        except Exception as e:
            # Only this thread hands out tokens: without it the training loop would wait for one
            # for ever. End the task instead, so the launcher sees a lost chief and acts.
            log.error('the sync aggregator failed, so this chief cannot go on: %s: %s', type(e).__name__,
                      session.first_line(str(e)))
            logging.shutdown()
            os._exit(rundir.EXIT_FAILED)


def check_memory(spec: ClusterSpec, task: TaskSpec) -> None:
    """SpecError (one line, about train.batch_size) if this worker's CPU towers cannot hold one
    batch of the model in this host's memory: refused here, on the worker's own host (the
    launcher checks workers on its machine before anything starts), not after a minute of
    silence and a ResourceExhaustedError. No restart can help."""
    towers = sum(1 for d in tower_devices(spec, task) if '/device:CPU:' in d)
    refusal = model.batch_memory_refusal(spec.train.batch_size, towers, model.host_memory_bytes(),
                                         host=f'{task.name}\'s host ({socket.gethostname()})')
    if refusal:
        raise spec.error('train.batch_size', refusal)


def run_worker(server, spec: ClusterSpec, task: TaskSpec, data_dir: str) -> dict:
    """Train to `train.steps` global steps; returns this worker's figures (also written as JSON)."""
    train = spec.train
    check_memory(spec, task)
    os.makedirs(train.train_dir, exist_ok=True)
    with tf.Graph().as_default():
        if train.seed is not None:
            v1.set_random_seed(train.seed)
        g = build_graph(spec, task, data_dir)
        config = v1.ConfigProto(device_filters=['/job:ps', f'/job:worker/task:{task.index}'],
                                allow_soft_placement=True)
        start = time.monotonic()
        sess, stopper = session.start_session(server.target, task.is_chief, train.train_dir, g.saver,
                                              g.local_init_op, g.ready_for_local_init_op, config)
        result = _train_loop(sess, spec, task, g, start, stopper)
        session.report_done(sess, g.done_ops)
    session.write_result(train.train_dir, task.index, result)
    return result


def _train_loop(sess, spec: ClusterSpec, task: TaskSpec, g: _Graph, start: float,
                stopper: session.GracefulStop | None = None) -> dict:
    train = spec.train
    first = sess.run(g.global_step)
    log.info('session ready after %.1fs at global step %d', time.monotonic() - start, first)
    writer = summaries.writer(train.train_dir, sess.graph) if task.is_chief else None
    own_writer = summaries.writer(rundir.worker_summary_dir(train.train_dir, task.index))
    if writer and summaries.note_restart(writer, int(first)):
        log.info('recorded the restart in TensorBoard at global step %d', first)
    save_lock = stopper.lock if stopper else threading.Lock()
    step_lock = stopper.step_lock if stopper else threading.Lock()

    def save() -> int:
        step_now = int(sess.run(g.global_step))
        session.save_checkpoint(g.saver, sess, train.train_dir, step_now)
        if writer:
            writer.flush()
        own_writer.flush()
        return step_now

    if stopper:
        stopper.arm(save)
    aggregator = None
    if train.sync and task.is_chief and first < train.steps:
        aggregator = _Aggregator(sess, g, train.steps)
        aggregator.start()

    step, local_steps, applied = int(first), 0, []
    profiler = StepProfiler.of_env(train.train_dir, task)
    t0 = time.monotonic()
    last_log, last_log_step, last_save, last_saved_step = t0, first, t0, int(first)
    log_every = train.log_every_secs if task.is_chief else max(10.0, train.log_every_secs)
    loss = float('nan')
    shard = None
    saves_asked = LIVE.save_requests()      # a request made before this start was for the last cluster

    def one_step():     # reads this iteration's fetches and local_steps
        with step_lock:
            return profiler.run(sess, fetches) if profiler and profiler.wants(local_steps) else sess.run(fetches)
    while step < train.steps:
        if LIVE.leaving(task.index, spec.num_workers):
            log.info('%s leaves at global step %d: the launcher took it out of the live workers', task.name, step)
            break
        if g.reshard is not None and (shard is None or LIVE.changed.is_set()):
            LIVE.changed.clear()
            members = LIVE.current(spec.num_workers)
            now = (members.rank(task.index) or 0, members.count)
            if now != shard:
                g.reshard(sess, *now)
                if shard is not None:
                    log.info('reading input shard %d of %d now (%d live workers)', now[0] + 1, now[1], now[1])
                shard = now
        due = time.monotonic() - last_log >= log_every or local_steps == 0
        fetches = [g.step_after, g.loss] + ([g.summary] if due and writer else [])
        out = run_retrying(one_step, 'the step after global step %d', step)
        applied.append(step)
        token, loss, local_steps = int(out[0]), float(out[1]), local_steps + 1
        if train.sync and token <= step:
            token = _skip_to_next_step(sess, g, step, train.steps)
        step = token
        now = time.monotonic()
        if due or step >= train.steps:
            rate = (step - last_log_step) * g.examples_per_run * _per_step(spec) / max(now - last_log, 1e-9)
            live = LIVE.current(spec.num_workers).count      # said when part of the pool runs
            session.log_progress(step, train.steps, loss, f'  {rate:.0f} images/s'
                                 + (f'  {live} of {spec.num_workers} workers' if live != spec.num_workers else ''))
            if len(out) > 2:
                writer.add_summary(out[2], step)
            if writer:      # the global step's advance counts every worker's images
                writer.add_summary(summaries.scalar(summaries.IMAGES_PER_SEC, rate), step)
            own_writer.add_summary(summaries.scalar(summaries.WORKER_STEPS, local_steps), step)
            last_log, last_log_step = now, step
        asked = LIVE.save_requests() if task.is_chief else 0
        if asked > saves_asked:
            log.info('saving a checkpoint at global step %d: the launcher asked for one', step)
        if task.is_chief and (asked > saves_asked or session.save_due(train, step, last_saved_step, now - last_save)):
            saves_asked = max(saves_asked, asked)
            with save_lock:
                session.save_checkpoint(g.saver, sess, train.train_dir, step)
            last_save, last_saved_step = now, step
    elapsed = time.monotonic() - t0
    if profiler:
        profiler.write()
    if aggregator:
        aggregator.join()
    final = int(sess.run(g.global_step))
    if task.is_chief:
        with save_lock:
            session.save_checkpoint(g.saver, sess, train.train_dir, final)
        writer.close()
    own_writer.close()
    images = local_steps * g.examples_per_run
    log.info('done: %d local steps, global step %d, loss %.3f, %.0f images/s from this worker',
             local_steps, final, loss, images / max(elapsed, 1e-9))
    return {'task': task.name, 'local_steps': local_steps, 'first_global_step': int(first),
            'global_step': final, 'loss': loss, 'seconds': elapsed,
            'images_per_sec': images / max(elapsed, 1e-9), 'applied_at': _runs(applied)}


ABORT_RETRIES = 3       # TensorFlow's AbortedError in a row before a step's failure is the task's


def run_retrying(run, what: str, *args, tries: int = ABORT_RETRIES):
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
                        rundir.cause_line(e.message, '(no message)'), attempt + 1, tries)


def _skip_to_next_step(sess, g: _Graph, step: int, steps: int) -> int:
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
