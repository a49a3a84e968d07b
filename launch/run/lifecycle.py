"""The one run lifecycle every `launch up` goes through, whichever backend runs the tasks.

    lock the train_dir -> the strategy prepares (bad input: nothing left, exit 2) -> clear an
    earlier run's figures -> two-stage signals -> the strategy runs -> every log line shown ->
    one closing line -> a typed RunResult

Two strategies run on it: supervised (launch/run/supervised/loop.py: the launcher starts, observes and
stops every task through a Backend, and decides with launch/run/policy.py) and delegated (a
scheduler owns the tasks: launch/backends/slurm/job.py submits, watches and cancels a Slurm job). What the
user sees at the edges — the lock message, Ctrl-C twice, the resume line, the closing summary —
is written once, here.
"""
from __future__ import annotations

import hashlib
import importlib
import logging
import os
import re
import shlex
import signal
import threading
import time
from typing import Any
from collections.abc import Callable, Iterable

from cluster.runtime import contract, messages, rundir, runjson
from cluster.runtime.rundir import EXIT_OK, write_atomically
from cluster.spec import ClusterSpec
from launch.errors import UsageError
from launch.records.event_types import (Checkpoint, Evaluation, Event, Finished, FirstStep, Progress, Restart,
                                        RunStarted, Serving, TaskStarted)
from launch.records.events import EventLog, typed_events, typed_run_record
from launch.records.jsonrecord import read_real, read_whole
from launch.records.result import Failure, RunRecord, RunResult, RunState  # noqa: F401 (the strategies import them from here)
from launch.records.result import steps_note
from cluster.runtime.masking import spec_masker
from launch.records.lock import LockBusy, TrainDirLock, in_use
from launch.run.console import Console
from launch.backends import marks
from launch.backends.tail import LogTail, ThreadTail
from launch.run.pump import Pump
from launch.backends.strategy import CHECKPOINT_GRACE_SECS, Outcome, Strategy, resume_hint  # noqa: F401 (theirs, re-exported)
from launch.run.disk import DiskWatch
from launch.records import index, ownership

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)     # SIGHUP: the terminal went away


def identify(spec: ClusterSpec) -> tuple[str, int]:
    """The run's id and the number of the attempt about to start: an earlier `up` of the same
    train_dir left them in events.jsonl (or run.json, if the events are gone); else a new id
    from the spec file's name and the time."""
    train_dir = spec.train.train_dir
    try:
        events = typed_events(rundir.events_path(train_dir))
    except OSError as e:        # unreadable, not missing: a new id would split the run in two
        raise UsageError(f'{rundir.events_path(train_dir)}: cannot read it: {e.strerror}') from None
    before = typed_run_record(rundir.run_path(train_dir))
    run = next((e.run for e in events if e.run), None) or before.id
    if run:
        return run, max([e.attempt for e in events] + [before.attempt or 0]) + 1
    stem = re.sub(r'[^A-Za-z0-9._-]', '_', os.path.splitext(os.path.basename(spec.path))[0]) or 'run'
    return f'{stem}-{time.strftime("%Y%m%d-%H%M%S")}', 1


class Lifecycle:
    """One `launch up`: owns the lock, the signals, the log followers, the run's identity and
    event log, and the closing line."""

    def __init__(self, spec: ClusterSpec, console: Console, backend: str = '', spec_yaml: str = '',
                 overrides: Iterable[str] = (), report: bool = True) -> None:
        self.spec, self.console = spec, console
        self.masker = spec_masker(spec)     # every log line shown or kept: no value the spec hides
        self.report = report            # write report.html at the end of every attempt
        self.backend, self.spec_yaml, self.overrides = backend, spec_yaml, list(overrides)
        self.run_id, self.attempt = '', 0
        self.events: EventLog | None = None
        self._serving: set[str] = set()      # tasks whose start was seen serving (event logged)
        self._stepped = False                # this attempt's first step logged
        self._seen_lock = threading.Lock()   # log followers of every task report at once
        self._attempt_started = time.time()
        self._saved: int | None = None       # the newest checkpoint step logged
        self._evaluated = False              # an evaluator reported an evaluation in this `launch up`
        self.interrupted = threading.Event()     # the first SIGINT/SIGTERM/SIGHUP
        self.signum = 0
        self._hurried = False
        self._strategy: Strategy | None = None
        self.disk: DiskWatch | None = None       # the disk under the run's own files (from _begin)
        self._followers: dict[str, Pump] = {}      # each followed log's pump (launch/run/pump.py)
        self._pumps: dict[str, Pump] = {}          # one per group of logs (a backend)
        self._readers: dict[str, messages.Reader] = {}     # each task's messages, read once (messages.Reader)
        self._reporting: threading.Thread | None = None     # a restart's report, written meanwhile

    # -- the lock -----------------------------------------------------------------------------
    def _lock(self) -> tuple[TrainDirLock, list[str]]:
        """Take the train_dir's lock (creating the directory); (lock, the directories created,
        deepest first), so a launch that never starts can leave no trace. A directory that is
        not tfcluster's (launch/records/ownership.py) is refused first, untouched."""
        spec = self.spec
        path = spec.train.train_dir
        ownership.check_train_dir(spec)     # before the lock file: nothing of someone else's directory is touched
        created, probe = [], os.path.abspath(path)
        while not os.path.exists(probe):
            created.append(probe)
            probe = os.path.dirname(probe)
        try:
            os.makedirs(path, exist_ok=True)
            lock = TrainDirLock(path)
            lock.acquire(f'launcher pid {os.getpid()}, `launch up {spec.path}` since {time.strftime("%H:%M:%S")}')
        except LockBusy as e:
            raise UsageError(in_use(spec.path, path, str(e))) from None
        except OSError as e:
            raise spec.error('train.train_dir', f'cannot write {e.filename or path}: {e.strerror}') from None
        return lock, created

    @staticmethod
    def _forget(lock: TrainDirLock, created: list[str]) -> None:
        """Leave no trace of a launch that never started: the lock file and the directories made for it."""
        if created:
            lock.release(remove=True)
            for directory in created:
                try:
                    os.rmdir(directory)     # only if empty: nothing of anyone else's goes
                except OSError:
                    break

    # -- the run ------------------------------------------------------------------------------
    def up(self, strategy: Strategy) -> RunResult:
        lock, created = self._lock()     # first: a second launcher is told who runs, nothing more
        try:
            self.run_id, self.attempt = identify(self.spec)
            done = self._done_already(strategy)
            if done is not None:
                self._forget(lock, created)
                return done
            try:
                strategy.prepare(self)
            except Exception:
                self._forget(lock, created)
                raise
            for path in strategy.stale_files():
                if ownership.written_by_task(path):     # nothing else is removed: it is not an earlier run's
                    try:
                        os.remove(path)
                    except FileNotFoundError:
                        pass
            marks.clear_all(self.spec.train.train_dir)     # an earlier launcher's run-wide stop mark (Slurm)
            self._begin()
            return self._run(strategy)
        finally:
            lock.release()

    def _done_already(self, strategy: Strategy) -> RunResult | None:
        """A run whose newest checkpoint is at train.steps already: nothing would be trained, so
        nothing starts and nothing of the run is written (its run.json, events and report keep the
        result it ended with); one line says so and how to train on. Exit 0, as `make` answers
        for a target that is up to date: the training asked for is done, and a script that runs
        `launch up` until it succeeds must not loop. A train.command is the user's own to end:
        the launcher cannot tell what its steps mean, so it always starts."""
        train = self.spec.train
        if train.command:
            return None
        step = rundir.checkpoint_step(strategy.read_file(rundir.checkpoint_index_path(train.train_dir)))
        if step is None or step < train.steps:
            return None
        which = f'run {self.run_id}' if self.attempt > 1 else os.path.abspath(train.train_dir)  # 1: no record of it
        self.console.say(f'{which} is already at step {step} of {train.steps} (train.steps): nothing started, its '
                         f'result kept; to train on, raise train.steps, e.g. `launch up {shlex.quote(self.spec.path)} '
                         f'--set train.steps={step + train.steps}`')
        return RunResult(state=RunState.DONE, exit_code=EXIT_OK, global_step=step)

    def _begin(self) -> None:
        """Name the run and this attempt, first thing on the console, and open the event log."""
        train_dir = self.spec.train.train_dir
        self.events = EventLog(rundir.events_path(train_dir), self.run_id, self.attempt)
        self.disk = DiskWatch(train_dir, self.console.say, self.emit, self.events)
        self.console.say(f'run {self.run_id}, attempt {self.attempt}: {os.path.abspath(train_dir)} '
                         f'(`launch status {self.run_id}`, `launch logs {self.run_id}`)')
        step = rundir.checkpoint_step(rundir.read_text(rundir.checkpoint_index_path(train_dir)))
        self.emit(RunStarted(spec=os.path.abspath(self.spec.path), backend=self.backend,
                             spec_hash=hashlib.sha256(self.spec_yaml.encode()).hexdigest(),
                             overrides=self.overrides, cwd=os.getcwd(), train_dir=os.path.abspath(train_dir),
                             launcher_pid=os.getpid(), resumes_from=step))
        index.remember(self.run_id, train_dir, self.spec.path)     # its id then works from anywhere

    def emit(self, event: Event) -> None:
        """Append an event to the run's log (EventLog.emit); a log that cannot be written is a
        warning, not a crash."""
        if self.events is None:
            return
        try:
            self.events.emit(event)
        except OSError as e:
            log.warning('cannot write %s: %s', self.events.path, e.strerror)

    def next_attempt(self, cause: str, from_step: int | None, tasks: tuple[str, ...] = (),
                     ended: RunResult | None = None) -> None:
        """A restart. Of some tasks (`tasks`): one event, the attempt goes on. Of the cluster: the
        attempt ends (its result `ended` in run.json and the report, as any attempt's end) and
        the next begins."""
        self.emit(Restart(cause=cause, from_step=from_step, tasks=list(tasks) or None))
        if tasks:
            return
        if ended is not None:
            ended.started, ended.ended = self._attempt_started, time.time()
            ended.seconds = ended.ended - ended.started
            self._write_result(ended, meanwhile=True)
        with self._seen_lock:
            self.attempt += 1
            self._attempt_started = time.time()
            self._serving.clear()
            self.console.starting()     # a large run's console counts their serving lines again
            self._stepped = False
            self._saved = None
            if self.events is not None:
                self.events.attempt = self.attempt

    def task_started(self, task: str, **where: Any) -> None:
        """`where`: host, and pid, container or job (the backend's words, in its order: the event keeps it)."""
        with self._seen_lock:
            self._serving.discard(task)
        self.emit(TaskStarted(task=task, **where, keys=('task', *where)))

    def said(self, task: str, line: str) -> messages.Message | None:
        """The message a line of `task`'s log carries (the messages' one reader, one per task)."""
        return self._readers.setdefault(task, messages.Reader()).read(line)

    def saw_line(self, task: str, line: str, worker: bool, chief: bool) -> dict | None:
        """What a task's log line tells the event log: that it is up, this attempt's first step,
        and (the chief's lines, at the console's cadence) progress. Returns a worker's progress."""
        said = self.said(task, line)
        serving = messages.says_ready(said, task)
        saved = said.step if chief and isinstance(said, messages.Checkpoint) else None
        found = said.facts() if worker and isinstance(said, messages.Progress) else None
        if isinstance(said, messages.Evaluation) and contract.job_of(task) == 'evaluator':
            self._evaluated = True
            self.emit(Evaluation(task=task, step=said.step, metrics=said.metrics))
        if not (serving or saved is not None or found is not None):
            return None
        with self._seen_lock:
            if serving and task not in self._serving:
                self._serving.add(task)
                self.emit(Serving(task=task))
            if saved is not None and saved != self._saved:      # a stopped chief says it twice
                self._saved = saved
                self.emit(Checkpoint(step=saved))
            if found is None:
                return None
            if not self._stepped:
                self._stepped = True
                self.emit(FirstStep(step=found['step']))
                if self.report:     # its import (matplotlib) is half a second the run's end need not wait
                    threading.Thread(target=importlib.import_module, args=('launch.records.report',),
                                     name='report-import', daemon=True).start()
            if chief:
                self.emit(Progress(**found))
        return found

    def _run(self, strategy: Strategy) -> RunResult:
        self._strategy = strategy
        previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        started = self._attempt_started = time.time()
        watched = self._watch_disk()
        try:
            outcome = strategy.run(self)
        finally:
            watched.set()
            self.unfollow(list(self._followers))      # every line shown before the verdict
            for s, handler in previous.items():
                signal.signal(s, handler)
        started = max(started, self._attempt_started)     # a cluster restart began a later attempt
        result = RunResult(state=outcome.state, exit_code=outcome.exit_code, seconds=time.time() - started,
                           restarts=outcome.restarts, failures=list(outcome.failures), started=started,
                           ended=time.time())
        self._add_figures(result, outcome.lost)
        if result.global_step is None:
            result.global_step = self._step_reached(outcome.global_step)
        result.recoveries = list(outcome.recoveries)
        result.rehearsal = outcome.rehearsal
        result.preemptions = outcome.preemptions
        if outcome.state == RunState.DONE:
            figures = self.summary(result, outcome.lost, asked=self.spec.train.steps, saved=self.checkpoint_step())
            self.console.say(outcome.headline + figures + self._unevaluated())
        elif outcome.state == RunState.INTERRUPTED:
            self.console.say(f'stopped; {outcome.resume or resume_hint(self.checkpoint_step())}')
        self.emit(Finished(result=self._as_record(result)))
        self._write_result(result)
        return result

    def _watch_disk(self) -> threading.Event:
        """Watch the disk under the run's files while the strategy runs (launch/run/disk.py): a
        full one is named at once, before any fault it causes; set the event to end the watch."""
        stop = threading.Event()
        if self.disk is not None:
            threading.Thread(target=self.disk.watch, args=(stop,), name='disk', daemon=True).start()
        return stop

    def _as_record(self, result: RunResult) -> RunRecord:
        """run.json's record of this attempt's result."""
        return result.record(self.run_id, self.attempt, os.path.abspath(self.spec.path), self.backend,
                              os.path.abspath(self.spec.train.train_dir))

    def _write_result(self, result: RunResult, meanwhile: bool = False) -> None:
        """The end of an attempt: run.json and the report, each best effort (a full disk must not
        turn a finished training into a crash). `meanwhile`: the report in a thread of its own, for
        an attempt a restart ends: drawing it takes most of a second, which the restart does not
        wait for (the run's last report waits for it, then is drawn afresh)."""
        train_dir = self.spec.train.train_dir
        record = self._as_record(result)
        try:
            write_atomically(rundir.run_path(train_dir), runjson.dumps(record.to_json(), indent=1) + '\n')
        except OSError as e:
            log.warning('cannot write %s: %s', rundir.run_path(train_dir), e.strerror)
        if not self.report:
            return
        if self._reporting is not None:
            self._reporting.join()      # one report at a time, the newest last
        if meanwhile:
            self._reporting = threading.Thread(target=self._write_report, name='report', daemon=True)
            self._reporting.start()
        else:
            self._write_report()

    def _write_report(self) -> None:
        try:
            from launch.records import report
            report.write(self.spec.train.train_dir)
        except Exception as e:      # the report is a convenience: never the reason a run fails
            log.warning('could not write the report: %s: %s', type(e).__name__, e)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self.interrupted.is_set():
            self.signum = signum
            self.interrupted.set()
        elif signum != signal.SIGHUP and not self._hurried and self._strategy is not None:
            # A second Ctrl-C (or SIGTERM): the user will not wait for the checkpoint and the
            # graceful stop. SIGHUP is not a request: a closed terminal sends it once more at exit.
            self._hurried = True
            threading.Thread(target=self._strategy.hurry, name='hurry', daemon=True).start()

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    def checkpoint_step(self) -> int | None:
        """The step of the newest checkpoint (what a restart or a new `launch up` resumes from)."""
        index = self._running().read_file(rundir.checkpoint_index_path(self.spec.train.train_dir))
        return rundir.checkpoint_step(index)

    def _running(self) -> Strategy:
        """The strategy running the tasks (known once `up` runs it)."""
        assert self._strategy is not None, 'no strategy runs yet'
        return self._strategy

    # -- following logs -------------------------------------------------------------------------
    def follow(self, name: str, lines: LogTail | Callable[[threading.Event], Iterable[str]],
               on_line: Callable[[str], None] | None = None, channel: messages.Channel | None = None,
               group: str = '') -> None:
        """Show a task's log lines on the console as they come, prefixed with `name`, until
        unfollow(name): `lines` is the log's LogTail (Backend.log_tail), or `lines(stop)` yields
        them, ending once `stop` is set and all is read (read in a thread of its own). Every log
        of a `group` (a backend's name) is polled by one thread (launch/run/pump.py), so a host
        that hangs holds up its own group's logs alone. `channel`: the records the task writes
        beside this log, read with it (a fresh Reader)."""
        self.unfollow([name])
        if channel is not None:
            self._readers[name] = messages.Reader(channel)
        tail = lines if isinstance(lines, LogTail) else ThreadTail(lines, name)

        def seen(raw: str) -> None:
            line = self.masker.text(raw)    # a value the spec hides, printed by the user's code
            if on_line is not None:
                try:
                    on_line(line)
                except Exception:       # a line the parsers trip on must not silence the task
                    log.debug('reading a line of %s failed', name, exc_info=True)
            self.console.line(name, line)
        pump = self._pumps.setdefault(group, Pump(f'follow-{group}' if group else 'follow'))
        pump.add(name, tail, seen)
        self._followers[name] = pump

    def unfollow(self, names: Iterable[str]) -> None:
        """Stop following these logs, once what is there has been read (all of them at once)."""
        by_pump: dict[Pump, list[str]] = {}
        for n in names:
            if n in self._followers:
                by_pump.setdefault(self._followers.pop(n), []).append(n)
        for pump, drained in by_pump.items():
            pump.drain(drained)

    # -- the closing line ------------------------------------------------------------------------
    def _worker_results(self, lost: tuple[str, ...]) -> list[dict]:
        """The closing figures each worker left in the train_dir (where its host has it): a
        coordinator run's chief's."""
        results = []
        train_dir = self.spec.train.train_dir
        paths = [rundir.chief_result_path(train_dir)] if self.spec.coordinator else \
            [rundir.result_path(train_dir, i) for i in range(self.spec.num_workers) if f'worker:{i}' not in lost]
        for path in paths:
            text = self._running().read_file(path)
            try:
                found = runjson.loads(text) if text else None
            except ValueError:      # damaged: no figures from that worker
                found = None
            if isinstance(found, dict):
                results.append(found)
        return results

    def _step_reached(self, seen: int | None) -> int | None:
        """The global step a run without the chief's closing figures reached: the newest it saw
        in progress lines, or its newest checkpoint's if that is further (a train.command prints
        its own lines, no progress of ours, but its checkpoints say how far it got)."""
        saved = self.checkpoint_step()
        return seen if saved is None else saved if seen is None else max(seen, saved)

    def _add_figures(self, result: RunResult, lost: tuple[str, ...]) -> None:
        results = self._worker_results(lost)
        if not results:
            return
        # Typed reads: a damaged or foreign file's "many" is no step (and must not end the run in a TypeError).
        result.global_step = max(read_whole(r.get('global_step')) or 0 for r in results)
        rates = [read_real(r.get('images_per_sec')) for r in results]
        result.images_per_sec = sum(r for r in rates if r is not None) if None not in rates else None     # a user program may not count examples
        chief = [r for r in results if r.get('task') == self.spec.chief.name and 'loss' in r]
        if chief:
            result.loss = read_real(chief[0]['loss'])
        result.dropped_gradients = dropped_gradients(self.spec, results, result.global_step)

    def _unevaluated(self) -> str:
        """'; no checkpoint was evaluated: why' for a finished run whose evaluator reported nothing
        (a run that ends done says so plainly, not only by the report's missing table)."""
        names = ', '.join(t.name for t in self.spec.job_tasks('evaluator'))
        if not names or self._evaluated:
            return ''
        if self.checkpoint_step() is None:
            return (f'; no checkpoint was evaluated: {os.path.abspath(self.spec.train.train_dir)} holds no '
                    f'{rundir.CHECKPOINT_PREFIX}-<step> checkpoint, which {names} waits for (docs/pss.md)')
        return f'; no checkpoint was evaluated: {names} reported no evaluation (its log says why)'

    @staticmethod
    def summary(result: RunResult, lost: tuple[str, ...] = (), asked: int | None = None,
                saved: int | None = None) -> str:
        """': global step G, R images/s in all, final loss L (notes)' — the figures of a finished run.
        Where the step reached is not the one `asked` (train.steps) or not the one `saved` in the
        last checkpoint (async workers step on after the chief's last save), the line says both:
        a resumed run starts from the checkpoint, not from G."""
        text = ''
        if result.global_step is not None:
            text += f': global step {result.global_step}{steps_note(result.global_step, asked, saved)}'
            if result.images_per_sec is not None:
                text += f', {result.images_per_sec:.0f} images/s in all'
            if result.loss is not None:
                text += f', final loss {result.loss:.3f}'
        notes = []
        if result.restarts:
            notes.append(f'{result.restarts} restart(s)')
        if result.preemptions:
            notes.append(f'{result.preemptions} preemption(s), not counted as faults')
        if result.dropped_gradients is not None:
            notes.append(f'{result.dropped_gradients} gradient(s) of backup workers dropped as stale')
        if lost:
            notes.append(f'lost {", ".join(sorted(lost))}')
        if notes:
            text += f' ({"; ".join(notes)})'
        return text


def dropped_gradients(spec: ClusterSpec, results: list[dict], reached: int) -> int | None:
    """Sync with backup workers (fewer gradients aggregated than live workers): the gradients the
    workers computed (one a local step) that no global step took (each takes replicas_to_aggregate),
    from their closing figures; None otherwise."""
    if not spec.train.sync or spec.coordinator or spec.train.program or spec.train.command \
            or spec.replicas_to_aggregate >= spec.live_workers:
        return None
    computed = [read_whole(r.get('local_steps')) for r in results]
    firsts = [read_whole(r.get('first_global_step')) for r in results]
    if not results or None in computed or None in firsts:
        return None
    taken = (reached - min(f for f in firsts if f is not None)) * spec.replicas_to_aggregate
    return max(0, sum(c for c in computed if c is not None) - taken)
