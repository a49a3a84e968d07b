"""`launch up SPEC --backend slurm`: submit the batch script (launch/render/sbatch.py), follow the job,
stream every task's log, and cancel the job on Ctrl-C or SIGTERM.

Slurm owns the tasks: it starts them where it likes, ends the job when a task fails
(--kill-on-bad-exit) and kills what is left when the job is cancelled. The launcher only watches,
through the client commands (`sbatch`, `scontrol`, `squeue`, `scancel`; no slurmdbd needed), and
reads the logs the tasks write into the train_dir, which it must see (a shared filesystem on a
multi-node cluster). Whichever way it ends, it returns only once the job has left the queue.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable

from cluster.runtime import causes, rundir
from cluster.runtime.rundir import EXIT_FAILED, EXIT_OK, EXIT_USAGE, write_atomically
from cluster.env.slurm import rank_task
from cluster.spec import ClusterSpec, TaskSpec
from launch import system
from launch.errors import UsageError
from launch.backends import marks
from launch.backends.tail import follow_file
from launch.backends.tail import FileTail
from launch.records.event_types import Interrupted, Preempted, TaskLost
from launch.records.result import Failure
from launch.backends.strategy import CHECKPOINT_GRACE_SECS, Life, Outcome, Strategy, resume_hint
from launch.render import preemption
from launch.render.options import RenderOptions
from launch.render.sbatch import heterogeneous

log = logging.getLogger(__name__)

COMMANDS = ('sbatch', 'scontrol', 'squeue', 'scancel')
INSTALL_HINT = ('install the Slurm client commands (Debian/Ubuntu: apt-get install slurm-client) and point them '
                'at the cluster (/etc/slurm/slurm.conf or $SLURM_CONF), or run on a login node of the cluster')
POLL_SECS = 0.5
COMMAND_TIMEOUT = 30.0          # one Slurm command; slurmctld answers in milliseconds when healthy
LEAVE_QUEUE_SECS = 120.0        # after the final cancel: Slurm's KillWait (30 s by default) and then some
# Job states that end a job (squeue's long names); COMPLETING is not one: its processes still run.
ENDED = {'COMPLETED', 'FAILED', 'CANCELLED', 'TIMEOUT', 'NODE_FAIL', 'OUT_OF_MEMORY', 'PREEMPTED',
         'BOOT_FAIL', 'DEADLINE', 'SPECIAL_EXIT', 'REVOKED'}


class SlurmError(Exception):
    """A Slurm command failed; one line."""


def missing_command() -> str | None:
    """The first Slurm client command not on PATH, or None."""
    return next((c for c in COMMANDS if shutil.which(c) is None), None)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    try:
        return system.run(argv, timeout=COMMAND_TIMEOUT)
    except system.CommandError as e:
        if e.timeout is None:
            raise SlurmError(f'cannot run {argv[0]}: {e.cause}') from None
        raise SlurmError(f'`{" ".join(argv)}` did not answer within {COMMAND_TIMEOUT:.0f}s (is slurmctld up?)') from None


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), '(no message)')


def submit(script_path: str) -> str:
    """sbatch the script; its job id."""
    out = _run('sbatch', '--parsable', script_path)
    if out.returncode != 0:
        raise SlurmError(f'sbatch refused the job: {_first_line(out.stderr or out.stdout)}')
    return out.stdout.strip().split(';')[0]     # --parsable: "jobid" or "jobid;cluster"


def parse_job(text: str) -> dict[str, str]:
    """`scontrol show job -o` (one line of Key=Value) -> dict. Values with spaces (Command,
    Comment) keep only their first word, which none of the keys used here have."""
    return dict(re.findall(r'(?:^|\s)([A-Za-z:/]+)=(\S*)', text))


def job_info(job: str) -> dict[str, str] | None:
    """The job's fields, or None once Slurm no longer knows it (purged after MinJobAge)."""
    out = _run('scontrol', 'show', 'job', '-o', job)
    if out.returncode != 0:
        if 'Invalid job id' in out.stderr:
            return None
        raise SlurmError(f'scontrol show job {job}: {_first_line(out.stderr)}')
    return parse_job(out.stdout)


def in_queue(job: str) -> bool:
    """Whether squeue still lists the job (pending, running or completing: processes may live)."""
    out = _run('squeue', '-h', '-j', job, '-o', '%T')
    if out.returncode != 0:
        if 'Invalid job id' in out.stderr:
            return False
        raise SlurmError(f'squeue -j {job}: {_first_line(out.stderr)}')
    return bool(out.stdout.strip())


def cancel(job: str, signal_name: str | None = None) -> None:
    """scancel the job, or with a signal name only signal its steps' tasks."""
    argv = ['scancel', *([f'--signal={signal_name}'] if signal_name else []), job]
    out = _run(*argv)
    if out.returncode != 0 and 'already completing or completed' not in out.stderr:
        raise SlurmError(f'{" ".join(argv)}: {_first_line(out.stderr)}')


def exit_status(info: dict[str, str]) -> int:
    """The launcher's exit code for an ended job: the script's exit code (srun's: the highest of
    its tasks'), 128 + a signal that killed it, else 0 only for COMPLETED."""
    code_text, _, sig_text = info.get('ExitCode', '0:0').partition(':')
    code, sig = int(code_text or 0), int(sig_text or 0)
    if code:
        return code
    if sig:
        return 128 + sig
    return EXIT_OK if info.get('JobState') == 'COMPLETED' else EXIT_FAILED


_RANKS = re.compile(r'\b(tasks?) ([\d,-]+):')


def _ranks(text: str) -> list[int]:
    """'0' -> [0]; '1-2,4' -> [1, 2, 4]."""
    out: list[int] = []
    for part in text.split(','):
        low, _, high = part.partition('-')
        if low.isdigit() and (high or low).isdigit():
            out.extend(range(int(low), int(high or low) + 1))
    return out


def name_ranks(line: str, spec: ClusterSpec) -> str:
    """srun's lines name ranks ('task 0: Exited with exit code 2', 'tasks 1-2: Terminated'): add
    the task each one is. Not in a heterogeneous job (GPU towers): srun numbers each component's
    tasks from 0 there, so a rank does not tell the task; the tasks' own logs do."""
    if heterogeneous(spec):
        return line

    def named(m: re.Match[str]) -> str:
        ranks = _ranks(m.group(2))
        if not ranks or max(ranks) >= len(spec.tasks):
            return m.group(0)
        names = ', '.join(rundir.task_name(*rank_task(spec, r)) for r in ranks)
        return f'{m.group(1)} {m.group(2)} ({names}):'
    return _RANKS.sub(named, line)


def first_failure(lines: Iterable[str], spec: ClusterSpec) -> str | None:
    """The first task srun reports as failed, from the batch log: 'ps:0 (Exited with exit code 2)'.
    (The job's exit code is srun's, the highest of all its tasks', often the 143 of the tasks
    that were stopped because of this one.) None in a heterogeneous job (see name_ranks)."""
    if heterogeneous(spec):
        return None
    for line in lines:
        m = re.search(r'srun: error: \S+: tasks? ([\d,-]+): (.+)$', line)
        if m is None:
            continue
        ranks = _ranks(m.group(1))
        if ranks and max(ranks) < len(spec.tasks):
            return ', '.join(rundir.task_name(*rank_task(spec, r)) for r in ranks) + f' ({m.group(2).strip()})'
    return None


def make_strategy(spec: ClusterSpec, opts: RenderOptions) -> SlurmRun:
    """The registry's factory: `up --backend slurm` runs the spec as one batch job (launch/render/sbatch.py)
    rendered with `opts`."""
    from launch.render import sbatch as slurm
    missing = missing_command()
    if missing:     # before anything is written
        raise UsageError(f'--backend slurm: `{missing}` not found on PATH; {INSTALL_HINT}')
    return SlurmRun(spec, lambda attempt: slurm.render(spec, opts, attempt), slurm.slurm_spec(spec).to_yaml())


class SlurmRun(Strategy[Life]):
    """The delegated strategy: Slurm owns the tasks; the launcher submits, watches and cancels."""

    def __init__(self, spec: ClusterSpec, script: Callable[[int], str], effective_spec: str) -> None:
        self.spec, self.script, self.effective_spec = spec, script, effective_spec
        self.train_dir = spec.train.train_dir
        self.script_path = rundir.batch_script_path(self.train_dir)
        self.logs = rundir.logs_dir(self.train_dir)
        self.hurried = threading.Event()

    def prepare(self, life: Life) -> None:
        """The batch script and the effective spec in the train_dir, seen from here: the tasks
        write their logs there (a shared filesystem on a multi-node cluster)."""
        if self.spec.train.data != 'synthetic':      # the tasks write the synthetic set themselves
            from cluster.checks import data
            data.resolve_spec_data(self.spec)   # seen from here: train_dir and data are on a shared filesystem
        if self.spec.supervise.restart != 'never':
            print('launch: WARNING: supervise.restart is not applied under Slurm: a failed task ends the job '
                  '(a new `launch up` resumes from the checkpoint)', file=sys.stderr, flush=True)
        try:
            os.makedirs(self.logs, exist_ok=True)
            write_atomically(rundir.spec_path(self.train_dir), self.effective_spec, rundir.PRIVATE)
            # The script exports the spec's env: values included (Slurm's tasks get them from it).
            write_atomically(self.script_path, self.script(life.attempt), rundir.PRIVATE)
        except OSError as e:
            raise self.spec.error('train.train_dir', f'cannot write {e.filename}: {e.strerror}') from None

    def read_file(self, path: str) -> str | None:
        return rundir.read_text(path)

    def hurry(self) -> None:
        self.hurried.set()       # a second Ctrl-C: cancel now, no checkpoint

    def run(self, life: Life) -> Outcome:
        t0 = time.monotonic()
        try:
            job = submit(self.script_path)
        except SlurmError as e:
            life.console.say(f'error: {e}')
            return Outcome(EXIT_USAGE)
        life.console.say(f'submitted job {job} ({self.spec.num_ps} ps + {self.spec.num_workers} '
                         f'worker(s)); logs in {self.logs}; Ctrl-C cancels it')
        return SubmittedJob(self, life, job).follow(t0)


class SubmittedJob:
    """One submitted job of a SlurmRun, followed to its end (or cancelled) for one lifecycle."""

    def __init__(self, strategy: SlurmRun, life: Life, job: str) -> None:
        self.strategy, self.life, self.job = strategy, life, job
        self.spec, self.train_dir = strategy.spec, strategy.train_dir
        self.state = 'PENDING'      # the job's state when last seen
        self.restarts = 0           # Slurm's requeues seen (Restarts=): each one is the next attempt

    def follow(self, t0: float) -> Outcome:
        """Stream its logs and watch it until it has left the queue; the outcome (`t0`: when it
        was submitted, monotonic)."""
        life = self.life
        try:
            self._follow()
            info = self._watch()
            if life.interrupted.is_set():
                life.emit(Interrupted(signal=life.signal_name))
                self._cancel(f'{life.signal_name} received')
                return Outcome(128 + life.signum)
            return self._report(info, time.monotonic() - t0)
        except SlurmError as e:
            life.console.say(f'error: {e}')
            self._cancel('cannot follow it')
            return Outcome(EXIT_FAILED)

    # -- following ------------------------------------------------------------------------
    def _follow(self) -> None:
        """Every task's log of this attempt, and the batch script's own output; what the task
        lines say (serving, steps) goes into the event log as for any backend."""
        life, spec = self.life, self.spec
        path = rundir.slurm_log_path(self.train_dir, self.job)
        life.follow('slurm', lambda stop: (name_ranks(line, spec) for line in follow_file(path, stop)))
        self._follow_tasks()

    def _follow_tasks(self) -> None:
        life, spec = self.life, self.spec
        for t in spec.tasks:
            log_path = rundir.attempt_log_path(self.train_dir, life.attempt, t.job, t.index)

            def seen(line: str, t: TaskSpec = t) -> None:     # a coordinator run's chief: not its worker 0
                life.saw_line(t.name, line, t.job in ('worker', 'chief'), t == spec.chief)
            life.follow(t.name, FileTail(log_path), seen, group='slurm')     # one thread polls them all

    def _watch(self) -> dict[str, str] | None:
        """Poll the job until it has ended and left the queue (or a signal came); its last fields."""
        said, info = '', None
        interrupted = self.life.interrupted
        while not interrupted.is_set():
            info = job_info(self.job)
            if info is None:        # purged: it ended before we saw how
                return None
            state = self.state = info.get('JobState', '?')
            self._requeued(int(info.get('Restarts', '0') or 0))
            reason = info.get('Reason', 'None')
            news = {'PENDING': f'job {self.job} is pending' + (f' ({reason})' if reason != 'None' else ''),
                    'RUNNING': f'job {self.job} is running on {info.get("NodeList", "?")}'}.get(state, '')
            if news and news != said:
                self.life.console.say(news)
                said = news
                if state == 'RUNNING':      # Slurm has placed every task: the job is where they run
                    for t in self.spec.tasks:
                        self.life.task_started(t.name, host=info.get('NodeList', '?'), job=self.job)
            if state in ENDED and not in_queue(self.job):
                return info
            interrupted.wait(POLL_SECS)
        return info

    def _requeued(self, restarts: int) -> None:
        """Slurm requeued the job (the batch script's trap after a preemption notice, `scontrol
        requeue`, a node failure): its script runs again as the next attempt (it adds
        SLURM_RESTART_COUNT to the attempt it was rendered with), so follow that attempt's logs."""
        if restarts <= self.restarts:
            return
        life, counted = self.life, self.restarts
        self.restarts = restarts
        if not preemption.restarts(self.spec):     # a script without notices keeps its attempt's folder
            life.console.say(f'job {self.job} was requeued by Slurm (a node failure, or scontrol requeue)')
            return
        life.unfollow([t.name for t in self.spec.tasks])
        life.emit(Preempted(task=None, cause=f'job {self.job} requeued by Slurm', grace=preemption.grace(self.spec)))
        for n in range(counted + 1, restarts + 1):
            life.next_attempt(f'job {self.job} requeued by Slurm (restart {n})', life.checkpoint_step())
        life.console.say(f'job {self.job} was requeued by Slurm (a preemption notice, its time limit or a node '
                         f'failure): attempt {life.attempt} resumes from the newest checkpoint when it starts again')
        self._follow_tasks()

    # -- ending -----------------------------------------------------------------------------
    def _cancel(self, why: str) -> None:
        """SIGTERM to every task first (the chief writes a checkpoint; the ps tasks ignore it, so
        they still hold the variables), the full cancel after a grace, then wait until the job has
        left the queue."""
        say = self.life.console.say
        if self.state == 'PENDING':
            say(f'{why}: cancelling job {self.job}, which has not started')
        else:
            say(f'{why}: cancelling job {self.job} (SIGTERM to every task first, so the chief saves a checkpoint; '
                'Ctrl-C again to cancel at once)')
        try:
            if not self.strategy.hurried.is_set() and self.state != 'PENDING':
                try:
                    marks.write([rundir.stop_all_path(self.train_dir)])     # every task: a stop, not a notice
                    cancel(self.job, 'TERM')
                    self._wait_gone(time.monotonic() + CHECKPOINT_GRACE_SECS, self.strategy.hurried)
                except SlurmError as e:     # e.g. a job still pending has no task to signal
                    log.debug('%s', e)
            if in_queue(self.job):
                cancel(self.job)
            if not self._wait_gone(time.monotonic() + LEAVE_QUEUE_SECS):
                say(f'error: job {self.job} is still in the queue {LEAVE_QUEUE_SECS:.0f}s after scancel; '
                    f'check it with `squeue -j {self.job}`')
                return
        except SlurmError as e:
            say(f'error: {e}; cancel the job with `scancel {self.job}`')
            return
        say(f'job {self.job} cancelled; it has left the queue')

    def _wait_gone(self, deadline: float, cut_short: threading.Event | None = None) -> bool:
        while in_queue(self.job):
            if time.monotonic() > deadline or (cut_short is not None and cut_short.is_set()):
                return False
            time.sleep(POLL_SECS)
        return True

    def _report(self, info: dict[str, str] | None, seconds: float) -> Outcome:
        say = self.life.console.say
        self.life.unfollow(['slurm'] + [t.name for t in self.spec.tasks])     # every line shown before the verdict
        if info is None:
            say(f'error: job {self.job} left the queue before its end state was seen (Slurm '
                'forgets ended jobs after MinJobAge); see the logs above')
            return Outcome(EXIT_FAILED)
        state, code = info.get('JobState', '?'), exit_status(info)
        if code == EXIT_OK:
            return Outcome(EXIT_OK, f'job {self.job} completed in {seconds:.1f}s')
        why = f'{state}, exit code {info.get("ExitCode", "?")}'
        if state == 'CANCELLED':
            why += ': cancelled outside this launcher (scancel, or an administrator)'
        elif state == 'TIMEOUT':
            why += ': it reached its time limit'
        first = first_failure((self.strategy.read_file(rundir.slurm_log_path(self.train_dir, self.job)) or '').splitlines(),
                              self.spec)
        failures = []
        if first and state != 'CANCELLED':
            why += f'; the first task to fail: {first}'
            task = first.split(' ', 1)[0].rstrip(',')
            job, index = rundir.parse_task_name(task)
            exit_code = re.search(r'exit code (\d+)', first)
            error = causes.last_error_line((self.strategy.read_file(rundir.attempt_log_path(
                self.train_dir, self.life.attempt, job, index)) or '').splitlines())
            failures.append(Failure(task, first))
            self.life.emit(TaskLost(task=task, cause=first, exit_code=int(exit_code.group(1)) if exit_code else None,
                                    signal=None, error=error))
        say(f'error: job {self.job} ended {why}; {resume_hint(self.life.checkpoint_step())}; task logs in {self.strategy.logs}')
        return Outcome(code, failures=failures)
