"""Run one task of a cluster: `python -m cluster.task --spec SPEC --job worker --index 0`.

Without --job and --index the task comes from $TF_CONFIG (its cluster too), so the image runs
unchanged where a scheduler sets TF_CONFIG (Kubeflow's TFJob, SageMaker, Vertex); with --slurm
from Slurm's environment, with --jobset from a JobSet pod's (launch render --format jobset).

The same entry point runs everywhere: started by hand, by `launch up` as a local process, over
SSH, or in a container. Everything that can be checked without TensorFlow is checked first, so a
bad invocation fails in a fraction of a second with exit code 2 and nothing started.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time
import types
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from cluster.runtime import masking, notice, ports, pulse, stacks, telemetry, tfenv
from cluster.runtime.causes import cause_line
from cluster.runtime.ports import port_in_use
from cluster.runtime.lease import CHILDREN, resolve_task, watch_lease
from cluster.runtime.membership import LIVE
from cluster.checks.code import ProgramError, check_user_code, user_code
from cluster.program import load_program, run_command, run_program
from cluster.runtime.contract import (EXIT_FAILED, EXIT_NO_RESTART, EXIT_OK, EXIT_USAGE, LEASE_ENV, LEASE_SECS_ENV,
                                      TaskArgs, parse_task_argv, run_to_exit)
from cluster.runtime.messages import Serving, say
from cluster.runtime.rundir import TaskLogFormatter
from cluster.spec import ClusterSpec, SpecError, TaskSpec
from cluster.spec.environ import MASK

if TYPE_CHECKING:
    from cluster.checks.data import DataSet

log = logging.getLogger('cluster.task')


def parse_args(argv: Sequence[str] | None = None) -> TaskArgs:
    """The task's command line, by the contract's one parser (the launcher builds it with task_argv)."""
    return parse_task_argv(argv, __doc__.splitlines()[0])


def import_tensorflow(keras: bool) -> types.ModuleType:
    """`import tensorflow`, without the Keras import it makes for Keras' own sake unless `keras`.

    TensorFlow's __init__ imports Keras' optimizers eagerly (so that they register themselves) and
    skips that if Keras cannot be imported. The ps tasks and the built-in trainer never use Keras,
    and it is about a sixth of the import, which every task pays at start-up, three or more of them
    at once on a shared host. A user's program may use Keras: its workers import it as usual."""
    blocked = [] if keras else [m for m in ('keras', 'tf_keras') if m not in sys.modules]
    for name in blocked:
        # import of it raises ImportError, which TensorFlow skips (typeshed allows only modules here)
        sys.modules[name] = None    # type: ignore[assignment]
    try:
        import tensorflow
    finally:
        for name in blocked:
            del sys.modules[name]   # a later `import keras` works as usual
    return tensorflow


SHOWN_VALUE_CHARS = 200     # a longer value is logged as its size: the line is read, not the data


def environment_line(spec: ClusterSpec, task: TaskSpec, environ: Mapping[str, str]) -> str:
    """What the task got of the spec's `env:` (as it sees it: a backend that lost one shows up
    here) and the GPUs it may use; '' when there is neither. Values the spec hides (secret-looking
    names, values taken from the launcher's environment: ClusterSpec.hides) are not written to
    the log, nor long ones."""
    words = []
    gpus = environ.get('CUDA_VISIBLE_DEVICES')
    if task.job == 'worker' and gpus:
        words.append(f'CUDA_VISIBLE_DEVICES={gpus}')
    names = {**spec.task_env(task.job), **spec.env_from, **spec.job_env_from.get(task.job, {})}
    for name in sorted(names):
        value = environ.get(name)
        shown = '(not set)' if value is None else MASK if spec.hides(task.job, name) else \
            repr(value) if len(value) <= SHOWN_VALUE_CHARS else f'({len(value):,} characters)'
        words.append(f'{name}={shown}')
    return f'environment: {" ".join(words)}' if words else ''


def main(argv: list[str] | None = None) -> int:
    """Run one task to its end; the exit code tells the launcher what happened (cluster/runtime/rundir.py)."""
    # A task started in the background by a shell (the SSH backend's wrapper) inherits SIGINT and
    # SIGQUIT ignored; give them back their usual meaning, so `kill -INT` stops a task anywhere.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    args = parse_args(argv)
    try:
        spec, task = resolve_task(args)
        masking.install(masking.task_masker(spec, task.job, os.environ))     # before anything prints
        check_user_code(spec, task)
        from cluster.checks import data   # no TensorFlow at import time
        builtin = not (spec.train.program or spec.train.command)
        data_set = data.resolve_spec_data(spec) if task.job == 'worker' and builtin else None
    except ValueError as e:       # SpecError
        print(f'cluster.task: error: {e}', file=sys.stderr)
        return EXIT_USAGE
    if task.job != 'evaluator' and port_in_use(task.port):     # an evaluator serves nothing
        print(f'cluster.task: error: {ports.in_use_line(task.name, task.port)}', file=sys.stderr)
        return EXIT_USAGE

    handler = pulse.LogHandler(sys.stdout)     # a line the disk refuses is noted in the pulse
    handler.setFormatter(TaskLogFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    # Before anything that can hang: from here on, SIGUSR1 dumps every thread's stack (a stall, `launch debug`).
    stacks.install(spec.train.train_dir, task.job, task.index, time.time())
    # SIGTERM from here on: the launcher's stop if it marked the task, else a preemption notice.
    notice.install(task.name, spec.train.train_dir, task.job, task.index, spec.supervise.preemption_grace)
    if pulse.start_beating():   # the launcher sees the steps even when the disk refuses the log
        # ... and each task's own figures: its steps (a built-in worker's), CPU, memory, TCP bytes.
        telemetry.Sampler(pulse.PULSE, trainer=task.job == 'worker' and builtin).start()
    if os.environ.get(LEASE_ENV):
        watch_lease(os.environ[LEASE_ENV], float(os.environ.get(LEASE_SECS_ENV) or 10), pool=spec.num_workers)
        # Sync: the graph counts the workers that run (a scale restarts the cluster with the new count).
        spec = dataclasses.replace(spec, live=LIVE.current(spec.num_workers).count)
    line = environment_line(spec, task, os.environ)
    if line:
        log.info('%s: %s', task.name, line)
    if spec.coordinator:
        return run_coordinator_task(spec, task)
    if spec.train.command:        # the user's process is the task: no TensorFlow in this one
        # With no launcher (Slurm, TFJob, by hand), a command's ps ends once its workers have.
        return run_command(spec, task, port_in_use, CHILDREN, stop_with_workers=not os.environ.get(LEASE_ENV))
    return serve_and_train(spec, task, data_set)


def run_coordinator_task(spec: ClusterSpec, task: TaskSpec) -> int:
    """A task of a coordinator run (cluster/coordinator.py): ps and workers serve, the chief runs
    the program or command, the evaluator train.evaluator."""
    from cluster import coordinator
    for name, value in tfenv.coordinator_env().items():     # also when started by hand
        os.environ.setdefault(name, value)
    key, code = user_code(spec, task)
    if isinstance(code, tuple):     # TF_CONFIG alone tells a TF2 program its place
        exit_code = run_command(spec, task, None, CHILDREN, command=code)     # it serves nothing
        if exit_code == EXIT_OK:    # the line a Slurm chief's rank waits for from the evaluator
            log.info('%s finished', task.name)
        return exit_code
    tf = import_tensorflow(keras=code is not None)
    for name in ('tensorflow', 'absl'):     # a line per save, a session config dump: not progress
        logging.getLogger(name).setLevel(logging.WARNING)
    tf.get_logger().setLevel(logging.ERROR)
    if code is None:
        try:
            return coordinator.serve(spec, task)
        except tf.errors.OpError as e:      # its port, taken after the check in main
            return cannot_serve(task, cause_line(e.message, '(no message)'))
    try:
        function = load_program(code)
    except ProgramError as e:
        print(f'cluster.task: error: {spec.error(key, str(e))}', file=sys.stderr)
        return EXIT_USAGE
    run = coordinator.run_chief if task.job == 'chief' else coordinator.run_evaluator
    try:
        exit_code = run(spec, task, function)
    except tf.errors.OpError as e:      # a lost ps (PSS raises it to the coordinator), a lost peer
        log.error('%s: %s: %s', task.name, type(e).__name__, cause_line(e.message, '(no message)'))
        return EXIT_FAILED
    except ProgramError as e:
        log.error('%s', e)
        return EXIT_NO_RESTART
    log.info('%s finished', task.name)
    return exit_code


def cannot_serve(task: TaskSpec, why: str) -> int:
    """The task's server could not bind its port (another process took it after the check in
    main): one line naming who holds it where that can be seen, EXIT_USAGE."""
    held = port_in_use(task.port)
    line = ports.in_use_line(task.name, task.port, {os.getpid()}) if held else \
        f'{task.name}: cannot serve on port {task.port}: {why} (another process took the port?)'
    print(f'cluster.task: error: {line}', file=sys.stderr)
    return EXIT_USAGE


def serve_and_train(spec: ClusterSpec, task: TaskSpec, data_set: DataSet | None) -> int:
    """Start the task's TensorFlow server, then serve (ps), run the user's program or the built-in
    trainer (worker); the exit code of the task."""
    ref = spec.train.program if task.job == 'worker' else None     # the user's program this task runs
    tf = import_tensorflow(keras=bool(ref))
    from cluster.runtime import session
    from cluster.training import train
    tf.get_logger().setLevel(logging.ERROR)     # TF1 deprecation notices drown the progress lines
    tf.compat.v1.disable_eager_execution()
    program = None
    if ref:
        try:
            program = load_program(ref)
        except ProgramError as e:
            print(f'cluster.task: error: {spec.error("train.program", str(e))}', file=sys.stderr)
            return EXIT_USAGE
    try:
        server = train.make_server(spec, task)
    except tf.errors.OpError as e:      # lost a race for the port after the check in main
        return cannot_serve(task, session.first_line(e.message, '(no message)'))
    say(log, Serving(task.name, task.address, os.getpid()))
    try:
        if task.job == 'ps':
            train.run_ps(server, spec, task)
        elif program is not None:
            run_program(server, spec, task, program)
        else:
            assert data_set is not None     # main resolves it for every worker of the built-in trainer
            train.run_worker(server, spec, task, data_set)
    except tf.errors.OpError as e:
        # A peer that went away (Unavailable, Aborted, a closed stream): one line, not 40 frames of
        # TensorFlow internals; the launcher names the task that was lost first.
        log.error('%s: %s: %s', task.name, type(e).__name__, cause_line(e.message, '(no message)'))
        return EXIT_FAILED
    except (session.CheckpointError, ProgramError, SpecError) as e:     # a restart would fail the same way
        log.error('%s', e)      # (a SpecError here: a batch too large for this host's memory)
        return EXIT_NO_RESTART
    log.info('%s finished', task.name)
    return EXIT_OK


if __name__ == '__main__':
    run_to_exit(main, closes=(masking.drain,))    # a command's last lines first
