"""`launch report`: one self-contained HTML page that tells a run's story — when each task started,
served, trained, died and was restarted, across every attempt — for the person debugging it the
day after.

Built from `events.jsonl`, `run.json` and `spec.yaml` (read by launch/records/timeline.py), and
for a run that recorded no global step, the train_dir's checkpoint index (a `train.command`
prints no progress line of ours; its checkpoints say how far it got).
TensorFlow is never imported (it takes seconds to load, and `launch up` writes this page at the
end of every attempt): the progress events already carry the loss and images/s. The page needs no
network to open: CSS inline, plots as PNG data URIs (launch/records/plots.py). Damaged input is
skipped with one warning; a run with no events yet still gets a page that says so.
"""
from __future__ import annotations

import datetime
import glob
import html
import math
import os
import statistics
import urllib.parse
from typing import Any, NamedTuple

import yaml

from cluster.runtime import rundir, runjson
from cluster.runtime.contract import job_of
from cluster.runtime.rundir import write_atomically
from cluster.runtime.runjson import short
from cluster.spec.environ import masked_spec_text
from cluster.spec.reader import parse_yaml
from launch.records.event_types import Checkpoint, Evaluation, Progress, Recovered, Restart, RunStarted, Stall, TaskStarted
from launch.records.jsonrecord import finite
from launch.records import telemetry_report
from launch.records.preemptions import preemptions
from launch.records.plots import TimeAxis, clock, progress_png, timeline_png
from launch.records.rehearsal import section_html
from launch.records.result import PHASES, RunRecord
from launch.records.runs import duration_text
from launch.records.timeline import RUN_ROW, Attempt, Fault, Run, Story, attempts, collapsed, load, story  # noqa: F401 (the parts)

STACK_FILES = 200              # stack dump files the page lists at most
STACK_CHARS = 1 << 20          # of each, read at most (a dump is a few kilobytes)
# A field of the run's files is shown to this many characters, as the console cuts a task's last
# error (launch/run/supervised/faults.py ERROR_CHARS): a foreign event log's 50 MB field makes no 50 MB page.
CELL_CHARS = 300
ALT_FAULTS = 10         # faults the timeline's alt text names (the plot's legend names as many)

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


def render(train_dir: str, page_dir: str | None = None) -> str:
    """The whole page as one string: nothing outside it is needed to open it (its links to the
    tasks' stack dumps lead from `page_dir`, where it is written: default the train_dir)."""
    run = load(train_dir)
    runs = attempts(run)
    parts = [_header(run, runs)]
    if run.events:
        parts.append(_plots(run, runs))
        parts.append(_attempts_table(run, runs))
    else:
        parts.append(f'<p class="note">No events yet: {_e(rundir.events_path(train_dir), None)} is missing or holds '
                     'no event. The run has not started, or its launcher keeps no event log.</p>')
    parts += [section_html(run.result.rehearsal), _evaluations(run),
              telemetry_report.section(run.events, run.tz, train_dir, _table), _failures(run), _preemptions(run),
              _recoveries(run), _stacks(run, train_dir if page_dir is None else page_dir), _result(run), _spec(run)]
    title = f'{_run_id(run)} report'
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<style>{CSS}</style></head>\n<body>\n' + '\n'.join(p for p in parts if p) +
            f'\n<p class="sub">Written {_e(clock(datetime.datetime.now().timestamp(), run.tz, True))} by '
            f'<code>launch report</code> from {_e(train_dir, None)}.</p>\n<script>{SCRIPT}</script>\n</body></html>\n')
    return page.encode('ascii', 'xmlcharrefreplace').decode('ascii')     # opens right whatever the locale


def write(train_dir: str, out: str | None = None) -> str:
    """Render and replace the page in one step: a browser reloading it never sees half a page."""
    path = out or rundir.report_path(train_dir)
    write_atomically(path, render(train_dir, os.path.dirname(os.path.abspath(path))))
    return path


def _run_id(run: Run) -> str:
    ids = [e.run for e in run.events if e.run]
    return str(run.result.id or (ids[-1] if ids else os.path.basename(os.path.abspath(run.train_dir))))


def _header(run: Run, runs: list[Attempt]) -> str:
    """The result at a glance: what ran, how it ended, how far and how fast it got."""
    r, started = run.result, [e for e in run.events if isinstance(e, RunStarted)]
    state = str(r.state or ('unknown: no result recorded yet' if run.events else 'not started'))
    rows = [
        ('spec', r.spec or (started[-1].spec if started else None)),
        ('backend', r.backend or (started[-1].backend if started else None)),
        ('state', _Raw(f'<span class="state {_e(state)}">{_e(state)}</span>')),
        ('exit code', r.exit_code),
        ('global step', _global_step(run, r)),
        ('images/s', _fixed(r.images_per_sec if r.has('images_per_sec') else _last(run, 'images_per_sec'), 1)),
        ('final loss', _fixed(r.loss if r.has('loss') else _last(run, 'loss'), 4)),
        ('restarts', _restarts(run, r)),
        *((('preemptions', _preempted(run, r)),) if _preempted(run, r) else ()),
        ('attempts', len(runs) or r.attempt),
        ('duration', _durations(run, r, runs)),
        ('train dir', r.train_dir or os.path.abspath(run.train_dir)),
    ]
    source = f'<p class="sub">Result from {_e(run.result_source)}.</p>' if run.result_source else \
        '<p class="sub">No run.json (or a damaged one): figures from the event log.</p>'
    return (f'<h1>Run {_e(_run_id(run))}</h1>\n{source}\n<table class="head">' +
            ''.join(f'<tr><td>{_e(k)}</td><td>{_cell(v)}</td></tr>' for k, v in rows) + '</table>')


def _global_step(run: Run, r: RunRecord) -> int | str | None:
    """The step the run reached: run.json's, else the newest progress event's, else its newest
    checkpoint's (the chief's checkpoint events, or the train_dir's checkpoint index), said so."""
    if r.global_step is not None:
        return r.global_step
    if _last(run, 'step') is not None:
        return _last(run, 'step')
    saved = [e.step for e in run.events if isinstance(e, Checkpoint) and e.step is not None]
    saved.append(rundir.checkpoint_step(rundir.read_text(rundir.checkpoint_index_path(run.train_dir))) or -1)
    return f'{max(saved)} (its newest checkpoint)' if max(saved) >= 0 else None


def _last(run: Run, key: str) -> Any:
    """The newest progress event's `key` (step, loss, images_per_sec) that is not null: what a run
    without a result reached."""
    return next((getattr(e, key) for e in reversed(run.events)
                 if isinstance(e, Progress) and getattr(e, key) is not None), None)


def _restarts(run: Run, r: RunRecord) -> str | None:
    """run.json counts the last `launch up`'s restarts; the event log has every attempt's."""
    logged = sum(1 for e in run.events if isinstance(e, Restart)       # an evaluator's restarts are its own
                 and not (e.tasks and all(job_of(t) == 'evaluator' for t in e.tasks)))
    if not r.has('restarts'):
        return str(logged) if run.events else None
    return f'{r.restarts} (the last launch up); {logged} in the whole run' if logged != r.restarts else \
        str(r.restarts)


def _preempted(run: Run, r: RunRecord) -> str | None:
    """How many times a task was preempted (None: never), apart from the restarts and faults."""
    logged = len(preemptions(run.events))
    if not logged and not r.preemptions:
        return None
    return f'{logged} (not faults, no restart spent: see Preemptions)'


def _durations(run: Run, r: RunRecord, runs: list[Attempt]) -> str:
    parts = []
    if finite(r.seconds) is not None:
        parts.append(f'{duration_text(r.seconds)} (the last launch up)')
    if runs:
        parts.append(f'{duration_text(runs[-1].end - runs[0].start)} from the first event to the last, '
                     f'{clock(runs[0].start, run.tz, True)} to {clock(runs[-1].end, run.tz, True)}')
    return '; '.join(parts) or '-'


def _plots(run: Run, runs: list[Attempt]) -> str:
    tale = collapsed(story(run))
    axis = TimeAxis([e.epoch for e in run.events], run.tz)
    alt = f'timeline of {len(tale.rows) - 1} row(s) of tasks, {len(runs)} attempt(s); ' + '; '.join(
        f'F{n}: {short(f.text, CELL_CHARS)} (attempt {f.attempt})' for n, f in enumerate(tale.faults[:ALT_FAULTS], 1))
    alt += f'; {len(tale.faults) - ALT_FAULTS} more faults in the table below' if len(tale.faults) > ALT_FAULTS else ''
    out = ['<h2>Timeline</h2>', f'<img alt="{_e(alt, None)}" src="{timeline_png(run, tale, axis, runs)}">']
    progress = progress_png(run, axis, runs, tale.faults)
    out.append('<h2>Training</h2>')
    out.append(f'<img alt="loss and images/s" src="{progress}">' if progress else
               f'<p class="note">No progress events: {_e(_why_no_progress(_roles(run)), None)}.</p>')
    return '\n'.join(out)


def _why_no_progress(roles: _Roles) -> str:
    """Why the launcher saw no step, in the words of what ran."""
    if roles.command:
        who = "the chief's" if roles.coordinator else "the tasks'"
        return (f'{who} train.command prints its own lines, not tfcluster\'s progress lines; how far it got is '
                'read from the checkpoints it writes to train_dir, if any (the global step above)')
    return 'the chief reported no step (ctx.report)' if roles.coordinator else 'no worker reported a step'


def _attempts_table(run: Run, runs: list[Attempt]) -> str:
    head = ('attempt', 'started', 'ended', 'duration', 'resumed from step', 'steps reached', 'tasks lost',
            'how it ended')
    rows = [(f'attempt {a.number}', clock(a.start, run.tz, True), clock(a.end, run.tz, True),
             duration_text(a.end - a.start),
             a.resumed_from, a.step, ', '.join(a.lost), a.ended) for a in runs]
    return '<h2>Attempts</h2>\n' + _table(head, rows)


def _evaluations(run: Run) -> str:
    """A coordinator run's evaluator: its figures for each checkpoint it evaluated ('' for none)."""
    found = [e for e in run.events if isinstance(e, Evaluation)]
    if not found:
        return _unevaluated(run)
    names = sorted({name for e in found for name in (e.metrics or {})})
    rows = [(clock(e.epoch, run.tz, True), e.attempt, e.step, *((e.metrics or {}).get(n) for n in names))
            for e in found]
    return '<h2>Evaluation</h2>\n' + _table(('time', 'attempt', 'global step', *names), rows)


def _unevaluated(run: Run) -> str:
    """A run that ended with an evaluator that reported no evaluation: said plainly ('' for a run
    with no evaluator, or one still going)."""
    names = sorted({e.task for e in run.events if isinstance(e, TaskStarted) and e.task and job_of(e.task) == 'evaluator'})
    if not names or run.result.is_empty():
        return ''
    return ('<h2>Evaluation</h2>\n<p class="note">No checkpoint was evaluated: ' + _e(', '.join(names)) +
            f' reported no evaluation. It evaluates the checkpoints named <code>{rundir.CHECKPOINT_PREFIX}-&lt;step&gt;'
            '</code> in the train dir (TensorFlow\'s <code>checkpoint</code> index names the newest): its log says '
            'whether it found none or failed on them.</p>')


def _failures(run: Run) -> str:
    """Every fault the event log recorded (with the task's last Python error), then run.json's list."""
    faults = story(run).faults if run.events else []
    out = ['<h2>Faults and failures</h2>']
    if faults:
        out.append(_table(('', 'time', 'attempt', 'where', 'what', 'last Python error'),
                          [(_Raw(f'<b class="fault">F{n}</b>'), clock(f.t, run.tz, True), f.attempt, f.row,
                            f.text, f.error) for n, f in enumerate(faults, 1)]))
    failures = run.result.failures or []
    if failures:
        out.append(f'<p>Failures in {_e(run.result_source)}:</p>')
        out.append(_table(('task', 'cause', 'host', 'pid'), [(f.task, f.cause, f.host, f.pid) for f in failures]))
    if len(out) == 1:
        out.append('<p>None recorded.</p>')
    return '\n'.join(out)


def _preemptions(run: Run) -> str:
    """Each preemption notice (a SIGTERM from outside the launcher), apart from the faults: the task,
    when, its grace, the save (notice to the chief's checkpoint), the time to training again and
    the steps trained again ('' for none)."""
    found = preemptions(run.events)
    if not found:
        return ''
    rows = [(clock(p.notice.epoch, run.tz, True), p.notice.attempt, p.task, p.notice.step, _fixed(p.notice.grace, 0),
             _fixed(p.save, 1), _fixed(p.seconds, 1), p.redone) for p in found]
    return ('<h2>Preemptions</h2>\n<p>Notices from outside the launcher (a node shutting down, a pod deleted, '
            '<code>launch preempt</code>): not faults, and none of <code>supervise.max_restarts</code> spent.</p>\n'
            + _table(('time', 'attempt', 'task', 'step at notice', 'grace (s)', 'save (s)', 'training again (s)',
                      'steps redone'), rows))


def _recoveries(run: Run) -> str:
    """How long each fault took to mend (the `recovered` events), phase by phase ('' for none)."""
    found = [e for e in run.events if isinstance(e, Recovered)]
    if not found:
        return ''
    seconds = sorted(e.seconds for e in found if e.seconds is not None)
    phases = [p for p in PHASES if p != 'save' or any(e.preempted for e in found)]     # 'save': a preemption's
    rows = [(clock(e.epoch, run.tz, True), e.attempt, ', '.join(e.tasks or ()) + (' (preempted)' if e.preempted else ''),
             _fixed(e.seconds, 1), e.steps_redone, *(_fixed((e.phases or {}).get(p), 1) for p in phases)) for e in found]
    summary = (f'<p>{len(found)} fault(s) mended: training again {statistics.median(seconds):.1f}s after the fault '
               f'seen (median; longest {seconds[-1]:.1f}s), {sum(e.steps_redone or 0 for e in found)} step(s) '
               'trained again in all.</p>') if seconds else ''
    return ('<h2>Recoveries</h2>\n' + summary
            + _table(('time', 'attempt', 'restarted', 'seconds', 'steps redone', *(f'{p} (s)' for p in phases)), rows))


def _stacks(run: Run, page_dir: str) -> str:
    """The tasks' stack dumps (a stall's, `launch debug`'s, a `kill -USR1`'s), linked: where each
    task was stuck. A file that holds only its header (no dump was asked for) is left out."""
    root = os.path.join(run.train_dir, rundir.STACKS_DIR)
    found = sorted(glob.glob(os.path.join(glob.escape(root), '*.txt'))
                   + glob.glob(os.path.join(glob.escape(root), rundir.attempt_dirname('*'), '*.txt')))
    rows = []
    for path in found[:STACK_FILES]:
        try:
            with open(path, encoding='utf-8', errors='replace') as f:
                text = f.read(STACK_CHARS)
        except OSError:
            continue
        if '\n  File "' not in text:
            continue
        where = os.path.relpath(path, run.train_dir)
        folder = os.path.dirname(where)
        attempt = folder.split('-')[-1] if folder != rundir.STACKS_DIR else '-'
        name = os.path.basename(path)[:-len('.txt')]
        task = ':'.join(name.rsplit('-', 1))
        link = urllib.parse.quote(os.path.relpath(os.path.abspath(path), os.path.abspath(page_dir)))
        rows.append((attempt, task, _Raw(f'<a href="{_e(link, None)}">{_e(where)}</a>'), text.count('\n  File "')))
    if not rows:
        return ''
    stalls = [f'attempt {e.attempt}, {clock(e.epoch, run.tz, True)}: {e.stacks}' for e in run.events
              if isinstance(e, Stall) and e.stacks]
    said = f'<p>Taken at the stall{"s" if len(stalls) > 1 else ""}: {_e("; ".join(stalls))}.</p>' if stalls else ''
    return ('<h2>Stack dumps</h2>\n<p>Every thread\'s Python stack, written by each task that answered (a stall, '
            '<code>launch debug</code>, or <code>kill -USR1</code>).</p>\n' + said
            + _table(('attempt', 'task', 'file', 'frames'), rows))


def _result(run: Run) -> str:
    if run.result.is_empty():
        return ''
    rows = [(k, runjson.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in run.result.to_json().items()]
    return f'<h2>Result ({_e(run.result_source)})</h2>\n' + _table(('field', 'value'), rows)


# The built-in TF1 trainer's own settings (SyncReplicasOptimizer, towers, its input order, what
# crosses to the ps): a coordinator run's ParameterServerStrategy program has none of them.
TF1_TRAINER_KEYS = ('sync', 'replicas_to_aggregate', 'devices', 'transfer_dtype', 'deterministic')


class _Roles(NamedTuple):
    coordinator: bool       # a chief: a TF2 ParameterServerStrategy run
    command: bool           # train.command: the user's own process, its own lines


def _spec_data(run: Run) -> dict:
    """spec.yaml as data ({} when missing or not YAML)."""
    if run.spec_text is None:
        return {}
    try:
        raw = parse_yaml(run.spec_text, 'spec', line_numbers=False)[1]
    except ValueError:
        return {}
    return raw if isinstance(raw, dict) else {}


def _roles(run: Run) -> _Roles:
    raw = _spec_data(run)
    cluster, train = raw.get('cluster'), raw.get('train')
    return _Roles(isinstance(cluster, dict) and bool(cluster.get('chief')),
                  isinstance(train, dict) and train.get('command') is not None)


def _spec(run: Run) -> str:
    if run.spec_text is None:
        return f'<h2>Effective spec</h2>\n<p>No {_e(rundir.SPEC_FILE)} in the train dir.</p>'
    text = masked_spec_text(run.spec_text)       # a page to share: no secret-looking env value
    if text is None:
        return f'<h2>Effective spec</h2>\n<p>{_e(rundir.SPEC_FILE)} is not YAML; not shown (it may hold secrets).</p>'
    text, dropped = _without_tf1_keys(run, text)
    note = (f'<p>Left out: {_e(", ".join(f"train.{k}" for k in dropped))}, the TF1 trainer\'s settings, which a '
            'coordinator run (TF2 ParameterServerStrategy, always asynchronous) does not use.</p>\n') if dropped else ''
    return f'<h2>Effective spec ({_e(rundir.SPEC_FILE)})</h2>\n{note}<pre>{_e(text, None)}</pre>'


def _without_tf1_keys(run: Run, text: str) -> tuple[str, list[str]]:
    """A coordinator run's spec text without the TF1 trainer's settings (the launcher writes every
    train key to spec.yaml), and the keys left out; any other spec as it is."""
    if not _roles(run).coordinator:
        return text, []
    raw = parse_yaml(text, 'spec', line_numbers=False)[1]      # read once already: it parses
    train = raw.get('train') if isinstance(raw, dict) else None
    if not isinstance(train, dict):
        return text, []
    dropped = [k for k in TF1_TRAINER_KEYS if k in train]
    if not dropped:
        return text, []
    shown = {**raw, 'train': {k: v for k, v in train.items() if k not in dropped}}
    return yaml.safe_dump(shown, sort_keys=False), dropped


# -- formatting -------------------------------------------------------------------------------------
class _Raw(str):
    """HTML made here, to be put in a cell as it is."""


def _e(value: Any, most: int | None = CELL_CHARS) -> str:
    """A value as HTML text, cut to `most` characters as the console cuts (None: whole)."""
    text = str(value)
    return html.escape(text if most is None else short(text, most))


def _cell(value: Any) -> str:
    if isinstance(value, _Raw):
        return value
    return '-' if value is None or value == '' else _e(value)


def _table(head: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    def td(v: Any) -> str:
        numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
        return f'<td class="n">{_cell(v)}</td>' if numeric else f'<td>{_cell(v)}</td>'
    return ('<table><tr>' + ''.join(f'<th>{_e(h)}</th>' for h in head) + '</tr>\n' +
            '\n'.join('<tr>' + ''.join(td(v) for v in row) + '</tr>' for row in rows) + '</table>')


def _fixed(value: Any, digits: int) -> str | None:
    """A figure to `digits` places; a diverged loss (NaN, inf) says so rather than vanish."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    number = finite(value)
    return None if number is None else f'{number:.{digits}f}'
