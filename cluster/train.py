"""What a task does once its server is up: a ps serves until every worker is done; a worker
builds per-device towers under `replica_device_setter` and trains, synchronously or not.

Why not MonitoredTrainingSession: its SyncReplicas hook hands out `replicas_to_aggregate` initial
tokens (so the chief can fill a global step alone), its chief queue runner stays blocked after the
last step (so closing waits out a 120 s grace period) and its non-chiefs poll every 30 s. Here the
chief drives the aggregation itself in a thread that stops at the last step, no initial tokens are
handed out, and non-chiefs poll for the chief's initialisation twice a second.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass

import tensorflow as tf

from cluster import data, model
from cluster.spec import ClusterSpec, TaskSpec

v1 = tf.compat.v1
log = logging.getLogger(__name__)

DONE_QUEUE = 'tfcluster_done_%d'     # one per ps task: workers report "finished" there
READY_POLL_SECS = 0.1                # how often a non-chief checks that the chief has initialised
PS_LINGER_SECS = 0.5                 # a ps stays this long after the last "done", so that reply arrives
DONE_TIMEOUT_MS = 30_000             # a worker waits this long for the ps tasks to take its "done"
STOP_SAVE_SECS = 20.0                # a stopped chief gives its last checkpoint this long, then exits
STEP_WAIT_SECS = 5.0                 # ...of which the step under way may take this long to finish


class CheckpointError(Exception):
    """No checkpoint in train_dir can be restored: one line naming the files."""


def first_line(text: str, default: str = '') -> str:
    """The first non-empty line of an error message (TensorFlow's run to dozens of lines)."""
    return next((line.strip() for line in (text or '').splitlines() if line.strip()), default)


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


def _done_queue(ps_index: int, capacity: int):
    with v1.device(f'/job:ps/task:{ps_index}'):
        return v1.FIFOQueue(capacity, [tf.int32], shapes=[()], shared_name=DONE_QUEUE % ps_index,
                            name=f'done_queue_{ps_index}')


def run_ps(server, spec: ClusterSpec, task: TaskSpec) -> None:
    """Serve variables until every worker has reported that it finished, then return."""
    with tf.Graph().as_default():
        dequeue = _done_queue(task.index, spec.num_workers).dequeue()
        config = v1.ConfigProto(device_filters=[f'/job:ps/task:{task.index}'])
        with v1.Session(server.target, config=config) as sess:
            log.info('serving variables; exits once all %d workers are done', spec.num_workers)
            for remaining in range(spec.num_workers - 1, -1, -1):
                worker = sess.run(dequeue)
                log.info('worker:%d is done; %d to go', worker, remaining)
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
            opt = v1.train.SyncReplicasOptimizer(
                opt, replicas_to_aggregate=spec.replicas_to_aggregate, total_num_replicas=spec.num_workers,
                variable_averages=ema, variables_to_average=None)

    with v1.device(f'{worker_device}/device:CPU:0'):
        if data_dir is None:        # only the graph's shape is wanted (ps_bytes): no data is read
            images = tf.zeros([examples_per_run, data.IMAGE_SIZE, data.IMAGE_SIZE, 3])
            labels = tf.zeros([examples_per_run], tf.int32)
        elif train.deterministic:     # worker w reads batches w, w+W, ...: together one big batch a step
            images, labels = data.deterministic_inputs(data_dir, examples_per_run, task.index * examples_per_run,
                                                       stride=spec.num_workers * examples_per_run)
        else:
            images, labels = data.train_inputs(data_dir, examples_per_run, shard_index=task.index,
                                               num_shards=spec.num_workers, seed=train.seed)
        image_parts, label_parts = tf.split(images, n), tf.split(labels, n)

    tower_grads, tower_losses = [], []
    for k, device in enumerate(devices):
        with v1.device(setter(device)), tf.name_scope(f'tower_{k}'):
            # The largest weights come in one block per ps task, for the placement to spread.
            logits, decay = model.inference(image_parts[k], seed=train.seed, partitions=spec.num_ps)
            tower_loss = model.loss(logits, label_parts[k], decay)
            tower_losses.append(tower_loss)
            tower_grads.append(opt.compute_gradients(tower_loss))

    with v1.device(setter(worker_device)):
        grads = _average(tower_grads)
        loss = tf.add_n(tower_losses) / n
        if train.sync:
            train_op = opt.apply_gradients(grads, global_step=global_step)
            step_after = tf.identity(train_op)   # the token: the global step to train on next
            local_init_op = opt.chief_init_op if task.is_chief else opt.local_step_init_op
            ready_for_local_init_op = opt.ready_for_local_init_op
            resync = opt.local_step_init_op
            sync_op = opt.get_chief_queue_runner().enqueue_ops[0] if task.is_chief else None
        else:
            apply = opt.apply_gradients(grads, global_step=global_step)
            with tf.control_dependencies([apply]):
                # Each average is computed where its variable lives: under the worker's device
                # function, (v - average) * decay would pull both to the worker and push the result
                # back, three times the model's bytes on every update of the chief.
                averages = []
                for var in v1.trainable_variables():
                    with v1.device(var.device):
                        averages.append(ema.apply([var]))
                averages = tf.group(*averages)
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
        v1.summary.scalar('loss', loss)
        v1.summary.scalar('learning_rate', lr)
        summary = v1.summary.merge_all()

    done_ops = [_done_queue(p, spec.num_workers).enqueue(task.index) for p in range(spec.num_ps)]
    saver = v1.train.Saver(max_to_keep=5, sharded=True)
    return _Graph(global_step, step_after, loss, lr, train_op, local_init_op, ready_for_local_init_op,
                  resync, sync_op, summary, saver, done_ops, examples_per_run)


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
                      first_line(str(e)))
            logging.shutdown()
            os._exit(1)


def run_worker(server, spec: ClusterSpec, task: TaskSpec, data_dir: str) -> dict:
    """Train to `train.steps` global steps; returns this worker's figures (also written as JSON)."""
    train = spec.train
    os.makedirs(train.train_dir, exist_ok=True)
    with tf.Graph().as_default():
        if train.seed is not None:
            v1.set_random_seed(train.seed)
        g = build_graph(spec, task, data_dir)
        config = v1.ConfigProto(device_filters=['/job:ps', f'/job:worker/task:{task.index}'],
                                allow_soft_placement=True)
        manager = v1.train.SessionManager(
            local_init_op=g.local_init_op, ready_op=v1.report_uninitialized_variables(),
            ready_for_local_init_op=g.ready_for_local_init_op, graph=tf.compat.v1.get_default_graph(),
            recovery_wait_secs=READY_POLL_SECS)
        start = time.monotonic()
        stopper = GracefulStop() if task.is_chief else None
        if task.is_chief:
            checkpoint = restorable_checkpoint(train.train_dir)
            sess = manager.prepare_session(server.target, init_op=v1.global_variables_initializer(),
                                           saver=g.saver, checkpoint_filename_with_path=checkpoint, config=config)
        else:
            sess = manager.wait_for_session(server.target, config=config)
        result = _train_loop(sess, spec, task, g, start, stopper)
        _report_done(sess, g.done_ops)
    _write_result(spec, task, result)
    return result


def run_program(server, spec: ClusterSpec, task: TaskSpec, fn) -> dict:
    """Call the user's `train.program` function in this worker (cluster/program.py), then report
    done to the ps tasks as the built-in trainer does, so they end by themselves."""
    from cluster.program import ProgramContext
    os.makedirs(spec.train.train_dir, exist_ok=True)
    cluster = v1.train.ClusterSpec(spec.cluster_def())
    worker_device = f'/job:worker/task:{task.index}'
    ctx = ProgramContext(
        target=server.target, cluster=cluster, job=task.job, index=task.index, is_chief=task.is_chief,
        devices=tuple(tower_devices(spec, task)), train_dir=spec.train.train_dir, train=spec.train,
        device_setter=v1.train.replica_device_setter(cluster=cluster, worker_device=worker_device),
        num_ps=spec.num_ps, num_workers=spec.num_workers,
        session_config=v1.ConfigProto(device_filters=['/job:ps', worker_device], allow_soft_placement=True))
    fn(ctx)
    result = ctx.result()
    with tf.Graph().as_default():
        done_ops = [_done_queue(p, spec.num_workers).enqueue(task.index) for p in range(spec.num_ps)]
        sess = v1.Session(server.target, config=ctx.session_config)
        _report_done(sess, done_ops)
    _write_result(spec, task, result)
    return result


def _write_result(spec: ClusterSpec, task: TaskSpec, result: dict) -> None:
    path = os.path.join(spec.train.train_dir, f'worker-{task.index}.json')
    with open(path + '.tmp', 'w') as f:
        json.dump(result, f)
    os.replace(path + '.tmp', path)


def _report_done(sess, done_ops: list) -> None:
    """Tell every ps that this worker has finished. The session is not closed afterwards: each ps
    exits soon after the last worker reports, and closing a session whose ps is gone can block for
    good (seen under load). Checkpoints and summaries are written already; the process ends next.

    Training is over at this point, so a ps that cannot be reached is no reason to fail: it has
    most likely taken the report and left (the reply to the last report can be lost when the ps
    exits), and a ps that crashed is reported by its own exit code."""
    deadline = time.monotonic() + DONE_TIMEOUT_MS / 1000     # one deadline for all ps tasks together
    for ps_index, op in enumerate(done_ops):
        left_ms = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            sess.run(op, options=v1.RunOptions(timeout_in_ms=left_ms))
        except tf.errors.OpError as e:     # Unavailable, DeadlineExceeded, or UNKNOWN "stream removed"
            log.warning('ps:%d did not acknowledge that this worker is done (%s); '
                        'it has most likely finished already', ps_index, type(e).__name__)


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


class GracefulStop:
    """SIGTERM or SIGINT to the chief: write a checkpoint, then exit (128 + the signal).

    The main thread may be blocked in a session call for as long as a sync step waits for a lost
    worker, and Python runs signal handlers only between bytecodes of the main thread. So the
    handler is a no-op and the signal's number arrives through `signal.set_wakeup_fd` at a thread
    of its own, which saves with the session the training loop uses (sessions are thread-safe).
    The launcher stops the chief first, while the ps tasks still hold the variables."""

    def __init__(self):
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._read = read
        self._save = None
        self.lock = threading.Lock()        # one save at a time: the loop's, the final one, or ours
        self.step_lock = threading.Lock()   # held by the loop while it trains one step
        signal.set_wakeup_fd(write)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *a: None)
        threading.Thread(target=self._wait, name='graceful-stop', daemon=True).start()

    def arm(self, save) -> None:
        self._save = save

    def _wait(self) -> None:
        signum = os.read(self._read, 1)[0]
        name = signal.Signals(signum).name
        code = 128 + signum
        threading.Timer(STOP_SAVE_SECS, _exit_now, (code, logging.WARNING, f'{name}: the checkpoint did not '
                                                    f'finish within {STOP_SAVE_SECS:.0f}s; exiting')).start()
        if self._save is None:
            _exit_now(code, logging.INFO, f'{name} received before training began; nothing to save')
        # Between two steps the global step is still (in sync mode), so the checkpoint's name
        # matches what it holds; a loop blocked in a stalled step is not waited for long. The loop
        # never gets the lock back: no step starts after the save.
        self.step_lock.acquire(timeout=STEP_WAIT_SECS)
        try:
            with self.lock:
                step = self._save()
        except Exception as e:
            _exit_now(code, logging.WARNING, f'{name} received, and the checkpoint failed: {type(e).__name__}: '
                                             f'{first_line(str(e))}')
        _exit_now(code, logging.INFO, f'{name} received: saved a checkpoint at global step {step}, exiting')


def _exit_now(code: int, level: int, message: str) -> None:
    log.log(level, message)
    logging.shutdown()
    os._exit(code)


def _train_loop(sess, spec: ClusterSpec, task: TaskSpec, g: _Graph, start: float,
                stopper: GracefulStop | None = None) -> dict:
    train = spec.train
    first = sess.run(g.global_step)
    log.info('session ready after %.1fs at global step %d', time.monotonic() - start, first)
    writer = v1.summary.FileWriter(train.train_dir, sess.graph) if task.is_chief else None
    save_lock = stopper.lock if stopper else threading.Lock()
    step_lock = stopper.step_lock if stopper else threading.Lock()
    checkpoint_prefix = os.path.join(train.train_dir, 'model.ckpt')

    def save() -> int:
        step_now = int(sess.run(g.global_step))
        g.saver.save(sess, checkpoint_prefix, global_step=step_now)
        if writer:
            writer.flush()
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
    while step < train.steps:
        due = time.monotonic() - last_log >= log_every or local_steps == 0
        fetches = [g.step_after, g.loss] + ([g.summary] if due and writer else [])
        with step_lock:
            if profiler and profiler.wants(local_steps):
                out = profiler.run(sess, fetches)
            else:
                out = sess.run(fetches)
        applied.append(step)
        token, loss, local_steps = int(out[0]), float(out[1]), local_steps + 1
        if train.sync and token <= step:
            token = _skip_to_next_step(sess, g, step, train.steps)
        step = token
        now = time.monotonic()
        if due or step >= train.steps:
            rate = (step - last_log_step) * g.examples_per_run * _per_step(spec) / max(now - last_log, 1e-9)
            log.info('step %d/%d  loss %.3f  %.0f images/s', step, train.steps, loss, rate)
            if len(out) > 2:
                writer.add_summary(out[2], step)
            last_log, last_log_step = now, step
        if task.is_chief and _save_due(train, step, last_saved_step, now - last_save):
            with save_lock:
                g.saver.save(sess, checkpoint_prefix, global_step=step)
            last_save, last_saved_step = now, step
    elapsed = time.monotonic() - t0
    if profiler:
        profiler.write()
    if aggregator:
        aggregator.join()
    final = int(sess.run(g.global_step))
    if task.is_chief:
        with save_lock:
            g.saver.save(sess, checkpoint_prefix, global_step=final)
        writer.close()
    images = local_steps * g.examples_per_run
    log.info('done: %d local steps, global step %d, loss %.3f, %.0f images/s from this worker',
             local_steps, final, loss, images / max(elapsed, 1e-9))
    return {'task': task.name, 'local_steps': local_steps, 'first_global_step': int(first),
            'global_step': final, 'loss': loss, 'seconds': elapsed,
            'images_per_sec': images / max(elapsed, 1e-9), 'applied_at': _runs(applied)}


PROFILE_ENV = 'TFCLUSTER_PROFILE'     # 'FIRST:COUNT': trace COUNT local steps from the FIRST-th on


class StepProfiler:
    """Where a worker's step goes, for benchmarks/profile.py. First TensorFlow's step stats
    (RunMetadata, full trace) of COUNT steps, summed per task and kind of op, with the bytes each
    transfer carried; then a Python profile of the next COUNT steps: how much of the loop's time is
    Python rather than TensorFlow's C++ session run. Written to <train_dir>/profile-worker-N.json."""

    KINDS = (('input', ('IteratorGetNext', 'IteratorV2', 'MakeIterator')),
             ('sync token', ('QueueDequeue', 'QueueEnqueue', 'AccumulatorApplyGradient', 'AccumulatorTakeGradient',
                             'AccumulatorNumAccumulated', 'AccumulatorSetGlobalStep', 'TakeGradient',
                             'ResourceAccumulator')),
             ('update', ('ApplyGradientDescent', 'ResourceApplyGradientDescent', 'Assign', 'AssignSub', 'AssignAdd',
                         'AssignVariableOp', 'AssignSubVariableOp', 'AssignAddVariableOp', 'ScatterSub')))
    UNITS = {'B': 1, 'KB': 1e3, 'KiB': 1 << 10, 'MB': 1e6, 'MiB': 1 << 20, 'GB': 1e9, 'GiB': 1 << 30}

    def __init__(self, path: str, first: int, count: int):
        self.path, self.first, self.count = path, first, count
        self.walls: list[float] = []
        self.by: dict[str, float] = {}
        self.bytes: dict[str, float] = {}
        self.python = None              # the cProfile of the second COUNT steps, while it runs
        self.python_steps, self.python_t0, self.python_report = 0, 0.0, None

    @classmethod
    def of_env(cls, train_dir: str, task: TaskSpec) -> 'StepProfiler | None':
        value = os.environ.get(PROFILE_ENV)
        if not value:
            return None
        first, _, count = value.partition(':')
        return cls(os.path.join(train_dir, f'profile-worker-{task.index}.json'), int(first), int(count or 10))

    def wants(self, local_step: int) -> bool:
        return self.first <= local_step < self.first + 2 * self.count

    def run(self, sess, fetches):
        if len(self.walls) < self.count:
            return self._traced(sess, fetches)
        if self.python is None:
            import cProfile
            self.python, self.python_t0 = cProfile.Profile(), time.monotonic()
            self.python.enable()
        out = sess.run(fetches)
        self.python_steps += 1
        if self.python_steps == self.count:
            self._end_python()
        return out

    def _traced(self, sess, fetches):
        meta = v1.RunMetadata()
        t0 = time.monotonic()
        out = sess.run(fetches, options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE), run_metadata=meta)
        self.walls.append(time.monotonic() - t0)
        for dev in meta.step_stats.dev_stats:
            job = 'ps' if '/job:ps' in dev.device else 'worker'
            for node in dev.node_stats:
                label = node.timeline_label
                if node.node_name == 'RecvTensor':     # '[3.4MB] [9.3Gb/s] edge_28_... from A to B'
                    kind = 'transfer in'
                    m = re.match(r'\[([\d.]+)([KMG]?i?B)\]', label)
                    size, unit = m.groups() if m else ('0', 'B')
                    self.bytes[job] = self.bytes.get(job, 0.0) + float(size) * self.UNITS.get(unit, 1)
                else:                                   # '[mklcpu 2.2MB 2.2MB] name = Op(inputs)'
                    op = label.split('(')[0].split(' = ')[-1].strip()
                    kind = next((k for k, ops in self.KINDS if any(o in op for o in ops)), 'compute')
                    if 'ExponentialMovingAverage' in node.node_name:
                        kind = 'moving averages'
                key = f'{job} {kind}'
                self.by[key] = self.by.get(key, 0.0) + node.all_end_rel_micros / 1e6
        return out

    def _end_python(self) -> None:
        """Stop the Python profile, if it runs, and sum it up."""
        if self.python is None or self.python_report is not None:
            return
        self.python.disable()
        elapsed = time.monotonic() - self.python_t0
        import pstats
        in_tf = sum(row[2] for (_, _, name), row in pstats.Stats(self.python).stats.items()
                    if 'TF_SessionRun_wrapper' in name)
        n = self.python_steps
        self.python_report = {'steps': n, 'loop_s_per_step': elapsed / n, 'in_tf_run_s_per_step': in_tf / n,
                              'python_s_per_step': (elapsed - in_tf) / n}

    def write(self) -> None:
        self._end_python()      # the run may end before its COUNT steps
        n = max(1, len(self.walls))
        report = {'steps': len(self.walls), 'wall_s_per_step': sum(self.walls) / n,
                  'op_s_per_step': {k: v / n for k, v in sorted(self.by.items(), key=lambda kv: -kv[1])},
                  'bytes_in_per_step': {k: v / n for k, v in self.bytes.items()},
                  'python': self.python_report}
        with open(self.path, 'w') as f:
            json.dump(report, f, indent=1)


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


def _save_due(train, step: int, last_saved_step: int, since_save: float) -> bool:
    """Whether the chief saves now. By steps: once a multiple of checkpoint_steps has been reached
    or passed since the last save (in async mode the chief sees the global step jump by as many
    updates as the other workers made, so it rarely lands on a multiple itself)."""
    if step >= train.steps:
        return False        # the final save happens after the loop
    every = train.checkpoint_steps
    by_steps = every and step // every > last_saved_step // every
    return bool(by_steps) or since_save >= train.checkpoint_secs


def _runs(values: list[int]) -> list[list[int]]:
    """[0,1,2,3,7,8] -> [[0,3],[7,8]]: the global steps a worker trained on, compactly."""
    out: list[list[int]] = []
    for v in values:
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out
