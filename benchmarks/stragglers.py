"""A slowed worker with and without a backup worker (`python benchmarks/bench.py --only stragglers`).

Three sync runs of 1 ps and 3 workers, interleaved in each repetition so that they share the
machine's load:
  - even: every worker at full speed, each global step aggregating all three gradients (the baseline);
  - slowed: worker:2 stopped half of every second (SIGSTOP/SIGCONT) from the first step on, still
    three gradients a step, so every step waits for it;
  - backup: the same slowed worker, with `train.backup_workers: 1`, so each step takes the first two
    gradients and drops the third.
Each run's steady images/s (benchmarks/bench.py launch_up), its ratio against the even run of its
repetition, the gradients the backup run dropped (run.json), and the loss: its first progress
event's and its last (it still learns where the last is lower).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import threading
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:        # the harness is the repository's, not an installed package
    sys.path.insert(0, REPO)

from tests.harness.faults import half_duty   # noqa: E402

KINDS = ('even', 'slowed', 'backup')
PERIOD = 1.0        # seconds of each stop-and-go cycle; stopped half of it


def slow_down(train_dir: str, stop: threading.Event) -> None:
    """Stop worker:2 for half of every PERIOD until `stop` (it runs on at the end)."""
    with open(os.path.join(train_dir, 'launch-state.json')) as f:
        pid = next(t['pid'] for t in json.load(f)['tasks'] if t['name'] == 'worker:2')
    half_duty(pid, stop, PERIOD)


def losses(train_dir: str) -> tuple[float | None, float | None]:
    """The first progress event's loss and the run's final one (run.json)."""
    first = None
    with open(os.path.join(train_dir, 'events.jsonl')) as f:
        for line in f:
            event = json.loads(line)
            if event.get('event') == 'progress' and event.get('loss') is not None:
                first = event['loss']
                break
    with open(os.path.join(train_dir, 'run.json')) as f:
        record = json.load(f)
    return first, record.get('loss')


def one(kind: str, rep: int, args, tmp: str, launch_up: Callable, cluster_overrides: Callable) -> dict:
    name = f'stragglers-{kind}-{rep}'
    extra = ('train.sync=true',) + (('train.backup_workers=1',) if kind == 'backup' else ())
    sets = cluster_overrides(tmp, name, args.steps, args.batch, workers=3, extra=extra)
    stop = threading.Event()
    slowing: list[threading.Thread] = []

    def on_step(pid: int, step: int, total: int) -> None:
        if kind != 'even' and not slowing:
            slowing.append(threading.Thread(target=slow_down, args=(f'{tmp}/{name}', stop)))
            slowing[0].start()
    try:
        got = launch_up('specs/local2.yaml', sets, args.batch * (2 if kind == 'backup' else 3), on_step=on_step)
    finally:
        stop.set()
        for t in slowing:
            t.join()
    with open(f'{tmp}/{name}/run.json') as f:
        got['dropped_gradients'] = json.load(f).get('dropped_gradients')
    got['first_loss'], got['final_loss'] = losses(f'{tmp}/{name}')
    return got


def bench(args, tmp: str, launch_up: Callable, cluster_overrides: Callable, rate_ratio: Callable) -> dict:
    runs: dict[str, list[dict]] = {k: [] for k in KINDS}
    print(f'\n== stragglers: sync, 1 ps + 3 workers, batch {args.batch}, {args.steps} steps; worker:2 stopped half '
          f'of every {PERIOD:g} s in the slowed runs', flush=True)
    for rep in range(args.reps):
        for kind in KINDS:
            got = one(kind, rep, args, tmp, launch_up, cluster_overrides)
            runs[kind].append(got)
            print(f'{kind:<7} rep {rep + 1}: {got["steady_images_per_sec"] or 0:6.0f} images/s, loss '
                  f'{got["first_loss"]} -> {got["final_loss"]}'
                  + (f', {got["dropped_gradients"]} gradients dropped' if got['dropped_gradients'] is not None else ''),
                  flush=True)
    out = {'runs': runs}
    for kind in ('slowed', 'backup'):
        out[f'{kind}_vs_even'] = rate_ratio(runs, kind, 'even', args.reps)
        print(f'{kind} / even: {out[f"{kind}_vs_even"]:.2f}x' if out[f'{kind}_vs_even'] else f'{kind} / even: n/a')
    out['backup_learns'] = all(r['final_loss'] is not None and r['first_loss'] is not None
                               and r['final_loss'] < r['first_loss'] for r in runs['backup'])
    out['median_dropped'] = statistics.median(r['dropped_gradients'] or 0 for r in runs['backup'])
    return out
