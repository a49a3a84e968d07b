"""What a worker builds: its training graph, towers on its devices and variables on the ps tasks.

Sync or async, every worker builds the same variables in the same order (so all agree where each
one lives, cluster/training/placement.py); what differs is how a step's gradients are applied.
The graph is built here and run by cluster/training/train.py.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import tensorflow as tf

from cluster.runtime import session
from cluster.runtime.membership import LIVE
from cluster.spec import ClusterSpec, TaskSpec
from cluster.checks import data
from cluster.training import inputs, model
from cluster.checks.data import DataSet
from cluster.training.placement import ByteBalance, WeightReads, ps_index, tower_devices

v1 = tf.compat.v1


@dataclass
class TrainGraph:
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
    reshard: Callable | None    # async: (sess, rank, count) -> chooses this worker's input shard
    saver: object
    done_ops: list
    examples_per_run: int


class _Updates(NamedTuple):
    """What applying a step's gradients is made of, sync or async (the fields of TrainGraph)."""
    train_op: object
    step_after: object
    local_init_op: object
    ready_for_local_init_op: object
    resync: object | None
    sync_op: object | None


def build_graph(spec: ClusterSpec, task: TaskSpec, data_set: DataSet | None) -> TrainGraph:
    """This worker's training graph, in the default graph: towers on its devices, variables on
    the ps tasks. With `data_set` None no data is read (only the graph's shape is wanted: that
    of the spec's data set, from its description)."""
    train = spec.train
    described = data_set or data.describe(train.data, train.train_dir)
    worker_device = f'/job:worker/task:{task.index}'
    devices = tower_devices(spec, task)
    n = len(devices)
    examples_per_run = train.batch_size * n
    examples_per_step = examples_per_run * (spec.replicas_to_aggregate if train.sync else 1)
    setter = _device_setter(spec)
    with v1.device(setter(worker_device)):
        global_step, lr, opt, ema = _optimizer(spec, examples_per_step, described.epoch_examples)
    images, labels, reshard = _inputs(spec, task, data_set, described, examples_per_run)
    with v1.device(f'{worker_device}/device:CPU:0'):
        image_parts, label_parts = tf.split(images, n), tf.split(labels, n)

    tower_grads, tower_losses = [], []
    reads = WeightReads(f'{worker_device}/device:CPU:0', train.transfer_dtype)
    for k, device in enumerate(devices):
        with v1.device(setter(device)), tf.name_scope(f'tower_{k}'):
            # The largest weights come in blocks (one per ps task, or train.partitions), for the placement to spread.
            logits, decay = model.inference(image_parts[k], seed=train.seed, partitions=spec.partitions, read=reads)
            tower_loss = model.loss(logits, label_parts[k], decay)
            tower_losses.append(tower_loss)
            tower_grads.append(opt.compute_gradients(tower_loss))

    with v1.device(setter(worker_device)):
        grads = reads.send_gradients(_average(tower_grads))
        loss = tf.add_n(tower_losses) / n
        if train.sync:
            updates = _sync_updates(spec, task, opt, ema, grads, global_step)
        else:
            updates = _async_updates(task, opt, ema, grads, global_step)
        summary = v1.summary.merge([_scalar_summary('loss', loss), _scalar_summary('learning_rate', lr)])

    generation = LIVE.generation(task.index, spec.num_workers)
    done_ops = session.done_ops(spec.num_ps, spec.num_workers, task.index, generation)
    saver = v1.train.Saver(max_to_keep=5, sharded=True)
    return TrainGraph(global_step=global_step, loss=loss, lr=lr, summary=summary, reshard=reshard, saver=saver,
                  done_ops=done_ops, examples_per_run=examples_per_run, **updates._asdict())


def _device_setter(spec: ClusterSpec) -> Callable[[str], Callable]:
    """device -> the device function that puts a worker's ops on `device`, its variables on the
    ps tasks. One placement for the whole graph, by bytes: every variable (and so its
    accumulator, its moving average) goes to the ps task holding the fewest bytes so far. Every
    worker builds the same variables in the same order, so all of them agree where each one lives."""
    cluster = v1.train.ClusterSpec(spec.cluster_def())
    strategy = ByteBalance(spec.num_ps)

    def setter(device: str) -> Callable:
        return v1.train.replica_device_setter(cluster=cluster, worker_device=device, ps_strategy=strategy)
    return setter


def _optimizer(spec: ClusterSpec, examples_per_step: int, epoch_examples: int) -> tuple:
    """(global step, learning rate, optimizer, moving average), built under the caller's device;
    the rate decays by epochs of `epoch_examples`."""
    train = spec.train
    global_step = v1.train.get_or_create_global_step()
    lr = model.learning_rate(global_step, train.learning_rate or model.default_learning_rate(examples_per_step),
                             examples_per_step, epoch_examples)
    opt = v1.train.GradientDescentOptimizer(lr)
    ema = v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY, global_step)
    if train.sync:
        # The moving averages are applied below, each on its variable's ps task: given to the
        # optimizer, every one would be computed on the global step's ps task (ps:0), so with
        # 2 ps tasks half the model crossed from ps to ps twice on every step.
        opt = v1.train.SyncReplicasOptimizer(
            opt, replicas_to_aggregate=spec.replicas_to_aggregate, total_num_replicas=spec.live_workers)
    return global_step, lr, opt, ema


def _inputs(spec: ClusterSpec, task: TaskSpec, data_set: DataSet | None, described: DataSet,
            examples_per_run: int) -> tuple:
    """(images, labels, reshard) of one run of this worker, on its CPU, from `data_set` (None:
    zeros of the `described` set's shape). The live workers split the records among them, by
    their rank in index order (a sync scale restarts the cluster; an async worker switches shards
    at its next step: `reshard`, None otherwise)."""
    train = spec.train
    members = LIVE.current(spec.num_workers)
    shard, shards = members.rank(task.index) or 0, members.count
    reshard = None
    with v1.device(f'/job:worker/task:{task.index}/device:CPU:0'):
        if data_set is None:        # only the graph's shape is wanted (ps_bytes): no data is read
            images = tf.zeros([examples_per_run, *described.image_shape])
            labels = tf.zeros([examples_per_run], tf.int32)
        elif train.deterministic:     # worker w reads batches w, w+W, ...: together one big batch a step
            images, labels = inputs.deterministic_inputs(data_set, examples_per_run, shard * examples_per_run,
                                                         stride=shards * examples_per_run)
        elif train.sync:     # a scale restarts a sync cluster: the shard is fixed for this start
            images, labels = inputs.train_inputs(data_set, examples_per_run, shard_index=shard,
                                                 num_shards=shards, seed=train.seed)
        else:                # async: the live workers can change while it runs (launch scale)
            (images, labels), reshard = inputs.train_inputs(data_set, examples_per_run, seed=train.seed,
                                                            reshardable=True)
    return images, labels, reshard


def _sync_updates(spec: ClusterSpec, task: TaskSpec, opt: Any, ema: Any, grads: list, global_step: Any) -> _Updates:
    """The workers' gradients aggregated into one update a step; the chief applies it and the
    moving averages, and hands out the tokens that let every worker take the next step."""
    train_op = opt.apply_gradients(grads, global_step=global_step)
    return _Updates(
        train_op=train_op,
        step_after=tf.identity(train_op),   # the token: the global step to train on next
        local_init_op=opt.chief_init_op if task.is_chief else opt.local_step_init_op,
        ready_for_local_init_op=_used(opt.ready_for_local_init_op),
        resync=opt.local_step_init_op,
        sync_op=_averaged(ema, opt.get_chief_queue_runner().enqueue_ops[0]) if task.is_chief else None)


def _async_updates(task: TaskSpec, opt: Any, ema: Any, grads: list, global_step: Any) -> _Updates:
    """Every worker applies its own gradients as they come. The moving averages move with the
    chief's updates only: every worker applying them on every update did W times the work for
    averages that move no better (each apply is one more read-modify-write of every variable on
    the ps). Every worker builds them, so all place the same variables alike."""
    apply = opt.apply_gradients(grads, global_step=global_step)
    averages = _averaged(ema, apply)
    train_op = averages if task.is_chief else apply
    with tf.control_dependencies([train_op]):
        step_after = global_step.read_value()
    return _Updates(train_op=train_op, step_after=step_after, local_init_op=v1.local_variables_initializer(),
                    ready_for_local_init_op=_used(v1.report_uninitialized_variables(v1.global_variables())),
                    resync=None, sync_op=None)


def _used(tensor: Any) -> Any:
    """`tensor`, marked as used. TensorFlow wraps what report_uninitialized_variables returns so
    that it prints "Object was never used" at exit if nothing reads it; the session manager reads
    this one when it runs, but a graph built only to be looked at (ps_bytes) never runs it. (Only
    a graph being built gets the wrapper: inside a tf.function the tensor comes back as it is.)"""
    mark_used = getattr(tensor, 'mark_used', None)
    if mark_used is not None:
        mark_used()
    return tensor


def _averaged(ema: Any, after: Any) -> tf.Operation:
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


def _scalar_summary(tag: str, tensor: tf.Tensor) -> tf.Tensor:
    """A scalar summary op tagged exactly `tag`: tf.summary.scalar makes its tag unique like an op
    name, and `learning_rate` is the schedule's own name, so it wrote `learning_rate_1`."""
    return tf.raw_ops.ScalarSummary(tags=tag, values=tensor, name=f'{tag}_summary')


def ps_bytes(spec: ClusterSpec) -> list[int]:
    """The bytes of variables each ps task holds for this spec: its graph is built, nothing runs."""
    task = spec.task('worker', 0)
    with tf.Graph().as_default() as graph:
        build_graph(spec, task, data_set=None)
        out = [0] * spec.num_ps
        for var in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES):
            index = ps_index(var.op)       # a moving average lives where its variable does
            if index is None:
                index = tf.DeviceSpec.from_string(var.device).task
            out[index] += var.dtype.size * var.shape.num_elements()
    return out


def _average(tower_grads: list[list[tuple]]) -> list[tuple]:
    """Each variable's gradient averaged over the towers (None where no tower has one)."""
    if len(tower_grads) == 1:
        return tower_grads[0]
    out = []
    for pairs in zip(*tower_grads):
        grads = [g for g, _ in pairs if g is not None]
        out.append((tf.add_n(grads) / len(grads) if grads else None, pairs[0][1]))
    return out
