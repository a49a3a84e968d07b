"""The benchmark's figures as pictures, for the documentation's performance page: one PNG per
section that ran, drawn with matplotlib's Agg backend (no display, no network).

    python benchmarks/bench.py --only cluster --plots docs/images/perf    # measure, then draw
    python benchmarks/plots.py benchmarks/results.json docs/images/perf    # redraw a saved run

Each PNG carries its caption in its own text chunks (Title, Description, Source: the command that
measured it, Creation Time), so the site's hook (docs/hooks/diagram.py) captions it without a
second file that could fall out of step with the picture. Files are named `N-section.png`, N the
reading order. A section that did not run, or whose runs were too short for a steady rate
(--quick), draws what it has: a missing figure is a bar left out and said so, never a zero.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
from collections.abc import Callable

import matplotlib

matplotlib.use('Agg')
import matplotlib.patches  # noqa: E402  (after the backend is chosen)
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

SYNC, ASYNC = '#1565c0', '#ef6c00'          # the two modes, alike in every figure
BASE, TF1 = '#616161', '#90a4ae'            # one process; the hand-written TF1 cluster
PIXELS = (880, 440)                         # at DPI: readable at the site's content width
DPI = 110


def _figure(height: float = 1.0):
    return plt.subplots(figsize=(PIXELS[0] / DPI, PIXELS[1] * height / DPI), dpi=DPI, layout='constrained')


def _settings(figures: dict) -> str:
    s = figures.get('settings') or {}
    parts = [f'batch {s["batch"]} per worker' if 'batch' in s else None,
             f'{s["steps"]} steps' if 'steps' in s else None,
             f'{s["reps"]} repetition(s), medians' if 'reps' in s else None]
    return ', '.join(p for p in parts if p)


def _bars(ax, labels: list[str], values: list[float | None], colors: list[str], notes: list[str]) -> None:
    """Horizontal bars, top to bottom; a None value is no bar and says why, never a zero."""
    ys = list(range(len(labels)))[::-1]
    top = max((v for v in values if v), default=1)
    for y, value, color, note in zip(ys, values, colors, notes):
        if value:
            ax.barh(y, value, color=color, height=0.62)
            ax.text(value + top * 0.01, y, f'{value:,.0f}  ' + note.replace('\n', '\n' + ' ' * (len(f'{value:,.0f}') + 3)),
                    va='center', fontsize=10)
        else:
            ax.text(top * 0.01, y, 'n/a: the run was too short for a steady rate', va='center', fontsize=10,
                    color=BASE, style='italic')
    ax.set_yticks(ys, labels, fontsize=10)
    ax.set_xlim(0, top * 1.5)        # room for the figure and its ratio right of the longest bar
    ax.spines[['top', 'right']].set_visible(False)


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return top / bottom if top and bottom else None


def _x(value: float | None, what: str) -> str:
    return f'{value:.2f}x {what}' if value else ''


# ---------------------------------------------------------------------------------------------
# One function per figure: (title, description, matplotlib figure) or None where nothing to draw.

def cluster(figures: dict):
    c = figures.get('cluster')
    if not c:
        return None
    base, q = c['single_images_per_sec'], c.get('ratios', {})
    rows = [('one process, no cluster', base, BASE, '1.00x')]
    for mode, color in (('sync', SYNC), ('async', ASYNC)):
        r = q.get(mode, {})
        rows.append((f'{mode}: hand-written TF1', c[f'tf1_{mode}']['steady_images_per_sec'], TF1,
                     _x(r.get('tf1_vs_one_process'), 'one process')))
        rows.append((f'{mode}: launcher', c[mode]['steady_images_per_sec'], color,
                     '\n'.join(t for t in (_x(r.get('launcher_vs_one_process'), 'one process'),
                                            _x(r.get('launcher_vs_tf1'), 'the hand-written')) if t)))
    fig, ax = _figure()
    _bars(ax, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows])
    ax.set_xlabel('images/s, steady state (higher is better)')
    ax.set_title('1 ps + 2 workers against the same model in one process', fontsize=12)
    detail = _settings(figures)
    return ('Training speed: the launcher, a hand-written TF1 cluster and one process',
            'Steady images/s of the same model and input pipeline: trained in one process with no cluster, '
            'by a between-graph TF1 cluster written by hand (benchmarks/tf1_cluster.py) and by the '
            f'launcher\'s cluster (specs/local2.yaml){", " + detail if detail else ""}; the ratios are '
            'against one process measured in the same run.', fig)


def startup(figures: dict):
    c = figures.get('cluster')
    if not c or not any(c.get(m, {}).get('startup') for m in ('sync', 'async')):
        return None
    stages = (('tasks_started_s', 'launcher: tasks started', '#b0bec5'),
              ('servers_up_s', 'every server up (TensorFlow imports)', '#78909c'),
              ('chief_session_ready_s', "chief's graph and session ready", '#546e7a'),
              ('first_step_s', 'first global step', '#263238'))
    fig, ax = _figure(0.72)
    modes = [m for m in ('sync', 'async') if c.get(m, {}).get('startup')]
    for y, mode in enumerate(modes[::-1]):
        times = dict(c[mode]['startup'], first_step_s=c[mode].get('first_step_s'))
        left = 0.0
        for key, label, color in stages:
            at = times.get(key)
            if at is None or at < left:
                continue
            ax.barh(y, at - left, left=left, color=color, height=0.55, label=label if y == 0 else None)
            left = at
        ax.text(left + 0.08, y, f'{left:.1f} s', va='center', fontsize=10)
    imp = c.get('tf_import_s')
    if imp:
        ax.axvline(imp, color='#c62828', ls='--', lw=1.2)
        ax.text(imp, len(modes) - 0.45, f' one `import tensorflow`: {imp:.1f} s', color='#c62828', fontsize=9)
    ax.set_yticks(range(len(modes)), [f'{m}: 1 ps + 2 workers' for m in modes[::-1]], fontsize=10)
    ax.set_ylim(-0.6, len(modes) - 0.2)
    ax.set_xlabel('seconds from `launch up` (lower is better)')
    ax.legend(fontsize=9, loc='lower center', bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
    ax.spines[['top', 'right']].set_visible(False)
    return ('Start-up: from `launch up` to the first global step, stage by stage',
            'When each stage of the start-up was first seen in the launcher\'s and the chief\'s lines, '
            'against the time one process takes to import TensorFlow (most of a start-up is the tasks\' '
            'imports, several at once on the same cores).', fig)


SHAPES = ((1, 1), (1, 2), (1, 3), (2, 2))


def scaling(figures: dict):
    s = figures.get('scaling')
    if not s:
        return None
    shapes = [shape for shape in SHAPES if any(f'{m}-{shape[0]}ps-{shape[1]}w' in s for m in ('sync', 'async'))]
    shapes += sorted({(int(k.split('-')[1][:-2]), int(k.split('-')[2][:-1])) for k in s} - set(shapes))
    modes = [m for m in ('async', 'sync') if any(k.startswith(m + '-') for k in s)]
    base = (figures.get('cluster') or {}).get('single_images_per_sec')
    fig, ax = _figure()
    width = 0.8 / len(modes)
    top = max((r['steady_images_per_sec'] or 0 for r in s.values()), default=0) or 1
    for i, mode in enumerate(modes):
        color = SYNC if mode == 'sync' else ASYNC
        for x, (ps, workers) in enumerate(shapes):
            run = s.get(f'{mode}-{ps}ps-{workers}w')
            value = run and run['steady_images_per_sec']
            at = x + (i - (len(modes) - 1) / 2) * width
            if value:
                ax.bar(at, value, width * 0.92, color=color)
                ax.text(at, value + top * 0.01, f'{value:,.0f}' + (f'\n{value / base:.2f}x' if base else ''),
                        ha='center', va='bottom', fontsize=9)
            elif run:
                ax.text(at, top * 0.02, 'n/a', ha='center', fontsize=9, color=BASE, style='italic')
    if base:
        ax.axhline(base, color=BASE, ls='--', lw=1.2)
        ax.text(len(shapes) - 0.5, base, f'one process {base:,.0f}', ha='right', va='bottom', fontsize=9,
                color=BASE)
        ratio = ax.secondary_yaxis('right', functions=(lambda v: v / base, lambda r: r * base))
        ratio.set_ylabel('x one process')
    ax.set_xticks(range(len(shapes)), [f'{ps} ps + {w} worker{"s" if w > 1 else ""}' for ps, w in shapes])
    ax.set_ylim(0, max(top, base or 0) * 1.25)
    ax.set_xlim(-0.6, len(shapes) - 0.4)
    ax.set_ylabel('images/s, steady state')
    ax.legend(handles=[matplotlib.patches.Patch(color=SYNC if m == 'sync' else ASYNC, label=m) for m in modes],
              fontsize=9, loc='lower center', bbox_to_anchor=(0.5, 1.0), ncols=len(modes), frameon=False)
    ax.spines[['top']].set_visible(False)
    detail = _settings(figures).replace(', medians', '').replace('repetition(s)', 'run')
    return ('Scaling on one machine: images/s by cluster shape and mode',
            'Steady images/s of each cluster shape, synchronous and asynchronous, one run each'
            f'{" (" + detail + ")" if detail else ""}; the dashed line and the right axis are the same model '
            f'in one process. On one machine every task shares the same {figures.get("cores", "few")} cores: '
            'more workers add processes, not compute.', fig)


def elastic(figures: dict):
    e = figures.get('elastic')
    if not e:
        return None
    fig, ax = _figure(0.8)
    modes = [m for m in ('async', 'sync') if m in e]
    for x, mode in enumerate(modes):
        r, color = e[mode], SYNC if mode == 'sync' else ASYNC
        for i, (key, label) in enumerate((('one_worker_images_per_sec', '1 worker'),
                                          ('three_workers_images_per_sec', '3 workers'))):
            value, at = r.get(key), x + (i - 0.5) * 0.38
            if value:
                ax.bar(at, value, 0.34, color=color, alpha=0.55 if i == 0 else 1.0)
                ax.text(at, value, f'{label}\n{value:,.0f}', ha='center', va='bottom', fontsize=9)
            else:
                ax.text(at, 5, f'{label}\nn/a', ha='center', va='bottom', fontsize=9, color=BASE)
    ax.set_xticks(range(len(modes)), [f'{m}: `launch scale` took {e[m]["scale_s"]:.1f} s' for m in modes])
    top = max((v for r in e.values() for v in (r.get('one_worker_images_per_sec'), r.get('three_workers_images_per_sec'))
               if v), default=1)
    ax.set_ylim(0, top * 1.25)
    ax.set_xlim(-0.6, len(modes) - 0.4)
    ax.set_ylabel('images/s, steady state')
    ax.spines[['top', 'right']].set_visible(False)
    return ('Elastic workers: before and after `launch scale --workers 3`',
            'A pool of 3 workers started with one (`launch up --workers 1`) and scaled to three a quarter '
            'of the way: steady images/s before and after, and how long `launch scale` took (async joins '
            'live; sync restarts through a checkpoint).', fig)


def placement(figures: dict):
    b = figures.get('bytes')
    if not b or not b.get('ps_bytes'):
        return None
    fig, ax = _figure(0.62)
    counts = sorted(b['ps_bytes'], key=int)
    for y, ps in enumerate(counts[::-1]):
        held, left = b['ps_bytes'][ps], 0.0
        for k, value in enumerate(held):
            share = value / sum(held)
            ax.barh(y, share, left=left, color=plt.cm.Blues(0.35 + 0.25 * k), edgecolor='white', height=0.6)
            ax.text(left + share / 2, y, f'ps:{k}\n{share:.0%}', ha='center', va='center', fontsize=9)
            left += share
    ax.set_yticks(range(len(counts)), [f'{ps} ps task{"s" if int(ps) > 1 else ""}' for ps in counts[::-1]])
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.set_xlabel(f'share of the model\'s {b["model_bytes"] / 1e6:.2f} MB each ps task holds')
    ax.spines[['top', 'right']].set_visible(False)
    return ('Variable placement: the bytes each ps task holds',
            'Variables are placed by bytes, and the largest weights split into one block per ps task, so '
            'every ps task carries about its share of each update\'s pulls and pushes.', fig)


def accuracy(figures: dict):
    a = figures.get('accuracy')
    runs = (a or {}).get('runs') or {}
    if not any(p.get('precision') is not None for r in runs.values() for p in r.get('points', [])):
        return None
    fig, ax = _figure()
    colors = {'single': BASE, 'sync': SYNC, 'async': ASYNC}
    labels = {'single': 'one process', 'sync': '1 ps + 2 workers, sync', 'async': '1 ps + 2 workers, async'}
    for kind, r in runs.items():
        points = [(p['epochs'], p['precision']) for p in r['points'] if p.get('precision') is not None]
        ax.plot(*zip(*points), marker='o', ms=3, color=colors.get(kind), label=labels.get(kind, kind))
    if a.get('target'):
        ax.axhline(a['target'], color='#c62828', ls=':', lw=1)
    ax.set_xlabel('epochs of Fashion-MNIST seen')
    ax.set_ylabel('test precision@1')
    ax.legend(fontsize=9, frameon=False)
    ax.grid(alpha=0.3)
    return ('Accuracy: test precision@1 against epochs, one process and the cluster',
            'Each run\'s checkpoints evaluated on the 10,000 Fashion-MNIST test images with the moving '
            'averages, as `launch eval` does; every run sees the same images on the same schedule.', fig)


def pss(figures: dict):
    p = figures.get('pss')
    if not p:
        return None
    base = p.get('one_process_images_per_sec')
    kinds = ['tf1_async'] + sorted((k for k in p if k.startswith('pss_join')), key=lambda k: int(k[8:]))
    rows = [('one process, no cluster', base, BASE, '1.00x')]
    for kind in kinds:
        r = p.get(kind) or {}
        label = 'TF1 between-graph, async' if kind == 'tf1_async' else f'PSS, {kind[8:]} step(s) per join'
        rows.append((label, r.get('steady_images_per_sec'), TF1 if kind == 'tf1_async' else SYNC,
                     _x(r.get('vs_one_process'), 'one process')))
    fig, ax = _figure()
    _bars(ax, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows])
    ax.set_xlabel('images/s, steady state (higher is better)')
    return ('TF2 ParameterServerStrategy against TF1 between-graph and one process',
            'The CIFAR-10 CNN trained in one process, by the TF1 between-graph cluster and as a coordinator '
            'run scheduling 1, 10 or 50 steps between two `coordinator.join()` calls.', fig)


def links(figures: dict):
    rows = [r for r in figures.get('links') or [] if r.get('measured_images_per_sec')]
    if not rows:
        return None
    fig, ax = _figure()
    for r in rows:
        color = SYNC if r['mode'] == 'sync' else ASYNC
        marker = 'o' if r['transfer_dtype'] == 'float32' else 's'
        if r.get('predicted_images_per_sec'):
            ax.scatter(r['predicted_images_per_sec'], r['measured_images_per_sec'], color=color, marker=marker,
                       s=20 + r['rate_mbit'] / 250, alpha=0.8)
    lo = min(min(r['measured_images_per_sec'], r.get('predicted_images_per_sec') or 1e9) for r in rows) * 0.9
    hi = max(max(r['measured_images_per_sec'], r.get('predicted_images_per_sec') or 0) for r in rows) * 1.1
    ax.plot([lo, hi], [lo, hi], color=BASE, lw=1, ls='--')
    for mode, color in (('sync', SYNC), ('async', ASYNC)):
        ax.scatter([], [], color=color, label=mode)
    ax.legend(fontsize=9, frameon=False, title='circle float32, square bfloat16; larger: faster link')
    ax.set_xlabel('predicted by the serial cost model, images/s')
    ax.set_ylabel('measured, images/s')
    return ('Emulated links: measured images/s against the cost model',
            'Each task in a network namespace of its own on a rate-limited link; a point on the dashed line '
            'is a measurement the serial model (compute plus every transfer through the busiest link) '
            'predicted exactly.', fig)


PLOTS: tuple[Callable[[dict], tuple | None], ...] = (cluster, startup, scaling, elastic, placement, accuracy, pss,
                                                      links)


def draw(figures: dict, out_dir: str, source: str, when: str | None = None) -> list[str]:
    """Draw every figure `figures` has into out_dir as N-name.png; the paths written. Earlier
    N-name.png files there are removed first, so the folder holds one run's pictures only."""
    os.makedirs(out_dir, exist_ok=True)
    for old in os.listdir(out_dir):
        if old.endswith('.png') and old.split('-', 1)[0].isdigit():
            os.remove(os.path.join(out_dir, old))
    when = when or datetime.date.today().isoformat()
    written = []
    for n, plot in enumerate(PLOTS, 1):
        got = plot(figures)
        if got is None:
            continue
        title, description, fig = got
        if figures.get('quick'):
            description += ' Quick mode (--quick): tiny runs that check the benchmark works; not a measurement.'
        path = os.path.join(out_dir, f'{n}-{plot.__name__}.png')
        fig.savefig(path, metadata={'Title': title, 'Description': description, 'Source': source,
                                    'Creation Time': when, 'Software': None})
        plt.close(fig)
        written.append(path)
    return written


def redraw(figures_path: str, out_dir: str) -> list[str]:
    """Draw a saved run (bench.py's --json) again: its own command and date in the captions."""
    with open(figures_path) as f:
        figures = json.load(f)
    when = figures.get('date') or datetime.date.fromtimestamp(os.path.getmtime(figures_path)).isoformat()
    source = figures.get('command') or 'python benchmarks/bench.py (its command line was not recorded)'
    return draw(figures, out_dir, source, when)


def main() -> None:
    p = argparse.ArgumentParser(description='draw the benchmark\'s figures (a --json file of bench.py) as PNGs')
    p.add_argument('figures', help='the JSON bench.py wrote (--json)')
    p.add_argument('out_dir')
    args = p.parse_args()
    for path in redraw(args.figures, args.out_dir):
        print(path)


if __name__ == '__main__':
    main()
