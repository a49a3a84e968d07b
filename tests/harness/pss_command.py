"""A ParameterServerStrategy script as people run it by hand: its cluster and its role from
TF_CONFIG alone, its checkpoints in the directory its flag names (model.ckpt-<step>, as the
launcher reads the resume step from), and its own print-outs (no progress lines of ours).
`python tests/harness/pss_command.py --train_dir DIR --steps N` on the chief of a coordinator run
(`--pause SECS` between rounds of 10 steps, so a test's kill lands mid-run; `--train_dir DIR/backup`:
its files where no evaluator looks, as Keras' BackupAndRestore keeps its own)."""
from __future__ import annotations

import argparse
import time

import tensorflow as tf


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument('--train_dir', required=True)
    p.add_argument('--steps', type=int, default=100)
    p.add_argument('--pause', type=float, default=0.0)
    args = p.parse_args()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        w = tf.Variable(tf.zeros([4, 1]))
        step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(w=w, step=step)
    manager = tf.train.CheckpointManager(checkpoint, args.train_dir, max_to_keep=3, checkpoint_name='model.ckpt')
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint)
    x = tf.random.stateless_normal([256, 4], seed=[1, 2])
    y = tf.matmul(x, [[1.0], [2.0], [3.0], [4.0]])

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        w.assign_sub(0.05 * tape.gradient(loss, w))
        step.assign_add(1)
        return loss

    while int(step.numpy()) < args.steps:
        losses = [coordinator.schedule(train_step) for _ in range(10)]
        coordinator.join()
        manager.save(checkpoint_number=int(step.numpy()))
        print(f'my own line: at {int(step.numpy())}, loss {float(losses[-1].fetch()):.4f}', flush=True)
        time.sleep(args.pause)


if __name__ == '__main__':
    main()
