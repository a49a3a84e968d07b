"""`bench.py --only recovery`: what a restart costs, without and with warm standbys.

A local TF1 async cluster (1 ps, 2 workers, synthetic data) is run by the chaos harness
(tests/harness/chaos.py) with a fixed plan: --reps kills of worker:1 (a task restart) and of ps:0 (a
restart of the whole cluster), once with `supervise.standby: 0` and once with as many standbys as
the host has tasks (3), so a cluster restart can take every task from a standby. Per setting and
target: the median of each restart phase as the launcher times it (its `recovered` events: stop,
backoff, start, step), the median kill -> training again (the kill to the recovered event), and
that as a share of one `import tensorflow` measured in the same run (the yardstick of #41).
"""
from __future__ import annotations

import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:        # the harness is the repository's, not an installed package
    sys.path.insert(0, REPO)

from tests.harness import chaos, chaos_standby   # noqa: E402

TARGETS = ('worker:1', 'ps:0')
PHASES = ('stop', 'backoff', 'start', 'step')


def one_setting(standby: int, reps: int, tmp: str, gap: tuple[int, int]) -> dict:
    """One chaos run with `standby` standbys per host: the figures per target."""
    plan = tuple((task, 'kill') for _ in range(reps) for task in TARGETS)
    options = chaos.Options(backend='local', plan=plan, standby=standby, gap=gap, seed=standby + 1,
                            dir=os.path.join(tmp, f'recovery-standby-{standby}'))
    result = chaos.run_chaos(options, say=lambda line: print(f'  {line}', flush=True))
    if result.broken:
        raise SystemExit('recovery bench: the chaos run broke an invariant:\n' + result.summary())
    by_target: dict[str, dict] = {}
    for fault, secs, event in chaos_standby.mended_kills(result.faults, events_of(result)):
        phases = event.get('phases') or {}
        entry = by_target.setdefault(fault.task, {'kill_to_training_s': [], **{p: [] for p in PHASES}})
        entry['kill_to_training_s'].append(round(secs, 3))
        for p in PHASES:
            entry[p].append(phases.get(p, 0.0))
    one = statistics.mean(result.import_secs)
    return {'standby': standby, 'import_s': result.import_secs, 'warm_starts': result.warm[0],
            'starts': result.warm[1],
            'targets': {task: {**{k: statistics.median(v) for k, v in entry.items()},
                               'runs': entry['kill_to_training_s'],
                               'x_import': statistics.median(entry['kill_to_training_s']) / one}
                        for task, entry in by_target.items()}}


def events_of(result: chaos.Result) -> list[dict]:
    from cluster.runtime import rundir
    from launch.records.events import read_events
    return read_events(rundir.events_path(os.path.join(result.workdir, 'chaos', 'run')))


def table(settings: list[dict]) -> str:
    lines = [f'{"standby":>7}  {"killed":<8} {"stop":>6} {"backoff":>7} {"start":>6} {"step":>6} '
             f'{"kill->training":>14} {"x import":>8}  from standby']
    for s in settings:
        for task, t in s['targets'].items():
            lines.append(f'{s["standby"]:>7}  {task:<8} {t["stop"]:>6.2f} {t["backoff"]:>7.2f} {t["start"]:>6.2f} '
                         f'{t["step"]:>6.2f} {t["kill_to_training_s"]:>14.2f} {t["x_import"]:>8.2f}  '
                         f'{s["warm_starts"]}/{s["starts"]}')
    return '\n'.join(lines)


def bench(args, tmp: str) -> dict:
    reps = 1 if args.quick else args.reps
    print(f'\n== recovery: {reps} kill(s) each of {" and ".join(TARGETS)}, supervise.standby 0 and 3 ==', flush=True)
    settings = [one_setting(n, reps, tmp, (20, 30) if args.quick else (30, 60)) for n in (0, 3)]
    print(table(settings))
    return {'settings': settings}
