"""Drivers for the golden files (tests/unit/test_golden_*.py): the `launch` command line run in
this process with its output caught, and a supervised run over a scripted backend whose run files
(events.jsonl, run.json) are read back with what varies from run to run (times, pids, paths)
replaced by placeholders. The golden files pin today's behaviour so that a restructuring which
changes none can show it: the same files, byte for byte."""
from __future__ import annotations

import contextlib
import difflib
import io
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.runtime import rundir
from cluster.spec import load_spec
from launch.backends.base import ENDED, RUNNING, Backend, Observation, TaskRecord, planned_record
from launch.planning.plan import plan_cluster
from launch.run.supervised import loop as supervised
from launch.run.console import Console
from launch.run.lifecycle import Lifecycle
from launch.run.supervised import SupervisedRun

LINE_TIME = '2026-11-23T12:00:00.000+00:00'      # the time a scripted task's line carries


@dataclass(frozen=True)
class CliResult:
    """One command line's exit code and what it wrote."""
    code: int
    out: str
    err: str


def run_cli(argv: list[str]) -> CliResult:
    """`launch ARGV...` in this process: its exit code (SystemExit's where argparse exits), its
    standard output and error. Logging goes to the caught error stream, as the command line's
    own handler would send it, and the SIGPIPE disposition main() changes is put back."""
    from launch.cli import main
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    pipe = signal.getsignal(signal.SIGPIPE)
    root.handlers = []
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = handlers, level
        signal.signal(signal.SIGPIPE, pipe)
    return CliResult(int(code), out.getvalue(), err.getvalue())


WRITE = 'TFCLUSTER_GOLDEN_WRITE'     # set (to anything) to rewrite the golden files instead of comparing


def check_golden(path: Path, text: str) -> None:
    """Compare text with the golden file at path (a unified diff on a mismatch), or, with
    TFCLUSTER_GOLDEN_WRITE set, write it there."""
    if os.environ.get(WRITE):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding='utf-8')
        return
    if not path.is_file():
        pytest.fail(f'no golden file {path}: write it with {WRITE}=1 and read what it holds')
    want = path.read_text(encoding='utf-8')
    if text != want:
        diff = difflib.unified_diff(want.splitlines(keepends=True), text.splitlines(keepends=True),
                                    f'{path.name} (golden)', f'{path.name} (now)')
        pytest.fail(f'{path} differs (rewrite with {WRITE}=1 only if the change is meant):\n' + ''.join(diff),
                    pytrace=False)


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version('tfcluster')
    except PackageNotFoundError:
        return None


def normalizer(tmp: Path, repo: str) -> Callable[[str], str]:
    """A function that replaces, in a text, what varies between machines and runs: the test's
    temporary directory, the index of runs (TFCLUSTER_STATE_DIR), the checkout, the Python, the
    home directory and the installed version, longest first (one may hold another)."""
    places = {str(tmp): '<TMP>', os.path.realpath(tmp): '<TMP>', repo: '<REPO>', sys.executable: '<PYTHON>',
              os.path.expanduser('~'): '<HOME>'}
    if os.environ.get('TFCLUSTER_STATE_DIR'):
        places[os.environ['TFCLUSTER_STATE_DIR']] = '<STATE>'
    order = sorted((p for p in places if len(p) > 1), key=len, reverse=True)
    version = _version()

    def normal(text: str) -> str:
        for place in order:
            text = text.replace(place, places[place])
        if version:
            text = text.replace(f'launch {version}\n', 'launch <VERSION>\n')
        return text
    return normal


# -- supervised runs over a scripted backend ----------------------------------------------------------
@dataclass(frozen=True)
class Start:
    """What one start of a task does: writes `lines` (after its serving line), then, once every
    line was read and every task in `after` is through (its lines read, its own exit, if any, seen),
    exits with `code` (None: runs until
    stopped). Conditions, not times: the order of what the launcher sees is the same on any machine."""
    lines: tuple[str, ...] = ()
    code: int | None = None
    after: tuple[str, ...] = ()
    early: bool = False     # exits with `code` at once, before it serves: no task of this start says it serves


def progress(step: int, total: int = 100) -> str:
    return f'{LINE_TIME} I {rundir.progress_line(step, total, 1.5)}'


def saved(step: int) -> str:
    return f'{LINE_TIME} I {rundir.checkpoint_line(step)}'


class GatedBackend(Backend):
    """Tasks that exist only as a script: task -> its starts in order (the last repeats). Once the
    launcher follows every task of a start, each says it serves once the task before it in the plan
    was seen serving, then (every server found up) writes its lines once those before it were read: the launcher sees the
    same order on any machine. A task exits only after the launcher read all its lines. A worker that exited 0 leaves its closing figures, as the real one does."""
    name = 'gated'

    def __init__(self, script: dict[str, list[Start]], order: list[str], checkpoint_step: int | None = None):
        self.script, self.order, self.checkpoint_step = script, order, checkpoint_step
        self.starts: dict[str, int] = {}
        self.read: set[tuple[str, int]] = set()        # (task, start) whose lines were all read
        self.served: set[tuple[str, int]] = set()      # (task, start) whose serving line was read
        self.following: set[tuple[str, int]] = set()   # (task, start) whose log the launcher follows
        self.saying: set[tuple[str, int]] = set()      # (task, start) whose serving line is out
        self.probed: set[tuple[str, int]] = set()      # (task, start) the launcher found up
        self.stopped: dict[str, int] = {}
        self.changed = threading.Condition()

    def _now(self, name: str) -> Start:
        starts = self.script.get(name) or [Start()]
        return starts[min(self.starts[name], len(starts)) - 1]

    def check(self, plans, imports=False):
        return []

    def start(self, plan):
        with self.changed:
            self.starts[plan.name] = self.starts.get(plan.name, 0) + 1
            self.stopped.pop(plan.name, None)
            self.changed.notify_all()
        t = plan.task
        return TaskRecord(t.name, t.job, t.index, t.host, t.port, self.name, 4000 + self.order.index(t.name), 'log',
                          ident=str(self.starts[plan.name]))

    def _exit(self, name: str) -> int | None:
        start = self._now(name)
        if start.early:
            return start.code
        if start.code is None or (name, self.starts[name]) not in self.read:
            return None
        if not all(self._through(other) for other in start.after):
            return None
        return start.code

    def _through(self, name: str) -> bool:
        """The task's lines were read and, if its script ends it, it ended."""
        if name not in self.starts or (name, self.starts[name]) not in self.read:
            return False
        return self._now(name).code is None or name in self.stopped or self._exit(name) is not None

    def status(self, record):
        with self.changed:
            if record.name in self.stopped:
                return Observation(ENDED, self.stopped[record.name])
            code = self._exit(record.name)
        return Observation(RUNNING) if code is None else Observation(ENDED, code)

    def probe(self, record, timeout, handshake=True, channel_ready=None):
        up = self.status(record).state == RUNNING
        key = (record.name, self.starts[record.name])
        with self.changed:
            # Once its serving line is out, the launcher may count the task up as soon as it has
            # read it: wait for that, so the task counts as probed exactly when the launcher has it up.
            while key in self.saying and key not in self.served:
                self.changed.wait(0.01)
            if up and key in self.served:
                self.probed.add(key)
                self.changed.notify_all()
        return up

    def stop(self, records, grace=0):
        with self.changed:
            for r in records:
                self.stopped.setdefault(r.name, -signal.SIGTERM)
            self.changed.notify_all()

    def log_record(self, plan):
        return planned_record(plan, 'log', '', self.name)

    def _wait(self, ready, stop) -> bool:
        """Wait for ready() (True) or the follower's stop (False)."""
        with self.changed:
            while not ready():
                if stop is None or stop.is_set():
                    return False
                self.changed.wait(0.01)
            return True

    def read_log(self, record, follow=False, stop=None, offset=0):
        name = record.name
        start = self.starts[name]
        with self.changed:
            self.following.add((name, start))
            self.changed.notify_all()
        earlier, began = self.order[:self.order.index(name)], self.order     # every task starts each time
        if not self._wait(lambda: all((t, start) in self.following for t in began)
                          and all((t, start) in self.served for t in earlier)
                          and not any(self._now(t).early for t in began if self.starts.get(t) == start), stop):
            return
        with self.changed:
            self.saying.add((name, start))
        yield f'{LINE_TIME} I ' + rundir.serving_line(name, record.endpoint, record.pid)
        with self.changed:
            self.served.add((name, start))
            self.changed.notify_all()
        if not self._wait(lambda: all((t, start) in self.served and (t, start) in self.probed for t in began)
                          and all((t, start) in self.read for t in earlier), stop):
            return
        yield from self._now(name).lines
        with self.changed:
            self.read.add((name, start))
            self.changed.notify_all()

    def read_file(self, record, path):
        if path.endswith(rundir.CHECKPOINT_INDEX):
            step = self.checkpoint_step
            return None if step is None else f'model_checkpoint_path: "model.ckpt-{step}"\n'
        for name in self.starts:
            index = int(name.split(':')[1])
            if name.startswith('worker:') and path == rundir.result_path(os.path.dirname(path), index):
                with self.changed:
                    done = self._exit(name) == 0 and name not in self.stopped
                if done:
                    return json.dumps({'task': name, 'global_step': 100, 'loss': 1.5, 'images_per_sec': 50.0})
        return None


@dataclass(frozen=True)
class RunFiles:
    """What a scripted run left: its result, the console's text and its files' normalized text."""
    state: str
    exit_code: int
    console: str
    events: str
    run_json: str
    launch_state: str | None


def drive(spec_path: str, backend: GatedBackend, interrupt_when: Callable[[str], bool] | None = None) -> RunFiles:
    """`launch up` of the spec over the backend, in this process (supervise rounds shortened):
    the run's files read back. `interrupt_when`: a SIGINT once it holds of the console's text (polled)."""
    spec = load_spec(spec_path)
    plans = [p.__class__(**{**p.__dict__, 'backend': backend.name}) for p in plan_cluster(spec)]
    out = io.StringIO()
    life = Lifecycle(spec, Console(stream=out), report=False)
    strategy = SupervisedRun(spec, '', plans, {backend.name: backend}, start_timeout=30, finish_timeout=30)
    done = threading.Event()
    if interrupt_when is not None:
        def interrupt() -> None:
            while not done.is_set():
                if interrupt_when(out.getvalue()):
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                time.sleep(0.01)
        threading.Thread(target=interrupt, daemon=True).start()
    saved_secs = supervised.SUPERVISE_SECS
    supervised.SUPERVISE_SECS = 0.01
    try:
        result = life.up(strategy)
    finally:
        done.set()
        supervised.SUPERVISE_SECS = saved_secs
    train_dir = spec.train.train_dir

    def text(path: str) -> str | None:
        return Path(path).read_text(encoding='utf-8') if os.path.exists(path) else None
    return RunFiles(str(result.state), result.exit_code, out.getvalue(), text(rundir.events_path(train_dir)) or '',
                    text(rundir.run_path(train_dir)) or '', text(rundir.state_path(train_dir)))


VARYING = [
    (re.compile(r'"(time|started|ended)": "[^"]*"'), r'"\1": "<TIME>"'),
    (re.compile(r'"seconds": [0-9.]+'), '"seconds": "<SECS>"'),
    (re.compile(r'"phases": \{[^}]*\}'), '"phases": "<SECS each>"'),
    (re.compile(r'"launcher_pid": \d+'), '"launcher_pid": "<PID>"'),
    (re.compile(r'\bspec-\d{8}-\d{6}\b'), '<RUN>'),
    (re.compile(r'\b\d+\.\d+s\b'), '<SECS>s'),
    (re.compile(r'launcher pid \d+'), 'launcher pid <PID>'),
]


def run_text(files: RunFiles, tmp: Path, repo: str) -> str:
    """A scripted run's files as one text, with what varies between runs replaced (the task lines
    the console echoes left out: their threads interleave with the launcher's lines)."""
    paths = normalizer(tmp, repo)

    def normal(text: str) -> str:
        text = paths(text)
        for pattern, placeholder in VARYING:
            text = pattern.sub(placeholder, text)
        return text
    state = '(none)\n' if files.launch_state is None else normal(files.launch_state)
    launcher = ''.join(line for line in files.console.splitlines(keepends=True) if line.startswith('[launch]'))
    return (f'state: {files.state}\nexit: {files.exit_code}\n'
            f'--- console (the launcher\'s lines)\n{normal(launcher)}'
            f'--- events.jsonl\n{normal(files.events)}'
            f'--- run.json\n{normal(files.run_json)}'
            f'--- launch-state.json\n{state}')
