"""Coordinator runs: TF2 `tf.distribute.ParameterServerStrategy` programs, as people write them today.

A spec with a `chief` task is a coordinator run. Its tasks play the roles PSS gives them:

- ps and worker tasks only serve: a `tf.distribute.Server` that joins for ever (no user code runs
  there; PSS sends them functions). They never exit by themselves: the launcher stops them once
  the chief's program has ended.
- the chief runs the user's program: `train.program` is called with a `CoordinatorContext` (the
  cluster resolver, the train_dir, `report` for the launcher's progress line, `checkpoint` for
  saves it knows about, `should_stop` for a graceful stop); a `train.command` runs with TF_CONFIG
  alone (no TF1 flags) and prints what it likes.
- the evaluator runs `train.evaluator` beside the training, never in its cluster (its TF_CONFIG
  names only itself): a function gets an `EvaluatorContext` that walks the train_dir's checkpoints
  and records each evaluation for TensorBoard and the launcher's event log.

The launcher's side of these rules (who restarts what) is launch/run/policy.py's.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cluster.program import connects
from cluster.runtime import messages, notice, placed, rundir, runjson
from cluster.runtime.membership import LIVE
from cluster.runtime.contract import EXIT_PREEMPTED
from cluster.runtime.pulse import PULSE
from cluster.spec import ClusterSpec, TaskSpec, TrainConfig

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger(__name__)

CHECKPOINT_POLL_SECS = 1.0
_CKPT_STEP = re.compile(r'-(\d+)$')


class StopSignal:
    """The launcher's SIGTERM or SIGINT asks the program to stop at its next `should_stop()` (the
    chief's then saves and returns); a second one ends the process at once. A preemption notice
    (cluster/runtime/notice.py) stops it the same way, and the task then exits EXIT_PREEMPTED.
    `after`: what the task finishes first, as its line says it (the chief saves a checkpoint; the
    evaluator saves nothing)."""

    def __init__(self, after: str = 'the work under way (a checkpoint is saved first)') -> None:
        self.event = threading.Event()
        self.signum = 0
        self.preempted = False
        self.after = after

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._on_signal)
        notice.NOTICES.take(notice.Role(on_stop=lambda signum: self._on_signal(signum, None),
                                        on_preempted=self._on_preempted))

    def _on_preempted(self) -> None:
        self.preempted = True
        self.event.set()
        log.info('preemption notice: stopping after %s', self.after)

    def _on_signal(self, signum: int, frame: types.FrameType | None) -> None:
        if self.event.is_set():
            log.error('%s again: exiting now', signal.Signals(signum).name)
            os._exit(128 + signum)
        self.signum = signum
        self.event.set()
        log.info('%s received: stopping after %s', signal.Signals(signum).name, self.after)


def checkpoint_step(path: str) -> int:
    """The step a checkpoint's path ends with (model.ckpt-120 -> 120), 0 for none."""
    m = _CKPT_STEP.search(path or '')
    return int(m.group(1)) if m else 0


class Checkpoints:
    """The chief's checkpoints in train_dir, as `model.ckpt-<step>` with TensorFlow's index file,
    the names the launcher reads the resume step from and the evaluator follows. `counter` is the
    variable that counts the global step (an optimizer's `iterations`)."""

    def __init__(self, train_dir: str, counter: tf.Variable, objects: Mapping[str, Any]) -> None:
        import tensorflow as tf
        self.counter = counter
        self.checkpoint = tf.train.Checkpoint(**objects)
        self.manager = tf.train.CheckpointManager(self.checkpoint, train_dir, max_to_keep=5,
                                                  checkpoint_name=rundir.CHECKPOINT_PREFIX)
        self.saved_step: int | None = None
        self.saved_at = time.monotonic()

    def restore(self) -> int:
        """Restore the newest checkpoint, if there is one; the global step training goes on from.
        What an earlier save left half-written (it died with its chief, or on a full disk) goes first."""
        from cluster.runtime import session
        session.remove_save_leftovers(str(self.manager.directory))
        path = self.manager.latest_checkpoint
        if not path:
            log.info('no checkpoint in %s: training starts at step 0', self.manager.directory)
            return 0
        self.checkpoint.restore(path).assert_existing_objects_matched()
        step = int(self.counter.numpy())
        self.saved_step = step
        log.info('restored %s: training goes on from global step %d', path, step)
        return step

    def save(self) -> int:
        """Save as of the counter's step. A save the disk or the OS refuses raises the TF1 trainer's
        SaveError (the cause first, then the checkpoint and the directory: TensorFlow's own error
        hides the cause under dozens of lines and an out-of-memory hint) and leaves nothing behind."""
        from cluster.runtime import session
        step = int(self.counter.numpy())
        directory = str(self.manager.directory)
        name = f'{rundir.CHECKPOINT_PREFIX}-{step}'
        before = set(os.listdir(directory)) if os.path.isdir(directory) else set()
        try:
            self.manager.save(checkpoint_number=step)
        except (session.tf.errors.OpError, OSError) as e:
            session.remove_save_leftovers(directory, name, before)
            cause = rundir.os_cause(e)
            if cause is None:
                raise
            raise session.SaveError(f'{cause}: cannot save checkpoint {name} in {directory}',
                                    getattr(e, 'error_code', session.tf.errors.UNKNOWN)) from e
        self.saved_step, self.saved_at = step, time.monotonic()
        messages.say(log, messages.Checkpoint(step))
        return step


@dataclass
class _Progress:
    step: int = 0
    loss: float = float('nan')
    reports: int = 0
    examples: int = 0
    first_step: int | None = None
    last_log: float = 0.0
    last_log_step: int = 0
    started: float = field(default_factory=time.monotonic)


class CoordinatorContext:
    """What a coordinator `train.program` gets. A minimal program (examples/pss_loop.py is a whole one):

        def train(ctx):
            strategy = tf.distribute.ParameterServerStrategy(ctx.cluster_resolver)
            coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
            with strategy.scope():
                model, optimizer = ..., ...
            saves = ctx.checkpoint(optimizer.iterations, model=model, optimizer=optimizer)
            while not ctx.should_stop():
                ... coordinator.schedule(step_fn, ...); coordinator.join()
                ctx.report(int(optimizer.iterations.numpy()), loss)
    """

    def __init__(self, spec: ClusterSpec, task: TaskSpec, stop: StopSignal | None = None) -> None:
        self.spec, self.task = spec, task
        self.train: TrainConfig = spec.train
        self.train_dir = spec.train.train_dir
        self.num_workers, self.num_ps = spec.num_workers, spec.num_ps
        self._stop = stop or StopSignal()
        self._progress = _Progress()
        self.checkpoints: Checkpoints | None = None
        self.variables = placed.Recorder(self.train_dir)     # where the strategy put each (variables.json)
        self._saves_asked = LIVE.save_requests()    # a request made before this start was for the last cluster

    @property
    def cluster_resolver(self) -> Any:
        """The training cluster (chief, ps, workers) with this task as the chief: what
        ParameterServerStrategy takes."""
        import tensorflow as tf
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(self.spec.cluster_def()), task_type='chief', task_id=0, rpc_layer='grpc')

    @property
    def stopping(self) -> bool:
        """Whether the launcher (or a user) asked the task to stop: SIGTERM or SIGINT."""
        return self._stop.event.is_set()

    @property
    def step(self) -> int:
        """The global step reported last (or restored)."""
        return self._progress.step

    def should_stop(self) -> bool:
        """Whether to leave the training loop: asked to stop, or train.steps reached by the last report."""
        stop = self.stopping or self._progress.step >= self.train.steps
        if stop:
            keep_program_alive(sys._getframe(1))
        return stop

    def checkpoint(self, counter: tf.Variable, **objects: Any) -> Checkpoints:
        """Checkpoints of `objects` in train_dir, restored now from the newest one (if any): saved
        as train.checkpoint_steps/_secs ask and at train.steps (checked in `report`), and when the
        program returns."""
        self.checkpoints = Checkpoints(self.train_dir, counter, objects)
        step = self.checkpoints.restore()
        p = self._progress
        p.step = p.last_log_step = step
        p.first_step = step
        return self.checkpoints

    def report(self, step: int, loss: float, examples: int | None = None) -> None:
        """The newest global step and loss (and the examples since the last report, for images/s):
        prints the progress line the launcher's supervisor reads, at most every
        train.log_every_secs, and saves a checkpoint when one is due."""
        from cluster.runtime.session import save_due
        p, now = self._progress, time.monotonic()
        if p.first_step is None:
            p.first_step = int(step)
        previous = p.step
        p.step, p.loss = int(step), float(loss)
        p.reports += 1
        p.examples += examples or 0
        if p.reports == 1:      # a step has run: the model's variables and the optimizer's slots exist
            self.variables.write()
        if now - p.last_log >= self.train.log_every_secs or p.reports == 1 or p.step >= self.train.steps:
            rate = '' if p.reports == 1 or now <= p.last_log else \
                f'  {(p.step - p.last_log_step) / (now - p.last_log):.1f} global steps/s'
            PULSE.beat(p.step, self.train.steps)      # heard when a full disk stops the log
            messages.say(log, messages.progress(p.step, self.train.steps, p.loss, rate))
            p.last_log, p.last_log_step = now, p.step
        c = self.checkpoints
        if c is None:
            return
        # The final step is saved at once, not after the program returns: freeing a PSS program's
        # tf.functions can block for seconds to a minute (each is removed from every remote task).
        final = p.step >= self.train.steps and c.saved_step != p.step
        if p.step >= self.train.steps:
            keep_program_alive(sys._getframe(1))
        asked = self._save_asked(p.step)
        if final or asked or save_due(
                self.train, p.step, c.saved_step if c.saved_step is not None else previous, now - c.saved_at):
            c.save()

    def _save_asked(self, step: int) -> bool:
        """Whether the launcher asked for a save since the last one (the lease's save requests,
        as the TF1 chief honours them: a ps or worker got a preemption notice, a scale)."""
        asked = LIVE.save_requests()
        if asked <= self._saves_asked:
            return False
        self._saves_asked = asked
        log.info('saving a checkpoint at global step %d: the launcher asked for one', step)
        return True

    def finish(self) -> None:
        """After the program: the last checkpoint, unless the newest step is saved already."""
        c = self.checkpoints
        if c is None or (c.saved_step is not None and c.saved_step >= self.train.steps):
            return      # the final step is saved: the ps may be gone already (the counter lives there)
        if c.saved_step != int(c.counter.numpy()):
            c.save()

    def result(self) -> dict:
        p = self._progress
        seconds = time.monotonic() - p.started
        out = {'task': self.task.name, 'reports': p.reports, 'first_global_step': p.first_step,
               'global_step': p.step, 'loss': p.loss, 'seconds': seconds}
        if p.examples:
            out['images_per_sec'] = p.examples / max(seconds, 1e-9)
        return out


# The program's frames from the moment its training ends, held until the process ends (the task
# ends through os._exit, which frees nothing). Freeing a PSS program's objects as it returns would
# remove each of its tf.functions from every remote task, an RPC each, which was seen to take from
# seconds to a minute with the servers up, and which logs a "Failed to remove function remotely"
# error per function and task once they are stopped. Held, they cost nothing: the process ends.
_KEPT: list[types.FrameType] = []


def keep_program_alive(frame: types.FrameType) -> None:
    """Hold `frame` (and through f_back every frame that called it) past its return, so what the
    program's functions hold is never freed by this process. Once per frame: should_stop() may
    be asked after every step of a stop."""
    if not any(kept is frame for kept in _KEPT):
        _KEPT.append(frame)


class EvaluatorContext:
    """What an evaluator `train.evaluator` function gets: the checkpoints to evaluate, one by one,
    and `report` for each evaluation's figures."""

    def __init__(self, spec: ClusterSpec, task: TaskSpec, stop: StopSignal | None = None) -> None:
        self.spec, self.task = spec, task
        self.train: TrainConfig = spec.train
        self.train_dir = spec.train.train_dir
        self.final_step = spec.train.steps
        self._stop = stop or StopSignal(after='the evaluation under way')
        self._writer: Any = None
        self.evaluated: int | None = None

    def should_stop(self) -> bool:
        """Asked to stop, or the final checkpoint (train.steps) evaluated."""
        return self._stop.event.is_set() or (self.evaluated is not None and self.evaluated >= self.final_step)

    def checkpoints(self, poll_secs: float = CHECKPOINT_POLL_SECS) -> Iterator[tuple[str, int]]:
        """(path, step) of each newest checkpoint as the chief writes it (a newer one may skip
        some); ends after the final one (its step reaches train.steps) or when asked to stop."""
        import tensorflow as tf
        seen = None
        while not self.should_stop():
            path = tf.train.latest_checkpoint(self.train_dir)
            if path and path != seen:
                seen = path
                yield path, checkpoint_step(path)
            elif self._stop.event.wait(poll_secs):
                return

    def report(self, step: int, metrics: Mapping[str, float]) -> None:
        """One evaluation's figures: scalars in TensorBoard under <train_dir>/eval, and the line the
        launcher records as an `evaluation` event."""
        from cluster.training import summaries     # the protos: tf.summary needs the tensorboard package
        values = {k: float(v) for k, v in metrics.items()}
        if self._writer is None:
            self._writer = summaries.writer(rundir.eval_summary_dir(self.train_dir))
        for name, value in values.items():
            self._writer.add_summary(summaries.scalar(f'eval/{name}', value), step)
        self._writer.flush()
        self.evaluated = max(step, self.evaluated or 0)
        messages.say(log, messages.Evaluation(step, values))


# -- the task side ---------------------------------------------------------------------------------

def serve(spec: ClusterSpec, task: TaskSpec) -> int:
    """A ps or worker task of a coordinator run: serve until stopped (PSS runs the work here).
    With no launcher to stop it (under Slurm, or started by hand) it ends by itself once the chief
    has come and gone (watch_chief)."""
    import tensorflow as tf
    server = tf.distribute.Server(tf.train.ClusterSpec(spec.cluster_def()), job_name=task.job,
                                  task_index=task.index, protocol='grpc', start=True)
    messages.say(log, messages.Serving(task.name, task.address, os.getpid()))
    if not os.environ.get(rundir.LEASE_ENV):
        threading.Thread(target=watch_chief, args=(spec.chief,), name='chief-watch', daemon=True).start()
    server.join()
    return rundir.EXIT_OK


CHIEF_GONE_SECS = 10.0      # the chief's port closed this long (once seen open): its program has ended


def watch_chief(chief: TaskSpec, poll: float = 0.2) -> None:
    """End this serving task (exit 0) once the chief's port, seen open, has stayed closed for
    CHIEF_GONE_SECS: what ends a coordinator run's servers where no launcher stops them (a Slurm
    job ends when its last task does). It looks often: a short run's chief may hold its port for
    a second or two only, and a chief never seen open is never seen gone."""
    seen = False
    closed_since: float | None = None
    while True:
        time.sleep(poll)
        if connects(chief.host, chief.port):
            seen, closed_since = True, None
        elif seen:
            closed_since = closed_since or time.monotonic()
            if time.monotonic() - closed_since >= CHIEF_GONE_SECS:
                log.info('%s has ended (its port closed %.0fs ago): nothing left to serve', chief.name,
                         CHIEF_GONE_SECS)
                logging.shutdown()
                os._exit(rundir.EXIT_OK)


def run_chief(spec: ClusterSpec, task: TaskSpec, program: Callable[[CoordinatorContext], Any]) -> int:
    """The chief: call the user's program with a CoordinatorContext, then save what is left."""
    stop = StopSignal()
    stop.install()
    os.makedirs(spec.train.train_dir, exist_ok=True)
    ctx = CoordinatorContext(spec, task, stop)
    # The chief serves no task of the cluster: the launcher waits for this line instead of a
    # server (launch/run/supervised/startup.py probes no port of a chief or an evaluator).
    messages.say(log, messages.Started(task.name, f'the program {spec.train.program}', os.getpid()))
    with ctx.variables.scope():
        program(ctx)
    ctx.variables.write()
    ctx.finish()
    rundir.write_atomically(rundir.chief_result_path(spec.train.train_dir), runjson.dumps(ctx.result()))
    log.info('the program ended at global step %d', ctx.step)
    if stop.preempted and ctx.step < spec.train.steps:
        return EXIT_PREEMPTED
    return 128 + stop.signum if stop.signum and ctx.step < spec.train.steps else rundir.EXIT_OK


def run_evaluator(spec: ClusterSpec, task: TaskSpec, function: Callable[[EvaluatorContext], Any]) -> int:
    """The evaluator: call train.evaluator with an EvaluatorContext (it serves no port)."""
    stop = StopSignal(after='the evaluation under way')
    stop.install()
    ctx = EvaluatorContext(spec, task, stop)
    messages.say(log, messages.Started(task.name, f'the evaluator {spec.train.evaluator}', os.getpid()))
    log.info('%s', rundir.evaluator_waits_line(task.name, spec.train.train_dir))
    function(ctx)
    log.info('evaluated up to global step %s', ctx.evaluated)
    if stop.preempted:
        return EXIT_PREEMPTED
    return 128 + stop.signum if stop.signum else rundir.EXIT_OK
