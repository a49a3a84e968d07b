"""Benchmarks: figures and ratios against baselines measured in the same run (machines are shared
and noisy, so absolute seconds only mean something next to their baseline).

    python benchmarks/bench.py                 # everything but links, 3 repetitions, medians (about 75 min)
    python benchmarks/bench.py --quick         # every figure once, tiny runs (CI: no speed asserted)
    python benchmarks/bench.py --only cluster  # or scaling, bytes, learning, towers, elastic
    python benchmarks/bench.py --only accuracy # Fashion-MNIST: one process, sync, async, 6 epochs each (about 30 min)
    python benchmarks/bench.py --only pss      # TF2 ParameterServerStrategy vs TF1 between-graph vs one process
    python benchmarks/bench.py --only links    # emulated links, by hand (root; about 20 min, 3 with --quick)
    python benchmarks/bench.py --only ray      # the same spec on local, a run's own Ray and a 3-node Ray cluster
    python benchmarks/bench.py --only recovery # kills of a worker and the ps, standby 0 vs 3 (x one TF import)
    python benchmarks/bench.py --only startup  # launch up -> first step, start-up zygote vs cold (x one TF import)
    python benchmarks/bench.py --only stragglers  # a worker stopped half the time, with and without a backup worker
    python benchmarks/bench.py --only scale    # the launcher at 10, 100, 300 rehearsal tasks, and over SSH to
                                               # 1, 10, 50 rig hosts at 100, 300, by hand (--sizes, --ssh-sizes, --hosts)
    python benchmarks/bench.py --plots DIR     # and draw the figures as PNGs there (benchmarks/plots.py)

Baselines: the time one process takes to `import tensorflow` (start-up is mostly imports), the
images/s of the same model and input pipeline trained in one process with no cluster, and the
hand-written TF1 cluster of the same model with no launcher (benchmarks/tf1_cluster.py). Cluster
rates are steady state: read from the chief's progress lines as they arrive, from the first line
after warm-up (a tenth of the steps) to the last one before the end. The figures also go to JSON
(--json, default benchmarks/results.json), with the command line and the date that made them;
--plots DIR draws them as PNGs (the documentation's performance page shows docs/images/perf).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from cluster.runtime import rundir, runjson
from launch.planning import link_time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QUIET = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')


def median(values):
    return statistics.median(values) if values else None


def rate_ratio(runs: dict, top: str, bottom: str, reps: int) -> float | None:
    """The median over repetitions of runs[top]'s steady images/s over runs[bottom]'s (a run dict
    each, or a baseline figure), each repetition against its own baseline."""
    got = []
    for rep in range(reps):
        a, b = runs[top][rep]['steady_images_per_sec'], runs[bottom][rep]
        b = b['steady_images_per_sec'] if isinstance(b, dict) else b
        if a and b:
            got.append(a / b)
    return median(got)


def num(value, spec: str, unit: str = '') -> str:
    """A figure, or n/a where a run was too short to give it (--quick)."""
    return 'n/a'.rjust(len(format(0, spec))) if value is None else format(value, spec) + unit


def ratio(a, b) -> str:
    return 'n/a' if a is None or not b else f'{a / b:.2f}x'


# ---------------------------------------------------------------------------------------------
# Baselines

def tf_import_seconds() -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, '-c', 'import tensorflow'], check=True, capture_output=True, env=QUIET)
    return time.monotonic() - t0


def single_process(batch_size: int, steps: int) -> dict:
    """The model and input pipeline of a worker, trained in one process with a local session:
    its images/s, and the CPU time (every thread, user + system) one batch costs."""
    code = f'''
import os, time, tempfile, tensorflow as tf
from cluster.checks import data
from cluster.training import inputs
from cluster.training import model
v1 = tf.compat.v1
v1.disable_eager_execution()
tmp = tempfile.TemporaryDirectory()
d = data.resolve_data("synthetic", tmp.name)
images, labels = inputs.train_inputs(d, {batch_size}, seed=1)
logits, decay = model.inference(images)
loss = model.loss(logits, labels, decay)
step = v1.train.get_or_create_global_step()
train = v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
with v1.Session() as s:
    s.run(v1.global_variables_initializer())
    for _ in range(max(5, {steps} // 10)): s.run(train)
    t0, c0 = time.monotonic(), sum(os.times()[:2])
    for _ in range({steps}): s.run(train)
    print({batch_size} * {steps} / (time.monotonic() - t0), (sum(os.times()[:2]) - c0) / {steps})
'''
    out = subprocess.run([sys.executable, '-c', code], cwd=REPO, check=True, capture_output=True, text=True,
                         env=QUIET)
    rate, cpu = out.stdout.split()[-2:]
    return {'images_per_sec': float(rate), 'cpu_s_per_batch': float(cpu)}


def loopback_bytes_per_sec(total: int = 256 << 20, chunk: int = 4 << 20) -> float:
    """What one TCP connection over loopback carries per second: the link between tasks here."""
    server = socket.create_server(('127.0.0.1', 0))
    port = server.getsockname()[1]

    def sink():
        conn, _ = server.accept()
        with conn:
            while conn.recv(chunk):
                pass
    t = threading.Thread(target=sink)
    t.start()
    data = b'\0' * chunk
    t0 = time.monotonic()
    with socket.create_connection(('127.0.0.1', port)) as c:
        for _ in range(total // chunk):
            c.sendall(data)
    t.join()
    server.close()
    return total / (time.monotonic() - t0)


# ---------------------------------------------------------------------------------------------
# One `launch up`, timed from the outside

def launch_up(spec: str, overrides: list[str], images_per_step: int, on_step=None, up_args=(),
              timeline: list | None = None, chief: str = '[worker:0]', env: dict | None = None) -> dict:
    """Run `launch up` and read, as lines arrive: the first global step, the steady-state rate,
    the last step and the clean exit (every task gone: the launcher waits for them). `timeline`,
    if given, gets every (monotonic time, global step) of the chief's lines.
    on_step(launcher_pid, step, total), if given, is called at each of the chief's progress lines."""
    args = [sys.executable, '-m', 'launch', 'up', spec, *up_args]
    for o in overrides:
        args += ['--set', o]
    t0 = time.monotonic()
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env or QUIET)
    steps, lines, first_step, last_step_at = [], [], None, None
    startup: dict[str, float] = {}      # when each stage of the start-up was first seen
    for line in proc.stdout:
        now = time.monotonic() - t0
        lines.append(line)
        for stage, marks in STARTUP_STAGES.items():
            if stage not in startup and all(m in line for m in marks):
                startup[stage] = now
        if ' serving on ' in line:      # the last task's server up, as that task says it
            startup['servers_up_s'] = now
        progress = rundir.step_of(line) if line.startswith(chief) else None     # the chief's lines
        if progress:
            step, total = progress
            first_step = first_step if first_step is not None else now
            steps.append((now, step))
            if timeline is not None:
                timeline.append((t0 + now, step))
            if on_step:
                on_step(proc.pid, step, total)
            if step >= total:
                last_step_at = now
    code = proc.wait()
    exit_s = time.monotonic() - t0
    if code != 0:
        raise SystemExit(f'launch up {spec} failed ({code}):\n' + ''.join(lines[-30:]))
    return {'first_step_s': first_step, 'exit_s': exit_s, 'steady_images_per_sec': steady_rate(steps, images_per_step),
            'last_step_to_gone_s': exit_s - last_step_at if last_step_at is not None else None, 'startup': startup}


# The launcher's and the chief's lines that mark where `launch up` -> first global step goes.
STARTUP_STAGES = {'tasks_started_s': ('[launch]', ' started '), 'chief_session_ready_s': ('[worker:0]', 'session ready')}


def steady_rate(steps: list[tuple[float, int]], images_per_step: int) -> float | None:
    """images/s between the first progress line after warm-up (a tenth of the steps) and the last
    one before the end, from (seconds, global step) pairs; None if the run was too short."""
    total = steps[-1][1] if steps else 0
    steady = [(t, s) for t, s in steps if total * 0.1 <= s < total]
    if len(steady) >= 2 and steady[-1][0] > steady[0][0]:
        return (steady[-1][1] - steady[0][1]) * images_per_step / (steady[-1][0] - steady[0][0])
    return None


def tf1_cluster(mode: str, steps: int, batch: int, ps: int = 1, workers: int = 2) -> dict:
    """The peer baseline: the same model and input trained by a hand-written between-graph TF1
    cluster (benchmarks/tf1_cluster.py, no launcher), its steady rate read from the chief's lines
    as launch_up reads the launcher's. Every task is ended once the chief is done."""
    ports = free_ports(ps + workers)
    hosts = [f'localhost:{p}' for p in ports]
    common = ['--ps', ','.join(hosts[:ps]), '--workers', ','.join(hosts[ps:]), '--steps', str(steps),
              '--batch', str(batch)] + (['--sync'] if mode == 'sync' else [])
    script = os.path.join(REPO, 'benchmarks', 'tf1_cluster.py')
    tasks = [('ps', i) for i in range(ps)] + [('worker', i) for i in range(workers)]
    procs = [subprocess.Popen([sys.executable, script, '--job', job, '--index', str(i), *common], cwd=REPO,
                              stdout=subprocess.PIPE if (job, i) == ('worker', 0) else subprocess.DEVNULL,
                              stderr=subprocess.STDOUT, text=True, env=QUIET)
             for job, i in tasks]
    chief = procs[ps]
    t0 = time.monotonic()
    points, first_step, lines = [], None, []
    try:
        for line in chief.stdout:
            lines.append(line)
            m = re.match(r'step (\d+)$', line.strip())
            if m:
                now = time.monotonic() - t0
                first_step = first_step if first_step is not None else now
                points.append((now, int(m.group(1))))
        if chief.wait() != 0 or not points:
            raise SystemExit(f'the hand-written TF1 cluster failed ({chief.returncode}):\n' + ''.join(lines[-30:]))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return {'first_step_s': first_step, 'exit_s': time.monotonic() - t0,
            'steady_images_per_sec': steady_rate(points, batch * (workers if mode == 'sync' else 1))}


def free_ports(n: int) -> list[int]:
    """n ports nobody listens on now, below the range the kernel hands to outgoing connections."""
    from cluster.runtime.ports import port_in_use
    out = list(itertools.islice((p for p in range(22400, 32000) if not port_in_use(p)), n))
    if len(out) < n:
        raise SystemExit('no free ports in 22400-32000')
    return out


def cluster_overrides(tmp: str, name: str, steps: int, batch: int, ps: int = 1, workers: int = 2,
                      extra: tuple = ()) -> list[str]:
    ports = free_ports(ps + workers)
    ps_list = ', '.join(f'localhost:{p}' for p in ports[:ps])
    worker_list = ', '.join(f'localhost:{p}' for p in ports[ps:])
    return [f'cluster.ps=[{ps_list}]', f'cluster.worker=[{worker_list}]', f'train.steps={steps}',
            f'train.batch_size={batch}', f'train.train_dir={tmp}/{name}', 'train.log_every_secs=1',
            'supervise.stall_secs=120', *extra]


# ---------------------------------------------------------------------------------------------
# The sections

def bench_cluster(args, tmp: str) -> dict:
    """Baselines and 1 ps + 2 workers, sync and async, each mode by the launcher and by the
    hand-written TF1 cluster, interleaved, `reps` times. Ratios are medians of each repetition's
    ratio (each run against the baselines of its own repetition), figures medians of the runs."""
    runs = {'tf_import_s': [], 'single_images_per_sec': [], 'sync': [], 'async': [], 'tf1_sync': [], 'tf1_async': []}
    for rep in range(args.reps):
        runs['tf_import_s'].append(tf_import_seconds())
        runs['single_images_per_sec'].append(single_process(args.batch, args.single_steps)['images_per_sec'])
        for mode in ('sync', 'async'):
            runs[f'tf1_{mode}'].append(tf1_cluster(mode, args.steps, args.batch))
            print(f'  rep {rep + 1}/{args.reps} {mode} hand-written TF1: {fmt_run(runs[f"tf1_{mode}"][-1])}', flush=True)
            sets = cluster_overrides(tmp, f'{mode}{rep}', args.steps, args.batch, extra=(f'train.sync={mode == "sync"}',))
            per_step = args.batch * (2 if mode == 'sync' else 1)
            runs[mode].append(launch_up('specs/local2.yaml', sets, per_step))
            print(f'  rep {rep + 1}/{args.reps} {mode} launcher:        {fmt_run(runs[mode][-1])}', flush=True)
    out = {'tf_import_s': median(runs['tf_import_s']), 'single_images_per_sec': median(runs['single_images_per_sec'])}
    for kind in ('sync', 'async', 'tf1_sync', 'tf1_async'):
        out[kind] = {k: median([r[k] for r in runs[kind] if r.get(k) is not None]) for k in runs[kind][0]
                     if k != 'startup'}

    def per_rep(top, bottom):
        return rate_ratio(runs, top, bottom, args.reps)
    out['ratios'] = {mode: {'launcher_vs_one_process': per_rep(mode, 'single_images_per_sec'),
                            'tf1_vs_one_process': per_rep(f'tf1_{mode}', 'single_images_per_sec'),
                            'launcher_vs_tf1': per_rep(mode, f'tf1_{mode}')} for mode in ('sync', 'async')}
    out['runs'] = runs
    base, imp = out['single_images_per_sec'], out['tf_import_s']
    print(f'\n== 1 ps + 2 workers (specs/local2.yaml shapes), batch {args.batch} per worker, {args.steps} steps, '
          f'{args.reps} rep(s), medians (ratios: medians of each repetition\'s ratio)')
    print(f'baseline  import tensorflow, one process             {imp:7.2f} s')
    print(f'baseline  same model and input, one process          {base:7.0f} images/s')
    for mode in ('sync', 'async'):
        q = out['ratios'][mode]
        for kind, label, key in ((f'tf1_{mode}', 'hand-written TF1', 'tf1_vs_one_process'),
                                 (mode, 'launcher', 'launcher_vs_one_process')):
            print(f'{mode:<5}     {label:<16} steady, both workers {num(out[kind]["steady_images_per_sec"], "7.0f")} '
                  f'images/s   {num(q[key], ".2f", "x")} one process')
        print(f'{mode:<5}     launcher / hand-written TF1                     {num(q["launcher_vs_tf1"], "7.2f", "x")}')
    for mode in ('sync', 'async'):
        r = out[mode]
        print(f'{mode:<5}     launch up -> first global step             {num(r["first_step_s"], "7.2f")} s'
              f'        {ratio(r["first_step_s"], imp)} one import')
        print(f'{mode:<5}     last global step -> every process gone     {num(r["last_step_to_gone_s"], "7.2f")} s')
    for mode in ('sync', 'async'):
        stages = {k: median([r['startup'][k] for r in runs[mode] if k in r['startup']])
                  for k in ('tasks_started_s', 'servers_up_s', 'chief_session_ready_s')}
        out[mode]['startup'] = stages
        print(f'{mode:<5}     start-up: launcher to tasks started {num(stages["tasks_started_s"], ".2f")} s, every '
              f'server up (their imports) {num(stages["servers_up_s"], ".2f")} s, chief\'s session ready (graph) '
              f'{num(stages["chief_session_ready_s"], ".2f")} s, first step {num(out[mode]["first_step_s"], ".2f")} s')
    return out


def fmt_run(r: dict) -> str:
    rate = r['steady_images_per_sec']
    return (f'{rate:.0f} images/s' if rate else 'too short for a steady rate') + \
        f', first step {num(r["first_step_s"], ".1f")}s, exit {r["exit_s"]:.1f}s'


SCALING = ((1, 1), (1, 2), (1, 3), (2, 2))      # (ps, workers)
QUICK_SCALING = ((2, 2),)                      # --quick (CI): sync on the 2-ps layout, which has the most parts


def bench_scaling(args, tmp: str) -> dict:
    """Cost growth: 1/2/3 workers with 1 ps, and 2 workers with 2 ps, async and sync, one run each."""
    out = {}
    print(f'\n== scaling: steady images/s, batch {args.batch} per worker, {args.steps} steps, one run each')
    for mode in ('sync',) if args.quick else ('async', 'sync'):
        for ps, workers in QUICK_SCALING if args.quick else SCALING:
            name = f'{mode}-{ps}ps-{workers}w'
            sets = cluster_overrides(tmp, name, args.steps, args.batch, ps, workers, (f'train.sync={mode == "sync"}',))
            per_step = args.batch * (workers if mode == 'sync' else 1)
            r = launch_up('specs/local2.yaml', sets, per_step)
            out[name] = r
            print(f'{mode:<5} {ps} ps + {workers} worker(s): {fmt_run(r)}', flush=True)
    return out


def model_bytes_and_shares() -> tuple[int, dict[int, list[int]]]:
    """The model's bytes (float32), and the bytes each ps task holds with 1, 2 and 3 ps tasks."""
    code = '''
import json, logging, sys, tensorflow as tf
tf.get_logger().setLevel(logging.FATAL)
tf.compat.v1.disable_eager_execution()
from cluster.training import train
from cluster.spec import load_spec
out = {}
for ps in (1, 2, 3):
    spec = load_spec("specs/local2.yaml", ["cluster.ps=[%s]" % ", ".join("localhost:%d" % (3000 + i) for i in range(ps))])
    out[ps] = train.ps_bytes(spec)
with tf.Graph().as_default():
    from cluster.training import model
    model.inference(tf.zeros([1, 24, 24, 3]))
    out["model"] = sum(v.shape.num_elements() * 4 for v in tf.compat.v1.trainable_variables())
print(json.dumps(out, allow_nan=False))
'''
    got = json.loads(subprocess.run([sys.executable, '-c', code], cwd=REPO, check=True, capture_output=True,
                                    text=True, env=QUIET).stdout.splitlines()[-1])
    return got.pop('model'), {int(ps): b for ps, b in got.items()}


def bench_bytes(args) -> dict:
    """What crosses the link per global step, next to what computing a step costs."""
    model_bytes, got = model_bytes_and_shares()
    link = loopback_bytes_per_sec()
    per_update = 2 * model_bytes        # every update pulls every weight and pushes a gradient for each
    out = {'model_bytes': model_bytes, 'bytes_per_update_per_worker': per_update, 'loopback_bytes_per_sec': link,
           'link_seconds_per_update': per_update / link, 'ps_bytes': got,
           'largest_ps_share': {ps: max(b) / sum(b) for ps, b in got.items()}}
    print('\n== bytes: what each worker moves per update (its global step share)')
    print(f'model weights                                    {model_bytes / 1e6:7.2f} MB')
    print(f'per update and worker: pull weights + push grads {per_update / 1e6:7.2f} MB')
    print(f'loopback, one TCP connection (measured)          {link / 1e9:7.2f} GB/s  '
          f'-> {per_update / link * 1e3:.2f} ms per update on the wire')
    for ps, b in got.items():
        shares = ', '.join(f'{x / sum(b):.0%}' for x in b)
        print(f'{ps} ps task(s): bytes held per ps                   {shares}')
    return out


def bench_learning(args, tmp: str) -> dict:
    """Seconds to precision@1 >= 0.9 on the synthetic test split, sync and async, spec defaults."""
    out = {}
    print('\n== learning: seconds from `launch up` to a checkpoint with precision@1 >= 0.9 (defaults)')
    runs = (('sync', 'specs/local2.yaml', 'float32'), ('async', 'specs/local2-async.yaml', 'float32'),
            ('sync', 'specs/local2.yaml', 'bfloat16'))
    for run_mode, spec, dtype in runs[:args.learn_modes]:
        mode = run_mode if dtype == 'float32' else f'{run_mode}-{dtype}'
        train_dir = f'{tmp}/learn-{mode}'
        sets = cluster_overrides(tmp, f'learn-{mode}', args.learn_steps, 64,
                                 extra=(f'train.sync={run_mode == "sync"}', f'train.checkpoint_steps={args.learn_every}',
                                        f'train.transfer_dtype={dtype}'))
        t0 = time.time()
        launch_up(spec, sets, 64)
        reached = None
        checkpoints = sorted({int(m.group(1)) for f in os.listdir(train_dir)
                              for m in [re.match(re.escape(rundir.CHECKPOINT_PREFIX) + r'-(\d+)\.index$', f)] if m})
        for step in checkpoints:
            prefix = f'{rundir.checkpoint_prefix(train_dir)}-{step}'
            got = subprocess.run([sys.executable, '-m', 'launch', 'eval', spec, '--checkpoint', prefix,
                                  *[a for s in sets for a in ('--set', s)]], cwd=REPO, capture_output=True,
                                 text=True, env=QUIET)
            m = re.search(r'precision @ 1 = ([\d.]+)', got.stdout)
            if m and float(m.group(1)) >= 0.9:
                reached = {'step': step, 'precision_at_1': float(m.group(1)),
                           'seconds': os.path.getmtime(prefix + '.index') - t0}
                break
        out[mode] = reached
        print(f'{mode:<14}: ' + (f'{reached["seconds"]:.1f} s (global step {reached["step"]}, precision@1 '
                                f'{reached["precision_at_1"]:.3f})' if reached else
                                f'not reached in {args.learn_steps} steps'), flush=True)
    return out


def bench_towers(args, tmp: str) -> dict:
    out = {}
    print(f'\n== towers: one worker, N logical CPU towers of batch {args.batch} ({os.cpu_count()} cores)')
    for n in (1, 2):
        sets = cluster_overrides(tmp, f'towers{n}', args.steps, args.batch, 1, 1, (f'train.devices={n}',))
        r = launch_up('specs/local2.yaml', sets, args.batch * n)
        out[n] = r['steady_images_per_sec']
        print(f'{n} tower(s): {fmt_run(r)}', flush=True)
    return out


def bench_elastic(args, tmp: str) -> dict:
    """1 ps + a pool of 3 workers started with one (`launch up --workers 1`) and scaled to 3 a
    quarter of the way (`launch scale`): steady images/s before and after, and how long the scale
    took. Async scales live; sync restarts through a checkpoint (its replicas follow: 1, then 3)."""
    out = {}
    print(f'\n== elastic: 1 ps + a pool of 3 workers, batch {args.batch}: `launch up --workers 1`, then '
          '`launch scale --workers 3`')
    for mode in args.elastic_modes:
        steps = args.elastic_steps
        sets = cluster_overrides(tmp, f'elastic-{mode}', steps, args.batch, 1, 3, (f'train.sync={mode == "sync"}',))
        scale: dict = {}

        def ask(train_dir: str = f'{tmp}/elastic-{mode}', scale: dict = scale) -> None:
            scale['asked'] = time.monotonic()
            got = subprocess.run([sys.executable, '-m', 'launch', 'scale', train_dir, '--workers', '3'], cwd=REPO,
                                 capture_output=True, text=True, env=QUIET)
            scale['done'], scale['code'] = time.monotonic(), got.returncode
            scale['said'] = (got.stdout + got.stderr).strip().splitlines()

        def on_step(pid: int, step: int, total: int, scale: dict = scale, ask=ask) -> None:
            if step >= total // 4 and not scale:
                scale['thread'] = threading.Thread(target=ask)
                scale['thread'].start()
        timeline: list = []
        launch_up('specs/local2.yaml', sets, args.batch, on_step=on_step, up_args=('--workers', '1'), timeline=timeline)
        scale['thread'].join()
        if scale['code'] != 0:
            raise SystemExit(f'launch scale ({mode}) failed ({scale["code"]}):\n' + '\n'.join(scale['said']))
        before = [(t, s) for t, s in timeline if s >= steps * 0.1 and t <= scale['asked']]
        after = [(t, s) for t, s in timeline if t >= scale['done'] + 2 and s < steps]
        per_step_after = args.batch * (3 if mode == 'sync' else 1)      # a sync step aggregates every replica

        def rate(points, per_step):
            ok = len(points) >= 2 and points[-1][0] > points[0][0]
            return (points[-1][1] - points[0][1]) * per_step / (points[-1][0] - points[0][0]) if ok else None
        one, three = rate(before, args.batch), rate(after, per_step_after)
        out[mode] = {'one_worker_images_per_sec': one, 'three_workers_images_per_sec': three,
                     'scale_s': scale['done'] - scale['asked']}
        print(f'{mode:<5}: 1 worker {num(one, "6.0f")} images/s   3 workers {num(three, "6.0f")} images/s   '
              f'{ratio(three, one)}   `launch scale` took {scale["done"] - scale["asked"]:5.1f} s', flush=True)
    return out


LINK_RATES = (1000, 10000)      # Mbit/s each way: gigabit and ten-gigabit Ethernet


def cluster_on_links(links, tmp: str, name: str, mode: str, ps: int, workers: int, steps: int, batch: int,
                     dtype: str) -> dict:
    """Train 1 ps + `workers` in `links`' hosts (task k on host k), each task started by hand as
    `python -m cluster.task`; the steady rate from the chief's progress lines."""
    import yaml
    spec = {'cluster': {'ps': [f'{links.addr(k)}:{links.port}' for k in range(ps)],
                        'worker': [f'{links.addr(ps + k)}:{links.port}' for k in range(workers)]},
            'train': {'sync': mode == 'sync', 'steps': steps, 'batch_size': batch, 'data': 'synthetic',
                      'train_dir': f'{tmp}/{name}', 'log_every_secs': 1.0, 'transfer_dtype': dtype}}
    path = f'{tmp}/{name}.yaml'
    with open(path, 'w') as f:
        yaml.safe_dump(spec, f)
    tasks = [('ps', i) for i in range(ps)] + [('worker', i) for i in range(workers)]
    t0 = time.monotonic()
    procs = [subprocess.Popen(links.wrap(k, [sys.executable, '-m', 'cluster.task', '--spec', path, '--job', job,
                                             '--index', str(i)]),
                              cwd=REPO, stdout=subprocess.PIPE if (job, i) == ('worker', 0) else subprocess.DEVNULL,
                              stderr=subprocess.STDOUT, text=True, env=QUIET)
             for k, (job, i) in enumerate(tasks)]
    points, lines = [], []
    for line in procs[ps].stdout:
        lines.append(line)
        got = rundir.step_of(line)
        if got:
            points.append((time.monotonic() - t0, got[0]))
    codes = [p.wait(timeout=120) for p in procs]
    if any(codes):
        raise SystemExit(f'{name}: tasks exited {codes}:\n' + ''.join(lines[-30:]))
    return {'steady_images_per_sec': steady_rate(points, batch * (workers if mode == 'sync' else 1)),
            'first_step_s': points[0][0] if points else None}


def link_prediction(tmp: str, name: str, rate: float, batch: int, free: float, exposed: float) -> float | None:
    """images/s `launch plan --link` predicts (launch/planning/link_time.py) for the spec
    cluster_on_links wrote as `name`, from its images/s with unlimited links."""
    from cluster.spec import load_spec
    from launch.planning import ps_load
    spec = load_spec(f'{tmp}/{name}.yaml')
    load = ps_load.builtin_load(spec)
    assert load is not None
    return link_time.predict(load, spec, rate, batch, free, exposed).images_per_sec


def bench_links(args, tmp: str) -> dict:
    """Each task in a network namespace of its own, on links of LINK_RATES (benchmarks/links.py):
    measured images/s against `launch plan --link`'s model, which starts from the same cluster's
    images/s with unlimited links (measured just before) and adds the bytes over the busiest link."""
    import links as emulated        # beside this script: on sys.path as its folder
    why = emulated.netns.unavailable()
    if why:
        raise SystemExit(f'--only links {why}')
    emulated.remove_stale()
    model_bytes, _ = model_bytes_and_shares()
    workers, rows, measured_links = 2, [], {}
    batch = args.link_batch
    print(f'\n== links: 2 workers, batch {batch}, each task in a namespace of its own on a link of '
          f'R Mbit/s each way; the model is {model_bytes / 1e6:.2f} MB in float32')
    for rate in args.link_rates:
        with emulated.Links(2, rate) as links:
            measured_links[rate] = links.measure()
        print(f'a {rate} Mbit/s link carries {measured_links[rate][0]:.0f} Mbit/s (one TCP connection), '
              f'round trip {measured_links[rate][1]:.3f} ms', flush=True)
    for dtype in args.link_dtypes:
        for ps in args.link_ps:
            for mode in ('sync', 'async'):
                steps = args.link_steps * (1 if mode == 'sync' else 3)     # async steps are one batch
                with emulated.Links(ps + workers, None) as links:
                    free = cluster_on_links(links, tmp, f'links-{mode}-{ps}ps-{dtype}-free', mode, ps, workers,
                                            steps, batch, dtype)['steady_images_per_sec']
                print(f'{mode:<5} {ps} ps {dtype:<8} unlimited links {num(free, "6.0f")} images/s', flush=True)
                for rate in args.link_rates:
                    with emulated.Links(ps + workers, rate) as links:
                        got = cluster_on_links(links, tmp, f'links-{mode}-{ps}ps-{dtype}-{rate}', mode, ps, workers,
                                               steps, batch, dtype)['steady_images_per_sec']
                    predicted, overlapped = (link_prediction(tmp, f'links-{mode}-{ps}ps-{dtype}-free', rate, batch,
                                                             free, exposed) if free else None
                                             for exposed in (link_time.EXPOSED, 0.0))
                    rows.append({'rate_mbit': rate, 'latency_ms': measured_links[rate][1] / 2, 'mode': mode,
                                 'num_ps': ps, 'transfer_dtype': dtype, 'measured_images_per_sec': got,
                                 'predicted_images_per_sec': predicted,
                                 'predicted_overlapped_images_per_sec': overlapped, 'unlimited_images_per_sec': free,
                                 'link_measured_mbit': measured_links[rate][0]})
                    err = got / predicted - 1 if got and predicted else None
                    print(f'{mode:<5} {ps} ps {dtype:<8} {rate:>6} Mbit/s  measured {num(got, "6.0f")}  predicted '
                          f'{num(predicted, "6.0f")} images/s  ({num(err, "+.0%")}; overlapped bound: '
                          f'{num(overlapped, "6.0f")})', flush=True)
    gains = {}
    if 'bfloat16' in args.link_dtypes and 'float32' in args.link_dtypes:
        print('bfloat16 transfers, images/s against float32 (same mode, ps tasks and link):')
        for r in rows:
            if r['transfer_dtype'] != 'bfloat16':
                continue
            base = next(b for b in rows if b['transfer_dtype'] == 'float32' and
                        (b['mode'], b['num_ps'], b['rate_mbit']) == (r['mode'], r['num_ps'], r['rate_mbit']))
            key = f'{r["mode"]}-{r["num_ps"]}ps-{r["rate_mbit"]}'
            gains[key] = r['measured_images_per_sec'] / base['measured_images_per_sec']
            print(f'  {r["mode"]:<5} {r["num_ps"]} ps {r["rate_mbit"]:>6} Mbit/s: {gains[key]:.2f}x')
    return {'links': rows, 'bfloat16_gain': gains, 'model_bytes': model_bytes}


def bench_pss(args, tmp: str) -> dict:
    """TF2 ParameterServerStrategy against the TF1 between-graph cluster and one process
    (benchmarks/pss.py, beside this script)."""
    import pss
    return pss.bench(args, tmp, launch_up, free_ports, cluster_overrides, rate_ratio)


def bench_accuracy(args, tmp: str) -> dict:
    """Test precision@1 on Fashion-MNIST after the same images, one process against the cluster
    (benchmarks/accuracy.py, beside this script)."""
    import accuracy
    return accuracy.bench(args, tmp, free_ports)


def bench_scale(args, tmp: str) -> dict:
    """The launcher as the run grows: `launch up --rehearse` at each of --sizes tasks
    (benchmarks/scale.py, beside this script)."""
    import scale
    return scale.bench(args, tmp, free_ports, QUIET, REPO)


def bench_ray(args, tmp: str) -> dict:
    """The same spec on local, on a run's own Ray and on a three-node Ray cluster (benchmarks/on_ray.py)."""
    import on_ray
    return on_ray.bench(args, tmp, launch_up, free_ports, cluster_overrides, QUIET, REPO)


def bench_startup(args, tmp: str) -> dict:
    """`launch up` -> first step with the start-up zygote and cold, as a share of one import (benchmarks/startup.py)."""
    import startup
    return startup.bench(args, tmp)


def bench_recovery(args, tmp: str) -> dict:
    """What a restart costs with and without warm standbys, as a share of one import (benchmarks/recovery.py)."""
    import recovery
    return recovery.bench(args, tmp)


def bench_stragglers(args, tmp: str) -> dict:
    """A worker stopped half the time, with and without a backup worker (benchmarks/stragglers.py)."""
    import stragglers
    return stragglers.bench(args, tmp, launch_up, cluster_overrides, rate_ratio)


SECTIONS = ('cluster', 'scaling', 'bytes', 'learning', 'towers', 'elastic', 'accuracy', 'pss')
BY_HAND = ('links', 'scale', 'ray', 'recovery', 'startup', 'stragglers')        # long, or needing more than the core install: only with --only


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--quick', action='store_true', help='every figure once with tiny runs (CI: checks it runs)')
    p.add_argument('--only', choices=SECTIONS + BY_HAND, action='append',
                   help='run only these sections (links and scale run only when named: emulated links, about '
                        '20 min, 3 with --quick; scale, the launcher at --sizes rehearsal tasks)')
    p.add_argument('--sizes', type=lambda text: tuple(int(n) for n in text.split(',')),
                   help='--only scale: tasks per local run, comma-separated (default 10,100,300; 10 with --quick)')
    p.add_argument('--ssh-sizes', type=lambda text: tuple(int(n) for n in text.split(',')),
                   help='--only scale: tasks per SSH run on the rig, comma-separated (default 100,300; 10 with --quick; '
                        '0: no SSH run)')
    p.add_argument('--hosts', type=lambda text: tuple(int(n) for n in text.split(',')),
                   help='--only scale: rig hosts of the SSH runs, comma-separated (default 1,10,50; 1,2 with --quick)')
    p.add_argument('--reps', type=int, default=3)
    p.add_argument('--steps', type=int, default=300, help='global steps of each cluster run')
    p.add_argument('--batch', type=int, default=64, help='batch per worker (per tower)')
    p.add_argument('--epochs', type=float, default=6, help='epochs of Fashion-MNIST each accuracy run sees')
    p.add_argument('--json', '--out', default=os.path.join(REPO, 'benchmarks', 'results.json'),
                   help='where the figures go as JSON (default benchmarks/results.json)')
    p.add_argument('--plots', metavar='DIR', help='also draw the figures as PNGs in DIR, one per section that ran '
                   '(e.g. docs/images/perf for the documentation; benchmarks/plots.py redraws from --json)')
    args = p.parse_args()
    args.single_steps = 100
    args.learn_steps, args.learn_every, args.learn_modes = 600, 50, 3     # sync, async, sync in bfloat16
    args.elastic_modes, args.elastic_steps = ('async', 'sync'), 800
    args.link_rates, args.link_ps, args.link_dtypes, args.link_steps = LINK_RATES, (1, 2), ('float32', 'bfloat16'), 100
    args.link_batch = args.batch
    args.accuracy_kinds, args.accuracy_epochs = ('single', 'sync', 'async'), args.epochs
    args.scale_sizes = args.sizes or ((10,) if args.quick else (10, 100, 300))
    args.scale_ssh_sizes = args.ssh_sizes or ((10,) if args.quick else (100, 300))
    args.scale_hosts = args.hosts or ((1, 2) if args.quick else (1, 10, 50))
    if args.quick:
        args.reps, args.steps, args.batch, args.single_steps = 1, 30, 16, 10
        args.learn_steps, args.learn_every, args.learn_modes = 40, 40, 1     # sync: one checkpoint, one eval
        args.elastic_modes, args.elastic_steps = ('async',), 450     # the scale takes some 12 s to join
        args.link_ps, args.link_dtypes, args.link_steps = (1,), ('float32',), 60
        args.accuracy_kinds, args.accuracy_epochs = ('single', 'sync'), 0.05    # a checkpoint each, evaluated
    figures = {'quick': args.quick, 'cores': len(os.sched_getaffinity(0)),
               'command': shlex.join(['python', 'benchmarks/bench.py', *sys.argv[1:]]),
               'date': time.strftime('%Y-%m-%d'), 'settings': {'batch': args.batch, 'steps': args.steps, 'reps': args.reps}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or SECTIONS:
            if name in ('bytes',):
                figures[name] = bench_bytes(args)
            elif name == 'links':       # the `links` list at the top, as --out promises
                got = bench_links(args, tmp)
                figures['links'], figures['links_bfloat16_gain'] = got['links'], got['bfloat16_gain']
            else:
                figures[name] = globals()[f'bench_{name}'](args, tmp)
    with open(args.json, 'w') as f:
        f.write(runjson.dumps(figures, indent=1))
    print(f'\nfigures written to {args.json}')
    if args.plots:
        import plots        # beside this script; matplotlib only now, after the runs
        with open(args.json) as f:      # drawn from the JSON as written, as plots.py redraws them
            saved = json.load(f)
        for path in plots.draw(saved, args.plots, saved['command'], saved['date']):
            print(f'plot written to {path}')


if __name__ == '__main__':
    main()
