"""`bench.py --only startup`: `launch up` -> first step, with the start-up zygote and cold.

`specs/local2.yaml` (1 ps, 2 sync workers, synthetic data), 100 steps, run --reps times each way,
alternating: with the default `supervise.standby` (the tasks fork from one TensorFlow import, a
start-up zygote: launch/backends/local/zygote.py) and with `supervise.standby: 0` (each task imports
TensorFlow itself). Before each run one `import tensorflow` is timed, the yardstick: per way, the
median first step as a share of it, the start-up's stages (tasks started, servers up, the chief's
session ready) and the last step -> every process gone.
"""
from __future__ import annotations

import os
import statistics

WAYS = {'zygote': [], 'cold': ['supervise.standby=0']}
STEPS = 100


def bench(args, tmp: str) -> dict:
    import bench as b       # the caller, beside this file
    runs: dict[str, list[dict]] = {way: [] for way in WAYS}
    for rep in range(args.reps):
        for way, overrides in WAYS.items():
            imported = b.tf_import_seconds()
            train_dir = os.path.join(tmp, f'startup-{way}-{rep}')
            got = b.launch_up('specs/local2.yaml', [f'train.train_dir={train_dir}', f'train.steps={STEPS}',
                                                    *overrides], 2 * 64)
            got['import_s'] = imported
            runs[way].append(got)
            print(f'  {way:6} first step {got["first_step_s"]:.2f} s = {got["first_step_s"] / imported:.2f}x one '
                  f'import ({imported:.2f} s); last step -> gone {got["last_step_to_gone_s"]:.2f} s', flush=True)
    out = {}
    for way, got in runs.items():
        stages = {k: round(statistics.median(r['startup'][k] for r in got if k in r['startup']), 2)
                  for k in ('tasks_started_s', 'servers_up_s', 'chief_session_ready_s')}
        out[way] = {'first_step_s': round(statistics.median(r['first_step_s'] for r in got), 2),
                    'x_import': round(statistics.median(r['first_step_s'] / r['import_s'] for r in got), 2),
                    'import_s': round(statistics.median(r['import_s'] for r in got), 2),
                    'last_step_to_gone_s': round(statistics.median(r['last_step_to_gone_s'] for r in got), 2),
                    'stages': stages}
    print('\nstart-up of specs/local2.yaml (median of %d runs each):' % args.reps)
    for way, f in out.items():
        print(f'  {way:6} first step {f["first_step_s"]:5.2f} s = {f["x_import"]:.2f}x one import; stages '
              + ', '.join(f'{k} {v:.2f}' for k, v in f['stages'].items())
              + f'; last step -> gone {f["last_step_to_gone_s"]:.2f} s')
    out['zygote_vs_cold'] = round(out['zygote']['first_step_s'] / out['cold']['first_step_s'], 2)
    print(f'  zygote / cold: {out["zygote_vs_cold"]:.2f}')
    return out
