"""The report's Telemetry section: what each task measured of itself over the run (its `sample`
events), the workers named stragglers, and each ps task's bytes as measured beside the plan's
prediction for the same steps (launch/planning/ps_load.py).

The prediction: a ps task receives (and sends) its `in_per_step` bytes per global step, so at the
run's global steps per second (from its progress events over the samples' span) its bytes per
second are in_per_step x steps/s. The measured figure is the mean of its samples' TCP bytes in
(cluster/runtime/telemetry.py), which counts gRPC's own framing and the small reads (the global
step, the sync tokens) besides the weights and the gradients."""
from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from matplotlib.figure import Figure

from cluster.runtime import placed, rundir
from cluster.runtime.contract import job_of
from cluster.spec import SpecError, load_spec
from launch.planning import ps_load
from launch.records.event_types import Event, Progress, Sample
from launch.records.plots import TimeAxis, png
from launch.records.telemetry import series, stragglers

FIGURES = (('steps_per_sec', 'steps/s (each worker)', 1.0), ('cpu', 'CPU, % of one core', 100.0),
           ('rss', 'memory, MB', 1e-6), ('in_per_sec', 'TCP bytes in, MB/s', 1e-6))
GPU_FIGURES = (('gpu', 'GPU busy, % (mean over its GPUs)', 100.0), ('gpu_memory', 'GPU memory, MB', 1e-6))
MOST_LINES = 12         # tasks drawn per plot at most (the busiest ones)


def section(events: Sequence[Event], tz: datetime.tzinfo, train_dir: str,
            table: Callable[[tuple[str, ...], list[tuple[Any, ...]]], str]) -> str:
    """The section's HTML ('' for a run with no sample events)."""
    samples = [e for e in events if isinstance(e, Sample)]
    if not samples:
        return ''
    out = ['<h2>Telemetry</h2>',
           f'<p class="sub">What each task measured of itself, {len(samples)} sample(s) '
           '(supervise.sample_secs apart): its steps/s, CPU, resident memory and TCP bytes, and its GPUs where it '
           'measured them.</p>']
    axis = TimeAxis([e.epoch for e in samples], tz)
    out.append(f'<img alt="each task\'s steps/s, CPU, memory and bytes in over wall time" src="{_png(events, axis)}">')
    slow = stragglers(events)
    if slow:
        out.append('<p>Stragglers (a worker below 0.67x of the others\' median steps/s for three looks):</p>')
        out.append(table(('time', 'attempt', 'worker', 'steps/s', "others' median", 'cause'),
                         [(e.time[11:19], e.attempt, e.task, e.steps_per_sec, e.median, e.cause) for e in slow]))
    else:
        out.append('<p>No worker was named a straggler.</p>')
    rows = ps_rows(events, train_dir)
    if rows:
        out.append('<p>Each ps task\'s bytes in per second, measured against the plan '
                   '(<code>launch plan</code>: its bytes per global step x the global steps per second):</p>')
        out.append(table(('ps task', 'measured, MB/s', 'plan, MB/s', 'measured / plan'), list(rows)))
    return '\n'.join(out)


def _png(events: Sequence[Event], axis: TimeAxis) -> str:
    measured = {figure: series(events, figure) for figure, _, _ in FIGURES + GPU_FIGURES}
    figures = FIGURES + (GPU_FIGURES if any(measured[f] for f, _, _ in GPU_FIGURES) else ())
    rows = len(figures) // 2
    fig = Figure(figsize=(12.8, 3.5 * rows), layout='constrained')
    grid = fig.subplots(rows, 2)
    for ax, (figure, title, scale) in zip(grid.flat, figures):
        found = measured[figure]
        busiest = sorted(found, key=lambda t: -statistics.fmean(v for _, v in found[t]))[:MOST_LINES]
        for task in sorted(busiest):
            points = found[task]
            ax.plot([float(axis(t)) for t, _ in points], [v * scale for _, v in points], marker='.', ms=4, lw=1.2,
                    label=task)
        ax.set(title=title)
        axis.decorate(ax, 540)
        ax.grid(color='#e5e5e5')
        if ax.lines:
            ax.legend(fontsize=8, frameon=False)
        else:
            ax.text(0.5, 0.5, 'not measured', transform=ax.transAxes, ha='center', color='#777777')
    return png(fig)


def ps_rows(events: Sequence[Event], train_dir: str) -> list[tuple[Any, ...]]:
    """Per ps task: measured and predicted MB/s in, and their ratio ([] where no plan can be made)."""
    load = _load(train_dir)
    rate = _global_steps_per_sec(events)
    measured = {t: statistics.fmean(v for _, v in points)
                for t, points in series(events, 'in_per_sec').items() if job_of(t) == 'ps'}
    if load is None or rate is None or not measured:
        return []
    rows = []
    for p in load.ps:
        got = measured.get(p.task)
        plan = p.in_per_step * rate
        rows.append((p.task, '-' if got is None else f'{got / 1e6:.2f}', f'{plan / 1e6:.2f}',
                     '-' if got is None or not plan else f'{got / plan:.2f}'))
    return rows


def _load(train_dir: str) -> ps_load.Load | None:
    """The plan's load for the run's effective spec (its spec.yaml), or from what the run's own
    program placed (its variables.json or checkpoint graph, as `launch plan --from-run` reads them)."""
    try:
        spec = load_spec(rundir.spec_path(train_dir))
        load = ps_load.builtin_load(spec)
        found = placed.recorded(train_dir) if load is None else None
    except (OSError, SpecError, ValueError):
        return None
    return ps_load.run_load(spec, found[0], train_dir) if found else load


def _global_steps_per_sec(events: Sequence[Event]) -> float | None:
    """The global steps per second over the samples' span, from the progress events in it."""
    times = [e.epoch for e in events if isinstance(e, Sample)]
    points = [(e.epoch, e.step) for e in events if isinstance(e, Progress) and e.step is not None
              and times and times[0] <= e.epoch <= times[-1]]
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])
