"""The peer baseline: the between-graph TF1 cluster a user would write by hand, without tfcluster.

    python benchmarks/tf1_cluster.py --job worker --index 0 --ps localhost:2222 \\
        --workers localhost:2223,localhost:2224 --sync --steps 300 --batch 64

One process per task, as in TensorFlow's own distributed-training how-to: a `tf.train.Server`,
`replica_device_setter` putting the variables on the ps tasks (round-robin, its default), and a
`MonitoredTrainingSession` on each worker. Sync mode wraps the optimizer in
`SyncReplicasOptimizer` aggregating every worker's gradient per step, with its hook; async mode
applies each worker's update as it comes. It trains the same model on the same input pipeline as
the launcher's workers (`cluster.training.model`, `cluster.checks.data`, one tower) and keeps what the launcher's
cluster keeps: the moving averages of the weights (the classic CIFAR-10 trainer's way: after every
update) and no summaries in the step.

A ps serves for ever and a non-chief worker may wait for a token after the last step: the
benchmark ends every task once the chief has printed its figures. The chief prints one line per
second, `step GLOBAL_STEP`, that the benchmark reads the steady rate from as it does the launcher's.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import tensorflow as tf  # noqa: E402

from cluster.checks import data  # noqa: E402
from cluster.training import inputs  # noqa: E402
from cluster.training import model  # noqa: E402

v1 = tf.compat.v1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--job', choices=('ps', 'worker'), required=True)
    p.add_argument('--index', type=int, required=True)
    p.add_argument('--ps', required=True, help='host:port,... of the ps tasks')
    p.add_argument('--workers', required=True, help='host:port,... of the workers')
    p.add_argument('--sync', action='store_true')
    p.add_argument('--steps', type=int, default=300)
    p.add_argument('--batch', type=int, default=64)
    p.add_argument('--data', help='a data directory (default: synthetic records written to a temporary one)')
    args = p.parse_args()
    v1.disable_eager_execution()
    cluster = v1.train.ClusterSpec({'ps': args.ps.split(','), 'worker': args.workers.split(',')})
    server = v1.train.Server(cluster, job_name=args.job, task_index=args.index)
    if args.job == 'ps':
        server.join()
    num_workers = len(cluster.job_tasks('worker'))
    is_chief = args.index == 0
    tmp = tempfile.TemporaryDirectory()
    data_set = data.resolve_data(args.data or 'synthetic', tmp.name)
    per_step = args.batch * (num_workers if args.sync else 1)

    with v1.device(v1.train.replica_device_setter(worker_device=f'/job:worker/task:{args.index}', cluster=cluster)):
        global_step = v1.train.get_or_create_global_step()
        images, labels = inputs.train_inputs(data_set, args.batch, shard_index=args.index, num_shards=num_workers,
                                             seed=1)
        logits, decay = model.inference(images)
        loss = model.loss(logits, labels, decay)
        lr = model.learning_rate(global_step, model.default_learning_rate(per_step), per_step)
        opt = v1.train.GradientDescentOptimizer(lr)
        ema = v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY, global_step)
        hooks = [v1.train.StopAtStepHook(last_step=args.steps)]
        if args.sync:
            opt = v1.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=num_workers,
                                                 total_num_replicas=num_workers, variable_averages=ema,
                                                 variables_to_average=v1.trainable_variables())
            train_op = opt.minimize(loss, global_step=global_step)
            hooks.append(opt.make_session_run_hook(is_chief))
        else:
            apply = opt.minimize(loss, global_step=global_step)
            with tf.control_dependencies([apply]):
                train_op = ema.apply(v1.trainable_variables())

    config = v1.ConfigProto(device_filters=['/job:ps', f'/job:worker/task:{args.index}'])
    with v1.train.MonitoredTrainingSession(master=server.target, is_chief=is_chief, hooks=hooks, config=config,
                                           save_checkpoint_secs=None, save_summaries_steps=None,
                                           save_summaries_secs=None, log_step_count_steps=None) as sess:
        last = 0.0
        while not sess.should_stop():
            _, step = sess.run([train_op, global_step])
            now = time.monotonic()
            if is_chief and now - last >= 1.0:
                print(f'step {step}', flush=True)
                last = now
        if is_chief:
            print(f'step {args.steps}\ndone', flush=True)
        # Leave without closing: a sync chief's close waits out its queue runner's grace period
        # (120 s), and a non-chief may wait for a token. The benchmark ends the other tasks.
        os._exit(0)


if __name__ == '__main__':
    main()
