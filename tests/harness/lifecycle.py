"""Helpers of the tests of lifecycle, used by
tests/unit/launch/records/test_run_index.py, tests/unit/launch/run/test_lifecycle.py: here, since no test module
imports another."""
from __future__ import annotations

import json
import os
import signal
import threading
import time


from cluster.runtime import rundir
from launch.backends.base import ENDED, RUNNING, Backend, Observation, TaskRecord, planned_record


NOW = '2026-11-23T12:00:00.000+00:00'      # a task line's time (nothing here reads it)


class ScriptedBackend(Backend):
    """Tasks that exist only as a script: for each task and start (1, 2, ...), a list of
    (seconds after its start, what happens): ('log', line) or ('exit', code). A task not told to
    exit runs until stopped (exit -15). Every start says it serves at once.

    A start's clock begins when the launcher has read its serving line (`clock='serving'`), so the
    script's times do not race the launcher's own start-up however busy the machine is; with
    `clock='spawn'` it begins at the start itself, for a task that must end during start-up."""
    name = 'scripted'

    def __init__(self, script, checkpoint_step: int | None = None, clock: str = 'serving'):
        self.script = script
        self.clock = clock
        self.starts: dict[str, list[float]] = {}
        self.since: dict[str, float | None] = {}    # task -> its current start's clock (None: not begun)
        self.stopped: dict[str, int] = {}           # task -> its exit code once stopped
        self.checkpoint_step = checkpoint_step
        self.lock = threading.Lock()

    def check(self, plans, imports=False):
        return []

    def start(self, plan):
        with self.lock:
            self.starts.setdefault(plan.name, []).append(time.monotonic())
            self.since[plan.name] = time.monotonic() if self.clock == 'spawn' else None
            self.stopped.pop(plan.name, None)
        t = plan.task
        return TaskRecord(t.name, t.job, t.index, t.host, t.port, self.name, 1000 + len(self.starts), 'log',
                          ident=str(len(self.starts[plan.name])))

    def _events(self, record):
        attempt = len(self.starts[record.name])
        events = self.script.get(record.name, {})
        return self.since[record.name], events.get(attempt, events.get('*', []))

    def status(self, record):
        with self.lock:
            if record.name in self.stopped:
                return Observation(ENDED, self.stopped[record.name])
            started, events = self._events(record)
        if started is None:
            return Observation(RUNNING)
        now = time.monotonic() - started
        code = next((value for at, what, value in events if what == 'exit' and at <= now), None)
        return Observation(RUNNING) if code is None else Observation(ENDED, code)

    def probe(self, record, timeout, handshake=True, channel_ready=None):
        return self.status(record).state == RUNNING

    def stop(self, records, grace=0):
        with self.lock:
            for r in records:
                self.stopped.setdefault(r.name, -signal.SIGTERM)

    def log_record(self, plan):
        return planned_record(plan, 'log', '', self.name)

    def read_log(self, record, follow=False, stop=None, offset=0):
        yield f'{NOW} I ' + rundir.serving_line(record.name, record.endpoint, record.pid)
        with self.lock:         # the launcher took the serving line: this start's clock begins
            if self.since.get(record.name) is None:
                self.since[record.name] = time.monotonic()
            started, events = self._events(record)
        pending = sorted((at, value) for at, what, value in events if what == 'log')
        while pending:
            if time.monotonic() - started >= pending[0][0]:
                yield pending.pop(0)[1]
            elif stop is None or stop.is_set():
                return
            else:
                time.sleep(0.01)

    def read_file(self, record, path):
        if path.endswith(rundir.CHECKPOINT_INDEX):
            step = self.checkpoint_step
            return None if step is None else f'model_checkpoint_path: "model.ckpt-{step}"\n'
        for i in range(8):
            if path == rundir.result_path(os.path.dirname(path), i) and f'worker:{i}' in self.starts:
                seen = self.status(TaskRecord(f'worker:{i}', 'worker', i, '', 0, self.name, 0, ''))
                if seen.state == ENDED and seen.exit_code == 0:
                    return json.dumps({'task': f'worker:{i}', 'global_step': 100, 'loss': 1.5,
                                       'images_per_sec': 50.0})
        return None


def step(n, total=100):
    return ('log', f'{NOW} I {rundir.progress_line(n, total, 2.0)}')


# Times are after the launcher read the task's serving line (ScriptedBackend's clock).
DONE = [(0.3, *step(50)), (0.4, *step(100)), (0.5, 'exit', 0)]

