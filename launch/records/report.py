"""`launch report`: one self-contained HTML page that tells a run's story — when each task started,
served, trained, died and was restarted, across every attempt — for the person debugging it the
day after.

Built from `events.jsonl`, `run.json` and `spec.yaml` only. TensorFlow is never imported (it takes
seconds to load, and `launch up` writes this page at the end of every attempt): the progress events
already carry the loss and images/s. The page needs no network to open: CSS inline, plots as PNG
data URIs drawn with matplotlib's Agg renderer (a bare `Figure`, never pyplot, so no global state
and no display). Damaged input is skipped with one warning; a run with no events yet still gets a
page that says so.
"""
from __future__ import annotations

import base64
import datetime
import html
import io
import json
import logging
import math
import os
from dataclasses import dataclass, field

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from cluster.runtime import rundir
from cluster.runtime.rundir import write_atomically
from launch.records.events import read_events, read_run_record
from launch.records.runs import duration_text

log = logging.getLogger(__name__)

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
    'scale': ('scaled (launch scale)', 'd', 11, '#1f77b4', 'black'),
    'failover': ('failed over to a spare', '^', 11, LOST, 'black'),
    'stopped': ('stopped', 's', 6, 'black', 'black'),
    'done': ('finished: done', '*', 15, '#2ca02c', 'black'),
    'ended': ('ended: interrupted', '*', 15, 'white', 'black'),
    'failed': ('ended: failed', '*', 15, LOST, 'black'),
}
RUN_ROW = 'run'
MIN_CUT_SECS = 120.0      # an idle stretch shorter than this is never cut from a time axis
NICE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


# -- reading the run ---------------------------------------------------------------------------------
@dataclass
class Run:
    """Everything the page shows, read once; events sorted by time, each with `_t` (epoch seconds)."""
    train_dir: str
    events: list[dict]
    result: dict                # run.json, else the last `finished` event's result, else {}
    result_source: str          # where `result` came from, for the page to say
    spec_text: str | None
    tz: datetime.tzinfo


def load(train_dir: str) -> Run:
    events = _timed(read_events(rundir.events_path(train_dir)), rundir.events_path(train_dir))
    result, source = read_run_record(rundir.run_path(train_dir)), 'run.json'
    if not result:
        finished = [e for e in events if e['event'] == 'finished' and isinstance(e.get('result'), dict)]
        result, source = (finished[-1]['result'], 'the last finished event') if finished else ({}, '')
    tz = (datetime.datetime.fromisoformat(events[0]['time']).tzinfo if events else None) or _local_tz()
    return Run(train_dir, events, result, source, rundir.read_text(rundir.spec_path(train_dir)), tz)


def _timed(events: list[dict], path: str) -> list[dict]:
    """The events with a readable time and attempt, in time order: a hand-edited or foreign line
    with neither cannot be placed on a time axis, so it is left out (one warning, as for a torn line)."""
    out, bad = [], 0
    for e in events:
        try:
            when = datetime.datetime.fromisoformat(str(e['time']))
            if when.tzinfo is None:
                when = when.astimezone()
            out.append({**e, '_t': when.timestamp(), 'attempt': int(e.get('attempt') or 1)})
        except (KeyError, ValueError, TypeError):
            bad += 1
    if bad:
        log.warning('%s: left out %d event(s) without a readable time or attempt', path, bad)
    out.sort(key=lambda e: e['_t'])       # stable: events of one instant keep the order they were written in
    return out


def _local_tz() -> datetime.tzinfo:
    return datetime.datetime.now().astimezone().tzinfo


def _num(value) -> float | None:
    """A number from an event field, None for anything else (null, NaN from a diverged loss, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


# -- what happened: attempts, task segments, marks and faults -----------------------------------------
@dataclass
class Attempt:
    number: int
    start: float
    end: float
    ended: str = 'no end recorded'
    step: int | None = None
    resumed_from: int | None = None
    lost: list[str] = field(default_factory=list)


def attempts(run: Run) -> list[Attempt]:
    """One row per attempt: when, from which step, how far, and how it ended."""
    out: dict[int, Attempt] = {}
    resume = None
    for e in run.events:
        a = out.get(e['attempt'])
        if a is None:
            a = out[e['attempt']] = Attempt(e['attempt'], e['_t'], e['_t'], resumed_from=resume)
        a.end = e['_t']
        resume = _account(a, e, resume)
    if out:
        last = out[max(out)]
        if last.ended == 'no end recorded':
            last.ended = 'no end recorded yet (still running, or its launcher was killed)'
    return [out[n] for n in sorted(out)]


def _account(a: Attempt, e: dict, resume: int | None) -> int | None:
    """Fold one event into its attempt; returns the step the next attempt resumes from."""
    kind = e['event']
    step = _num(e.get('step'))
    if kind in ('first_step', 'progress', 'checkpoint') and step is not None:
        a.step = max(a.step or 0, int(step))
    if kind == 'run_started':
        a.resumed_from = e.get('resumes_from')
    elif kind == 'task_lost':
        a.lost.append(str(e.get('task', '?')))
    elif kind == 'restart' and not e.get('tasks'):
        a.ended = f'restarted: {e.get("cause", "?")}'
        return e.get('from_step')
    elif kind == 'interrupted':
        a.ended = f'interrupted by {e.get("signal") or "a signal"}'
    elif kind == 'finished' and not a.ended.startswith('interrupted'):
        a.ended = _how_finished(e.get('result'))
    return resume


def _how_finished(result) -> str:
    if not isinstance(result, dict):
        return 'finished'
    state, code = result.get('state', '?'), result.get('exit_code')
    causes = [str(f.get('cause')) for f in result.get('failures') or () if isinstance(f, dict)]
    text = f'finished: {state}' + (f' (exit code {code})' if code not in (0, None) else '')
    return text + (f': {causes[0]}' if causes else '')


@dataclass
class Segment:
    """One task's life within one attempt: a bar on the timeline."""
    task: str
    attempt: int
    start: float
    serving: float | None = None
    end: float | None = None


@dataclass
class Story:
    """The timeline's content: rows top to bottom, bars, marks (row, time, kind) and numbered faults."""
    rows: list[str]
    segments: list[Segment]
    marks: list[tuple[str, float, str]]
    faults: list[dict]


def story(run: Run) -> Story:
    """Walk the events once, opening a task's bar when it starts and closing it when it is lost,
    the cluster restarts or the attempt ends."""
    segments, marks, faults, live = [], [], [], {}
    attempt_end = {a.number: a.end for a in attempts(run)}
    seen = set()
    for e in run.events:
        for task, seg in list(live.items()):
            if seg.attempt < e['attempt']:          # its attempt ended with no word of the task
                seg.end = attempt_end[seg.attempt]
                del live[task]
        _mark(e, live, seen, segments, marks, faults)
    for seg in live.values():
        seg.end = attempt_end[seg.attempt]
    tasks = sorted({s.task for s in segments} | {m[0] for m in marks if m[0] != RUN_ROW}, key=_task_order)
    return Story([RUN_ROW] + tasks, segments, marks, faults)


def _mark(e: dict, live: dict, seen: set, segments: list, marks: list, faults: list) -> None:
    kind, t, task = e['event'], e['_t'], str(e.get('task', ''))
    if kind == 'task_started':
        if task in live:
            live.pop(task).end = t
        live[task] = Segment(task, e['attempt'], t)
        segments.append(live[task])
        marks.append((task, t, 'restarted' if task in seen else 'started'))
        seen.add(task)
    elif kind == 'serving' and task in live and live[task].serving is None:
        live[task].serving = t
        marks.append((task, t, 'serving'))
    elif kind in ('first_step', 'checkpoint'):
        marks.append((RUN_ROW, t, kind))
    elif kind == 'task_lost':
        if task in live:
            live.pop(task).end = t
        marks.append((task, t, 'lost'))
        faults.append(_fault(e, task, _lost_text(e)))
    elif kind == 'tolerated':
        marks.append((task, t, 'tolerated'))
    elif kind == 'stall':
        marks.append((RUN_ROW, t, 'stall'))
        tasks = ', '.join(map(str, e.get('tasks') or ()))
        faults.append(_fault(e, RUN_ROW, f'stall{" of " + tasks if tasks else ""}: {e.get("cause", "?")}'))
    elif kind == 'scale':
        marks.append((RUN_ROW, t, 'scale'))
    elif kind == 'failover':
        marks.append((task, t, 'failover'))
        faults.append(_fault(e, task, f'{task}\'s host could not be reached: {e.get("to", "?")} started in its place'))
    elif kind == 'interrupted':
        marks.append((RUN_ROW, t, 'interrupted'))
        faults.append(_fault(e, RUN_ROW, f'interrupted by {e.get("signal") or "a signal"}'))
    elif kind == 'restart' and not e.get('tasks'):       # a task's own restart shows as its new start
        marks.append((RUN_ROW, t, 'restart'))
        _stop_all(live, t, marks)
    elif kind == 'finished':
        state = e['result'].get('state') if isinstance(e.get('result'), dict) else None
        marks.append((RUN_ROW, t, {'done': 'done', 'failed': 'failed'}.get(state, 'ended')))
        _stop_all(live, t, marks)


def _stop_all(live: dict, t: float, marks: list) -> None:
    for task, seg in list(live.items()):
        seg.end = t
        marks.append((task, t, 'stopped'))
    live.clear()


def _lost_text(e: dict) -> str:
    """The cause as the supervisor said it, with the signal or exit code when it does not say them."""
    cause = str(e.get('cause') or f'{e.get("task", "?")} lost')
    if e.get('signal'):
        return cause if str(e['signal']) in cause else f'{cause} ({e["signal"]})'
    code = e.get('exit_code')
    return cause if code is None or f'code {code}' in cause else f'{cause} (exit code {code})'


def _fault(e: dict, row: str, text: str) -> dict:
    return {'t': e['_t'], 'attempt': e['attempt'], 'row': row, 'text': text, 'error': e.get('error')}


def _task_order(name: str):
    """ps tasks first, then the chief, then workers, each by index: the order of a spec's cluster."""
    job, _, index = name.partition(':')
    rank = {'ps': 0, 'chief': 1, 'worker': 2}.get(job, 3)
    return rank, job, int(index) if index.isdigit() else 0, index


# -- the time axis ----------------------------------------------------------------------------------
class TimeAxis:
    """Wall time -> x, piecewise linear. A resume the next morning would crush every attempt into
    a line at either edge, so an idle stretch longer than a third of the rest is cut to a sliver,
    which the plots hatch and label with the time it stood for."""

    def __init__(self, times: list[float], tz: datetime.tzinfo):
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

    def __call__(self, t):
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
        offset = datetime.datetime.fromtimestamp(self.lo, self.tz).utcoffset().total_seconds()
        lo, hi = self.limits
        xs, times = [], []
        for a, b in kept:
            t = math.ceil((a + offset) / step) * step - offset
            while t <= b:
                x = float(self(t))
                if not xs or (x - xs[-1]) / (hi - lo) * width_px > label_px:
                    xs.append(x)
                    times.append(t)
                t += step
        dates = [None] + [self._date(t) for t in times]
        labels = [self._label(t, step, many_days and dates[i] != dates[i + 1]) for i, t in enumerate(times)]
        return xs, labels

    def _date(self, t: float):
        return datetime.datetime.fromtimestamp(t, self.tz).date()

    def _label(self, t: float, step: float, with_date: bool) -> str:
        fmt = ('%b %d ' if with_date else '') + ('%H:%M:%S' if step < 60 else '%H:%M')
        return datetime.datetime.fromtimestamp(t, self.tz).strftime(fmt)

    def decorate(self, ax, width_px: float) -> None:
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


def _xdata_yaxes(ax):
    return blended_transform_factory(ax.transData, ax.transAxes)


# -- plots ------------------------------------------------------------------------------------------
def colour(attempt: int) -> str:
    return ATTEMPT_COLOURS[(attempt - 1) % len(ATTEMPT_COLOURS)]


def png(fig: Figure) -> str:
    """The figure as a data URI; no metadata (matplotlib's would carry its web address)."""
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=100, metadata={'Software': None})
    return 'data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode('ascii')


def timeline_png(run: Run, tale: Story, axis: TimeAxis, runs: list[Attempt]) -> str:
    """One row per task across all attempts: the bars show when each task lived (pale while it
    started, solid once it served), the marks what happened, faults numbered F1.. in the legend."""
    legend_rows = len(tale.faults[:10]) + 2
    fig = Figure(figsize=(12.8, 1.6 + 0.45 * len(tale.rows) + 0.24 * legend_rows), layout='constrained')
    ax = fig.add_subplot()
    y = {name: i for i, name in enumerate(tale.rows)}
    for seg in tale.segments:
        _bar(ax, axis, seg, y[seg.task])
    for kind in MARKS:
        below = 0.36 if kind == 'tolerated' else 0.0      # under the bar: it follows the loss mark at once
        points = [(float(axis(t)), y[row] + below) for row, t, k in tale.marks if k == kind]
        if points:
            _, marker, size, face, edge = MARKS[kind]
            ax.plot(*zip(*points), ls='none', marker=marker, ms=size, mfc=face, mec=edge, mew=1.2, zorder=4)
    for x, row, text in _fault_labels(tale.faults, axis, y.get, 0.035):
        ax.annotate(text, (x, row), xytext=(7, 6), textcoords='offset points',
                    fontsize=8, fontweight='bold', color=LOST, zorder=5,
                    bbox={'boxstyle': 'round,pad=0.15', 'fc': 'white', 'ec': LOST, 'lw': 0.8})
    ax.set_yticks(range(len(tale.rows)), tale.rows)
    ax.set_ylim(len(tale.rows) - 0.4, -0.6)
    ax.grid(axis='x', color='#e5e5e5')
    axis.decorate(ax, 1100)
    _attempt_lines(ax, axis, runs, labels=True)
    _timeline_legend(fig, ax, tale, run.tz, runs)
    return png(fig)


def _bar(ax, axis: TimeAxis, seg: Segment, row: int) -> None:
    x0, x1 = float(axis(seg.start)), float(axis(seg.end if seg.end is not None else seg.start))
    xs = float(axis(seg.serving)) if seg.serving is not None else x1
    ax.barh(row, xs - x0, left=x0, height=0.5, color=colour(seg.attempt), alpha=0.3, lw=0, zorder=2)
    ax.barh(row, x1 - xs, left=xs, height=0.5, color=colour(seg.attempt), alpha=0.85, lw=0, zorder=2)


def _fault_labels(faults: list[dict], axis: TimeAxis, row_of, near: float) -> list[tuple[float, float, str]]:
    """(x, row, 'F3 F4'): faults on one row closer than `near` (a fraction of the axis) share a
    label, so that no two labels overlap."""
    lo, hi = axis.limits
    out: list[list] = []
    for n, f in sorted(enumerate(faults, 1), key=lambda p: (row_of(p[1]['row']), p[1]['t'])):
        x, row = float(axis(f['t'])), row_of(f['row'])
        if out and out[-1][1] == row and x - out[-1][3] < (hi - lo) * near:
            out[-1][2] += f' F{n}'
            out[-1][3] = x
        else:
            out.append([x, row, f'F{n}', x])
    return [(x, row, text) for x, row, text, _ in out]


def _attempt_lines(ax, axis: TimeAxis, runs: list[Attempt], labels: bool) -> None:
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


def _timeline_legend(fig: Figure, ax, tale: Story, tz: datetime.tzinfo, runs: list[Attempt]) -> None:
    """What the marks mean (only those used) and, below, each fault with its time and cause."""
    used = {k for _, _, k in tale.marks}
    handles: dict[str, Line2D] = {}      # by label: a task's and the cluster's restart share one
    for kind, (label, m, s, f, e) in MARKS.items():
        if kind in used:
            handles.setdefault(label, Line2D([], [], ls='none', marker=m, ms=min(s, 11), mfc=f, mec=e, label=label))
    handles = list(handles.values()) + [
        Patch(color='#888888', alpha=0.85, label='task running (colour: attempt)'),
        Patch(color='#888888', alpha=0.3, label='not serving yet')]
    faults = [Line2D([], [], ls='none', label=f'F{n}  {_clock(f["t"], tz)}  attempt {f["attempt"]}  '
                                                f'{_short(f["text"], 110)}')
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


def progress_png(run: Run, axis: TimeAxis, runs: list[Attempt], faults: list[dict]) -> str | None:
    """Loss and images/s over global step and over wall time, one colour per attempt (a resumed
    attempt that re-does steps shows as a second line over the same steps)."""
    series = _series(run)
    if not series:
        return None
    fig = Figure(figsize=(12.8, 7.4), layout='constrained')
    grid = fig.subplots(2, 2)
    for col, (key, name) in enumerate((('loss', 'loss'), ('images_per_sec', 'images/s'))):
        for n, points in series.items():
            _line(grid[0][col], [(p['step'], p[key]) for p in points], n)
            _line(grid[1][col], [(float(axis(p['t'])), p[key]) for p in points], n)
        grid[0][col].set(title=f'{name} over global step', xlabel='global step', ylabel=name)
        grid[1][col].set(title=f'{name} over wall time', ylabel=name)
        axis.decorate(grid[1][col], 540)
        _attempt_lines(grid[1][col], axis, runs, labels=False)
        for f in faults:
            grid[1][col].axvline(float(axis(f['t'])), color=LOST, ls=':', lw=1.2)
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


def _series(run: Run) -> dict[int, list[dict]]:
    """Progress points per attempt: step, loss, images/s (None where not reported), time."""
    out: dict[int, list[dict]] = {}
    for e in run.events:
        step = _num(e.get('step'))
        if e['event'] == 'progress' and step is not None:
            out.setdefault(e['attempt'], []).append({'step': step, 'loss': _num(e.get('loss')), 't': e['_t'],
                                                     'images_per_sec': _num(e.get('images_per_sec'))})
    return out


def _line(ax, points: list[tuple[float, float | None]], attempt: int) -> None:
    points = [(x, y) for x, y in points if y is not None]
    if points:
        ax.plot(*zip(*points), color=colour(attempt), marker='.', ms=5, lw=1.4)


# -- the page ---------------------------------------------------------------------------------------
CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;margin:24px auto;
max-width:1280px;padding:0 16px;color:#1d1d1f}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
table{border-collapse:collapse;margin:4px 0} td,th{border:1px solid #d5d5d5;padding:3px 9px;text-align:left;
vertical-align:top} td:not(:last-child){white-space:nowrap} th{background:#f3f3f3} td.n{text-align:right;font-variant-numeric:tabular-nums}
.head td:first-child{color:#555;background:#fafafa} .sub{color:#555;margin:0 0 12px}
img{max-width:100%;display:block;margin:6px 0}
pre{background:#f7f7f7;border:1px solid #ddd;padding:10px;overflow:auto;font-size:12.5px}
.state{font-weight:bold;padding:1px 8px;border-radius:4px;color:#fff;background:#777}
.done{background:#2e7d32} .failed{background:#c62828} .interrupted{background:#ef6c00}
.fault{color:#c62828} .note{background:#fff8e1;border:1px solid #ffe082;padding:8px 12px}
"""
# Proof, for a test in a real browser, that every plot decoded: the title says how many did.
SCRIPT = """window.addEventListener('load', function () {
  var all = document.images, ok = 0;
  for (var i = 0; i < all.length; i++) if (all[i].complete && all[i].naturalWidth > 0) ok++;
  document.title = 'images-ok ' + ok + '/' + all.length + ' \\u00b7 ' + document.title;
});"""


def render(train_dir: str) -> str:
    """The whole page as one string: nothing outside it is needed to open it."""
    run = load(train_dir)
    runs = attempts(run)
    parts = [_header(run, runs)]
    if run.events:
        parts.append(_plots(run, runs))
        parts.append(_attempts_table(run, runs))
    else:
        parts.append(f'<p class="note">No events yet: {_e(rundir.events_path(train_dir))} is missing or holds '
                     'no event. The run has not started, or its launcher keeps no event log.</p>')
    parts += [_failures(run), _result(run), _spec(run)]
    title = f'{_run_id(run)} report'
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<style>{CSS}</style></head>\n<body>\n' + '\n'.join(p for p in parts if p) +
            f'\n<p class="sub">Written {_e(_clock(datetime.datetime.now().timestamp(), run.tz, True))} by '
            f'<code>launch report</code> from {_e(train_dir)}.</p>\n<script>{SCRIPT}</script>\n</body></html>\n')
    return page.encode('ascii', 'xmlcharrefreplace').decode('ascii')     # opens right whatever the locale


def write(train_dir: str, out: str | None = None) -> str:
    """Render and replace the page in one step: a browser reloading it never sees half a page."""
    path = out or rundir.report_path(train_dir)
    write_atomically(path, render(train_dir))
    return path


def _run_id(run: Run) -> str:
    ids = [e['run'] for e in run.events if e.get('run')]
    return str(run.result.get('id') or (ids[-1] if ids else os.path.basename(os.path.abspath(run.train_dir))))


def _header(run: Run, runs: list[Attempt]) -> str:
    """The result at a glance: what ran, how it ended, how far and how fast it got."""
    r, started = run.result, [e for e in run.events if e['event'] == 'run_started']
    state = str(r.get('state') or ('unknown: no result recorded yet' if run.events else 'not started'))
    rows = [
        ('spec', r.get('spec') or (started[-1].get('spec') if started else None)),
        ('backend', r.get('backend') or (started[-1].get('backend') if started else None)),
        ('state', _Raw(f'<span class="state {_e(state)}">{_e(state)}</span>')),
        ('exit code', r.get('exit_code')),
        ('global step', r.get('global_step', _last(run, 'step'))),
        ('images/s', _fixed(r.get('images_per_sec', _last(run, 'images_per_sec')), 1)),
        ('final loss', _fixed(r.get('loss', _last(run, 'loss')), 4)),
        ('restarts', _restarts(run, r)),
        ('attempts', len(runs) or r.get('attempt')),
        ('duration', _durations(run, r, runs)),
        ('train dir', r.get('train_dir') or os.path.abspath(run.train_dir)),
    ]
    source = f'<p class="sub">Result from {_e(run.result_source)}.</p>' if run.result_source else \
        '<p class="sub">No run.json (or a damaged one): figures from the event log.</p>'
    return (f'<h1>Run {_e(_run_id(run))}</h1>\n{source}\n<table class="head">' +
            ''.join(f'<tr><td>{_e(k)}</td><td>{_cell(v)}</td></tr>' for k, v in rows) + '</table>')


def _last(run: Run, key: str):
    """The newest progress event's value of `key` that is not null: what a run without a result reached."""
    return next((e[key] for e in reversed(run.events) if e['event'] == 'progress' and e.get(key) is not None), None)


def _restarts(run: Run, r: dict) -> str | None:
    """run.json counts the last `launch up`'s restarts; the event log has every attempt's."""
    logged = sum(1 for e in run.events if e['event'] == 'restart')
    if 'restarts' not in r:
        return str(logged) if run.events else None
    return f'{r["restarts"]} (the last launch up); {logged} in the whole run' if logged != r['restarts'] else \
        str(r['restarts'])


def _durations(run: Run, r: dict, runs: list[Attempt]) -> str:
    parts = []
    if _num(r.get('seconds')) is not None:
        parts.append(f'{duration_text(r["seconds"])} (the last launch up)')
    if runs:
        parts.append(f'{duration_text(runs[-1].end - runs[0].start)} from the first event to the last, '
                     f'{_clock(runs[0].start, run.tz, True)} to {_clock(runs[-1].end, run.tz, True)}')
    return '; '.join(parts) or '-'


def _plots(run: Run, runs: list[Attempt]) -> str:
    tale = story(run)
    axis = TimeAxis([e['_t'] for e in run.events], run.tz)
    alt = f'per-task timeline of {len(runs)} attempt(s); ' + '; '.join(
        f'F{n}: {f["text"]} (attempt {f["attempt"]})' for n, f in enumerate(tale.faults, 1))
    out = ['<h2>Timeline</h2>', f'<img alt="{_e(alt)}" src="{timeline_png(run, tale, axis, runs)}">']
    progress = progress_png(run, axis, runs, tale.faults)
    out.append('<h2>Training</h2>')
    out.append(f'<img alt="loss and images/s" src="{progress}">' if progress else
               '<p class="note">No progress events: no worker reported a step.</p>')
    return '\n'.join(out)


def _attempts_table(run: Run, runs: list[Attempt]) -> str:
    head = ('attempt', 'started', 'ended', 'duration', 'resumed from step', 'steps reached', 'tasks lost',
            'how it ended')
    rows = [(f'attempt {a.number}', _clock(a.start, run.tz, True), _clock(a.end, run.tz, True),
             duration_text(a.end - a.start),
             a.resumed_from, a.step, ', '.join(a.lost), a.ended) for a in runs]
    return '<h2>Attempts</h2>\n' + _table(head, rows)


def _failures(run: Run) -> str:
    """Every fault the event log recorded (with the task's last Python error), then run.json's list."""
    faults = story(run).faults if run.events else []
    out = ['<h2>Faults and failures</h2>']
    if faults:
        out.append(_table(('', 'time', 'attempt', 'where', 'what', 'last Python error'),
                          [(_Raw(f'<b class="fault">F{n}</b>'), _clock(f['t'], run.tz, True), f['attempt'], f['row'],
                            f['text'], f['error']) for n, f in enumerate(faults, 1)]))
    failures = [f for f in run.result.get('failures') or () if isinstance(f, dict)]
    if failures:
        out.append(f'<p>Failures in {_e(run.result_source)}:</p>')
        out.append(_table(('task', 'cause', 'host', 'pid'),
                          [(f.get('task'), f.get('cause'), f.get('host'), f.get('pid')) for f in failures]))
    if len(out) == 1:
        out.append('<p>None recorded.</p>')
    return '\n'.join(out)


def _result(run: Run) -> str:
    if not run.result:
        return ''
    rows = [(k, json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in run.result.items()]
    return f'<h2>Result ({_e(run.result_source)})</h2>\n' + _table(('field', 'value'), rows)


def _spec(run: Run) -> str:
    if run.spec_text is None:
        return f'<h2>Effective spec</h2>\n<p>No {_e(rundir.SPEC_FILE)} in the train dir.</p>'
    return f'<h2>Effective spec ({_e(rundir.SPEC_FILE)})</h2>\n<pre>{_e(run.spec_text)}</pre>'


# -- formatting -------------------------------------------------------------------------------------
class _Raw(str):
    """HTML made here, to be put in a cell as it is."""


def _e(value) -> str:
    return html.escape(str(value))


def _cell(value) -> str:
    if isinstance(value, _Raw):
        return value
    return '-' if value is None or value == '' else _e(value)


def _table(head: tuple, rows: list[tuple]) -> str:
    def td(v):
        numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
        return f'<td class="n">{_cell(v)}</td>' if numeric else f'<td>{_cell(v)}</td>'
    return ('<table><tr>' + ''.join(f'<th>{_e(h)}</th>' for h in head) + '</tr>\n' +
            '\n'.join('<tr>' + ''.join(td(v) for v in row) + '</tr>' for row in rows) + '</table>')


def _fixed(value, digits: int) -> str | None:
    """A figure to `digits` places; a diverged loss (NaN, inf) says so rather than vanish."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    number = _num(value)
    return None if number is None else f'{number:.{digits}f}'


def _clock(t: float, tz: datetime.tzinfo, full: bool = False) -> str:
    when = datetime.datetime.fromtimestamp(t, tz)
    return when.isoformat(sep=' ', timespec='seconds') if full else when.strftime('%H:%M:%S')


def _short(text: str, most: int) -> str:
    text = ' '.join(str(text).split())
    return text if len(text) <= most else text[:most - 1] + '\u2026'
