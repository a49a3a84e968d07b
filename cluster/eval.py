"""Precision@1 on the data set's test split (CIFAR-10's 10,000 images, Fashion-MNIST's 10,000, ...)
from a checkpoint, with the moving averages of the weights in place of the weights (as the tutorial
evaluates): `python -m cluster.eval --spec SPEC`
or `launch eval SPEC`. Runs in this process, on this machine; it needs no cluster. The figure also
goes to TensorBoard, under <train_dir>/eval at the checkpoint's global step.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import types
from collections.abc import Sequence

from cluster.checks import data
from cluster.training import inputs
from cluster.runtime import causes, rundir
from cluster.spec import DEFAULT_SPEC, ClusterSpec, load_spec

log = logging.getLogger(__name__)
EVAL_BATCH = 250


class EvalError(ValueError):
    """No checkpoint to evaluate, or no test data: a one-line user error."""


def evaluate(spec: ClusterSpec, checkpoint: str | None = None) -> dict:
    """Run the whole test split once through the averaged model; returns the figures."""
    train_dir = spec.train.train_dir
    if spec.coordinator:        # before anything is read or written: nothing here fits its checkpoints
        raise EvalError(f'{spec.path}: a coordinator run\'s checkpoints hold the model of your own program '
                        f'({_own_code(spec)}), and `launch eval` scores only the built-in CIFAR-10 model: '
                        'evaluate yours with train.evaluator (an evaluator task beside the chief)')
    if checkpoint is None and not os.path.exists(rundir.checkpoint_index_path(train_dir)):
        # Before the data: synthetic data would be written for nothing.
        raise EvalError(f'{train_dir}: no checkpoint to evaluate; train first with `launch up {spec.path}`')
    data_set = data.resolve_data(spec.train.data, train_dir)
    data.check_split(data_set, 'test')
    import tensorflow as tf
    from cluster.training import model
    from cluster.training import summaries
    v1 = tf.compat.v1
    checkpoint = checkpoint or tf.train.latest_checkpoint(train_dir)
    if not checkpoint:
        raise EvalError(f'{train_dir}: the checkpoint index names no checkpoint that exists')
    with tf.Graph().as_default():
        images, labels = inputs.eval_inputs(data_set, EVAL_BATCH)
        logits, _ = model.inference(images, partitions=_partitions(tf, checkpoint))
        correct = model.precision_at_1(logits, labels)
        count = tf.shape(labels)[0]
        global_step = v1.train.get_or_create_global_step()
        ema = v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY)
        saver = v1.train.Saver(ema.variables_to_restore())
        with v1.Session() as sess:
            try:
                saver.restore(sess, checkpoint)
            except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as e:
                why = f'trained by {_own_code(spec)}?' if spec.train.program or spec.train.command else \
                    'trained on another data set?'
                raise EvalError(f'{checkpoint} does not hold the built-in model for {data_set.name}\'s '
                                f'{data_set.shape_text} images ({why}): '
                                f'{causes.cause_line(e.message, "restore failed")}') from None
            right = total = 0
            while True:
                try:
                    c, n = sess.run([correct, count])
                except tf.errors.OutOfRangeError:
                    break
                right, total = right + int(c), total + int(n)
            step = int(sess.run(global_step))
    precision = right / max(total, 1)
    summaries.write_precision(train_dir, precision, step)
    return {'precision': precision, 'correct': right, 'total': total, 'global_step': step,
            'checkpoint': checkpoint}


def _own_code(spec: ClusterSpec) -> str:
    """The spec's own training code, as its key says it."""
    train = spec.train
    return f'train.program {train.program}' if train.program else f'train.command {" ".join(train.command or ())}'


def _partitions(tf: types.ModuleType, checkpoint: str) -> int:
    """How many blocks the checkpoint's local3 weights were trained in (one per ps task): their
    moving averages are saved per block, so the model is built the same way to restore them."""
    names = tf.train.list_variables(checkpoint)
    return sum(1 for name, _ in names if name.startswith('cifar10/local3/weights/part_')
               and name.endswith('/ExponentialMovingAverage')) or 1


def report(result: dict) -> str:
    return (f'precision @ 1 = {result["precision"]:.4f} ({result["correct"]}/{result["total"]}) '
            f'at global step {result["global_step"]} ({result["checkpoint"]})')


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog='python -m cluster.eval', description=__doc__.splitlines()[0])
    p.add_argument('--spec', help=f'cluster spec (default: $CLUSTER_SPEC, else {DEFAULT_SPEC})')
    p.add_argument('--set', dest='overrides', action='append', default=[], metavar='KEY=VALUE')
    p.add_argument('--checkpoint', help="a checkpoint prefix (default: the newest in train_dir)")
    args = p.parse_args(argv)
    try:
        spec = load_spec(args.spec or os.environ.get('CLUSTER_SPEC') or DEFAULT_SPEC, args.overrides)
        result = evaluate(spec, args.checkpoint)
    except ValueError as e:       # SpecError, EvalError, DataError
        print(f'cluster.eval: error: {e}', file=sys.stderr)
        return rundir.EXIT_USAGE
    except OSError as e:          # the synthetic test data, or its summaries, on a disk that refuses them
        print(f'cluster.eval: error: cannot write {e.filename or "the evaluation files"}: {rundir.os_cause(e)}',
              file=sys.stderr)
        return rundir.EXIT_FAILED
    print(report(result))
    return rundir.EXIT_OK


# Last: the module's functions must all be defined before main() runs.
if __name__ == '__main__':
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
