"""Where a step's time goes: `launch up` of 1 ps + 2 workers, sync and async.

    python benchmarks/profile.py [--steps 200] [--batch 64] [--trace 40:20]

Three views of the same runs:
- where the cores go: the CPU time (user + system, every thread) each task spends per global step
  in steady state, read from /proc, next to what one batch costs in one process with no cluster,
  and the cores' idle time. On a shared host this is the whole story: what the ps and the
  transfers cost comes out of the workers' compute.
- the chief's step stats (TensorFlow's RunMetadata, full trace, cluster/training/profiler.py StepProfiler):
  op-seconds per task and kind of op, and the bytes each task received. Op-seconds are summed over
  ops, so ops that run in parallel add up past the wall time, and a transfer's time includes
  waiting for its tensor to be produced (a ps waits for the worker's gradients).
- the chief's Python per step: its loop's wall time against the time spent inside TensorFlow's
  C++ session run (cProfile of the steps after the traced ones).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import psutil
from bench import QUIET, REPO, cluster_overrides, fmt_run, launch_up, single_process

from cluster.runtime import rundir, runjson
from cluster.training.profiler import PROFILE_ENV


def children(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def task_name(pid: int) -> str:
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return '?'
    return f'{argv[argv.index("--job") + 1]}:{argv[argv.index("--index") + 1]}' if '--job' in argv else '?'


def process_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of a process so far; None once it is gone."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


class CoreSampler:
    """Two snapshots of every task's CPU time, at 20% and 90% of the run's global steps."""

    def __init__(self):
        self.snaps: list[tuple[float, int, dict[str, float]]] = []

    def __call__(self, launcher: int, step: int, total: int) -> None:
        if len(self.snaps) < 2 and step >= total * (0.2, 0.9)[len(self.snaps)]:
            tasks = {task_name(p): process_cpu_seconds(p) for p in children(launcher)}
            self.snaps.append((time.monotonic(), step, {k: v for k, v in tasks.items() if v is not None}))

    def per_step(self) -> tuple[float, dict[str, float]] | None:
        """(wall seconds per global step, CPU seconds per global step of each task)."""
        if len(self.snaps) < 2:
            return None
        (t0, s0, c0), (t1, s1, c1) = self.snaps
        n = max(1, s1 - s0)
        return (t1 - t0) / n, {k: (c1[k] - c0.get(k, 0.0)) / n for k in sorted(c1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--steps', type=int, default=200)
    p.add_argument('--batch', type=int, default=64)
    p.add_argument('--trace', default='40:20', help='FIRST:COUNT: the chief traces COUNT local steps from the '
                                                    'FIRST-th, then profiles its Python for COUNT more')
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    single = single_process(args.batch, 100)
    base_ms = single['cpu_s_per_batch'] * 1e3
    print(f'== one process, no cluster: {single["images_per_sec"]:.0f} images/s, {base_ms:.1f} CPU-ms per batch of '
          f'{args.batch} ({cores} cores)')
    QUIET[PROFILE_ENV] = args.trace     # launch_up runs with this environment
    figures = {'single': single, 'cores': cores}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ('sync', 'async'):
            sets = cluster_overrides(tmp, mode, args.steps, args.batch, extra=(f'train.sync={mode == "sync"}',))
            batches = 2 if mode == 'sync' else 1        # worker batches in one global step
            sampler = CoreSampler()
            r = launch_up('specs/local2.yaml', sets, args.batch * batches, on_step=sampler)
            with open(rundir.profile_path(os.path.join(tmp, mode), 0)) as f:
                prof = json.load(f)
            figures[mode] = {'run': r, 'profile': prof}
            print(f'\n== {mode}: {fmt_run(r)}')
            cores_per_step = sampler.per_step()
            if cores_per_step:
                wall, tasks = cores_per_step
                used = sum(tasks.values())
                figures[mode]['cpu_s_per_global_step'] = tasks
                print(f'where the cores go, per global step ({batches} batch(es), {wall * 1e3:.1f} ms wall, '
                      f'{cores} cores = {cores * wall * 1e3:.1f} core-ms):')
                for name, secs in tasks.items():
                    print(f'  {name:<8} {secs * 1e3:7.1f} CPU-ms')
                print(f'  idle     {(cores * wall - used) * 1e3:7.1f} core-ms')
                print(f'  per batch: {used / batches * 1e3:.1f} CPU-ms in the cluster against {base_ms:.1f} in one '
                      f'process: {used / batches / (base_ms / 1e3) - 1:+.0%}; the ps alone '
                      f'{sum(v for k, v in tasks.items() if k.startswith("ps")) / batches * 1e3:.1f}')
            print(f'chief, {prof["steps"]} traced steps: {prof["wall_s_per_step"] * 1e3:.1f} ms wall per step')
            for kind, secs in prof['op_s_per_step'].items():
                print(f'  {kind:<24} {secs * 1e3:8.1f} op-ms per step')
            for job, b in prof['bytes_in_per_step'].items():
                print(f'  {job + " received":<24} {b / 1e6:8.2f} MB per step')
            py = prof.get('python')
            if py:
                print(f'chief, {py["steps"]} steps under cProfile: {py["loop_s_per_step"] * 1e3:.1f} ms per step, of '
                      f'which {py["in_tf_run_s_per_step"] * 1e3:.1f} in TensorFlow\'s session run and '
                      f'{py["python_s_per_step"] * 1e3:.2f} in Python')
    out = os.path.join(REPO, 'benchmarks', 'profile.json')
    with open(out, 'w') as f:
        f.write(runjson.dumps(figures, indent=1))
    print(f'\nfigures written to {out}')


if __name__ == '__main__':
    main()
