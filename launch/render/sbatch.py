"""The Slurm batch script of a spec: `launch render SPEC --format sbatch` prints it, and
`launch up SPEC --backend slurm` (launch/backends/slurm/job.py) submits it and follows the job.

The script stands on its own (plain `sbatch FILE` runs it too): it carries the effective spec and
writes it into the train_dir, then one `srun` step runs `python -m cluster.task --slurm` on every
rank. Each task works out its job, index, host and port from Slurm's environment
(cluster/env/slurm.py), so the script names no host: Slurm picks the nodes when the job starts.

A coordinator run (a `chief`: TF2 ParameterServerStrategy) has one rank per task too, the chief
and the evaluator after the ps and before the workers (cluster/env/slurm.py says why). Its ps and
workers only serve and never end by themselves, so the chief's rank ends the step when the
chief's program has ended (COORDINATOR_WRAPPER), and the script exits with the chief's exit code:
the job's state is the chief's, as the run's is. An evaluator gets EVALUATOR_WAIT_SECS to evaluate the last checkpoint first.
Every task gets GRPC_FAIL_FAST=use_caller and TF_USE_LEGACY_KERAS=1 (cluster/coordinator.py).
Pure: a spec in, text out; nothing is read or written here.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys
from collections.abc import Mapping

import cluster
from cluster.runtime.tfenv import coordinator_env
from cluster.runtime.rundir import attempt_dirname
from cluster.env.slurm import DEFAULT_PORT_BASE, RANK_ORDER, counts_text
from cluster.spec import ClusterSpec
from cluster.spec.model import emptied
from launch.planning.gpus import scheduler_request
from launch.render import preemption
from launch.render.options import RenderOptions

SPEC_MARK = 'TFCLUSTER_SPEC'     # ends the here-document that carries the effective spec

# One rank of the step: its log file by its place in the layout (ps-0.log, worker-1.log, as the
# other backends name them), then cluster.task. A ps task ignores SIGTERM: scancel and the time
# limit send SIGTERM to every task at once, and the chief can only write its checkpoint while the
# ps tasks still hold the variables; Slurm's SIGKILL (KillWait seconds later) ends them. Workers
# keep SIGTERM: the chief saves and exits on it, the others just exit.
# $1: the number of ps tasks, $2: the logs directory, then the command. `ps` and `worker` are
# what each job does besides (rank_wrapper: its own `env:` variables, its GPUs).
_WRAPPER = ('if [ "$SLURM_PROCID" -lt "$1" ]; then task=ps-$SLURM_PROCID; trap "" TERM;{ps} '
            'else task=worker-$((SLURM_PROCID - $1));{worker} fi; '
            'logs=$2; shift 2; exec "$@" >"$logs/$task.log" 2>&1')


def rank_wrapper(ps: str = '', worker: str = '') -> str:
    """The wrapper with shell commands of each job's own (each ending in `;`)."""
    return _WRAPPER.format(ps=f' {ps}' if ps else '', worker=f' {worker}' if worker else '')


RANK_WRAPPER = rank_wrapper()

# A coordinator run's rank: ps, then the chief, the evaluator (if any), the workers. $1: the number
# of ps tasks, $2: of evaluators (0 or 1), $3: the logs directory, $4: the file the chief's exit
# code goes to; then the command. Every rank but the chief's execs its task (a ps ignoring SIGTERM,
# as above). The chief's waits for it instead: once the chief's program has ended the run is done,
# so it writes the exit code down and ends the step, at once with scancel --signal=KILL on it; if
# that did not end it (no scancel on the node, or a heterogeneous step, which spans several job
# ids), its own non-zero exit makes srun's --kill-on-bad-exit end the rest (SIGTERM, then SIGKILL
# KillWait seconds later). `trap :` keeps its shell alive through the SIGTERM of a scancel (the
# task itself gets it and, the chief, saves) so that the exit code is still written. Before it ends
# the step, a chief that succeeded gives the evaluator (if any) EVALUATOR_WAIT_SECS to evaluate
# the last checkpoint: until its log says it finished.
_COORDINATOR_WRAPPER = (
    'if [ "$SLURM_PROCID" -lt "$1" ]; then task=ps-$SLURM_PROCID; trap "" TERM;{ps} '
    'elif [ "$SLURM_PROCID" -eq "$1" ]; then task=chief-0;{chief} '
    'elif [ "$SLURM_PROCID" -le $(($1 + $2)) ]; then task=evaluator-0;{evaluator} '
    'else task=worker-$((SLURM_PROCID - $1 - 1 - $2));{worker} fi; '
    'logs=$3; ended=$4; evaluators=$2; shift 4; '
    'if [ "$task" != chief-0 ]; then exec "$@" >"$logs/$task.log" 2>&1; fi; '
    'trap : TERM INT; "$@" >"$logs/$task.log" 2>&1; code=$?; echo "$code" >"$ended"; '
    'waited=0; while [ "$evaluators" -gt 0 ] && [ "$code" -eq 0 ] && [ "$waited" -lt {evaluator_wait} ] '
    '&& ! grep -qs " evaluator:0 finished" "$logs/evaluator-0.log"; do sleep 1; waited=$((waited + 1)); done; '
    'scancel --quiet --signal=KILL "$SLURM_JOB_ID.$SLURM_STEP_ID"; sleep 5; exit $((code ? code : {fallback}))')
END_STEP_EXIT = 99      # the chief's rank when the chief succeeded but scancel left the step running
EVALUATOR_WAIT_SECS = 120


def coordinator_wrapper(jobs: Mapping[str, str] | None = None) -> str:
    """The coordinator run's wrapper with shell commands of each job's own (each ending in `;`)."""
    jobs = jobs or {}
    return _COORDINATOR_WRAPPER.format(**{job: f' {jobs[job]}' if jobs.get(job) else '' for job in RANK_ORDER},
                                       fallback=END_STEP_EXIT, evaluator_wait=EVALUATOR_WAIT_SECS)


COORDINATOR_WRAPPER = coordinator_wrapper()
# A ps task (and a chief or an evaluator) sees no GPU; a worker sees the GPUs Slurm bound to it
# (CUDA_VISIBLE_DEVICES, set per task by --gpus-per-task), and none when the job asked for none:
# never the whole node's.
PS_GPUS = 'export CUDA_VISIBLE_DEVICES=;'
WORKER_GPUS = 'export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}";'


def heterogeneous(spec: ClusterSpec) -> bool:
    """GPU towers make the job heterogeneous: a component asking no GPU (the ps, and a coordinator
    run's chief and evaluator), a worker component asking --gpus-per-task. One srun step runs
    both, ranks numbered across them (the GPU-less first), so the layout rules hold; Slurm gives
    each component its own nodes."""
    return scheduler_request(spec) > 0


def exports(env: Mapping[str, str]) -> str:
    """`export K=V ...;` for a mapping (values quoted), '' for none."""
    return f'export {" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())};' if env else ''


def job_name(spec: ClusterSpec, name: str | None = None) -> str:
    """The Slurm job name: `name`, else the spec file's name without its extension."""
    base = name or os.path.splitext(os.path.basename(spec.path))[0] or 'tfcluster'
    return re.sub(r'[^A-Za-z0-9._-]', '_', base)


def slurm_spec(spec: ClusterSpec, cwd: str | None = None) -> ClusterSpec:
    """The effective spec a Slurm job's tasks read: train_dir (and a data directory) absolute, so
    the script runs wherever it is submitted from; no `hosts` (Slurm places the tasks). The
    cluster section keeps the spec's tasks: their counts decide the layout, their hosts and ports
    are replaced by Slurm's at run time. No `gpus` either: Slurm gives out the GPUs."""
    cwd = cwd or os.getcwd()
    train = spec.train

    def absolute(path: str) -> str:
        return os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    data = train.data if train.data == 'synthetic' else absolute(train.data)
    train = dataclasses.replace(train, train_dir=absolute(train.train_dir), data=data)
    return dataclasses.replace(spec, train=train, hosts=emptied(spec.hosts), gpus=emptied(spec.gpus))


def package_root() -> str:
    """The directory holding the `cluster` package, which every task must import."""
    return os.path.dirname(os.path.dirname(os.path.abspath(cluster.__file__)))


def _slice(first: int, count: int, job: str) -> str:
    """'rank 0 is ps:0', 'ranks 1-2 are worker:0-1'."""
    if count == 1:
        return f'rank {first} is {job}:0'
    return f'ranks {first}-{first + count - 1} are {job}:0-{count - 1}'


def _layout_comment(spec: ClusterSpec) -> str:
    """'rank 0 is ps:0; ranks 1-2 are worker:0-1 (worker:0 is the chief)', every job's slice."""
    slices, first = [], 0
    for job in RANK_ORDER:
        count = len(spec.job_tasks(job))
        if count:
            slices.append(_slice(first, count, job))
            first += count
    return '; '.join(slices) + ('' if spec.coordinator else ' (worker:0 is the chief)')


def wrapper(spec: ClusterSpec) -> str:
    """The rank wrapper of this spec, with each job's own `env:` and GPU lines."""
    def own(job: str, gpus: str) -> str:
        return f'{gpus} {exports(spec.job_env.get(job, {}))}'.strip()
    if spec.coordinator:
        return coordinator_wrapper({job: own(job, WORKER_GPUS if job == 'worker' else PS_GPUS) for job in RANK_ORDER})
    return rank_wrapper(own('ps', PS_GPUS), own('worker', WORKER_GPUS))


def render(spec: ClusterSpec, opts: RenderOptions | None, attempt: int | None = None) -> str:
    """The batch script, with the name, partition, time_limit and port_base of `opts` (None: the
    defaults). Tasks log into logs/attempt-N/, logs/<task>.log leading there, so earlier attempts'
    logs are kept: N is `attempt` (`launch up` counts them), else the first N not used yet."""
    opts = opts or RenderOptions()
    cwd = os.getcwd()
    placed = slurm_spec(spec, cwd)
    train_dir = placed.train.train_dir
    port_base = opts.port_base or DEFAULT_PORT_BASE
    sbatch, step = _job_options(spec, opts, cwd)
    lines = [
        '#!/bin/bash',
        f'# tfcluster: {spec.path} as one Slurm job: {counts_text(spec)}, {len(spec.tasks)} tasks.',
        '# Written by `launch render --format sbatch`. Submit it with `launch up SPEC --backend slurm`',
        '# (which also follows the job, streams every task\'s log and cancels the job on Ctrl-C), or',
        '# by itself: `sbatch THIS_FILE`; it needs nothing else.',
        '#',
        '# Layout (the rules of TensorFlow\'s SlurmClusterResolver): ranks are dealt to nodes in node',
        f'# order; {_layout_comment(spec)};',
        f'# every task listens on port {port_base} + its position among its node\'s tasks.',
        *(_gpu_comment(spec) if heterogeneous(spec) else []),
        f'# Output: {train_dir}/logs/ (slurm-JOBID.out; attempt-N/ps-0.log, worker-0.log, ... with',
        '# ps-0.log, worker-0.log, ... in logs/ leading to the newest attempt\'s).',
        '# The train_dir, this Python and the tfcluster package must be at the same paths on every',
        '# node (a shared filesystem) when the job spans several nodes.',
        *(f'#SBATCH {option}' for option in sbatch),
        '',
        'set -eu',
        f'train_dir={shlex.quote(train_dir)}',
        'mkdir -p "$train_dir/logs"',
        '# Not --output: Slurm opens that before the script runs, when logs/ may not exist yet.',
        'exec >>"$train_dir/logs/slurm-$SLURM_JOB_ID.out" 2>&1',
        f'cat >"$train_dir/spec.yaml.$SLURM_JOB_ID" <<\'{SPEC_MARK}\'',
        *placed.to_yaml().rstrip('\n').split('\n'),
        SPEC_MARK,
        'mv -f "$train_dir/spec.yaml.$SLURM_JOB_ID" "$train_dir/spec.yaml"',
        *_environment_lines(spec),
        f'echo "tfcluster: job $SLURM_JOB_ID: {counts_text(spec)} on '
        + (f'$SLURM_JOB_NODELIST_HET_GROUP_0 ({"no GPU" if spec.coordinator else "ps"}) and '
           '$SLURM_JOB_NODELIST_HET_GROUP_1 (workers)"'
           if heterogeneous(spec) else '$SLURM_JOB_NODELIST"'),
        *_attempt_links(spec, attempt),
        *_step_lines(spec, step, port_base),
    ]
    return '\n'.join(lines) + '\n'


def _environment_lines(spec: ClusterSpec) -> list[str]:
    """What every task's environment holds besides Slurm's: this package, unbuffered output, a
    coordinator run's variables and the spec's `env:`."""
    return [
        f'export PYTHONPATH={shlex.quote(package_root())}${{PYTHONPATH:+:$PYTHONPATH}}',
        'export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2',
        *(['# A coordinator run: what ParameterServerStrategy needs in every task (cluster/coordinator.py)',
           exports(coordinator_env()).rstrip(';')] if spec.coordinator else []),
        *(['# The spec\'s env: (every task; tasks.<job>.env is set by the rank wrapper below)',
           exports(spec.env).rstrip(';')] if spec.env else []),
    ]


def _step_lines(spec: ClusterSpec, step: str, port_base: int) -> list[str]:
    """The srun step that runs every task, and for a coordinator run the script's exit code: the chief's."""
    q = shlex.quote
    python = sys.executable or 'python3'
    logs = f'"$train_dir/logs/{attempt_dirname("$attempt")}"'
    srun = [f'srun {step} --distribution=block --kill-on-bad-exit=1 \\',
            f'    bash -c {q(wrapper(spec))} tfcluster-task {spec.num_ps} '
            + (f'{len(spec.job_tasks("evaluator"))} {logs} "$ended" \\' if spec.coordinator else f'{logs} \\'),
            f'    {q(python)} -m cluster.task --spec "$train_dir/spec.yaml" --slurm --port-base {port_base}']
    why = ['# --kill-on-bad-exit: a task that fails ends the step (a lost ps or worker would leave the',
           '# others waiting for ever); --distribution=block: ranks in node order, as the layout assumes.']
    notices = preemption.restarts(spec)
    run = [*notice_trap(), 'status=0', *srun[:-1], srun[-1] + ' &', *notice_wait()] if notices else \
        ['status=0', *srun[:-1], srun[-1] + ' || status=$?']
    if not spec.coordinator:
        done = '# The ps tasks exit by themselves once every worker is done, so the job ends with training.'
        return [*why, done, *run, 'exit "$status"'] if notices else [*why, done, *srun]
    return [*why,
            '# The ps and workers only serve: the chief\'s rank ends the step once the chief has ended, and',
            '# the job exits with the chief\'s exit code (srun\'s, if the chief never got to end).',
            'ended="$train_dir/chief-exit.$SLURM_JOB_ID"',
            'rm -f "$ended"',
            *run,
            'if [ -s "$ended" ]; then status=$(cat "$ended"); rm -f "$ended"; fi',
            'exit "$status"']


def notice_options(spec: ClusterSpec) -> list[str]:
    """#SBATCH options of a run that takes preemption notices and restarts: SIGTERM to the batch
    script alone (B:) the notice's seconds before the time limit, and a job Slurm may requeue."""
    seconds = preemption.kill_after(spec)
    return [f'--signal=B:TERM@{seconds}', '--requeue'] if seconds is not None and preemption.restarts(spec) else []


def notice_trap() -> list[str]:
    """The batch script's TERM trap: a SIGTERM to it (the --signal before the time limit, `scancel
    --signal=TERM --batch JOB` from a spot-notice watcher or by hand, Slurm's own preemption) is
    passed on to every task of the step as a preemption notice, since it carries no stop mark (the
    launcher writes stops/all before its own scancel, and then the trap does nothing)."""
    mark = f'"$train_dir/{preemption.STOPS_DIR}/{preemption.ALL_MARK}"'
    return ['# Preemption notices (supervise.preemption_grace; docs/preemption.md): a SIGTERM to this script is passed',
            '# on to every task, which has the grace to have its checkpoint saved; then the job is requeued.',
            'preempted="$train_dir/preempted.$SLURM_JOB_ID"',
            'rm -f "$preempted"',
            'notice() {',
            f'  if [ -e "$preempted" ] || [ -e {mark} ]; then return 0; fi    # noticed already; the launcher\'s stop',
            '  echo "tfcluster: job $SLURM_JOB_ID: SIGTERM to the batch script: a preemption notice to every task, '
            'then a requeue"',
            '  : >"$preempted"',
            '  scancel --signal=TERM "$SLURM_JOB_ID" || :      # the steps\' tasks, not this script',
            '}',
            'trap notice TERM']


def notice_wait() -> list[str]:
    """Wait for the step in the background (bash runs a trap only between commands), then requeue
    a job that had a notice, unless it was cancelled meanwhile."""
    ends = 'the next attempt resumes from the checkpoint'
    return ['step=$!',
            'while kill -0 "$step" 2>/dev/null; do wait "$step" || :; done    # the trap runs between the waits',
            'wait "$step" || status=$?',
            'if [ -e "$preempted" ]; then',
            '  rm -f "$preempted"',
            '  if scontrol show job "$SLURM_JOB_ID" | grep -q "JobState=RUNNING" && scontrol requeue "$SLURM_JOB_ID"; then',
            f'    echo "tfcluster: job $SLURM_JOB_ID requeued after the preemption notice: {ends}"',
            '    exit 0',
            '  fi',
            '  echo "tfcluster: job $SLURM_JOB_ID was not requeued (cancelled, or JobRequeue is off): it ends here"',
            'fi']


def _job_options(spec: ClusterSpec, opts: RenderOptions, cwd: str) -> tuple[list[str], str]:
    """The script's #SBATCH options, and the srun option that runs every task in one step."""
    ntasks = len(spec.tasks)
    sbatch = [f'--job-name={job_name(spec, opts.name)}', *notice_options(spec)]
    # Where and how long: options of each component of a heterogeneous job.
    where = [f'--partition={opts.partition}'] if opts.partition else []
    where += [f'--time={opts.time_limit}'] if opts.time_limit else []
    if heterogeneous(spec):     # each component asks for its own: the ps tasks (chief, evaluator) no GPU
        sbatch += ['--output=/dev/null', f'--chdir={cwd}', f'--ntasks={ntasks - spec.num_workers}', *where, 'hetjob',
                   f'--ntasks={spec.num_workers}', f'--gpus-per-task={scheduler_request(spec)}', *where]
        return sbatch, '--het-group=0,1'
    return sbatch + [f'--ntasks={ntasks}', '--output=/dev/null', f'--chdir={cwd}', *where], f'--ntasks={ntasks}'


def _gpu_comment(spec: ClusterSpec) -> list[str]:
    n = scheduler_request(spec)
    first = 'the ps tasks' if not spec.coordinator else 'the ps, chief and evaluator'
    return [f'# GPUs: a heterogeneous job: {first} (component 0) ask for none, each worker (component 1)',
            f'# for {n} (--gpus-per-task) and trains on the ones Slurm binds to it (CUDA_VISIBLE_DEVICES).',
            '# Slurm gives the two components separate nodes, and schedules such jobs with sched/backfill.']


def _attempt_links(spec: ClusterSpec, attempt: int | None) -> list[str]:
    """Script lines: $attempt, this attempt's log folder, and logs/<task>.log leading into it (a
    plain file there, from before runs had attempts, is kept as attempt-0's)."""
    names = ' '.join(f'{t.job}-{t.index}' for t in spec.tasks)
    first = [f'attempt={attempt}'] if attempt else [
        'attempt=1  # the first not used yet: an earlier attempt\'s logs are never written again',
        f'while [ -e "$train_dir/logs/{attempt_dirname("$attempt")}" ]; do attempt=$((attempt + 1)); done']
    if attempt and preemption.restarts(spec):   # Slurm's requeue runs the same script: the next attempt's folder
        first = [f'attempt=$(({attempt} + ${{SLURM_RESTART_COUNT:-0}}))  # a requeued job is the next attempt']
    return [*first,
            f'mkdir -p "$train_dir/logs/{attempt_dirname("$attempt")}"',
            f'for t in {names}; do',
            '  l="$train_dir/logs/$t.log"',
            '  if [ -f "$l" ] && [ ! -L "$l" ]; then',
            f'    mkdir -p "$train_dir/logs/{attempt_dirname(0)}" && mv "$l" "$train_dir/logs/{attempt_dirname(0)}/"',
            '  fi',
            f'  ln -sfn "{attempt_dirname("$attempt")}/$t.log" "$l"',
            'done']


_OPTION = re.compile(r'^[A-Za-z0-9_.,:+-]+$')


def option_problem(spec: ClusterSpec, opts: RenderOptions) -> str | None:
    """One line about a --partition, --time-limit or --port-base that cannot go into the script
    (an #SBATCH line ends at a newline and a space would split it), else None."""
    for flag, value in (('partition', opts.partition), ('time_limit', opts.time_limit)):
        if value is not None and not _OPTION.match(value):
            return (f'--{flag.replace("_", "-")} {value!r}: expected letters, digits and _.,:+- only '
                    '(e.g. --partition gpu --time-limit 2:00:00)')
    port_base = opts.port_base
    ntasks = len(spec.tasks)
    if port_base is not None and not 1 <= port_base <= 65536 - ntasks:
        return (f'--port-base {port_base}: the tasks of one node listen on it and the ports after it, '
                f'up to {ntasks} of them: give 1..{65536 - ntasks}')
    return None
