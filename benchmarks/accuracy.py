"""Real accuracy (`python benchmarks/bench.py --only accuracy`): Fashion-MNIST trained by one process,
by 1 ps + 2 workers in sync mode and in async mode, each seeing the same images in all (N epochs)
on the same schedule (the rate per example: 0.1 for an update of 128 images), and evaluated on
the real 10,000-image test split: precision@1 after N epochs and the time to a checkpoint of
precision@1 >= 0.90.

Every run's checkpoints are kept as they appear (a watcher copies each one the `checkpoint` file
names; the chief keeps only its last five) and evaluated after the run, one process for all of a
run's checkpoints, so evaluating takes no CPU from the training it times. A checkpoint's time is
its index file's modification time, from the start of the run's process (`launch up`, or the one
process: start-up and TensorFlow's import count for both).

This file is also the one-process trainer and the evaluator (`--single`, `--evaluate`), run as
subprocesses by the benchmark.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
TARGET = 0.90
BATCH = 64                  # per worker; one process trains on the two workers' batches together
WORKERS = 2
EPOCH = 60000               # Fashion-MNIST's train split
CHECKPOINTS_PER_EPOCH = 4   # how often each run is evaluated, in images seen


# ---------------------------------------------------------------------------------------------
# In the subprocesses: the one-process trainer and the evaluator

def train_single(spec_path: str, steps: int, batch: int, every: int, seed: int) -> None:
    """The worker's model, input pipeline, rate, schedule and moving averages, trained in one
    process with a local session; a checkpoint (all kept) every `every` steps and at the end."""
    import tensorflow as tf

    from cluster.spec import load_spec
    from cluster.checks import data
    from cluster.training import inputs, model
    v1 = tf.compat.v1
    v1.disable_eager_execution()
    spec = load_spec(spec_path)
    data_set = data.resolve_spec_data(spec)
    v1.set_random_seed(seed)
    images, labels = inputs.train_inputs(data_set, batch, seed=seed)
    logits, decay = model.inference(images, seed=seed)
    loss = model.loss(logits, labels, decay)
    step = v1.train.get_or_create_global_step()
    initial = spec.train.learning_rate or model.default_learning_rate(batch)
    rate = model.learning_rate(step, initial, batch, data_set.epoch_examples)
    apply = v1.train.GradientDescentOptimizer(rate).minimize(loss, global_step=step)
    ema = v1.train.ExponentialMovingAverage(model.MOVING_AVERAGE_DECAY, step)
    with tf.control_dependencies([apply]):
        train_op = ema.apply(v1.trainable_variables())
    saver = v1.train.Saver(max_to_keep=None)
    prefix = os.path.join(spec.train.train_dir, 'model.ckpt')
    os.makedirs(spec.train.train_dir, exist_ok=True)
    with v1.Session() as sess:
        sess.run(v1.global_variables_initializer())
        for k in range(1, steps + 1):
            _, value = sess.run([train_op, loss])
            if k % every == 0 or k == steps:
                saver.save(sess, prefix, global_step=k)
                print(f'step {k}/{steps}  loss {value:.3f}', flush=True)


def evaluate_all(spec_path: str, checkpoints: list[str]) -> None:
    """precision@1 of each checkpoint on the test split (cluster.eval, as `launch eval` does), one
    JSON line each."""
    from cluster import eval as evaluation
    from cluster.runtime import runjson
    from cluster.spec import load_spec
    spec = load_spec(spec_path)
    for checkpoint in checkpoints:
        got = evaluation.evaluate(spec, checkpoint)
        print(runjson.dumps({'checkpoint': checkpoint, 'step': got['global_step'], 'precision': got['precision']}),
              flush=True)


# ---------------------------------------------------------------------------------------------
# In the benchmark: runs, kept checkpoints, evaluation, the table

class Keeper(threading.Thread):
    """Copies every checkpoint the train_dir's `checkpoint` file names into `kept` as it appears,
    with its index file's time from `t0` (time.time())."""

    def __init__(self, train_dir: str, kept: str, t0: float) -> None:
        super().__init__(daemon=True)
        self.train_dir, self.kept, self.t0 = train_dir, kept, t0
        self.seen: dict[int, float] = {}       # step -> seconds from t0
        self.done = threading.Event()
        os.makedirs(kept, exist_ok=True)

    def run(self) -> None:
        while not self.done.is_set():
            self.poll()
            time.sleep(0.2)
        self.poll()

    def poll(self) -> None:
        try:
            with open(os.path.join(self.train_dir, 'checkpoint')) as f:
                found = re.findall(r'^(?:all_)?model_checkpoint_paths?: "(.*?ckpt-(\d+))"', f.read(), re.M)
        except OSError:
            return
        for prefix, step_text in found:
            step = int(step_text)
            path = prefix if os.path.isabs(prefix) else os.path.join(self.train_dir, prefix)
            if step in self.seen or not os.path.exists(path + '.index'):
                continue
            try:
                for file in glob.glob(glob.escape(path) + '.*'):
                    shutil.copy2(file, self.kept)
                self.seen[step] = os.path.getmtime(path + '.index') - self.t0
            except OSError:
                continue        # deleted under us (it was the oldest of five): the next poll is too late


def run_kept(argv: list[str], train_dir: str, kept: str, on_line: Callable[[str], None] | None = None) -> dict:
    """Run `argv` from the repository root, keeping its checkpoints; (seconds, {step: seconds})."""
    t0 = time.time()
    keeper = Keeper(train_dir, kept, t0)
    keeper.start()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=QUIET)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if on_line:
            on_line(line)
    code = proc.wait()
    keeper.done.set()
    keeper.join()
    if code != 0:
        raise SystemExit(f'{" ".join(argv[:4])} ... failed ({code}):\n' + ''.join(lines[-30:]))
    return {'seconds': time.time() - t0, 'checkpoints': dict(sorted(keeper.seen.items()))}


def evaluate_kept(spec: str, kept: str, steps: list[int]) -> dict[int, float]:
    """step -> precision@1 of each kept checkpoint, in one process."""
    prefixes = [os.path.join(kept, f'model.ckpt-{s}') for s in steps]
    out = subprocess.run([sys.executable, os.path.abspath(__file__), '--evaluate', spec, *prefixes], cwd=REPO,
                         capture_output=True, text=True, env=QUIET)
    if out.returncode != 0:
        raise SystemExit(f'evaluating {kept} failed:\n{out.stderr[-3000:]}')
    got = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{')]
    return {int(g['step']): float(g['precision']) for g in got}


def write_spec(tmp: str, name: str, steps: int, batch: int, sync: bool, every: int, ports: list[int],
               rate: float | None = None) -> str:
    """A spec of 1 ps + 2 workers on Fashion-MNIST (the one process reads its train section);
    `rate`: the learning rate of an update (None: the default, linearly scaled)."""
    import yaml
    spec = {'cluster': {'ps': [f'localhost:{ports[0]}'], 'worker': [f'localhost:{p}' for p in ports[1:]]},
            'train': {'sync': sync, 'steps': steps, 'batch_size': batch, 'data': 'fashion-mnist',
                      'train_dir': f'{tmp}/{name}', 'checkpoint_steps': every, 'checkpoint_secs': 1e6,
                      'log_every_secs': 5, 'seed': 1, 'learning_rate': rate},
            'supervise': {'stall_secs': 300}}
    path = f'{tmp}/{name}.yaml'
    with open(path, 'w') as f:
        yaml.safe_dump(spec, f)
    return path


def one_run(kind: str, tmp: str, epochs: float, free_ports: Callable[[int], list[int]]) -> dict:
    """Train `kind` (single, sync, async) for `epochs` of Fashion-MNIST and evaluate its checkpoints."""
    per_update = {'single': BATCH * WORKERS, 'sync': BATCH * WORKERS, 'async': BATCH}[kind]
    steps = max(1, round(epochs * EPOCH / per_update))
    every = max(1, round(EPOCH / CHECKPOINTS_PER_EPOCH / per_update))
    batch = BATCH * WORKERS if kind == 'single' else BATCH
    spec = write_spec(tmp, f'accuracy-{kind}', steps, batch, kind != 'async', every, free_ports(WORKERS + 1))
    train_dir, kept = f'{tmp}/accuracy-{kind}', f'{tmp}/accuracy-{kind}-kept'
    if kind == 'single':
        argv = [sys.executable, os.path.abspath(__file__), '--single', spec, '--steps', str(steps),
                '--batch', str(batch), '--every', str(every)]
    else:
        argv = [sys.executable, '-m', 'launch', 'up', spec]
    run = run_kept(argv, train_dir, kept)
    precision = evaluate_kept(spec, kept, list(run['checkpoints']))
    points = [{'step': s, 'epochs': s * per_update / EPOCH, 'seconds': t, 'precision': precision.get(s)}
              for s, t in run['checkpoints'].items()]
    reached = next((p for p in points if p['precision'] is not None and p['precision'] >= TARGET), None)
    from cluster.training import model
    return {'kind': kind, 'steps': steps, 'images_per_update': per_update,
            'learning_rate': model.default_learning_rate(per_update), 'seconds': run['seconds'],
            'images_per_sec': steps * per_update / run['seconds'], 'points': points,
            'final': points[-1]['precision'] if points else None, 'reached': reached}


LABELS = {'single': 'one process', 'sync': '1 ps + 2 workers, sync', 'async': '1 ps + 2 workers, async'}


def bench(args: Any, tmp: str, free_ports: Callable[[int], list[int]]) -> dict:
    """The runs of args.accuracy_kinds for args.accuracy_epochs epochs each, and their table."""
    from cluster.checks import data
    if not os.path.isdir(data.FASHION_MNIST_DIR):
        print(f'\n== accuracy: skipped, {data.FASHION_MNIST_DIR} is missing (apt-get install '
              f'{data.FASHION_MNIST_PACKAGE})')
        return {'skipped': f'{data.FASHION_MNIST_DIR} is missing'}
    epochs = args.accuracy_epochs
    print(f'\n== accuracy: Fashion-MNIST, {epochs:g} epoch(s) of {EPOCH:,} images per run, the rate 0.1 per '
          f'{BATCH * WORKERS} images of an update (linear scaling), batch {BATCH} per worker; test precision@1 on '
          'the 10,000 test images, with the moving averages')
    out: dict[str, Any] = {'epochs': epochs, 'target': TARGET, 'runs': {}}
    for kind in args.accuracy_kinds:
        r = one_run(kind, tmp, epochs, free_ports)
        out['runs'][kind] = r
        curve = ', '.join(f'{p["epochs"]:.2f}: {p["precision"]:.4f}' for p in r['points']
                          if p['precision'] is not None)
        print(f'{LABELS[kind]:<24} {r["seconds"]:6.0f} s, {r["images_per_sec"]:4.0f} images/s; precision@1 by '
              f'epoch {curve}', flush=True)
    table(out)
    return out


def table(out: dict) -> None:
    """The accuracy table of docs/performance.md: final precision and time to the target, each against one process."""
    runs, base = out['runs'], out['runs'].get('single')
    print(f'\n| run | images per update | learning rate | precision@1 after {out["epochs"]:g} epochs | '
          f'vs one process | time to >= {TARGET:.2f} (epochs) | vs one process | images/s |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- |')
    for kind, r in runs.items():
        final = r['final']
        delta = f'{(final - base["final"]) * 100:+.2f} points' if base and final is not None and kind != 'single' \
            else ''
        reached = r['reached']
        when = f'{reached["seconds"]:.0f} s ({reached["epochs"]:.2f})' if reached else 'not reached'
        ratio = f'{reached["seconds"] / base["reached"]["seconds"]:.2f}x' \
            if reached and base and base['reached'] and kind != 'single' else ''
        size = f'{WORKERS} x {BATCH}' if kind == 'sync' else str(r['images_per_update'])
        print(f'| {LABELS[kind]} | {size} | {r["learning_rate"]:.3g} | '
              f'{"n/a" if final is None else f"{final:.4f}"} | {delta} | {when} | {ratio} | '
              f'{r["images_per_sec"]:.0f} |')


def main() -> None:
    p = argparse.ArgumentParser(description='the one-process trainer and the evaluator of the accuracy benchmark')
    p.add_argument('--single', metavar='SPEC')
    p.add_argument('--steps', type=int)
    p.add_argument('--batch', type=int)
    p.add_argument('--every', type=int)
    p.add_argument('--seed', type=int, default=1)
    p.add_argument('--evaluate', metavar='SPEC')
    p.add_argument('checkpoints', nargs='*')
    args = p.parse_args()
    sys.path.insert(0, REPO)
    if args.single:
        train_single(args.single, args.steps, args.batch, args.every, args.seed)
    elif args.evaluate:
        evaluate_all(args.evaluate, args.checkpoints)
    else:
        p.error('run it through benchmarks/bench.py --only accuracy')


if __name__ == '__main__':
    main()
