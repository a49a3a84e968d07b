"""The launcher as the run grows (issue #39): `launch up --rehearse` on the local backend at a few
sizes, every task a light stand-in, so that what is measured is the launcher, not TensorFlow.

Per size: spawn to serving (p50, p99, all up), the launcher's CPU share of one core and RSS at
steady state, SIGKILL of 3 workers to the launcher's fault event, the last worker's finish to the
launcher's exit, events.jsonl bytes per minute, and `launch status` / `launch report` time and size.
Imported by bench.py (`--only scale`); it runs only when named.
"""
from __future__ import annotations

import datetime
import glob
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import yaml

from launch.records.rehearsal import percentile     # nearest rank, as the rehearsal's own figures

STEPS_PER_SEC = 100         # the stand-in's pace (cluster/rehearsal)
STEADY_SECS = 20            # steady state wanted once every task is up
SAMPLE_SECS = 0.5
KILLS = 3
MB = 1024 * 1024
PER_TASK_BYTES = 16 * MB    # a stand-in's own memory (PSS 13 MB measured; RSS 21 MB counts shared pages)
HEADROOM_BYTES = 2048 * MB
FAULT_EVENTS = ('task_lost', 'tolerated')
ALL_UP = re.compile(r'all (\d+) servers are up after ([\d.]+)s')
LOG_TIME = re.compile(r'(\d{4}-\d\d-\d\dT[\d:.]+[+-]\d\d:\d\d) I .* finished$')


def layout(size: int) -> tuple[int, int]:
    """(ps, workers): one ps per 50 workers, at least one."""
    ps = max(1, math.ceil(size / 51))
    return ps, size - ps


def stamp(text: str) -> float:
    """An event's or a log line's ISO time as epoch seconds."""
    return datetime.datetime.fromisoformat(text).timestamp()


def write_spec(tmp: str, size: int, free_ports) -> tuple[str, str]:
    """A spec of `size` tasks on free local ports, async (a killed non-chief worker is tolerated)."""
    ps, workers = layout(size)
    ports = free_ports(size)
    train_dir = os.path.join(tmp, f'scale-{size}')
    spec = {'cluster': {'ps': [f'localhost:{p}' for p in ports[:ps]],
                        'worker': [f'localhost:{p}' for p in ports[ps:]]},
            'train': {'sync': False, 'steps': 100, 'batch_size': 16, 'data': 'synthetic', 'train_dir': train_dir,
                      'log_every_secs': 2.0}}
    path = os.path.join(tmp, f'scale-{size}.yaml')
    with open(path, 'w') as f:
        yaml.safe_dump(spec, f)
    return path, os.path.join(train_dir, 'rehearsal')


def read_events(rundir: str) -> list[dict]:
    """The rehearsal's events so far (a half-written last line skipped)."""
    out = []
    try:
        with open(os.path.join(rundir, 'events.jsonl')) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    except FileNotFoundError:
        pass
    return out


class Launcher:
    """`launch up SPEC --rehearse`, its output read as it comes, its CPU and RSS sampled on demand."""

    def __init__(self, spec: str, steps: int, start_timeout: int, env: dict, cwd: str, extra: tuple[str, ...] = ()):
        args = [sys.executable, '-m', 'launch', 'up', spec, '--rehearse', '--set', f'train.steps={steps}',
                '--start-timeout', str(start_timeout), *extra]
        self.t0 = time.time()
        self.proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)
        self.lines: list[str] = []
        self.all_up = threading.Event()
        self.up_after: float | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            got = ALL_UP.search(line)
            if got:
                self.up_after = float(got.group(2))
                self.all_up.set()

    def sample(self, secs: float) -> dict:
        """The launcher's own CPU (share of one core) and RSS over `secs` (children not counted)."""
        rss, start = [], time.monotonic()
        cpu0 = sum(self.ps.cpu_times()[:2])
        while time.monotonic() - start < secs and self.proc.poll() is None:
            rss.append(self.ps.memory_info().rss)
            time.sleep(SAMPLE_SECS)
        wall = time.monotonic() - start
        try:
            cpu = sum(self.ps.cpu_times()[:2]) - cpu0
        except psutil.NoSuchProcess:
            return {'cpu_share': None, 'rss_mb': None, 'sampled_s': wall}
        return {'cpu_share': cpu / wall if wall else None, 'rss_mb': max(rss) / MB if rss else None,
                'sampled_s': wall}

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds so far: the launcher's own, and its tasks' (the children it has now)."""
        own = sum(self.ps.cpu_times()[:2])
        tasks = 0.0
        for child in self.ps.children(recursive=True):
            try:
                tasks += sum(child.cpu_times()[:2])
            except psutil.Error:        # ended meanwhile
                pass
        return own, tasks

    def stop(self) -> None:
        """Kill what this benchmark started (the launcher's session: it and its stand-ins)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def tail(self, n: int = 5) -> str:
        return ''.join(self.lines[-n:])

    def wait_up(self, secs: float) -> bool:
        """Whether every server came up within `secs`; False at once if the launcher ended first."""
        deadline = time.monotonic() + secs
        while time.monotonic() < deadline:
            if self.all_up.wait(1):
                return True
            if self.proc.poll() is not None:
                self.reader.join(5)
                return self.all_up.is_set()
        return False

    def closing(self) -> str:
        """The launcher's own lines, less the rehearsal's link table: the last 3 (why it ended)."""
        own = [line.strip() for line in self.lines if line.startswith('[launch]') and not line.startswith('[launch]     ')]
        return ' | '.join(own[-3:]) or self.tail(2).strip()

    @staticmethod
    def served(rundir: str) -> int:
        return len({e.get('task') for e in read_events(rundir) if e.get('event') == 'serving'})


def kill_workers(rundir: str, workers: int) -> list[tuple[str, float]]:
    """SIGKILL KILLS random non-chief workers, a second apart: [(task, when)]."""
    pids = {e['task']: e['pid'] for e in read_events(rundir) if e.get('event') == 'task_started'}
    chosen = random.sample([f'worker:{i}' for i in range(1, workers)], workers - 1)
    out: list[tuple[str, float]] = []
    for task in chosen:
        if len(out) == KILLS:
            break
        try:
            os.kill(pids[task], signal.SIGKILL)
        except ProcessLookupError:      # already finished: a start-up longer than the steps allowed for
            continue
        out.append((task, time.time()))
        time.sleep(1)
    return out


def fault_delays(rundir: str, kills: list[tuple[str, float]], wait: float = 15) -> list[float | None]:
    """Each kill to the launcher's first fault event for that task after it (None if none in `wait` s)."""
    deadline = time.monotonic() + wait
    while True:
        events = read_events(rundir)
        got = []
        for task, when in kills:
            seen = [stamp(e['time']) for e in events
                    if e.get('event') in FAULT_EVENTS and e.get('task') == task and stamp(e['time']) >= when - 0.01]
            got.append(min(seen) - when if seen else None)
        if None not in got or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def last_finish(rundir: str, events: list[dict]) -> float | None:
    """When the last worker said it finished (its log), else the run's last progress event."""
    ends = []
    for path in glob.glob(os.path.join(rundir, 'logs', 'worker-*.log')):
        with open(path, errors='replace') as f:
            for line in f:
                got = LOG_TIME.search(line.rstrip())
                if got:
                    ends.append(stamp(got.group(1)))
    if ends:
        return max(ends)
    progress = [stamp(e['time']) for e in events if e.get('event') == 'progress']
    return max(progress) if progress else None


def startup(events: list[dict]) -> dict:
    """Each task's first task_started to its first serving (p50, p99) and the first start to the last serving."""
    started, serving = {}, {}
    for e in events:
        kind, task = e.get('event'), e.get('task')
        if kind == 'task_started':
            started.setdefault(task, stamp(e['time']))
        elif kind == 'serving':
            serving.setdefault(task, stamp(e['time']))
    delays = [serving[t] - started[t] for t in serving if t in started]
    last = max(serving.values()) - min(started.values()) if serving and started else None
    return {'serving_p50_s': percentile(delays, 50), 'serving_p99_s': percentile(delays, 99), 'last_serving_s': last,
            'served': len(serving)}


def timed(args: list[str], env: dict, repo: str, timeout: float) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    done = subprocess.run(args, cwd=repo, env=env, capture_output=True, timeout=timeout)
    return time.monotonic() - t0, done


def readers(rundir: str, tmp: str, size: int, env: dict, repo: str, extra: tuple[str, ...] = ()) -> dict:
    """`launch status` and `launch report` on the rehearsal's directory: wall time and size."""
    status_s, status = timed([sys.executable, '-m', 'launch', 'status', rundir, *extra], env, repo, 120)
    html = os.path.join(tmp, f'scale-{size}-report.html')
    report_s, report = timed([sys.executable, '-m', 'launch', 'report', rundir, '-o', html], env, repo, 300)
    return {'status_s': status_s, 'status_bytes': len(status.stdout), 'status_rc': status.returncode,
            'report_s': report_s, 'report_bytes': os.path.getsize(html) if os.path.exists(html) else None,
            'report_rc': report.returncode}


def steps_for(size: int) -> int:
    """Steps for STEADY_SECS of steady state plus the kills, with room for a start-up that grows with N."""
    return STEPS_PER_SEC * (STEADY_SECS + 10 + math.ceil(size * 0.4))     # 300 tasks took ~90 s to be up here


def run_size(size: int, tmp: str, free_ports, env: dict, repo: str, made: tuple | None = None) -> dict:
    """One size, end to end; raises RuntimeError with a short reason where it fails (args[1]: the
    launcher's last lines). `made`: (spec, rundir, cwd, extra launch arguments) of a spec written
    elsewhere (scale_ssh.py), else a local spec of `size` tasks."""
    ps, workers = layout(size)
    spec, rundir, cwd, extra = made or (*write_spec(tmp, size, free_ports), repo, ())
    start_timeout = max(120, size)
    launcher = Launcher(spec, steps_for(size), start_timeout, env, cwd, extra)
    try:
        if not launcher.wait_up(start_timeout + 30):
            raise RuntimeError(f'not all up (launch up rc {launcher.proc.poll()}, {launcher.served(rundir)} of '
                               f'{size} serving): {launcher.closing()}', launcher.tail(40))
        start_cpu = launcher.cpu_seconds()       # what the start cost, and whose it was
        steady = launcher.sample(STEADY_SECS / 2)
        kills = kill_workers(rundir, workers)
        delays = fault_delays(rundir, kills)
        steady_after = launcher.sample(STEADY_SECS / 2)
        try:
            rc = launcher.proc.wait(timeout=steps_for(size) / STEPS_PER_SEC + 120)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f'launch up did not end: {launcher.tail(2).strip()}') from None
        exited = time.time()
    finally:
        launcher.stop()
    launcher.reader.join(5)
    events = read_events(rundir)
    finish = last_finish(rundir, events)
    times = [stamp(e['time']) for e in events]
    run_min = (max(times) - min(times)) / 60 if times else None
    size_bytes = os.path.getsize(os.path.join(rundir, 'events.jsonl'))
    got = [d for d in delays if d is not None]
    out = {'tasks': size, 'ps': ps, 'workers': workers, 'exit_code': rc, 'all_up_s': launcher.up_after,
           **startup(events), 'launcher_cpu_share': steady['cpu_share'], 'launcher_rss_mb': steady['rss_mb'],
           'launcher_cpu_share_after_kills': steady_after['cpu_share'], 'kills': [k for k, _ in kills],
           'start_launcher_cpu_s': start_cpu[0], 'start_tasks_cpu_s': start_cpu[1],
           'fault_seen_s': delays, 'fault_p50_s': percentile(got, 50), 'fault_p99_s': percentile(got, 99),
           'teardown_s': exited - finish if finish else None, 'events_bytes': size_bytes,
           'events_bytes_per_min': size_bytes / run_min if run_min else None}
    out.update(readers(rundir, tmp, size, env, repo, extra))
    return out


def fmt(value, spec: str) -> str:
    return 'n/a'.rjust(len(format(0, spec))) if value is None else format(value, spec)


HEAD = (f'{"tasks":>5} {"ps":>3} {"serve p50":>9} {"p99":>6} {"all up":>6} {"cpu":>5} {"rss MB":>6} '
        f'{"fault p50":>9} {"p99":>6} {"teardn":>6} {"ev KB/min":>9} {"status":>7} {"KB":>6} {"report":>7} {"KB":>6}')


def kb(count: float | None) -> float | None:
    return None if count is None else count / 1024


def row(r: dict) -> str:
    return (f'{r["tasks"]:>5} {r["ps"]:>3} {fmt(r["serving_p50_s"], "8.2f")}s {fmt(r["serving_p99_s"], "5.2f")}s '
            f'{fmt(r["all_up_s"], "5.1f")}s {fmt(r["launcher_cpu_share"], "5.0%")} {fmt(r["launcher_rss_mb"], "6.0f")} '
            f'{fmt(r["fault_p50_s"], "8.2f")}s {fmt(r["fault_p99_s"], "5.2f")}s {fmt(r["teardown_s"], "5.1f")}s '
            f'{fmt(kb(r["events_bytes_per_min"]), "9.1f")} {fmt(r["status_s"], "6.2f")}s '
            f'{fmt(kb(r["status_bytes"]), "6.1f")} {fmt(r["report_s"], "6.2f")}s {fmt(kb(r["report_bytes"]), "6.0f")}')


def fits(size: int) -> tuple[bool, int]:
    """Whether `size` stand-ins fit in the memory free now (N x 16 MB + 2 GB), and what is free."""
    free = psutil.virtual_memory().available
    return free >= size * PER_TASK_BYTES + HEADROOM_BYTES, free


def measured(size: int, run, lead: str = '') -> dict:
    """One row: run() measured and printed (`lead` before it, the SSH rows' host count), or a
    skipped or failed row said so."""
    ok, free = fits(size)
    if not ok:
        print(f'{lead}{size:>5} skipped: {free / MB:.0f} MB free, needs {(size * PER_TASK_BYTES + HEADROOM_BYTES) / MB:.0f}'
              ' MB (N x 16 MB + 2 GB)', flush=True)
        return {'tasks': size, 'skipped': f'{free / MB:.0f} MB free'}
    t0 = time.monotonic()
    try:
        r = run()
    except (RuntimeError, OSError, subprocess.SubprocessError, psutil.Error, KeyError, ValueError) as e:
        print(f'{lead}{size:>5} FAILED after {time.monotonic() - t0:.0f} s: {type(e).__name__}: {e.args[0]}', flush=True)
        return {'tasks': size, 'failed': f'{type(e).__name__}: {e.args[0]}', 'output_tail': e.args[1:]}
    r['wall_s'] = time.monotonic() - t0
    print(lead + row(r), flush=True)
    if r.get('start_tasks_cpu_s') and r.get('all_up_s'):      # local: the tasks are the launcher's children
        cores = os.cpu_count() or 1
        print(f'      start: {r["start_launcher_cpu_s"]:.1f} s of CPU in the launcher '
              f'({r["start_launcher_cpu_s"] / r["all_up_s"]:.0%} of one core), {r["start_tasks_cpu_s"]:.0f} s in the '
              f'tasks ({r["start_tasks_cpu_s"] / r["all_up_s"] / cores:.0%} of {cores} cores), until all up', flush=True)
    if r['exit_code'] or None in r['fault_seen_s']:
        print(f'      note: launch up exited {r["exit_code"]}; kills {r["kills"]} -> fault seen '
              f'{[fmt(d, ".2f") for d in r["fault_seen_s"]]}', flush=True)
    return r


def bench(args, tmp: str, free_ports, env: dict, repo: str) -> dict:
    """Every size of args.scale_sizes in turn, locally, then args.scale_ssh_sizes over SSH to each
    of args.scale_hosts hosts of the rig (scale_ssh.py): a row each, failed or skipped rows said so."""
    print(f'\n== scale: `launch up --rehearse` (local), stand-ins at {STEPS_PER_SEC} steps/s, async, 1 ps per '
          f'50 workers; {KILLS} workers SIGKILLed at steady state; cpu = the launcher\'s share of one core')
    print(HEAD, flush=True)
    rows = [measured(size, lambda size=size: run_size(size, tmp, free_ports, env, repo)) for size in args.scale_sizes]
    import scale_ssh        # beside this script
    ssh_rows = scale_ssh.bench(args, tmp, free_ports, env, repo) if any(n > 0 for n in args.scale_ssh_sizes) else []
    return {'rows': rows, 'ssh_rows': ssh_rows, 'steps_per_sec': STEPS_PER_SEC, 'steady_secs': STEADY_SECS}
