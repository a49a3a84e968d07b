"""`bench.py --only ray`: the same TF1 spec (1 ps + 2 workers, sync) run by the local backend, on a
Ray instance the run starts for itself, and on a real three-node Ray cluster on this machine (the
workers pinned to its nodes 127.0.0.2 and .3, the ps placed by the run's placement group; the
cluster of the tests, tests/harness/raycluster.py), interleaved `reps` times: start-up (`launch
up` -> every server up, -> first global step) and the steady images/s, side by side, with each
Ray figure as a ratio to the local run of its own repetition. Named `on_ray` so that it does not
hide the `ray` package from the scripts beside it."""
from __future__ import annotations

import statistics
import sys
import tempfile

KINDS = ('local', 'ray-own', 'ray-cluster')


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def bench(args, tmp: str, launch_up, free_ports, cluster_overrides, env: dict, repo: str) -> dict:
    sys.path.insert(0, repo)
    from tests.harness.raycluster import RayCluster, ray_missing
    missing = ray_missing()
    if missing:
        raise SystemExit(f'--only ray: {missing} (pip install -e \'.[ray]\')')
    cluster = RayCluster(tempfile.mkdtemp(prefix='rt', dir='/tmp'))
    runs: dict[str, list[dict]] = {k: [] for k in KINDS}
    try:
        cluster.start()
        ray_env = {**env, **cluster.env}
        for rep in range(args.reps):
            for kind in KINDS:
                sets = cluster_overrides(tmp, f'{kind}{rep}', args.steps, args.batch, extra=('train.sync=true',))
                up_args: tuple[str, ...] = ()
                if kind != 'local':
                    up_args = ('--backend', 'ray')
                if kind == 'ray-cluster':
                    ports = free_ports(2)
                    sets.append(f'cluster.worker=[127.0.0.2:{ports[0]}, 127.0.0.3:{ports[1]}]')
                    up_args += ('--ray-address', cluster.address)
                runs[kind].append(launch_up('specs/local2.yaml', sets, 2 * args.batch, up_args=up_args,
                                            env=ray_env if kind == 'ray-cluster' else env))
                r = runs[kind][-1]
                print(f'  rep {rep + 1}/{args.reps} {kind:<11} servers up {r["startup"].get("servers_up_s", 0):5.1f} s, '
                      f'first step {r["first_step_s"]:5.1f} s, {r["steady_images_per_sec"] or 0:6.0f} images/s', flush=True)
    finally:
        problems = cluster.stop()
        if problems:
            print('the Ray cluster did not stop cleanly: ' + '; '.join(problems))
    return report(runs, args)


def report(runs: dict[str, list[dict]], args) -> dict:
    """Medians per kind, and each Ray kind's ratio to the local run of the same repetition."""
    out: dict = {'runs': runs}
    for kind in KINDS:
        out[kind] = {'servers_up_s': _median([r['startup'].get('servers_up_s') for r in runs[kind]]),
                     'first_step_s': _median([r['first_step_s'] for r in runs[kind]]),
                     'steady_images_per_sec': _median([r['steady_images_per_sec'] for r in runs[kind]]),
                     'last_step_to_gone_s': _median([r['last_step_to_gone_s'] for r in runs[kind]])}
    print(f'\n== the same spec (1 ps + 2 workers, sync, batch {args.batch}, {args.steps} steps) on local and on Ray, '
          f'{args.reps} rep(s), medians; ratios: medians of each repetition\'s Ray / local')
    print(f'{"":<12} {"servers up":>11} {"first step":>11} {"images/s":>9} {"gone after":>11}')
    for kind in KINDS:
        f = out[kind]
        line = (f'{kind:<12} {_num(f["servers_up_s"], "s")} {_num(f["first_step_s"], "s")} '
                f'{_num(f["steady_images_per_sec"], "", "9.0f")} {_num(f["last_step_to_gone_s"], "s")}')
        if kind != 'local':
            ratios = {key: _median([_ratio(r, b, key) for r, b in zip(runs[kind], runs['local'])])
                      for key in ('first_step_s', 'steady_images_per_sec')}
            out[kind]['vs_local'] = ratios
            line += (f'   first step {_num(ratios["first_step_s"], "x", ".2f")} local, '
                     f'images/s {_num(ratios["steady_images_per_sec"], "x", ".2f")} local')
        print(line)
    return out


def _ratio(run: dict, base: dict, key: str) -> float | None:
    a, b = run.get(key), base.get(key)
    return a / b if a and b else None


def _num(value, unit: str, spec: str = '10.1f') -> str:
    return f'{value:{spec}}{unit}' if value is not None else f'{"-":>{len(format(0.0, spec))}}{unit}'
