"""The figures of `launch report`: the per-task timeline across attempts, and loss and images/s
over global step and over wall time. PNG data URIs drawn with matplotlib's Agg renderer (a bare
`Figure`, never pyplot, so no global state and no display); what they show is read by
launch/records/timeline.py.
"""
from __future__ import annotations

import base64
import datetime
import io
import math
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory
from PIL import Image

from cluster.runtime.runjson import short
from launch.records.event_types import Progress
from launch.records.jsonrecord import finite
from launch.records.runs import duration_text
from launch.records.timeline import Attempt, Fault, Run, Segment, Story

# Attempt colours: no red (a lost task) and no orange (a stall) among them.
ATTEMPT_COLOURS = ('#1f77b4', '#17becf', '#9467bd', '#8c564b', '#e377c2', '#bcbd22', '#7f7f7f', '#2ca02c')
LOST, WARN = '#d62728', '#ff7f0e'
RESTART_MARK = r'$\circlearrowleft$'
# How each kind of mark looks on the timeline: (legend label, marker, size, face, edge).
MARKS = {
    'started': ('task started', '|', 14, 'black', 'black'),
    'restarted': ('restarted', RESTART_MARK, 13, '#6a3d9a', '#6a3d9a'),
    'serving': ('serving', 'o', 7, 'white', 'black'),
    'first_step': ('first step', '>', 9, '#2ca02c', 'black'),
    'checkpoint': ('checkpoint saved', 'd', 6, '#999999', '#555555'),
    'lost': ('task lost', 'X', 13, LOST, 'black'),
    'tolerated': ('tolerated (training goes on)', '^', 9, WARN, 'black'),
    'stall': ('stall', 'X', 13, WARN, 'black'),
    'restart': ('restarted', RESTART_MARK, 15, '#6a3d9a', '#6a3d9a'),
    'interrupted': ('interrupted', 'H', 10, WARN, 'black'),
    'disk full': ('disk full', 'v', 11, WARN, 'black'),
    'resumed': ('resumed (a new launch up)', 'P', 11, 'white', 'black'),
    'scale': ('scaled (launch scale)', 'd', 11, '#1f77b4', 'black'),
    'failover': ('failed over to a spare', '^', 11, LOST, 'black'),
    'moved': ('moved to another node', '>', 11, WARN, 'black'),
    'preempted': ('preemption notice', 'v', 11, '#1f77b4', 'black'),
    'stopped': ('stopped', 's', 6, 'black', 'black'),
    'done': ('finished: done', '*', 15, '#2ca02c', 'black'),
    'ended': ('ended: interrupted', '*', 15, 'white', 'black'),
    'failed': ('ended: failed', '*', 15, LOST, 'black'),
}
ROW_CHARS = 40            # of a task's name on the timeline (a foreign event log may hold any text)
MAX_ROWS = 200            # rows of the timeline: 0.45 inch each, a foreign log's thousands would take minutes and GBs
PNG_COLOURS = 256         # a plot's palette (png())
MIN_CUT_SECS = 120.0      # an idle stretch shorter than this is never cut from a time axis
NICE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


# -- the time axis ----------------------------------------------------------------------------------
class TimeAxis:
    """Wall time -> x, piecewise linear. A resume the next morning would crush every attempt into
    a line at either edge, so an idle stretch longer than a third of the rest is cut to a sliver,
    which the plots hatch and label with the time it stood for."""

    def __init__(self, times: list[float], tz: datetime.tzinfo) -> None:
        self.tz, self.lo, self.hi = tz, min(times), max(times)
        self.cuts = _cuts(sorted(set(times)))
        busy = (self.hi - self.lo) - sum(b - a for a, b in self.cuts)
        self.sliver = max(busy * 0.04, 1.0)
        ts, xs = [self.lo], [0.0]
        for a, b in self.cuts:
            ts += [a, b]
            xs += [xs[-1] + a - ts[-3], xs[-1] + a - ts[-3] + self.sliver]
        xs.append(xs[-1] + self.hi - ts[-1])
        ts.append(self.hi)
        knots_t, knots_x = [self.lo - 1e9] + ts + [self.hi + 1e9], [-1e9] + xs + [xs[-1] + 1e9]
        self.t, self.x = np.array(knots_t), np.array(knots_x)

    def __call__(self, t: Any) -> Any:
        return np.interp(t, self.t, self.x)

    @property
    def limits(self) -> tuple[float, float]:
        lo, hi = float(self(self.lo)), float(self(self.hi))
        pad = max((hi - lo) * 0.02, 1.0)
        return lo - pad, hi + pad

    def ticks(self, width_px: float) -> tuple[list[float], list[str]]:
        """Round clock times in the run's own time zone, none inside a cut, none crowding another
        on an axis `width_px` wide; the date only where it changes."""
        kept = list(zip([self.lo] + [b for _, b in self.cuts], [a for a, _ in self.cuts] + [self.hi]))
        many_days = self._date(self.lo) != self._date(self.hi)
        label_px = 7.5 * (14 if many_days else 8) + 24
        busy = sum(b - a for a, b in kept) or 1.0
        step = next((s for s in NICE_STEPS if busy / s <= max(width_px / label_px, 2)), NICE_STEPS[-1])
        offset = datetime.datetime.fromtimestamp(self.lo, self.tz).utcoffset() or datetime.timedelta()
        lo, hi = self.limits
        xs: list[float] = []
        times: list[float] = []
        for a, b in kept:
            t = math.ceil((a + offset.total_seconds()) / step) * step - offset.total_seconds()
            while t <= b:
                x = float(self(t))
                if not xs or (x - xs[-1]) / (hi - lo) * width_px > label_px:
                    xs.append(x)
                    times.append(t)
                t += step
        dates = [None] + [self._date(t) for t in times]
        labels = [self._label(t, step, many_days and dates[i] != dates[i + 1]) for i, t in enumerate(times)]
        return xs, labels

    def _date(self, t: float) -> datetime.date:
        return datetime.datetime.fromtimestamp(t, self.tz).date()

    def _label(self, t: float, step: float, with_date: bool) -> str:
        fmt = ('%b %d ' if with_date else '') + ('%H:%M:%S' if step < 60 else '%H:%M')
        return datetime.datetime.fromtimestamp(t, self.tz).strftime(fmt)

    def decorate(self, ax: Any, width_px: float) -> None:
        """Clock-time ticks, the axis's time zone, and each cut hatched with the time it hides."""
        xs, labels = self.ticks(width_px)
        ax.set_xticks(xs, labels)
        ax.set_xlim(*self.limits)
        ax.set_xlabel(f'wall time ({_zone(self.tz, self.lo)})')
        for a, b in self.cuts:
            x = float(self(a))
            ax.axvspan(x, x + self.sliver, facecolor='#eeeeee', edgecolor='#aaaaaa', hatch='//', lw=0, zorder=0)
            ax.text(x + self.sliver / 2, 0.5, f'{duration_text(b - a)} idle', transform=_xdata_yaxes(ax), rotation=90,
                    ha='center', va='center', fontsize=8, color='#444444',
                    bbox={'facecolor': 'white', 'edgecolor': 'none', 'pad': 1})


def _cuts(times: list[float]) -> list[tuple[float, float]]:
    """The idle stretches to cut: the longest first, each while it is longer than half of what
    would be left (so cutting never hides a pause that is merely long)."""
    span = times[-1] - times[0] if times else 0.0
    cuts = []
    for gap, a, b in sorted(((b - a, a, b) for a, b in zip(times, times[1:])), reverse=True):
        if gap < MIN_CUT_SECS or gap * 2 < span - gap:
            break
        cuts.append((a, b))
        span -= gap
    return sorted(cuts)


def _zone(tz: datetime.tzinfo, t: float) -> str:
    off = datetime.datetime.fromtimestamp(t, tz).strftime('%z')
    return f'UTC{off[:3]}:{off[3:]}' if off else 'local time'


def _xdata_yaxes(ax: Any) -> Any:
    return blended_transform_factory(ax.transData, ax.transAxes)


# -- plots ------------------------------------------------------------------------------------------
def colour(attempt: int) -> str:
    return ATTEMPT_COLOURS[(attempt - 1) % len(ATTEMPT_COLOURS)]


def png(fig: Figure) -> str:
    """The figure as a data URI: a 256-colour PNG (a plot's few flat colours and their
    anti-aliasing survive; a third of the bytes of a true-colour one, which kept a 1,000-task
    report over 100 KB), with no metadata (matplotlib's would carry its web address)."""
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=100, metadata={'Software': None})
    buf.seek(0)
    with Image.open(buf) as drawn:
        few = drawn.convert('RGB').quantize(PNG_COLOURS, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    few.save(out, format='png', optimize=True)
    return 'data:image/png;base64,' + base64.b64encode(out.getvalue()).decode('ascii')


def timeline_png(run: Run, tale: Story, axis: TimeAxis, runs: list[Attempt]) -> str:
    """One row per task across all attempts: the bars show when each task lived (pale while it
    started, solid once it served), the marks what happened, faults numbered F1.. in the legend."""
    legend_rows = len(tale.faults[:10]) + 2
    rows = tale.rows[:MAX_ROWS]
    fig = Figure(figsize=(12.8, 1.6 + 0.45 * len(rows) + 0.24 * legend_rows), layout='constrained')
    ax = fig.add_subplot()
    y = {name: i for i, name in enumerate(rows)}
    for seg in tale.segments:
        if seg.task in y:
            _bar(ax, axis, seg, y[seg.task])
    for kind in MARKS:
        below = 0.36 if kind == 'tolerated' else 0.0      # under the bar: it follows the loss mark at once
        points = [(float(axis(t)), y[row] + below) for row, t, k in tale.marks if k == kind and row in y]
        if points:
            _, marker, size, face, edge = MARKS[kind]
            ax.plot(*zip(*points), ls='none', marker=marker, ms=size, mfc=face, mec=edge, mew=1.2, zorder=4)
    for x, row, text in _fault_labels(tale.faults, axis, lambda task: y.get(task, len(rows)), 0.035):
        if row < len(rows):         # a fault of a row left out is in the faults table only
            ax.annotate(text, (x, row), xytext=(7, 6), textcoords='offset points',
                        fontsize=8, fontweight='bold', color=LOST, zorder=5,
                        bbox={'boxstyle': 'round,pad=0.15', 'fc': 'white', 'ec': LOST, 'lw': 0.8})
    ax.set_yticks(range(len(rows)), [_short(row, ROW_CHARS) for row in rows])
    ax.set_ylim(len(rows) - 0.4, -0.6)
    if len(tale.rows) > len(rows):
        ax.set_ylabel(f'the first {len(rows)} of {len(tale.rows)} rows (the faults table lists every fault)')
    ax.grid(axis='x', color='#e5e5e5')
    axis.decorate(ax, 1100)
    _attempt_lines(ax, axis, runs, labels=True)
    _timeline_legend(fig, ax, tale, run.tz)
    return png(fig)


def _bar(ax: Any, axis: TimeAxis, seg: Segment, row: int) -> None:
    x0, x1 = float(axis(seg.start)), float(axis(seg.end if seg.end is not None else seg.start))
    xs = float(axis(seg.serving)) if seg.serving is not None else x1
    ax.barh(row, xs - x0, left=x0, height=0.5, color=colour(seg.attempt), alpha=0.3, lw=0, zorder=2)
    ax.barh(row, x1 - xs, left=xs, height=0.5, color=colour(seg.attempt), alpha=0.85, lw=0, zorder=2)


def _fault_labels(faults: list[Fault], axis: TimeAxis, row_of: Callable[[str], Any],
                  near: float) -> list[tuple[float, float, str]]:
    """(x, row, 'F3 F4'): faults on one row closer than `near` (a fraction of the axis) share a
    label, so that no two labels overlap."""
    lo, hi = axis.limits
    out: list[list] = []
    for n, f in sorted(enumerate(faults, 1), key=lambda p: (row_of(p[1].row), p[1].t)):
        x, row = float(axis(f.t)), row_of(f.row)
        if out and out[-1][1] == row and x - out[-1][3] < (hi - lo) * near:
            out[-1][2] += f' F{n}'
            out[-1][3] = x
        else:
            out.append([x, row, f'F{n}', x])
    return [(x, row, text) for x, row, text, _ in out]


def _attempt_lines(ax: Any, axis: TimeAxis, runs: list[Attempt], labels: bool) -> None:
    """A dashed line where each attempt begins; labels above the plot, lifted a level when two
    would otherwise overlap."""
    lo, hi = axis.limits
    last_x, level = -math.inf, 0
    for a in runs:
        x = float(axis(a.start))
        ax.axvline(x, color='#444444', ls='--', lw=1, zorder=1)
        if labels:
            level = level + 1 if x - last_x < (hi - lo) * 0.09 and level < 2 else 0
            right = x > hi - (hi - lo) * 0.08         # near the right edge: the label ends at its line
            ax.text(x, 1.01 + 0.07 * level, f'attempt {a.number}', transform=_xdata_yaxes(ax),
                    ha='right' if right else 'left',
                    va='bottom', fontsize=9, color=colour(a.number), fontweight='bold')
            last_x = x


def _timeline_legend(fig: Figure, ax: Any, tale: Story, tz: datetime.tzinfo) -> None:
    """What the marks mean (only those used) and, below, each fault with its time and cause."""
    used = {k for _, _, k in tale.marks}
    by_label: dict[str, Line2D] = {}      # a task's and the cluster's restart share one
    for kind, (label, m, s, f, e) in MARKS.items():
        if kind in used:
            by_label.setdefault(label, Line2D([], [], ls='none', marker=m, ms=min(s, 11), mfc=f, mec=e, label=label))
    handles: list[Any] = list(by_label.values()) + [
        Patch(color='#888888', alpha=0.85, label='task running (colour: attempt)'),
        Patch(color='#888888', alpha=0.3, label='not serving yet')]
    faults = [Line2D([], [], ls='none', label=f'F{n}  {clock(f.t, tz)}  attempt {f.attempt}  {_short(f.text, 110)}')
              for n, f in enumerate(tale.faults[:10], 1)]
    if len(tale.faults) > 10:
        faults.append(Line2D([], [], ls='none', label=f'... {len(tale.faults) - 10} more in the faults table'))
    fig.legend(handles=handles, loc='outside lower center', ncols=min(len(handles), 5), fontsize=9, frameon=False)
    if faults:
        legend = ax.legend(handles=faults, loc='upper left', bbox_to_anchor=(0, -0.16), fontsize=9,
                           handlelength=0, handletextpad=0, title='faults', title_fontsize=9,
                           alignment='left', frameon=False)
        for text in legend.get_texts():
            text.set_color(LOST)


def progress_png(run: Run, axis: TimeAxis, runs: list[Attempt], faults: list[Fault]) -> str | None:
    """Loss and images/s over global step and over wall time, one colour per attempt (a resumed
    attempt that re-does steps shows as a second line over the same steps)."""
    series = _series(run)
    if not series:
        return None
    fig = Figure(figsize=(12.8, 7.4), layout='constrained')
    grid = fig.subplots(2, 2)
    for col, (key, name) in enumerate((('loss', 'loss'), ('images_per_sec', 'images/s'))):
        for n, points in series.items():
            _line(grid[0][col], [(p.step, getattr(p, key)) for p in points], n)
            _line(grid[1][col], [(float(axis(p.t)), getattr(p, key)) for p in points], n)
        grid[0][col].set(title=f'{name} over global step', xlabel='global step', ylabel=name)
        grid[1][col].set(title=f'{name} over wall time', ylabel=name)
        axis.decorate(grid[1][col], 540)
        _attempt_lines(grid[1][col], axis, runs, labels=False)
        for f in faults:
            grid[1][col].axvline(float(axis(f.t)), color=LOST, ls=':', lw=1.2)
        for x, _, text in _fault_labels(faults, axis, lambda row: 0, 0.06):
            grid[1][col].text(x, 0.99, f' {text}', transform=_xdata_yaxes(grid[1][col]),
                              ha='left', va='top', fontsize=8, color=LOST, fontweight='bold')
    for ax in grid.flat:
        ax.grid(color='#e5e5e5')
        if not ax.lines:
            ax.text(0.5, 0.5, 'not reported', transform=ax.transAxes, ha='center', color='#777777')
    fig.legend(handles=[Line2D([], [], color=colour(n), marker='.', label=f'attempt {n}') for n in series]
               + ([Line2D([], [], color=LOST, ls=':', label='fault (see the timeline)')] if faults else []),
               loc='outside lower center', ncols=len(series) + 1, fontsize=9, frameon=False)
    return png(fig)


@dataclass(frozen=True)
class Point:
    """One progress event as plotted: None where a figure was not reported (or is not finite)."""
    step: float
    loss: float | None
    images_per_sec: float | None
    t: float


def _series(run: Run) -> dict[int, list[Point]]:
    """Progress points per attempt."""
    out: dict[int, list[Point]] = {}
    for e in run.events:
        if isinstance(e, Progress) and e.step is not None:
            out.setdefault(e.attempt, []).append(Point(float(e.step), finite(e.loss), finite(e.images_per_sec),
                                                       e.epoch))
    return out


def _line(ax: Any, points: list[tuple[float, float | None]], attempt: int) -> None:
    points = [(x, y) for x, y in points if y is not None]
    if points:
        ax.plot(*zip(*points), color=colour(attempt), marker='.', ms=5, lw=1.4)




def clock(t: float, tz: datetime.tzinfo, full: bool = False) -> str:
    """A time as the run's clock shows it: 21:08:43, or in full with the date and UTC offset."""
    when = datetime.datetime.fromtimestamp(t, tz)
    return when.isoformat(sep=' ', timespec='seconds') if full else when.strftime('%H:%M:%S')


def _short(text: str, most: int) -> str:
    """One line of at most `most` characters, cut as the console cuts (a legend entry, a row's name)."""
    return short(' '.join(str(text)[:most * 4].split()), most)
