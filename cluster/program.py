"""The user's own training code, in place of the built-in CIFAR-10 trainer.

Two spec keys, one or the other:

- `train.program: package.module:function` is between-graph TF1 code called in every worker task
  with a `ProgramContext`. The launcher keeps its part: the ps tasks, the "done" protocol that
  ends them, logs, progress lines (the program calls `ctx.report(step, loss)`), checkpoints by the
  chief (`ctx.session()` restores the newest one and saves on schedule, on SIGTERM and at the end)
  and tear-down. A minimal program:

      def train(ctx):
          with tf.Graph().as_default():
              with tf.compat.v1.device(ctx.device_setter):
                  step = tf.compat.v1.train.get_or_create_global_step()
                  loss = ...
                  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step)
              with ctx.session() as sess:
                  while not ctx.should_stop():
                      _, n, value = sess.run([train_op, step, loss])
                      ctx.report(n, value)

- `train.command: python my_train.py --flags` runs in every task instead of the task itself, with
  TF_CONFIG and the classic TF1 flags (--job_name --task_index --ps_hosts --worker_hosts), so a
  script written for TensorFlow's distributed guide runs unchanged. `run_command` keeps the task's
  part: the lease, signals passed on, the "serving on" line once the script's server listens
  (a coordinator run's chief and evaluator serve nothing: they say "started").

The checks of both (`check_program`, `check_command`) live in cluster/checks/code.py: they read no
TensorFlow and import nothing of the user's, so the launcher runs them before anything starts, and
each task again on its own host.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from cluster.checks.code import PROGRAM_IS, PYTHON_NAMES, ProgramError, split_program
from cluster.runtime.membership import LIVE
from cluster.runtime import children as lineage, masking, messages, notice, ports, rundir
from cluster.runtime.contract import EXIT_PREEMPTED
from cluster.spec import ClusterSpec, TaskSpec, TrainConfig, address

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger('cluster.program')

# ---------------------------------------------------------------------------------------------
# Loading a program, once the checks have found it

def load_program(ref: str) -> Callable[[Any], Any]:
    """Import the program's function; ProgramError (one line) if it cannot be."""
    module, function = split_program(ref)
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise ProgramError(f'importing {module!r} failed: {e}') from None
    fn = getattr(mod, function, None)
    if not callable(fn):
        raise ProgramError(f'module {module!r} has no function {function!r}' if fn is None else
                           f'{module}.{function} is a {type(fn).__name__}, not a function: {PROGRAM_IS}')
    why = signature_problem(fn)
    if why:
        raise ProgramError(f'{module}.{function} {why}: {PROGRAM_IS}')
    return fn


# Functions of C code: a signature may well take one argument (os.system's does), but ctx is no
# argument they can use.
_BUILTINS = (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodWrapperType,
             types.MethodDescriptorType, types.ClassMethodDescriptorType)


def signature_problem(fn: Callable[..., object]) -> str | None:
    """Why `fn` cannot be called as fn(ctx), read from its signature without calling it, else None."""
    if inspect.isclass(fn):
        return 'is a class'
    if isinstance(fn, _BUILTINS):
        return 'is a built-in function, not a Python def'    # os.system's signature would take ctx
    if inspect.iscoroutinefunction(fn):
        return 'is an async def (calling it runs nothing)'
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 'has no signature that can be read'
    try:
        sig.bind(object())
    except TypeError:
        return f'takes {sig}, not one argument'
    return None


def command_argv(command: tuple[str, ...], spec: ClusterSpec, task: TaskSpec) -> list[str]:
    """The command line a task runs: the user's command with the classic TF1 flags appended (not
    in a coordinator run: a TF2 program reads TF_CONFIG), and `python`/`python3` replaced by this
    task's interpreter (the one with TensorFlow)."""
    argv = list(command)
    if argv[0] in PYTHON_NAMES:
        argv[0] = sys.executable
    if spec.coordinator:
        return argv
    hosts = spec.cluster_def()
    return argv + ['--job_name', task.job, '--task_index', str(task.index),
                   '--ps_hosts', ','.join(hosts['ps']), '--worker_hosts', ','.join(hosts['worker'])]


# ---------------------------------------------------------------------------------------------
# train.program: the context a worker's program gets

@dataclass
class _Progress:
    local_steps: int = 0
    examples: int = 0
    step: int = 0
    loss: float = float('nan')
    first_step: int | None = None
    last_log: float = 0.0
    last_log_step: int = 0
    last_save: float = field(default_factory=time.monotonic)
    last_saved_step: int = 0
    started: float = field(default_factory=time.monotonic)
    save: Callable[[int], int] | None = None


@dataclass(frozen=True)
class ProgramContext:
    """What a `train.program` function gets: where it runs, and the launcher's services."""
    target: str                     # the worker's server, for tf.compat.v1.Session(target)
    cluster: Any                    # tf.compat.v1.train.ClusterSpec of the whole cluster
    job: str                        # 'worker'
    index: int
    is_chief: bool                  # worker 0: initialises, restores and saves checkpoints
    devices: tuple[str, ...]        # the tower devices of this worker (train.devices), as TF names
    train_dir: str
    train: TrainConfig              # the spec's train section (steps, batch_size, sync, seed, ...)
    device_setter: Callable         # replica_device_setter: variables on the ps tasks, ops here
    num_ps: int
    num_workers: int
    session_config: Any = None      # a ConfigProto that sees only the ps tasks and this worker
    _progress: _Progress = field(default_factory=_Progress, repr=False, compare=False)

    def device_setter_for(self, device: str) -> Callable:
        """A replica_device_setter placing a tower's ops on `device` (one of `devices`)."""
        import tensorflow as tf
        return tf.compat.v1.train.replica_device_setter(cluster=self.cluster, worker_device=device)

    def should_stop(self) -> bool:
        """Whether the global step reported last has reached train.steps."""
        return self._progress.step >= self.train.steps

    @contextlib.contextmanager
    def session(self) -> Iterator[tf.compat.v1.Session]:
        """A session on this worker's server, ready to train: on the chief, the variables restored
        from the newest checkpoint in train_dir (or initialised); elsewhere, once the chief has done
        that. Build the whole graph first, with a global step (get_or_create_global_step) under
        `device_setter`. The chief saves checkpoints as train.checkpoint_steps/_secs ask (checked
        in `report`), when stopped by SIGTERM or SIGINT, and when the block ends."""
        import tensorflow as tf
        from cluster.runtime import session as runtime
        v1 = tf.compat.v1
        global_step = v1.train.get_global_step()
        if global_step is None:
            raise ProgramError('the program built no global step: create it with '
                               'tf.compat.v1.train.get_or_create_global_step() under ctx.device_setter')
        saver = v1.train.Saver(max_to_keep=5, sharded=True)
        sess, stopper = runtime.start_session(
            self.target, self.is_chief, self.train_dir, saver, local_init_op=v1.local_variables_initializer(),
            ready_for_local_init_op=v1.report_uninitialized_variables(v1.global_variables()),
            config=self.session_config)
        p = self._progress
        p.step = p.first_step = p.last_log_step = p.last_saved_step = int(sess.run(global_step))
        p.started = p.last_save = p.last_log = time.monotonic()
        log.info('session ready at global step %d', p.step)
        if self.is_chief:
            _note_restart(self.train_dir, p.step)
        lock = stopper.lock if stopper else threading.Lock()

        def held(step: int | None = None) -> int:
            """A save, the lock held by the caller (GracefulStop holds it when it calls)."""
            step = int(sess.run(global_step)) if step is None else step
            runtime.save_checkpoint(saver, sess, self.train_dir, step)
            p.last_saved_step, p.last_save = step, time.monotonic()
            return step

        def save(step: int | None = None) -> int:
            with lock:
                return held(step)

        if stopper is not None:     # the chief's: it saves (on a signal too: GracefulStop, which holds the lock)
            stopper.arm(held)
            p.save = save
        yield sess
        if self.is_chief:
            save()

    def report(self, step: int, loss: float, examples: int | None = None) -> None:
        """Tell the launcher this worker's newest global step and loss (and, optionally, how many
        examples this update used, for the images/s figures). Call it once per update: it prints
        the progress line the launcher's supervisor reads, and the chief saves when one is due."""
        from cluster.runtime import session as runtime
        p = self._progress
        now = time.monotonic()
        p.step, p.loss = int(step), float(loss)
        p.local_steps += 1
        p.examples += examples or 0
        every = self.train.log_every_secs if self.is_chief else max(10.0, self.train.log_every_secs)
        if now - p.last_log >= every or p.local_steps == 1 or p.step >= self.train.steps:
            rate = '' if p.local_steps == 1 else \
                f'  {(p.step - p.last_log_step) / max(now - p.last_log, 1e-9):.1f} global steps/s'
            runtime.log_progress(p.step, self.train.steps, p.loss, rate)
            p.last_log, p.last_log_step = now, p.step
        if p.save and runtime.save_due(self.train, p.step, p.last_saved_step, now - p.last_save):
            p.save(p.step)

    def result(self) -> dict:
        """This worker's figures, as the built-in trainer writes them (worker-N.json)."""
        p = self._progress
        seconds = time.monotonic() - p.started
        out = {'task': f'{self.job}:{self.index}', 'local_steps': p.local_steps, 'first_global_step': p.first_step,
               'global_step': p.step, 'loss': p.loss, 'seconds': seconds}
        if p.examples:
            out['images_per_sec'] = p.examples / max(seconds, 1e-9)
        return out


def _note_restart(train_dir: str, step: int) -> None:
    """A restarted chief records the launcher's cause in TensorBoard, as the built-in trainer does
    (the program's own summaries, if any, are its business)."""
    from cluster.training import summaries
    if summaries.restart_cause():
        w = summaries.writer(train_dir)
        try:
            summaries.note_restart(w, step)
        finally:
            w.close()


def run_program(server: tf.compat.v1.train.Server, spec: ClusterSpec, task: TaskSpec,
                fn: Callable[[ProgramContext], Any]) -> dict:
    """Call the user's `train.program` function in this worker, then report done to the ps tasks
    as the built-in trainer does, so they end by themselves, and write this worker's figures."""
    import tensorflow as tf
    from cluster.runtime import session as runtime
    from cluster.training.train import tower_devices
    v1 = tf.compat.v1
    os.makedirs(spec.train.train_dir, exist_ok=True)
    cluster = v1.train.ClusterSpec(spec.cluster_def())
    worker_device = f'/job:worker/task:{task.index}'
    ctx = ProgramContext(
        target=server.target, cluster=cluster, job=task.job, index=task.index, is_chief=task.is_chief,
        devices=tuple(tower_devices(spec, task)), train_dir=spec.train.train_dir, train=spec.train,
        device_setter=v1.train.replica_device_setter(cluster=cluster, worker_device=worker_device),
        num_ps=spec.num_ps, num_workers=spec.num_workers,
        session_config=v1.ConfigProto(device_filters=['/job:ps', worker_device], allow_soft_placement=True))
    fn(ctx)
    result = ctx.result()
    with tf.Graph().as_default():
        done_ops = runtime.done_ops(spec.num_ps, spec.num_workers, task.index,
                                    LIVE.generation(task.index, spec.num_workers))
        sess = v1.Session(server.target, config=ctx.session_config)
        runtime.report_done(sess, done_ops)
    runtime.write_result(spec.train.train_dir, task.index, result)
    return result


# ---------------------------------------------------------------------------------------------
# train.command: the user's process in place of the task

def run_command(spec: ClusterSpec, task: TaskSpec, listening: Callable[[int], bool] | None,
                children: list[subprocess.Popen], stop_with_workers: bool = False,
                command: tuple[str, ...] | None = None) -> int:
    """Run the spec's command as this task and return its exit code (128 + N if killed by signal
    N). SIGTERM, SIGINT and SIGHUP are passed on; "serving on" is logged once its server listens
    on the task's port (`listening(port)`) and every listener there is the task's own (another
    process there ends the task: EXIT_USAGE, one line naming it), which is what the launcher waits
    for; a task that serves nothing (`listening` None: a coordinator run's chief or evaluator)
    says "started" at once instead. The process is added to `children`, which the task kills if
    it has to end without it; it dies with the task in any case (cluster/runtime/children.py).

    `stop_with_workers` (a ps task with no launcher to stop it: under Slurm, TFJob, or by hand):
    once every worker's server has been seen and all of them are gone, the command's ps, which
    would `server.join()` for ever, is stopped and the task exits 0."""
    command = command or spec.train.command
    assert command is not None       # called only for a spec with a train.command (or an evaluator's)
    argv = command_argv(command, spec, task)
    env = dict(os.environ, TF_CONFIG=spec.tf_config(task))
    child = lineage.start(argv, env, **masking.command_streams())   # dies with this task; masked output
    children.append(child)
    masking.copy_output(child)
    if listening is None:
        messages.say(log, messages.Started(task.name, ' '.join(argv), child.pid))
    else:
        log.info('%s runs %s (pid %d)', task.name, ' '.join(argv), child.pid)

    def forward(signum: int, frame: types.FrameType | None = None) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    # SIGTERM through the notice thread: passed on either way; a notice makes the end "preempted".
    notice.NOTICES.take(notice.Role(on_stop=forward, on_preempted=lambda: forward(signal.SIGTERM)))
    serving = listening is None
    watch = _WorkersGone(spec) if stop_with_workers and task.job == 'ps' else None
    while child.poll() is None:
        if not serving and listening is not None and listening(task.port):
            taken = ports.taken_from(task.name, task.port, os.getpid())
            if taken:       # another process answers on the task's port: it must not pass for ours
                log.error('%s', taken)
                _end(child)
                return rundir.EXIT_USAGE
            serving = True
            messages.say(log, messages.Serving(task.name, address(task.host, task.port), child.pid))
        if watch and watch.all_gone():
            log.info('every worker has finished; stopping this ps task\'s command')
            _end(child)
            return 0
        time.sleep(0.05 if not serving else 0.2)
    code = child.returncode
    if notice.NOTICES.preempted.is_set():
        log.info('%s: the command ended (%s) after the preemption notice', task.name, code)
        return EXIT_PREEMPTED
    return 128 - code if code < 0 else code


class _WorkersGone:
    """Whether every worker's server was seen listening and none has listened for a while since
    (asked at most twice a second, each probe a plain TCP connect)."""

    QUIET_SECS = 3.0

    def __init__(self, spec: ClusterSpec) -> None:
        self.workers = spec.job_tasks('worker')
        self.seen: set[str] = set()
        self.quiet_since: float | None = None
        self.asked = 0.0

    def all_gone(self) -> bool:
        if time.monotonic() - self.asked < 0.5:
            return False
        self.asked = time.monotonic()
        up = {t.name for t in self.workers if connects(t.host, t.port)}
        self.seen |= up
        if up or len(self.seen) < len(self.workers):
            self.quiet_since = None
            return False
        self.quiet_since = self.quiet_since or time.monotonic()
        return time.monotonic() - self.quiet_since >= self.QUIET_SECS


def connects(host: str, port: int) -> bool:
    """Whether a TCP connection to host:port is accepted within half a second."""
    import socket
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _end(child: subprocess.Popen) -> None:
    """SIGINT (a Python script's KeyboardInterrupt; SIGTERM may be ignored, as under Slurm, where
    ps tasks keep it off to let the chief save), then SIGKILL after a grace."""
    for sig, grace in ((signal.SIGINT, 5), (signal.SIGKILL, 5)):
        try:
            child.send_signal(sig)
            child.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return

