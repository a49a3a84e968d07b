"""Benchmarks: figures and ratios against baselines measured in the same run (machines are shared
and noisy, so absolute seconds only mean something next to their baseline).

    python benchmarks/bench.py cluster   # start-up and throughput of specs/local2.yaml, sync and async
    python benchmarks/bench.py towers    # images/s of 1, 2 and 4 CPU towers on one worker
    python benchmarks/bench.py all

Baselines: the time one process takes to import TensorFlow (start-up is mostly imports), and the
images/s of the same model trained in one process with no cluster (what distribution costs).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def tf_import_seconds() -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, '-c', 'import tensorflow'], check=True, capture_output=True)
    return time.monotonic() - t0


def single_process_images_per_sec(batch_size: int, steps: int = 60, towers: int = 1) -> float:
    """The model and input pipeline of a worker, trained in one process with a local session."""
    code = f'''
import time, tempfile, tensorflow as tf
from cluster import data, model
v1 = tf.compat.v1
v1.disable_eager_execution()
tmp = tempfile.TemporaryDirectory()
d = data.resolve_data("synthetic", tmp.name)
images, labels = data.train_inputs(d, {batch_size}, seed=1)
logits, decay = model.inference(images)
loss = model.loss(logits, labels, decay)
step = v1.train.get_or_create_global_step()
train = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
with v1.Session() as s:
    s.run(v1.global_variables_initializer())
    for _ in range(5): s.run(train)
    t0 = time.monotonic()
    for _ in range({steps}): s.run(train)
    print({batch_size} * {steps} / (time.monotonic() - t0))
'''
    out = subprocess.run([sys.executable, '-c', code], cwd=REPO, check=True, capture_output=True, text=True)
    return float(out.stdout.split()[-1])


def launch_up(spec: str, *overrides: str) -> dict:
    """Run `launch up` and time it from the outside: first global step, clean exit, images/s."""
    args = [sys.executable, '-m', 'launch', 'up', spec]
    for o in overrides:
        args += ['--set', o]
    t0 = time.monotonic()
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first_step = servers_up = None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        now = time.monotonic() - t0
        if servers_up is None and 'servers are up' in line:
            servers_up = now
        if first_step is None and re.search(r'\[worker:0\].* step \d+/', line):
            first_step = now
    code = proc.wait()
    total = time.monotonic() - t0
    if code != 0:
        raise SystemExit(f'launch up {spec} failed ({code}):\n' + ''.join(lines[-30:]))
    done = next(line for line in lines if '[launch]' in line and 'done in' in line)
    rate = float(re.search(r'([\d.]+) images/s in all', done).group(1))
    return {'servers_up_s': servers_up, 'first_step_s': first_step, 'exit_s': total, 'images_per_sec': rate}


def evaluate(spec: str, *overrides: str) -> float:
    args = [sys.executable, '-m', 'launch', 'eval', spec]
    for o in overrides:
        args += ['--set', o]
    out = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return float(re.search(r'precision @ 1 = ([\d.]+)', out).group(1))


def bench_cluster(steps: int, batch: int) -> dict:
    base_import = tf_import_seconds()
    base_rate = single_process_images_per_sec(batch)
    out = {'tf_import_s': base_import, 'single_process_images_per_sec': base_rate}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, spec in (('sync', 'specs/local2.yaml'), ('async', 'specs/local2-async.yaml')):
            sets = (f'train.steps={steps}', f'train.batch_size={batch}', f'train.train_dir={tmp}/{mode}')
            r = launch_up(spec, *sets)
            r['precision_at_1'] = evaluate(spec, *sets)
            out[mode] = r
    s = out['sync']
    print(f'\n== cluster: specs/local2.yaml, 1 ps + 2 workers, {steps} steps, batch {batch} per worker')
    print(f'baseline: import tensorflow in one process          {base_import:6.1f} s')
    print(f'baseline: same model, one process, no cluster       {base_rate:6.0f} images/s')
    print(f'sync  launch up -> all servers up                   {s["servers_up_s"]:6.1f} s  '
          f'({s["servers_up_s"] / base_import:.1f}x one import)')
    print(f'sync  launch up -> first global step                {s["first_step_s"]:6.1f} s  '
          f'({s["first_step_s"] / base_import:.1f}x one import)')
    print(f'sync  launch up -> clean exit                       {s["exit_s"]:6.1f} s')
    for mode in ('sync', 'async'):
        r = out[mode]
        print(f'{mode:<5} throughput (both workers)                   {r["images_per_sec"]:6.0f} images/s  '
              f'({r["images_per_sec"] / base_rate:.2f}x one process)   precision@1 {r["precision_at_1"]:.3f}')
    return out


def bench_towers(steps: int, batch: int, towers=(1, 2, 4)) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in towers:
            r = launch_up('specs/local2.yaml', 'cluster.worker=[localhost:2223]', f'train.devices={n}',
                          f'train.steps={steps}', f'train.batch_size={batch}', f'train.train_dir={tmp}/t{n}')
            out[n] = r['images_per_sec']
    print(f'\n== towers: one worker, N logical CPU towers of batch {batch}, {steps} sync steps '
          f'({os.cpu_count()} cores)')
    for n, rate in out.items():
        print(f'{n} tower(s): {rate:6.0f} images/s  ({rate / out[towers[0]]:.2f}x one tower)')
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('what', choices=['cluster', 'towers', 'all'])
    p.add_argument('--steps', type=int, default=100)
    p.add_argument('--batch', type=int, default=64)
    p.add_argument('--json', help='also write the figures to this file')
    args = p.parse_args()
    figures = {}
    if args.what in ('cluster', 'all'):
        figures['cluster'] = bench_cluster(args.steps, args.batch)
    if args.what in ('towers', 'all'):
        figures['towers'] = bench_towers(max(20, args.steps // 2), args.batch)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(figures, f, indent=1)


if __name__ == '__main__':
    main()
