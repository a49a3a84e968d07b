"""`launch up`: start every task, wait for every server, stream output, watch, tear down.

The run is all-or-nothing: the first task to fail (or a deadline, or SIGINT/SIGTERM) stops all the
others, and nothing is left running whichever way the run ends.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
import time
from typing import Mapping

import grpc

from cluster.spec import ClusterSpec, address
from launch.backend import Backend, BackendError, TaskRecord, stop_all, tail
from launch.local import process_ident
from launch.plan import TaskPlan, state_path
from launch.state import LaunchState

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


# TensorFlow's C++ start-up chatter, which TF_CPP_MIN_LOG_LEVEL does not reach (it is printed
# before absl logging is initialised). Hidden from the console only: log files keep every line.
_NOISE = re.compile(
    r'^[IW]\d{4} [\d:.]+ +\d+ \S+\] '                      # absl INFO and WARNING lines
    r'|^WARNING: All log messages before absl::InitializeLog'
    r'|^E\d{4} .*(failed call to cuInit|oneDNN supports DT_UINT8 only)')


class Console:
    """Serialises output lines from many threads, each with its source as a prefix."""

    def __init__(self, stream=None, width: int = 10, verbose: bool = False):
        self.stream = stream or sys.stdout
        self.width = width
        self.verbose = verbose
        self._lock = threading.Lock()

    def line(self, source: str, text: str) -> None:
        if not self.verbose and _NOISE.match(text):
            return
        with self._lock:
            try:
                self.stream.write(f'{"[" + source + "]":<{self.width}} {text}\n')
                self.stream.flush()
            except (BrokenPipeError, ValueError):   # the reader went away (`| head`, a closed tee):
                pass                                  # keep running so the tear-down still happens

    def say(self, text: str) -> None:
        self.line('launch', text)


class TaskFailed(Exception):
    """One line for the user, then the task's last log lines."""

    def __init__(self, message: str, log_tail: list[str] = ()):
        super().__init__(message)
        self.log_tail = list(log_tail)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f'was killed by {signal.Signals(-code).name}'
        except ValueError:
            return f'was killed by signal {-code}'
    return f'exited with code {code}'


def wait_for_servers(records: list[TaskRecord], backends: Mapping[str, Backend], deadline: float,
                     stop: threading.Event) -> None:
    """Return once every task's gRPC server accepts connections; raise TaskFailed naming the first
    task that died on the way or did not come up before the deadline."""
    # Retry connecting every 100-500 ms: gRPC's default backoff grows towards two minutes, so a
    # server that came up during a backoff would be noticed long after it was serving.
    options = [('grpc.enable_http_proxy', 0), ('grpc.initial_reconnect_backoff_ms', 100),
               ('grpc.min_reconnect_backoff_ms', 100), ('grpc.max_reconnect_backoff_ms', 500)]
    pending = {r.name: (r, grpc.insecure_channel(address(r.host, r.port), options=options)) for r in records}
    futures = {name: grpc.channel_ready_future(ch) for name, (_, ch) in pending.items()}
    try:
        while pending and not stop.is_set():
            for name, (record, _) in list(pending.items()):
                code = backends[record.backend].poll(record)
                if code is not None and code != 0:
                    raise TaskFailed(f'{record.name} {describe_exit(code)} during start-up', _log_tail(record, backends))
                if code == 0 or futures[name].done():     # a task that finished already was up
                    del pending[name]
            if pending and time.monotonic() > deadline:
                record = next(iter(pending.values()))[0]
                raise TaskFailed(f'{record.name} ({record.host}:{record.port}) did not accept gRPC connections '
                                 f'in time; raise the limit with --start-timeout', _log_tail(record, backends))
            time.sleep(0.1)
    finally:
        for name, future in futures.items():
            future.cancel()
        for _, ch in pending.values():
            ch.close()


def _log_tail(record: TaskRecord, backends: Mapping[str, Backend], n: int = 15) -> list[str]:
    try:
        return tail(backends[record.backend].read_log(record), n)
    except Exception as e:  # a log we cannot read must not hide the failure itself
        return [f'(could not read {record.log}: {e})']


class ClusterRun:
    def __init__(self, spec: ClusterSpec, spec_yaml: str, plans: list[TaskPlan], backends: Mapping[str, Backend],
                 console: Console, start_timeout: float = 120.0, finish_timeout: float = 60.0):
        self.spec, self.spec_yaml, self.plans, self.backends = spec, spec_yaml, plans, backends
        self.console = console
        self.start_timeout, self.finish_timeout = start_timeout, finish_timeout
        self.records: list[TaskRecord] = []
        self.interrupted = threading.Event()
        self.signum = 0
        self._followers: list[threading.Thread] = []
        self._follow_stop = threading.Event()

    # -- signals --------------------------------------------------------------------------
    def _on_signal(self, signum, frame):
        if not self.interrupted.is_set():
            self.signum = signum
            self.interrupted.set()

    def _install_signals(self):
        signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)    # SIGHUP: the terminal went away
        previous = {s: signal.signal(s, self._on_signal) for s in signals}
        return lambda: [signal.signal(s, h) for s, h in previous.items()]

    # -- the run --------------------------------------------------------------------------
    def up(self) -> int:
        restore = self._install_signals()
        t0 = time.monotonic()
        state = LaunchState.new(self.spec.path, process_ident(os.getpid()) or '')
        try:
            for name, backend in self.backends.items():
                backend.prepare([p for p in self.plans if p.backend == name], self.spec_yaml)
            for plan in self.plans:
                if self.interrupted.is_set():
                    break
                record = self.backends[plan.backend].start(plan)
                self.records.append(record)
                state.tasks.append(record)
                state.save(state_path(self.spec))
                self._follow(record)
            self.console.say(f'started {len(self.records)} tasks; waiting for their servers')
            wait_for_servers(self.records, self.backends, t0 + self.start_timeout, self.interrupted)
            if not self.interrupted.is_set():
                self.console.say(f'all {len(self.records)} servers are up after {time.monotonic() - t0:.1f}s')
                self._watch()
            if self.interrupted.is_set():
                self.console.say(f'{signal.Signals(self.signum).name} received: stopping every task')
                return 128 + self.signum
            self._report(time.monotonic() - t0)
            return EXIT_OK
        except (TaskFailed, BackendError, OSError) as e:    # OSError: e.g. a train_dir we cannot write
            self.console.say(f'error: {e}')
            for line in getattr(e, 'log_tail', ()):
                self.console.say(f'    {line}')
            return EXIT_FAILED
        finally:
            self._teardown()
            if all(not self.backends[r.backend].alive(r) for r in self.records):
                try:
                    os.remove(state_path(self.spec))
                except FileNotFoundError:
                    pass
            restore()

    def _follow(self, record: TaskRecord) -> None:
        def pump():
            for line in self.backends[record.backend].read_log(record, follow=True, stop=self._follow_stop):
                self.console.line(record.name, line)
        t = threading.Thread(target=pump, name=f'follow-{record.name}', daemon=True)
        t.start()
        self._followers.append(t)

    def _watch(self) -> None:
        """Until every task has exited: fail on the first that exits non-zero. Once one side
        (all workers, or all ps tasks) is done, the other gets --finish-timeout to follow."""
        workers = [r for r in self.records if r.job == 'worker']
        ps = [r for r in self.records if r.job == 'ps']
        finished: set[str] = set()
        finish_deadline = None
        while not self.interrupted.is_set():
            for r in self.records:
                if r.name in finished:
                    continue
                code = self.backends[r.backend].poll(r)
                if code is None:
                    continue
                if code != 0:
                    raise TaskFailed(f'{r.name} (pid {r.pid} on {r.host}) {describe_exit(code)}; '
                                     f'last lines of {r.log}:', _log_tail(r, self.backends))
                finished.add(r.name)
            if len(finished) == len(self.records):
                return
            # Once every worker is done the ps tasks exit by themselves; once every ps is done (they
            # wait for every worker's report) a worker has nothing left but to exit.
            workers_done = all(w.name in finished for w in workers)
            if workers_done or all(p.name in finished for p in ps):
                if finish_deadline is None:
                    finish_deadline = time.monotonic() + self.finish_timeout
                elif time.monotonic() > finish_deadline:
                    left = ', '.join(r.name for r in self.records if r.name not in finished)
                    self.console.say(f'warning: {left} still running {self.finish_timeout:.0f}s after the '
                                     f'{"workers" if workers_done else "ps tasks"} finished; stopping them '
                                     '(raise --finish-timeout)')
                    return
            time.sleep(0.2)

    def _teardown(self) -> None:
        stop_all(self.records, self.backends)
        self._follow_stop.set()
        for t in self._followers:
            t.join(timeout=5)

    def _report(self, seconds: float) -> None:
        """One closing line, from the figures each worker left in its train_dir on its host."""
        results = []
        for r in self.records:
            if r.job != 'worker':
                continue
            text = self.backends[r.backend].read_file(r, os.path.join(self.spec.train.train_dir,
                                                                    f'worker-{r.index}.json'))
            if not text:
                continue
            try:
                results.append(json.loads(text))
            except ValueError:
                pass
        mode = 'sync' if self.spec.train.sync else 'async'
        summary = f'done in {seconds:.1f}s ({mode}, {self.spec.num_workers} workers)'
        if results:
            rate = sum(r['images_per_sec'] for r in results)
            summary += f': global step {max(r["global_step"] for r in results)}, {rate:.0f} images/s in all'
            chief = [r for r in results if r['task'] == 'worker:0']
            if chief:
                summary += f', final loss {chief[0]["loss"]:.3f}'
        self.console.say(summary)
