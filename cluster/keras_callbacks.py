"""Keras glue for coordinator runs: what a `model.fit` program under ParameterServerStrategy (and
its `SidecarEvaluator`) needs to talk to the launcher. examples/pss_keras.py uses all of it.

Keras under PSS is Keras 2 (tf-keras; Keras 3 has no PSS), so this module imports `tf_keras`:
import it only from a Keras program.

- `progress(ctx)`: the chief's progress lines and checkpoints (through `ctx.report`) from
  `model.fit`, and a graceful stop (`model.stop_training`) when the launcher asks for one.
- `fit_epochs(ctx, ...)`: steps_per_epoch, epochs and initial_epoch such that fit ends at
  train.steps, counted from the global step the newest checkpoint restored.
- `backup_and_restore(ctx)`: Keras' own fault tolerance, under <train_dir>/backup.
- `sidecar_evaluate(ctx, model, data)`: a SidecarEvaluator over the chief's checkpoints that
  reports each evaluation and ends after the final one (or when asked to stop).
"""
from __future__ import annotations

import collections
import logging
import math
import os
import threading
from typing import TYPE_CHECKING, Any

import tf_keras as keras

if TYPE_CHECKING:
    from cluster.coordinator import CoordinatorContext, EvaluatorContext

log = logging.getLogger(__name__)

BACKUP_DIR = 'backup'       # under train_dir: BackupAndRestore's checkpoints, apart from model.ckpt-<step>


class ReportProgress(keras.callbacks.Callback):
    """`ctx.report` after each execution of `model.fit` (steps_per_execution steps).

    Under PSS, fit schedules each execution and hands its batch logs to the callbacks as a
    RemoteValue at once, before any worker has run it. Fetching that value would wait for it and
    leave the other workers without work, so the loss reported is that of an execution `lag`
    executions older (by then it is done, or nearly so). The global step is read from the
    optimizer's `iterations` on the ps."""

    def __init__(self, ctx: CoordinatorContext, batch_size: int | None = None, lag: int | None = None) -> None:
        super().__init__()
        self._supports_tf_logs = True      # PSS refuses batch-level callbacks that would fetch every log
        self.ctx = ctx
        self.batch_size = batch_size or ctx.train.batch_size
        self.lag = ctx.num_workers if lag is None else lag
        self._pending: collections.deque = collections.deque()
        self._reported: int | None = None
        self._loss = math.nan

    def on_train_begin(self, logs: Any = None) -> None:
        self._reported = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._pending.append(logs)
        while len(self._pending) > self.lag:
            self._loss = _loss_of(self._pending.popleft(), self._loss)
        if not math.isnan(self._loss):      # no line before the first loss is known
            self._report(int(self.model.optimizer.iterations.numpy()))
        if self.ctx.stopping or self.ctx.should_stop():
            self.model.stop_training = True

    def on_train_end(self, logs: Any = None) -> None:
        """The last figures: every execution has ended (fit joins the workers before this)."""
        while self._pending:
            self._loss = _loss_of(self._pending.popleft(), self._loss)
        self._report(int(self.model.optimizer.iterations.numpy()))

    def _report(self, step: int) -> None:
        start = step if self._reported is None else self._reported
        self.ctx.report(step, self._loss, examples=max(step - start, 0) * self.batch_size)
        self._reported = step


def _loss_of(logs: Any, default: float) -> float:
    """The loss of a batch's logs: a dict, or under PSS a RemoteValue of one (fetched here)."""
    if logs is None:
        return default
    if hasattr(logs, 'fetch'):
        logs = logs.fetch()
    value = logs.get('loss') if isinstance(logs, dict) else None
    return default if value is None else float(value)


def progress(ctx: CoordinatorContext, batch_size: int | None = None) -> ReportProgress:
    """The callback that reports the chief's progress to the launcher (and saves checkpoints as
    train.checkpoint_steps/_secs ask); pass it to `model.fit(callbacks=[...])`."""
    return ReportProgress(ctx, batch_size)


def fit_epochs(ctx: CoordinatorContext, steps_per_execution: int, steps_per_epoch: int) -> dict[str, int]:
    """`model.fit` arguments (steps_per_epoch, epochs, initial_epoch) that end at train.steps.

    steps_per_epoch is rounded to a multiple of steps_per_execution (an epoch then never ends with
    a shorter execution), and shortened to one that divides train.steps where there is one. initial_epoch follows the global step the newest checkpoint restored
    (call it after `ctx.checkpoint`); BackupAndRestore, where it has a backup, replaces it with
    the epoch after its backup's. A resume within an epoch runs that whole epoch again, and
    ReportProgress stops fit once the global step reaches train.steps."""
    per_epoch = max(steps_per_execution, steps_per_epoch - steps_per_epoch % steps_per_execution)
    # The longest such epoch, at most that long, that divides train.steps: fit then ends on the
    # last step itself, not an execution or more past it (PSS schedules executions ahead).
    fitting = [n for n in range(per_epoch, 0, -steps_per_execution) if ctx.train.steps % n == 0]
    per_epoch = fitting[0] if fitting else per_epoch
    restored = int(ctx.checkpoints.counter.numpy()) if ctx.checkpoints is not None else 0
    return {'steps_per_epoch': per_epoch, 'epochs': math.ceil(ctx.train.steps / per_epoch),
            'initial_epoch': restored // per_epoch}


def backup_and_restore(ctx: CoordinatorContext) -> keras.callbacks.BackupAndRestore:
    """Keras' BackupAndRestore under <train_dir>/backup: under PSS it backs up at each epoch's end
    (batch-level backups are skipped there) and deletes its backup when fit ends."""
    return keras.callbacks.BackupAndRestore(backup_dir=os.path.join(ctx.train_dir, BACKUP_DIR))


class ReportEvaluation(keras.callbacks.Callback):
    """`ctx.report` after each of SidecarEvaluator's evaluations, at the global step its
    checkpoint restored (the model's optimizer's `iterations`)."""

    def __init__(self, ctx: EvaluatorContext) -> None:
        super().__init__()
        self.ctx = ctx

    def on_test_end(self, logs: Any = None) -> None:
        metrics = {k: float(v) for k, v in (logs or {}).items()}
        self.ctx.report(int(self.model.optimizer.iterations.numpy()), metrics)


def sidecar_evaluate(ctx: EvaluatorContext, model: Any, data: Any, steps: int | None = None) -> None:
    """Evaluate `model` (compiled with the chief's optimizer class, so the checkpoints' optimizer
    restores its `iterations`) on `data` for each newest checkpoint in train_dir, with Keras'
    SidecarEvaluator. It stops by itself once a checkpoint's number reaches max_evaluations
    (train.steps: the final checkpoint); it runs in a thread of its own so that a stop asked of
    the evaluator ends it too (it would otherwise wait for checkpoints for ever)."""
    evaluator = keras.utils.SidecarEvaluator(model, data, checkpoint_dir=ctx.train_dir, steps=steps,
                                             max_evaluations=ctx.final_step, callbacks=[ReportEvaluation(ctx)])
    failure: list[BaseException] = []

    def run() -> None:
        try:
            evaluator.start()
        except BaseException as e:      # noqa: B036 -- raised again in the caller's thread
            failure.append(e)

    thread = threading.Thread(target=run, name='sidecar-evaluator', daemon=True)
    thread.start()
    while thread.is_alive() and not ctx.should_stop():
        thread.join(timeout=1.0)
    if failure:
        raise failure[0]
    if thread.is_alive():
        log.info('stopping: the evaluation under way is abandoned')
