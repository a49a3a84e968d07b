"""One task's stand-in: the part the real task plays for its launcher and its peers, without
TensorFlow or grpcio (~20 MB where a real task takes ~0.7 GB).

What the launcher sees is a task's: the port bound (its readiness check connects with gRPC and
sees READY: wire.py answers HTTP/2's preface), the
same messages said the same way (cluster/runtime/contract.py `say`: serving or started, progress
at a steady rate, the chief's checkpoints where train.checkpoint_steps/_secs would save, the
closing line), the same ends (a trainer at train.steps, exit 0, after telling every ps it is done;
a TF1 ps once every live worker has; a coordinator run's servers never, until stopped),
the same lease. What the peers see: every task the real one must reach is reached (workers and
a chief -> every ps; a coordinator's chief -> every worker too), timed all at once (probe.py), and the
findings said as `Links` (messages.py). A peer not reached within REACH_SECS is reported, never
fatal: the rehearsal's table names it.

The rehearsal's train_dir is its own (`<train_dir>/rehearsal`), and the only thing a stand-in
writes there is what the launcher reads of a checkpoint: the chief's saves name their step in
TensorFlow's `checkpoint` index (a few bytes, no model), so that a restart resumes, and a sync
`launch scale` (which asks for a checkpoint and waits for it) goes through, as in a real run. A
stand-in starts from the step that index names, as a resumed task would; a worker the launcher
takes out of the live set leaves, as the real one does.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from cluster.rehearsal import probe, wire
from cluster.rehearsal.parts import Part, part_of, peers
from cluster.rehearsal.messages import Link, Links, say_links
from cluster.runtime import notice, ports, rundir, stacks
from cluster.runtime.membership import LIVE, DoneTracker
from cluster.runtime.contract import EXIT_OK, EXIT_PREEMPTED, EXIT_USAGE, LEASE_ENV, LEASE_SECS_ENV, parse_task_argv
from cluster.runtime.lease import resolve_task, watch_lease
from cluster.runtime.messages import Checkpoint, Evaluation, Serving, Started, progress, say
from cluster.runtime.rundir import TaskLogFormatter
from cluster.spec import ClusterSpec, TaskSpec

log = logging.getLogger('cluster.rehearsal')

STEPS_PER_SEC = 100.0       # the stand-ins' global steps a second: train.steps=2000 rehearses in 20 s
REACH_SECS = 30.0           # how long a stand-in tries to reach a peer before it names it unreachable
NON_CHIEF_LOG_SECS = 10.0   # a non-chief worker's progress lines come at most this often (as the trainer's)
PS_POLL_SECS = 1.0          # a ps reads the live workers again at least this often (`launch scale`)
PS_LINGER_SECS = 0.2        # a ps stays this long after the last "done", so that its reply arrives (as train.py)
LOOK_SECS = 0.5             # a trainer looks this often for the launcher's word (a save asked for, leave)


def reach(spec: ClusterSpec, task: TaskSpec, timeout: float = REACH_SECS) -> tuple[Link, ...]:
    """Every peer reached and timed at once from one selector (a blob from each ps), in the spec's order."""
    return probe.reach([wire.Target(t.name, t.address, t.job == 'ps') for t in peers(spec, task)], timeout)


def checkpoints_between(before: int, now: int, every_steps: int) -> list[int]:
    """The steps in (before, now] at which a chief saving every `every_steps` saves (0: none by steps)."""
    if every_steps <= 0 or now <= before:
        return []
    first = (before // every_steps + 1) * every_steps
    return list(range(first, now + 1, every_steps))


def fake_loss(step: int, total: int) -> float:
    """A loss that falls as the steps go (a rehearsal's figure, not a model's)."""
    return 2.3 * math.exp(-3.0 * step / max(total, 1))


class Trainer:
    """The steps of a trainer's stand-in: `STEPS_PER_SEC` from `start`, its lines and saves as
    the real trainer's cadence (train.log_every_secs; the chief's checkpoints)."""

    def __init__(self, spec: ClusterSpec, task: TaskSpec, start: int, saves: bool, rate: float = STEPS_PER_SEC):
        self.train, self.task, self.start, self.saves, self.rate = spec.train, task, start, saves, rate
        self.pool = spec.num_workers
        self.log_every = spec.train.log_every_secs if saves else max(NON_CHIEF_LOG_SECS, spec.train.log_every_secs)
        self.step = start       # the newest global step: what a preemption notice names and saves

    def run(self) -> None:
        total, every = self.train.steps, self.train.checkpoint_steps
        t0 = time.monotonic()
        last_log = last_save = t0
        step = saved = self.start
        asked = LIVE.save_requests()        # a request made before this start was for the last cluster
        self._progress(step)
        while step < total:
            if LIVE.leaving(self.task.index, self.pool):
                log.info('%s leaves at global step %d: the launcher took it out of the live workers', self.task.name, step)
                return
            wake = [last_log + self.log_every, t0 + (total - self.start) / self.rate, time.monotonic() + LOOK_SECS]
            if self.saves:
                wake.append(last_save + self.train.checkpoint_secs)
                if every > 0:
                    wake.append(t0 + ((saved // every + 1) * every - self.start) / self.rate)
            time.sleep(max(0.0, min(wake) - time.monotonic()))
            now = time.monotonic()
            step = self.step = min(total, self.start + int((now - t0) * self.rate + 1e-6))
            if self.saves:
                due = checkpoints_between(saved, step, every)
                if not due and step > saved and (now - last_save >= self.train.checkpoint_secs
                                                 or LIVE.save_requests() > asked):
                    due = [step]
                asked = max(asked, LIVE.save_requests())
                for at in due:
                    self.save(at)
                    saved, last_save = at, now
            if now - last_log >= self.log_every or step >= total:
                self._progress(step)
                last_log = now
        if self.saves and saved < total:
            self.save(total)

    def preempted(self) -> None:
        """A preemption notice (cluster/runtime/notice.py): a chief saves at once, as the real one
        does, and exits EXIT_PREEMPTED."""
        self.save(self.step)
        notice.exit_now(EXIT_PREEMPTED, logging.INFO, f'preemption notice received: {Checkpoint(self.step).human()}, '
                                                      'exiting')

    def save(self, step: int) -> None:
        """A chief's save: its line, and the checkpoint index naming the step (no model behind it)."""
        name = f'{rundir.CHECKPOINT_PREFIX}-{step}'
        try:
            rundir.write_atomically(rundir.checkpoint_index_path(self.train.train_dir),
                                    f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: "{name}"\n')
        except OSError as e:        # a full disk: the launcher sees no save, as for a real chief
            log.warning('cannot write the checkpoint index: %s', e.strerror)
            return
        say(log, Checkpoint(step))

    def _progress(self, step: int) -> None:
        total = self.train.steps
        say(log, progress(step, total, fake_loss(step, total), f'  {self.rate:g} steps/s (rehearsal)'))


class DoneWatch:
    """A TF1 ps's "every live worker is done" (cluster/runtime/membership.py DoneTracker, as the
    real ps keeps it): the workers' Done calls report, `wait` returns once all have."""

    def __init__(self, pool: int) -> None:
        self.pool, self.tracker = pool, DoneTracker()
        self._lock, self._changed = threading.Lock(), threading.Event()

    def report(self, index: int, generation: int) -> None:
        with self._lock:
            self.tracker.report(index, generation)
            left = self.tracker.waiting_for(LIVE.current(self.pool))
        log.info('worker:%d is done; %d to go', index, len(left))
        self._changed.set()

    def wait(self) -> None:
        log.info('serving; exits once all %d live workers are done', LIVE.current(self.pool).count)
        while True:
            with self._lock:
                if self.tracker.finished(LIVE.current(self.pool)):
                    break
            self._changed.wait(PS_POLL_SECS)
            self._changed.clear()
        time.sleep(PS_LINGER_SECS)


def say_done(spec: ClusterSpec, task: TaskSpec) -> None:
    """A TF1 worker's last word to every ps, as the real one enqueues it; a ps that cannot be
    told is noted (it is stopped by the launcher in the end), never fatal."""
    generation = LIVE.generation(task.index, spec.num_workers)
    for ps in spec.job_tasks('ps'):
        why = probe.report_done(ps.address, task.index, generation)
        if why:
            log.warning('%s could not tell %s it is done: %s', task.name, ps.name, why)


def start_step(spec: ClusterSpec) -> int:
    """Where a resumed task starts: the train_dir's newest checkpoint (where this host sees it), else 0."""
    found = rundir.checkpoint_step(rundir.read_text(rundir.checkpoint_index_path(spec.train.train_dir)))
    return min(found or 0, spec.train.steps)


def play(spec: ClusterSpec, task: TaskSpec) -> int:
    """The task's part, from its first word to its exit code."""
    part = part_of(spec, task)
    done = DoneWatch(spec.num_workers) if task.job == 'ps' and not spec.coordinator else None
    if part in (Part.SERVE, Part.TRAIN):
        try:
            server = wire.serve(task.port, done.report if done is not None else None)
        except RuntimeError as e:       # lost a race for the port after the check in main
            print(f'cluster.rehearsal: error: {task.name}: cannot serve on port {task.port}: {e}', file=sys.stderr)
            return EXIT_USAGE
        assert server is not None
        say(log, Serving(task.name, task.address, os.getpid()))
    else:
        say(log, Started(task.name, f'the rehearsal of the {part.value} part', os.getpid()))
    links = reach(spec, task)
    if links:
        say_links(log, Links(task.name, links))
    if done is not None:            # a TF1 ps: until every live worker is done
        done.wait()
    elif part is Part.SERVE:
        threading.Event().wait()        # until stopped, as a server (`Server.join()` never returns)
    else:
        step(spec, task, part)
    log.info('%s finished', task.name)
    return EXIT_OK


def step(spec: ClusterSpec, task: TaskSpec, part: Part) -> None:
    """A trainer's, a coordinator's or an evaluator's steps to train.steps."""
    start = start_step(spec)
    if part is Part.EVALUATE:
        notice.NOTICES.take(notice.Role(on_preempted=lambda: notice.exit_now(
            EXIT_PREEMPTED, logging.INFO, 'preemption notice received: the evaluator stops')))
        time.sleep(max(0.0, (spec.train.steps - start) / STEPS_PER_SEC))     # the training's length
        say(log, Evaluation(spec.train.steps, {'loss': round(fake_loss(spec.train.steps, spec.train.steps), 6)}))
    else:
        trainer = Trainer(spec, task, start, saves=part is Part.COORDINATE or task.is_chief)
        notice.NOTICES.step = lambda: trainer.step
        if trainer.saves:       # the others keep training until stopped or the deadline, as the real ones
            notice.NOTICES.take(notice.Role(on_preempted=trainer.preempted))
        trainer.run()
        if part is Part.TRAIN:
            say_done(spec, task)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one task's stand-in to its end, as cluster/task.py main runs the task."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    args = parse_task_argv(argv, (__doc__ or '').splitlines()[0])
    try:
        spec, task = resolve_task(args)
    except ValueError as e:       # SpecError
        print(f'cluster.rehearsal: error: {e}', file=sys.stderr)
        return EXIT_USAGE
    serves = part_of(spec, task) in (Part.SERVE, Part.TRAIN)
    if serves and ports.port_in_use(task.port):
        print(f'cluster.rehearsal: error: {ports.in_use_line(task.name, task.port)}', file=sys.stderr)
        return EXIT_USAGE
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(TaskLogFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    log.info('%s: a rehearsal stand-in (no TensorFlow)', task.name)
    stacks.install(spec.train.train_dir, task.job, task.index, time.time())    # `launch debug`, a stall's dump
    notice.install(task.name, spec.train.train_dir, task.job, task.index, spec.supervise.preemption_grace)
    if os.environ.get(LEASE_ENV):
        watch_lease(os.environ[LEASE_ENV], float(os.environ.get(LEASE_SECS_ENV) or 10), pool=spec.num_workers)
    return play(spec, task)
