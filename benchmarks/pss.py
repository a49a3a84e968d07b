"""TF2 ParameterServerStrategy against the TF1 between-graph cluster and one process
(`python benchmarks/bench.py --only pss`).

Three ways to train the CIFAR-10 tutorial CNN on this machine, interleaved in each repetition so
that they share its load:
  - one process: the model of examples/pss_loop.py and its input (synthetic, learnable images) in a
    `tf.function` step, no cluster (the baseline);
  - the TF1 between-graph cluster of the launcher (specs/local2.yaml, async: 1 ps + 2 workers, each
    worker its own steps; the built-in trainer's input pipeline, with the tutorial's distortions);
  - a coordinator run (specs/pss-loop.yaml, no evaluator: 1 chief + 1 ps + 2 workers), with 1, 10 or
    50 steps scheduled between two `coordinator.join()` (PSS_STEPS_PER_JOIN).
Each run's steady images/s is read from its chief's progress lines (benchmarks/bench.py launch_up);
a ratio is the median of each repetition's ratio against the baselines of that repetition.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
STEPS_PER_JOIN = (1, 10, 50)
QUICK_STEPS_PER_JOIN = (10,)


def one_process(batch: int, steps: int) -> float:
    """images/s of examples/pss_loop.py's model and input in one process (no strategy)."""
    code = f'''
import time, tensorflow as tf
from examples import pss_loop as m
model, rate = m.CifarCNN(), 0.1 * {batch} / 128
it = iter(m.train_dataset({batch}))
@tf.function
def step(images, labels):
    with tf.GradientTape() as tape:
        loss = m.cross_entropy(model(images), labels) + model.weight_decay()
    for v, g in zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables)):
        v.assign_sub(rate * g)
    return loss
for _ in range(max(5, {steps} // 10)): step(*next(it))
t0 = time.monotonic()
for _ in range({steps}): loss = step(*next(it))
float(loss)
print({batch} * {steps} / (time.monotonic() - t0))
'''
    out = subprocess.run([sys.executable, '-c', code], cwd=REPO, check=True, capture_output=True, text=True,
                         env=QUIET)
    return float(out.stdout.split()[-1])


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def bench(args, tmp: str, launch_up: Callable[..., dict], free_ports: Callable[[int], list[int]],
          tf1_overrides: Callable[..., list[str]], rate_ratio: Callable[..., float | None]) -> dict:
    joins = QUICK_STEPS_PER_JOIN if args.quick else STEPS_PER_JOIN
    kinds = ['one_process', 'tf1_async'] + [f'pss_join{k}' for k in joins]
    runs: dict[str, list] = {k: [] for k in kinds}
    for rep in range(args.reps):
        runs['one_process'].append(one_process(args.batch, args.single_steps))
        print(f'  rep {rep + 1}/{args.reps} one process:           {runs["one_process"][-1]:.0f} images/s', flush=True)
        sets = tf1_overrides(tmp, f'tf1-{rep}', args.steps, args.batch, extra=('train.sync=false',))
        runs['tf1_async'].append(launch_up('specs/local2.yaml', sets, args.batch))
        print(f'  rep {rep + 1}/{args.reps} TF1 between-graph:     {_rate(runs["tf1_async"][-1])}', flush=True)
        for k in joins:
            chief, ps, w0, w1 = (f'localhost:{p}' for p in free_ports(4))
            sets = [f'cluster.chief=[{chief}]', f'cluster.ps=[{ps}]', f'cluster.worker=[{w0}, {w1}]',
                    'cluster.evaluator=null', 'train.evaluator=null', f'train.steps={args.steps}',
                    f'train.batch_size={args.batch}', f'train.train_dir={tmp}/pss-{k}-{rep}',
                    'train.log_every_secs=1', 'supervise.stall_secs=120', f'env.PSS_STEPS_PER_JOIN={k}']
            runs[f'pss_join{k}'].append(launch_up('specs/pss-loop.yaml', sets, args.batch, chief='[chief:0]'))
            print(f'  rep {rep + 1}/{args.reps} PSS, {k:>2} steps per join: {_rate(runs[f"pss_join{k}"][-1])}',
                  flush=True)

    def ratio(top: str, bottom: str) -> float | None:
        return rate_ratio(runs, top, bottom, args.reps)
    out: dict = {'one_process_images_per_sec': _median(runs['one_process'])}
    for kind in kinds[1:]:
        out[kind] = {'steady_images_per_sec': _median([r['steady_images_per_sec'] for r in runs[kind]]),
                     'first_step_s': _median([r['first_step_s'] for r in runs[kind]]),
                     'vs_one_process': ratio(kind, 'one_process')}
        if kind != 'tf1_async':
            out[kind]['vs_tf1_between_graph'] = ratio(kind, 'tf1_async')
    out['runs'] = runs
    print(f'\n== TF2 ParameterServerStrategy vs TF1 between-graph vs one process: batch {args.batch} per '
          f'worker, {args.steps} steps, {args.reps} rep(s), medians')
    print(f'baseline  one process (examples/pss_loop.py model)    {out["one_process_images_per_sec"]:7.0f} images/s')
    for kind in kinds[1:]:
        r = out[kind]
        label = 'TF1 between-graph, async' if kind == 'tf1_async' else \
            f'PSS, {kind.removeprefix("pss_join")} steps per join'
        line = (f'{label:<28} {_num(r["steady_images_per_sec"], "7.0f")} images/s  '
                f'{_num(r["vs_one_process"], ".2f")}x one process')
        if 'vs_tf1_between_graph' in r:
            line += f'  {_num(r["vs_tf1_between_graph"], ".2f")}x TF1'
        print(line + f'  first step {_num(r["first_step_s"], ".1f")} s')
    return out


def _rate(run: dict) -> str:
    rate = run['steady_images_per_sec']
    return (f'{rate:.0f} images/s' if rate else 'too short for a steady rate') + \
        f', first step {_num(run["first_step_s"], ".1f")} s'


def _num(value: float | None, spec: str) -> str:
    return '-' if value is None else format(value, spec)
