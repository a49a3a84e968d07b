"""A chaos harness: run a real cluster with `supervise.restart: on-failure`, break random tasks at
random points of the training, and check that the launcher mends every fault.

    python -m tests.harness.chaos --backend local --faults 30 --seed 1
    python -m tests.harness.chaos --backend ssh --faults 10 --sync            # a test sshd on 127.0.0.2/.3
    python -m tests.harness.chaos --backend compose --faults 10 --baseline    # a Docker engine, the built image
    python -m tests.harness.chaos --backend local --plan worker:1=kill,ps:0=stop
    python -m tests.harness.chaos --backend local --faults 100 --startup 0.25    # and faults while restarts start
    python -m tests.harness.chaos --backend local --faults 100 --rehearse        # every task a stand-in (no TensorFlow)
    python -m tests.harness.chaos --backend local --faults 30 --kinds kill --standby 3   # restarts from warm standbys

It drives the real command line (`python -m launch up SPEC ...` in a subprocess) on a 1 ps + 2
worker spec and reads what the launcher writes (`events.jsonl`, `run.json`). A fault is one of
    kill        SIGKILL to the task's own process (compose: `docker kill` of its container)
    stop        SIGSTOP to it (local, SSH): a frozen task, caught by the stall watchdog
    pause       `docker pause` of its container (compose): the same, frozen by the cgroup
    disconnect  `docker network disconnect` of its container from the project's network (compose)
    standby-kill, standby-stop   SIGKILL or SIGSTOP to a warm standby that waits (local, SSH; only
                named in --kinds or --plan): nothing restarts, the launcher replaces it
aimed at ps:0, worker:0 (the chief) or worker:1. With --startup SHARE, that share of the faults
is followed by one more (a kill, or the backend's freeze: SIGSTOP or `docker pause`) aimed at a
task the answering restart starts again, half a second after its new start appears: the start-up
of a restart must be supervised as the steady state is. On SSH the kill is a `kill` run over SSH on the
task's host, aimed at the pid the task's log names. Each fault comes once the cluster trains (every
current task serves and the global step has moved since), a random number of global steps later;
the next waits until the launcher has answered and the cluster trains again.

A frozen task stops the global step only if every worker waits for it: the ps always, a worker only
in sync mode. In async mode a frozen worker is not a fault the watchdog can see (the other worker's
steps go on; once they reach train.steps the launcher waits for the frozen one for ever), so random
plans leave those pairs out; `--plan` can still name them.

Invariants checked once the run has ended (the exit status names those that broke):
    planned       every planned fault was injected (the steps did not run out first)
    finished      `launch up` exited 0, run.json says done and the global step reached train.steps
    restarts      one restart per fault: as many `restart` events as faults, one between each fault
                  and the next, and run.json's `restarts` the same
    resume        no restart resumed below the newest checkpoint that existed at its fault: a cluster
                  restart's `from_step`, and every global step seen after it, is at least that step
    nothing left  no task or launcher process, no listener on a task port, no SSH session, no
                  container or network of the compose project
    standby       no task started after a standby was killed or frozen runs in that standby, and
                  each one hit was replaced by a ready one (with --standby N, each fault waits until
                  every host keeps N ready standbys, and the summary also gives
                  the median kill -> training again as a share of one `import tensorflow`, measured
                  at the run's start and end: tests/harness/chaos_standby.py)
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import yaml

from cluster.runtime import rundir
from cluster.runtime.ports import listening_inodes
from launch.records.events import read_events, read_run_record
from tests.harness.chaos_standby import (STANDBY_KINDS, import_seconds, inject_standby, kill_to_training, never_used,
                                         ready_pids, replaced, standby_summary)
from tests.harness.parts import REPO, free_ports, task_processes

TASKS = ('ps:0', 'worker:0', 'worker:1')
KINDS = {'local': ('kill', 'stop'), 'ssh': ('kill', 'stop'), 'compose': ('kill', 'pause', 'disconnect')}
EXTRA_KINDS = {'local': STANDBY_KINDS, 'ssh': STANDBY_KINDS, 'compose': ()}     # only when named
FREEZES = ('stop', 'pause', 'disconnect')
SSH_LAYOUT = ('127.0.0.2', '127.0.0.2', '127.0.0.3')      # ps:0, worker:0, worker:1 (as tests/system/launch/backends/test_ssh.py)
POLL = 0.25


def answerable(task: str, kind: str, sync: bool) -> bool:
    """Whether the launcher can see this fault: a lost task always; a frozen one only if it stops
    the global step (the ps; in sync mode any worker too)."""
    return kind not in FREEZES or sync or task.startswith('ps:')


@dataclasses.dataclass
class Options:
    backend: str = 'local'
    faults: int = 3
    seed: int = 1
    sync: bool = False
    kinds: tuple[str, ...] = ()            # default: every kind the backend has
    tasks: tuple[str, ...] = TASKS
    plan: tuple[tuple[str, str], ...] = ()  # explicit (task, kind) faults instead of random ones
    gap: tuple[int, int] = (30, 90)        # global steps of training before a fault
    steps: int | None = None               # default: enough for the faults (see default_steps)
    checkpoint_steps: int = 20
    batch_size: int = 8
    stall_secs: float = 10.0
    margin: int = 2                        # max_restarts = faults + margin
    startup: float = 0.0                   # the share of faults followed by one more while the restart starts
    recover_secs: float = 240.0            # a fault not answered, or training not back, by then: abort
    baseline: bool = False                 # first an undisturbed run of the same spec, for its time
    dir: str | None = None                 # where the specs and runs go (default: a temporary folder)
    overrides: tuple[str, ...] = ()        # more `--set KEY=VALUE` for launch up (e.g. supervise.backoff_secs=0)
    json_out: str | None = None
    rehearse: bool = False                 # `launch up --rehearse`: every task a stand-in (local only)
    standby: int | None = None             # supervise.standby (None: the spec's default); measures the import
    fill: bool = True                      # with standby: each fault waits until the pool is full

    def default_steps(self) -> int:
        # Every fault's gap, plus what the chief trains alone while a lost async worker comes back
        # (on 2 cores ~10 s at ~25 steps/s for a local process, up to ~40 s over SSH or in a
        # container), plus a lead-in and a tail.
        rejoin = 300 if self.backend == 'local' else 700
        alone = sum(rejoin if not self.sync and task not in ('ps:0', 'worker:0') and kind == 'kill' else 0
                    for task, kind, _ in self.fault_plan())
        return 150 + len(self.fault_plan()) * (self.gap[1] + 20) + alone

    def startup_plan(self) -> list[str | None]:
        """Per planned fault, the kind of a second fault aimed at a task its restart starts again,
        half a second after it appears (kill, or the backend's freeze), or None; the same for the
        same seed."""
        rng = random.Random(self.seed + 1)
        kinds = [k for k in (self.kinds or KINDS[self.backend]) if k in ('kill', 'stop', 'pause')]
        drawn = [rng.choice(kinds) if kinds and rng.random() < self.startup else None for _ in self.fault_plan()]
        # A fault on a standby restarts nothing: no restart's start-up to aim a second fault at.
        return [None if kind in STANDBY_KINDS else d for (_, kind, _), d in zip(self.fault_plan(), drawn)]

    def fault_plan(self) -> list[tuple[str, str, int]]:
        """(task, kind, gap in steps) per fault, the same for the same seed."""
        rng = random.Random(self.seed)
        kinds = self.kinds or KINDS[self.backend]
        if self.plan:
            return [(task, kind, rng.randint(*self.gap)) for task, kind in self.plan]
        # A task first, then one of the kinds the launcher can see on it: every task as likely.
        choices = {t: [k for k in kinds if answerable(t, k, self.sync)] for t in self.tasks}
        choices = {t: ks for t, ks in choices.items() if ks}
        if not choices:
            raise SystemExit(f'chaos: no fault of {kinds} on {self.tasks} is visible to the launcher in '
                             f'{"sync" if self.sync else "async"} mode')
        plan = []
        for _ in range(self.faults):
            task = rng.choice(sorted(choices))
            plan.append((task, rng.choice(choices[task]), rng.randint(*self.gap)))
        return plan


@dataclasses.dataclass
class Fault:
    number: int
    task: str
    kind: str
    at: float = 0.0                   # time.time() of the injection
    step: int | None = None           # the newest global step the launcher had reported
    checkpoint: int | None = None     # the newest checkpoint that existed then
    target: str = ''                  # the pid or container hit
    restart: dict | None = None       # the launcher's restart event that answered it
    detected_secs: float | None = None     # fault -> the launcher's task_lost or stall event
    answered_secs: float | None = None     # fault -> its restart event (after the stop, for a cluster)
    recovered_secs: float | None = None
    redone: int = 0                   # global steps trained again after the restart
    startup: bool = False             # aimed at a task while a restart started it


@dataclasses.dataclass
class Result:
    options: Options
    steps: int
    faults: list[Fault]
    exit_code: int | None
    run: dict
    restarts: list[dict]
    wall_secs: float
    baseline_secs: float | None
    leftovers: dict
    broken: list[str]
    notes: list[str]
    workdir: str
    recovered: list[dict] = dataclasses.field(default_factory=list)     # the launcher's recovered events
    import_secs: list[float] = dataclasses.field(default_factory=list)  # one `import tensorflow`, start and end
    warm: tuple[int, int] = (0, 0)      # task starts after the first fault from a standby, of all of them
    kills: list[float] = dataclasses.field(default_factory=list)    # kill -> recovered event, per kill

    def summary(self) -> str:
        o = self.options
        lines = [f'chaos: {o.backend}, {"sync" if o.sync else "async"}, {len(self.faults)} fault(s) '
                 f'(seed {o.seed}), {self.steps} steps, checkpoint every {o.checkpoint_steps}, '
                 f'stall_secs {o.stall_secs:g}; {self.workdir}']
        for f in self.faults:
            r = f.restart
            if r is None:
                answer = 'no restart'
            elif r.get('tasks'):
                answer = f'restart of {", ".join(r["tasks"])}'
            else:
                answer = f'cluster restart from step {r.get("from_step")}, {f.redone} step(s) redone'
            times = [f'{what} {secs:.1f}s' for what, secs in (('seen', f.detected_secs), ('restart', f.answered_secs),
                                                               ('training', f.recovered_secs)) if secs is not None]
            lines.append(f'  fault {f.number}: {f.kind} {f.task} ({f.target}) '
                         + ('while its restart started it' if f.startup else f'at step {f.step}') + ', newest checkpoint '
                         f'{f.checkpoint} -> {answer}' + (f' ({", ".join(times)} after it)' if times else ''))
        kinds = collections.Counter(f.kind for f in self.faults)
        tasks = collections.Counter(f.task for f in self.faults)
        redone = sum(f.redone for f in self.faults)
        detect = [f.detected_secs for f in self.faults if f.detected_secs is not None]
        answer = [f.answered_secs for f in self.faults if f.answered_secs is not None]
        recover = [f.recovered_secs for f in self.faults if f.recovered_secs is not None]
        lines.append(f'faults: {len(self.faults)} ({_counts(kinds)}; {_counts(tasks)}); restarts: {len(self.restarts)} '
                     f'(run.json {self.run.get("restarts")}); steps redone: {redone}')
        figures = [f'{what} {_mean(v):.1f}s on average, median {statistics.median(v):.1f}s (max {max(v):.1f}s)'
                   for what, v in (('seen', detect), ('restarted', answer), ('training again', recover)) if v]
        mended = [m['seconds'] for m in self.recovered]
        if mended:
            figures.append(f'the launcher\'s own count (recovered events, fault seen -> next step): '
                           f'{len(mended)}, median {statistics.median(mended):.1f}s, max {max(mended):.1f}s, '
                           f'{sum(m.get("steps_redone") or 0 for m in self.recovered)} step(s) redone')
        if figures:
            lines.append('after a fault: ' + '; '.join(figures))
        base = f' (undisturbed: {self.baseline_secs:.1f}s)' if self.baseline_secs is not None else ''
        lines.append(f'wall time: {self.wall_secs:.1f}s{base}; exit {self.exit_code}, state {self.run.get("state")}, '
                     f'global step {self.run.get("global_step")}')
        lines.append(standby_summary(self.kills, self.import_secs, *self.warm))
        lines.append('leftovers: ' + ('; '.join(f'{k}: {v}' for k, v in self.leftovers.items()) or 'none'))
        lines += [f'note: {n}' for n in self.notes]
        lines.append('invariants: ' + ('all hold' if not self.broken else 'BROKEN:\n  ' + '\n  '.join(self.broken)))
        return '\n'.join(line for line in lines if line)

    def to_json(self) -> dict:
        return {'options': dataclasses.asdict(self.options), 'steps': self.steps, 'exit_code': self.exit_code,
                'faults': [dataclasses.asdict(f) for f in self.faults], 'restarts': len(self.restarts),
                'steps_redone': sum(f.redone for f in self.faults), 'wall_secs': self.wall_secs,
                'baseline_secs': self.baseline_secs, 'leftovers': self.leftovers, 'broken': self.broken,
                'notes': self.notes, 'run': self.run, 'recovered': self.recovered,
                'import_secs': self.import_secs, 'warm': list(self.warm), 'kill_to_training': self.kills}


def train_dir_of(events_file: str) -> str:
    return os.path.dirname(events_file)


def _counts(counter: collections.Counter) -> str:
    return ', '.join(f'{k} {v}' for k, v in sorted(counter.items())) or 'none'


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def event_time(event: dict) -> float:
    return datetime.datetime.fromisoformat(event['time']).timestamp()


# -- what is left of a run -----------------------------------------------------------------------
def listeners(ports: list[int]) -> list[int]:
    """The ports among `ports` that something on this machine listens on (/proc/net/tcp{,6}, read as
    the task side reads it for a busy port's line)."""
    return sorted({port for port in ports if listening_inodes(port)})


# -- backends ------------------------------------------------------------------------------------
class Driver:
    """How the harness makes a spec, injects faults and looks for leftovers on one backend."""
    name = 'local'

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.ports: list[int] = []
        self.rehearse = False       # a rehearsal's run lives below the spec's train_dir
        # When the last inject hit (time.time()), where the driver knows it better than the
        # harness's clock before the call: an SSH fault's signal is sent by a new ssh session,
        # whose connection takes a few tenths of a second before the kill runs on the host.
        self.hit_at: float | None = None

    def setup(self) -> None:
        pass

    def teardown(self) -> None:
        pass

    def launch_args(self) -> list[str]:
        return []

    def cwd(self, sub: str) -> str:
        return REPO

    def train_dir(self, sub: str) -> str:
        """The launcher's train_dir (events.jsonl, run.json); a rehearsal's is below the spec's."""
        run = os.path.join(self.workdir, sub, 'run')
        return os.path.join(run, 'rehearsal') if self.rehearse else run

    def spec_train_dir(self, sub: str) -> str:
        return os.path.join(self.workdir, sub, 'run')

    def task_hosts(self) -> list[str]:
        return ['localhost'] * 3

    def hosts(self, sub: str) -> dict | None:
        return None

    def write_spec(self, sub: str, train: dict, supervise: dict) -> str:
        folder = os.path.join(self.workdir, sub)
        os.makedirs(folder, exist_ok=True)
        self.ports = free_ports(3)
        where = self.task_hosts()
        spec = {'cluster': {'ps': [f'{where[0]}:{self.ports[0]}'],
                            'worker': [f'{h}:{p}' for h, p in zip(where[1:], self.ports[1:])]},
                'train': {**train, 'train_dir': self.spec_train_dir(sub)},
                'supervise': supervise}
        hosts = self.hosts(sub)
        if hosts:
            spec['hosts'] = hosts
        path = os.path.join(folder, 'spec.yaml')
        with open(path, 'w') as f:
            yaml.safe_dump(spec, f, sort_keys=False)
        return path

    def checkpoint_step(self, sub: str) -> int | None:
        """The newest checkpoint's step, from TensorFlow's index in the chief's train_dir."""
        return rundir.checkpoint_step(rundir.read_text(rundir.checkpoint_index_path(self.train_dir(sub))))

    def inject(self, sub: str, task: str, kind: str, started: dict) -> str:
        """Break `task` (its newest task_started event: `started`); returns what was hit."""
        pid = int(started['pid'])
        cmd = ''
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                cmd = f.read().replace(b'\0', b' ').decode(errors='replace')
        except OSError:
            pass
        if not any(m in cmd for m in ('cluster.task', 'cluster.rehearsal', 'cluster.standby', 'cluster.zygote')) \
                or self.workdir not in cmd:
            raise RuntimeError(f'{task}: pid {pid} is not its task any more ({cmd or "gone"})')
        os.kill(pid, {'kill': signal.SIGKILL, 'stop': signal.SIGSTOP}[kind])
        return f'pid {pid}'

    def leftovers(self, spec: str) -> dict:
        found = {}
        procs = task_processes(self.workdir)
        if procs:
            found['processes'] = [f'{p}: {c[:160]}' for p, c in sorted(procs.items())]
        ports = listeners(self.ports)
        if ports:
            found['listening ports'] = ports
        return found

    def clean(self, spec: str, sub: str) -> None:
        """Remove whatever a broken run left (after the leftovers were counted)."""
        subprocess.run([sys.executable, '-m', 'launch', 'down', spec, *self.down_args()], cwd=self.cwd(sub),
                       capture_output=True, timeout=120)
        for pid in task_processes(self.workdir):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def down_args(self) -> list[str]:
        return []


class SSHDriver(Driver):
    """Every task on a "host" of the test sshd (127.0.0.2, 127.0.0.3), each host with its own
    workdir; faults are `kill` commands run over SSH on the task's host."""
    name = 'ssh'

    def __init__(self, workdir: str, hosts=None):
        super().__init__(workdir)
        self.sshd = hosts               # a started tests.harness.sshd.SSHHosts, or None: start one
        self._own = hosts is None

    def setup(self) -> None:
        if self.sshd is None:
            from tests.harness.sshd import SSHHosts
            self.sshd = SSHHosts(os.path.join(self.workdir, 'sshd')).start()

    def teardown(self) -> None:
        if self._own and self.sshd is not None:
            self.sshd.stop()

    def launch_args(self) -> list[str]:
        return ['--ssh-config', str(self.sshd.ssh_config)]

    down_args = launch_args

    def cwd(self, sub: str) -> str:
        return os.path.join(self.workdir, sub)

    def spec_train_dir(self, sub: str) -> str:
        return 'run'            # relative: below the launcher's cwd here, below each host's workdir there

    def host_workdir(self, sub: str, address: str) -> str:
        return os.path.join(self.workdir, sub, f'host-{address}')

    def task_hosts(self) -> list[str]:
        return list(SSH_LAYOUT)

    def hosts(self, sub: str) -> dict:
        return {a: {'port': self.sshd.port, 'user': 'root', 'key': str(self.sshd.key_path), 'python': sys.executable,
                    'workdir': self.host_workdir(sub, a)} for a in self.sshd.addresses}

    def remote(self, address: str, script: str) -> subprocess.CompletedProcess:
        return self.sshd.ssh(address, script, timeout=30)

    def checkpoint_step(self, sub: str) -> int | None:
        index = os.path.join(self.host_workdir(sub, SSH_LAYOUT[1]), 'run', rundir.CHECKPOINT_INDEX)
        out = self.remote(SSH_LAYOUT[1], f'cat {shlex.quote(index)} 2>/dev/null; true')
        return rundir.checkpoint_step(out.stdout)

    def inject(self, sub: str, task: str, kind: str, started: dict) -> str:
        address = SSH_LAYOUT[TASKS.index(task)]
        job, index = task.split(':')
        log = rundir.attempt_log_path(os.path.join(self.host_workdir(sub, address), 'run'), started['attempt'],
                                      job, int(index))
        sig = {'kill': 'KILL', 'stop': 'STOP'}[kind]
        # The task's own pid, as its wrapper wrote it beside the log as it started it (the newest
        # start's: a task the restart is starting has no serving line yet), else as its serving line
        # names it; hit only if that pid still runs a task of this run.
        pidfile = os.path.join(self.host_workdir(sub, address), 'run', rundir.LOGS_DIR, f'{job}-{index}.task')
        script = (f'p=$(cat {shlex.quote(pidfile)} 2>/dev/null); [ -n "$p" ] || '
                  f'p=$(grep -o {shlex.quote(task + " serving on .* (pid [0-9]*)")} {shlex.quote(log)} | tail -n 1 '
                  "| sed 's/.*(pid \\([0-9]*\\))/\\1/'); [ -n \"$p\" ] || { echo 'no pid of the task'; exit 1; }; "
                  f'tr "\\0" " " < /proc/$p/cmdline 2>/dev/null | grep -qF {shlex.quote(self.workdir)} '
                  '|| { echo "pid $p is not the task"; exit 1; }; '
                  f'kill -{sig} $p && echo $p $(date +%s.%N)')
        out = self.remote(address, script)
        if out.returncode != 0:
            raise RuntimeError(f'{task}: kill -{sig} over SSH on {address} failed: {(out.stdout + out.stderr).strip()}')
        pid, at = out.stdout.split()
        self.hit_at = float(at)      # the "hosts" are this machine's loopback addresses: one clock
        return f'pid {pid} on {address}'

    def leftovers(self, spec: str) -> dict:
        found = super().leftovers(spec)
        sessions = self.sshd.session_processes() if self.sshd is not None else {}
        if sessions:
            found['ssh sessions'] = sorted(sessions)
        return found


class ComposeDriver(Driver):
    """Every task in a container of the run's compose project; faults through the Docker CLI."""
    name = 'compose'

    def __init__(self, workdir: str, ready: bool = False):
        super().__init__(workdir)
        self._ready = ready             # the engine answers and the image is built (a test's fixtures)
        self._engine = None
        self.project = ''

    def setup(self) -> None:
        if self._ready:
            return
        from tests.harness import dockerd
        if not dockerd.engine_answers():
            if os.geteuid() != 0 or not os.path.exists(dockerd.DOCKERD):
                raise SystemExit('chaos: no Docker engine answers, and none can be started here')
            self._engine = dockerd._start_dockerd(os.path.join(self.workdir, 'dockerd.log'))
        build = subprocess.run(['bash', os.path.join(REPO, 'docker', 'build-offline.sh')], stdin=subprocess.DEVNULL)
        if build.returncode != 0:
            raise SystemExit(f'chaos: docker/build-offline.sh failed (exit {build.returncode})')

    def teardown(self) -> None:
        if self._engine is not None:
            from tests.harness import dockerd
            dockerd._stop_dockerd(self._engine)

    def launch_args(self) -> list[str]:
        return ['--backend', 'compose']

    def write_spec(self, sub, train, supervise):
        from cluster.spec import load_spec
        from launch.backends.compose import project_name
        path = super().write_spec(sub, train, supervise)
        self.project = project_name(load_spec(path))
        return path

    @staticmethod
    def docker(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(['docker', *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)

    def inject(self, sub, task, kind, started):
        container = started.get('container')
        if not container:
            raise RuntimeError(f'{task}: its task_started event names no container: {started}')
        if kind == 'disconnect':
            network = self.docker('network', 'ls', '-q', '--filter',
                                  f'label=com.docker.compose.project={self.project}').stdout.split()
            if not network:
                raise RuntimeError(f'no network of compose project {self.project}')
            out = self.docker('network', 'disconnect', network[0], container)
        else:
            out = self.docker(kind, container)
        if out.returncode != 0:
            raise RuntimeError(f'docker {kind} {container}: {out.stderr.strip()}')
        return f'container {container[:12]}'

    def leftovers(self, spec):
        from tests.harness.dockerd import project_leftovers
        found = super().leftovers(spec)
        found.update({f'compose {k}': v for k, v in project_leftovers(self.project).items()})
        return found

    def clean(self, spec, sub):
        from tests.harness.dockerd import remove_project
        super().clean(spec, sub)
        remove_project(self.project)


def make_driver(backend: str, workdir: str, ssh_hosts=None, compose_ready: bool = False) -> Driver:
    if backend == 'local':
        return Driver(workdir)
    if backend == 'ssh':
        return SSHDriver(workdir, ssh_hosts)
    if backend == 'compose':
        return ComposeDriver(workdir, compose_ready)
    raise SystemExit(f'chaos: unknown backend {backend!r} (local, ssh or compose)')


# -- one run -------------------------------------------------------------------------------------
class Aborted(Exception):
    """The run cannot go on as planned (one line: why)."""


class Chaos:
    def __init__(self, options: Options, driver: Driver, say: Callable[[str], None] = print):
        self.o, self.driver, self.say = options, driver, say
        self.plan = options.fault_plan()
        self.startup = options.startup_plan()
        self.steps = options.steps or options.default_steps()
        self.proc: subprocess.Popen | None = None
        self.console = ''
        self.hit: dict[int, float] = {}        # standbys killed or frozen: pid -> time.time() of the hit

    def settings(self) -> tuple[dict, dict]:
        o = self.o
        train = {'sync': o.sync, 'steps': self.steps, 'batch_size': o.batch_size, 'data': 'synthetic',
                 'checkpoint_steps': o.checkpoint_steps, 'log_every_secs': 1.0}
        if not o.sync:
            train['learning_rate'] = 0.05
        task_faults = sum(kind not in STANDBY_KINDS for _, kind, _ in self.plan)
        supervise = {'restart': 'on-failure', 'stall_secs': o.stall_secs,
                     'max_restarts': task_faults + sum(k is not None for k in self.startup) + o.margin}
        if o.standby is not None:
            supervise['standby'] = o.standby
        return train, supervise

    def start(self, sub: str) -> tuple[str, str]:
        spec = self.driver.write_spec(sub, *self.settings())
        self.console = os.path.join(self.driver.workdir, sub, 'console.log')
        out = open(self.console, 'w')
        sets = [a for o in self.o.overrides for a in ('--set', o)]
        rehearse = ['--rehearse'] if self.o.rehearse else []
        self.proc = subprocess.Popen([sys.executable, '-m', 'launch', 'up', spec, *sets, *rehearse, *self.driver.launch_args()],
                                     cwd=self.driver.cwd(sub), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT)
        out.close()
        return spec, self.driver.train_dir(sub)

    def stop_launcher(self) -> None:
        """SIGTERM (the launcher stops every task, the chief checkpoints), SIGKILL if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def console_tail(self, n: int = 25) -> str:
        try:
            with open(self.console, errors='replace') as f:
                return ''.join(f.readlines()[-n:])
        except OSError:
            return ''

    # -- reading the run -----------------------------------------------------------------
    @staticmethod
    def step_now(events: list[dict]) -> int | None:
        """The newest global step the launcher reported, since its newest restart."""
        for e in reversed(events):
            if e['event'] == 'restart':
                return None
            if e['event'] in ('progress', 'first_step'):
                return e['step']
        return None

    @staticmethod
    def training(events: list[dict]) -> bool:
        """Every current task serves (a serving event after its newest start) and the chief has
        reported a global step since the last of those, with no restart since."""
        newest: dict[str, int] = {}
        served: dict[str, int] = {}
        for i, e in enumerate(events):
            if e['event'] == 'task_started':
                newest[e['task']] = i
                served.pop(e['task'], None)
            elif e['event'] == 'serving' and e['task'] in newest:
                served[e['task']] = i
            elif e['event'] == 'restart':       # those tasks (all, for a cluster) start again, maybe after a backoff
                for task in e.get('tasks') or TASKS:
                    newest.pop(task, None)
                    served.pop(task, None)
            elif e['event'] in ('finished', 'interrupted'):
                return False
        if set(newest) != set(TASKS) or set(served) != set(TASKS):
            return False
        ready = max(served.values())
        last_restart = max((i for i, e in enumerate(events) if e['event'] == 'restart'), default=-1)
        return any(e['event'] in ('progress', 'first_step') for e in events[max(ready, last_restart) + 1:])

    def wait(self, events_file: str, until: Callable[[list[dict]], bool], deadline: float, what: str) -> list[dict]:
        while True:
            events = read_events(events_file)
            if until(events):
                return events
            if self.proc.poll() is not None:
                raise Aborted(f'launch up exited ({self.proc.returncode}) while waiting for {what}')
            if time.monotonic() > deadline:
                raise Aborted(f'no {what} within {self.o.recover_secs:.0f}s')
            time.sleep(POLL)

    # -- the chaos run -----------------------------------------------------------------------
    def baseline(self) -> float:
        self.say('chaos: an undisturbed run first (--baseline)')
        t0 = time.monotonic()
        spec, _ = self.start('baseline')
        try:
            self.proc.wait(self.o.recover_secs + self.steps)
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.stop_launcher()
        if self.proc.returncode != 0:
            self.driver.clean(spec, 'baseline')
            raise SystemExit(f'chaos: the undisturbed run failed (exit {self.proc.returncode}):\n{self.console_tail()}')
        return time.monotonic() - t0

    def run(self) -> Result:
        self.driver.setup()
        try:
            baseline = self.baseline() if self.o.baseline else None
            return self._run(baseline)
        finally:
            self.driver.teardown()

    def _run(self, baseline: float | None) -> Result:
        sub = 'chaos'
        imports = [import_seconds()] if self.o.standby is not None else []
        t0 = time.monotonic()
        spec, train_dir = self.start(sub)
        events_file = rundir.events_path(train_dir)
        self.say(f'chaos: {self.o.backend}, {len(self.plan)} fault(s), {self.steps} steps; launch up {spec} '
                 f'(output: {self.console})')
        faults: list[Fault] = []
        notes: list[str] = []
        try:
            self._inject_all(sub, events_file, faults, notes)
            self.proc.wait(self.o.recover_secs + self.steps)
        except subprocess.TimeoutExpired:
            notes.append(f'launch up had not ended {self.o.recover_secs + self.steps:.0f}s after the last fault; '
                         'stopped it with SIGTERM')
        except Aborted as e:
            notes.append(f'aborted: {e}')
        finally:
            self.stop_launcher()
        wall = time.monotonic() - t0
        # What is left is counted before anything is cleaned: the launcher must leave nothing.
        leftovers = {}
        deadline = time.monotonic() + 5
        while True:
            leftovers = self.driver.leftovers(spec)
            if not leftovers or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if leftovers:
            self.driver.clean(spec, sub)
        events = read_events(events_file)
        run = read_run_record(rundir.run_path(train_dir))
        restarts = [e for e in events if e['event'] == 'restart']
        self._match(faults, events)
        broken = self.check(faults, events, run, leftovers, notes, train_dir, sub)
        broken += never_used(events, self.hit)
        if imports:
            imports.append(import_seconds())
        first = min((event_time(e) for e in restarts), default=float('inf'))
        again = [e for e in events if e['event'] == 'task_started' and event_time(e) >= first]
        if broken:
            notes.append('launch up\'s last lines:\n' + self.console_tail())
        result = Result(self.o, self.steps, faults, self.proc.returncode, run, restarts, wall, baseline, leftovers,
                        broken, notes, self.driver.workdir, [e for e in events if e['event'] == 'recovered'],
                        imports, (sum(bool(e.get('warm')) for e in again), len(again)),
                        kill_to_training(faults, events))
        if self.o.json_out:
            with open(self.o.json_out, 'w') as f:
                json.dump(result.to_json(), f, indent=1, default=str)
        return result

    def _inject_all(self, sub: str, events_file: str, faults: list[Fault], notes: list[str]) -> None:
        first = time.monotonic() + self.o.recover_secs + 120        # the first start: image, imports
        tail = 2 * self.o.checkpoint_steps + 20                      # no fault this close to the end
        for number, (task, kind, gap) in enumerate(self.plan, 1):
            deadline = first if number == 1 else time.monotonic() + self.o.recover_secs
            events = self.wait(events_file, self.training, deadline, 'training')
            if faults and faults[-1].recovered_secs is None:
                faults[-1].recovered_secs = time.time() - faults[-1].at
            target = (self.step_now(events) or 0) + gap
            if target > self.steps - tail:
                notes.append(f'the steps ran out: fault {number} would come at step {target} of {self.steps} '
                             '(raise --steps)')
                return
            events = self.wait(events_file, lambda ev, target=target: self.training(ev) and (self.step_now(ev) or 0) >= target,
                               time.monotonic() + self.o.recover_secs, f'global step {target}')
            if self.o.standby and self.o.fill:      # a fault once the standbys are back: faults rarer than a refill
                self._wait_standbys(train_dir_of(events_file), number)
            if kind in STANDBY_KINDS:
                faults.append(self._hit_standby(number, kind, events, train_dir_of(events_file)))
                continue
            started = next(e for e in reversed(events) if e['event'] == 'task_started' and e['task'] == task)
            fault = Fault(number, task, kind, step=self.step_now(events))
            checkpoints = [e['step'] for e in events if e['event'] == 'checkpoint']
            try:
                fault.checkpoint = max([s for s in [self.driver.checkpoint_step(sub), *checkpoints[-1:]]
                                        if s is not None], default=None)
                fault.at = time.time()
                fault.target = self.driver.inject(sub, task, kind, started)
                fault.at = self.driver.hit_at or fault.at
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                raise Aborted(f'fault {number} ({kind} {task}) could not be injected: {e}') from None
            faults.append(fault)
            self.say(f'chaos: fault {number}/{len(self.plan)}: {kind} {task} ({fault.target}) at step {fault.step}, '
                     f'newest checkpoint {fault.checkpoint}')
            before = sum(e['event'] == 'restart' for e in events)
            events = self.wait(events_file, lambda ev, before=before: sum(e['event'] == 'restart' for e in ev) > before,
                               time.monotonic() + self.o.recover_secs, f'restart after fault {number} ({kind} {task})')
            if self.startup[number - 1] is not None:
                self._inject_at_startup(sub, events_file, events, self.startup[number - 1], faults)
        events = self.wait(events_file, lambda ev: self.training(ev) or any(e['event'] == 'finished' for e in ev),
                           time.monotonic() + self.o.recover_secs, 'training after the last fault')
        if faults and self.training(events):
            faults[-1].recovered_secs = time.time() - faults[-1].at

    def _wait_standbys(self, train_dir: str, number: int) -> None:
        """Wait until every host keeps its --standby ready standbys (the launcher refills one per
        host at a time, an import each: faults closer than that meet a pool part empty)."""
        want = self.o.standby * len(set(self.driver.task_hosts()))
        deadline = time.monotonic() + self.o.recover_secs
        while len(ready_pids(train_dir)) < want:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise Aborted(f'{want} standbys were not ready before fault {number}')
            time.sleep(POLL)

    def _hit_standby(self, number: int, kind: str, events: list[dict], train_dir: str) -> Fault:
        """A standby that waits, killed or frozen; the launcher restarts nothing, but must replace
        it with a ready one (within the recovery deadline) and never start a task in it."""
        fault = Fault(number, 'standby', kind, step=self.step_now(events))
        deadline = time.monotonic() + self.o.recover_secs
        try:
            pid = inject_standby(kind, train_dir, deadline)
        except (RuntimeError, OSError) as e:
            raise Aborted(f'fault {number} ({kind}) could not be injected: {e}') from None
        fault.at, fault.target = time.time(), f'pid {pid}'
        self.hit[pid] = fault.at
        self.say(f'chaos: fault {number}/{len(self.plan)}: {kind} (pid {pid}) at step {fault.step}')
        while not replaced(train_dir, pid):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise Aborted(f'the standby hit by fault {number} ({kind}, pid {pid}) was not replaced')
            time.sleep(POLL)
        fault.recovered_secs = time.time() - fault.at
        return fault

    def _inject_at_startup(self, sub: str, events_file: str, events: list[dict], kind: str,
                           faults: list[Fault]) -> None:
        """One more fault while the restart just made starts its tasks: `kind` aimed at one of
        them (chosen by the seed) half a second after its new start appears."""
        k = max(i for i, e in enumerate(events) if e['event'] == 'restart')
        restart = events[k]
        rng = random.Random(self.o.seed * 1000 + len(faults))
        task = rng.choice(sorted(restart.get('tasks') or TASKS))

        def started_again(ev: list[dict]) -> bool:     # since the restart (a warm start may precede our look)
            return any(e['event'] == 'task_started' and e['task'] == task for e in ev[k + 1:])
        events = self.wait(events_file, started_again, time.monotonic() + self.o.recover_secs,
                           f'{task} to start again after fault {len(faults)}')
        started = next(e for e in reversed(events) if e['event'] == 'task_started' and e['task'] == task)
        time.sleep(0.5)
        fault = Fault(len(faults) + 1, task, kind, step=None, startup=True,
                      checkpoint=restart.get('from_step') if not restart.get('tasks') else None)
        try:
            fault.at = time.time()
            fault.target = self.driver.inject(sub, task, kind, started)
            fault.at = self.driver.hit_at or fault.at
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            raise Aborted(f'fault {fault.number} ({kind} {task} while starting) could not be injected: {e}') from None
        faults.append(fault)
        self.say(f'chaos: fault {fault.number}: {kind} {task} ({fault.target}) while the restart starts it')
        before = sum(e['event'] == 'restart' for e in events)
        self.wait(events_file, lambda ev: sum(e['event'] == 'restart' for e in ev) > before,
                  time.monotonic() + self.o.recover_secs, f'restart after fault {fault.number} ({kind} {task})')

    @staticmethod
    def _match(faults: list[Fault], events: list[dict]) -> None:
        """Each fault's answer: the first restart event after it (and before the next fault)."""
        restarts = [e for e in events if e['event'] == 'restart']
        for i, f in enumerate(faults):
            until = faults[i + 1].at if i + 1 < len(faults) else float('inf')
            mine = [e for e in restarts if f.at <= event_time(e) < until]
            if not mine:
                continue
            r = f.restart = mine[0]
            f.answered_secs = event_time(r) - f.at
            seen = [e for e in events if e['event'] in ('task_lost', 'stall') and f.at <= event_time(e) < until]
            f.detected_secs = event_time(seen[0]) - f.at if seen else None
            if r.get('from_step') is not None and not r.get('tasks'):
                k = events.index(r)
                seen = [e['step'] for e in events[:k] if e['event'] in ('progress', 'first_step')
                        and e['attempt'] == r['attempt']]
                f.redone = max(0, max(seen, default=f.step or 0) - r['from_step'])

    def check(self, faults, events, run, leftovers, notes, train_dir, sub) -> list[str]:
        broken = []
        planned = len(self.plan) + sum(k is not None for k in self.startup)
        if len(faults) != planned:
            broken.append(f'planned: {len(faults)} of {planned} faults injected')
        faults = [f for f in faults if f.kind not in STANDBY_KINDS]     # they restart nothing
        try:
            final = self.driver.checkpoint_step(sub)
        except (OSError, subprocess.SubprocessError) as e:
            final = None
            notes.append(f'could not read the newest checkpoint: {e}')
        if not (self.proc.returncode == 0 and run.get('state') == 'done' and run.get('exit_code') == 0
                and (run.get('global_step') or 0) >= self.steps and (final or 0) >= self.steps):
            broken.append(f'finished: launch up exit {self.proc.returncode}, run.json state {run.get("state")} '
                          f'exit_code {run.get("exit_code")} global_step {run.get("global_step")}, newest checkpoint '
                          f'{final}; wanted exit 0, done, step >= {self.steps}')
        restarts = [e for e in events if e['event'] == 'restart']
        if len(restarts) != len(faults) or run.get('restarts') != len(faults):
            causes = '; '.join(f'{e["time"]} {e["cause"]}' + (f' (tasks {e["tasks"]})' if e.get('tasks') else '')
                               for e in restarts)
            broken.append(f'restarts: {len(faults)} fault(s) but {len(restarts)} restart event(s) '
                          f'(run.json restarts {run.get("restarts")}): {causes or "none"}')
        for i, f in enumerate(faults):
            until = faults[i + 1].at if i + 1 < len(faults) else float('inf')
            answers = [e for e in restarts if f.at <= event_time(e) < until]
            if len(answers) != 1:
                broken.append(f'restarts: fault {f.number} ({f.kind} {f.task}) was answered by {len(answers)} '
                              f'restart(s): {[e["cause"] for e in answers]}')
            if f.restart is None or f.checkpoint is None:
                continue
            k = events.index(f.restart)
            if not f.restart.get('tasks') and (f.restart.get('from_step') is None
                                               or f.restart['from_step'] < f.checkpoint):
                broken.append(f'resume: fault {f.number} ({f.kind} {f.task}) came with the checkpoint at step '
                              f'{f.checkpoint}, the restart resumed from {f.restart.get("from_step")}')
            after = [e['step'] for e in events[k + 1:] if e['event'] in ('first_step', 'progress')]
            if after and min(after) < f.checkpoint:
                broken.append(f'resume: after fault {f.number} ({f.kind} {f.task}) the global step went back to '
                              f'{min(after)}, below the checkpoint at step {f.checkpoint}')
        if leftovers:
            broken.append('nothing left: ' + '; '.join(f'{k}: {v}' for k, v in leftovers.items()))
        return broken


def run_chaos(options: Options, ssh_hosts=None, compose_ready: bool = False,
              say: Callable[[str], None] = print) -> Result:
    """Run one chaos run; `ssh_hosts` (a started tests.harness.sshd.SSHHosts) and `compose_ready` let a
    test's fixtures provide the sshd, the engine and the image."""
    workdir = options.dir or tempfile.mkdtemp(prefix=f'chaos-{options.backend}-')
    workdir = os.path.abspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    driver = make_driver(options.backend, workdir, ssh_hosts, compose_ready)
    driver.rehearse = options.rehearse
    return Chaos(options, driver, say).run()


# -- the command line ----------------------------------------------------------------------------
def parse_plan(text: str) -> tuple[tuple[str, str], ...]:
    out = []
    for item in filter(None, (s.strip() for s in text.split(','))):
        task, _, kind = item.partition('=')
        if task not in TASKS or kind not in sum(KINDS.values(), ()) + STANDBY_KINDS:
            raise argparse.ArgumentTypeError(f'{item!r}: expected TASK=KIND, TASK one of {", ".join(TASKS)}, '
                                             f'KIND one of kill, stop, pause, disconnect, {", ".join(STANDBY_KINDS)}')
        out.append((task, kind))
    return tuple(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='python -m tests.harness.chaos', description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog='\n'.join(__doc__.splitlines()[1:]))
    p.add_argument('--backend', choices=sorted(KINDS), default='local')
    p.add_argument('--faults', type=int, default=3, help='how many faults (default 3)')
    p.add_argument('--seed', type=int, default=1, help='picks the faults and their steps (default 1)')
    p.add_argument('--sync', action='store_true', help='sync training (default async)')
    p.add_argument('--kinds', help='comma-separated subset of the backend\'s fault kinds')
    p.add_argument('--tasks', help=f'comma-separated subset of {",".join(TASKS)}')
    p.add_argument('--plan', type=parse_plan, default=(), help='explicit faults, e.g. worker:1=kill,ps:0=stop '
                   '(replaces --faults, --kinds and --tasks)')
    p.add_argument('--gap', default='30-90', help='global steps of training before each fault, MIN-MAX')
    p.add_argument('--steps', type=int, help='train.steps (default: enough for the faults)')
    p.add_argument('--checkpoint-steps', type=int, default=20)
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--stall-secs', type=float, default=10.0)
    p.add_argument('--startup', type=float, default=0.0, metavar='SHARE',
                   help='the share of faults followed by a kill or freeze of a task their restart starts (0-1)')
    p.add_argument('--recover-secs', type=float, default=240.0,
                   help='a fault not answered, or training not back, within this long aborts the run')
    p.add_argument('--baseline', action='store_true', help='an undisturbed run of the same spec first, for its time')
    p.add_argument('--dir', help='where the specs and runs go (default: a new temporary folder, kept)')
    p.add_argument('--json', dest='json_out', help='write the figures to this file')
    p.add_argument('--set', dest='overrides', action='append', default=[], metavar='KEY=VALUE',
                   help='passed on to launch up, e.g. --set supervise.backoff_secs=0.5')
    p.add_argument('--standby', type=int, metavar='N', help='supervise.standby for the run (warm standbys per '
                   'host), and measure one `import tensorflow` at its start and end')
    p.add_argument('--no-fill', dest='fill', action='store_false', help='with --standby: a fault does not wait '
                   'until every host keeps its standbys ready (faults closer than a refill)')
    p.add_argument('--rehearse', action='store_true', help='every task a stand-in (`launch up --rehearse`; local only)')
    a = p.parse_args(argv)
    if a.standby is not None and a.standby < 0:
        p.error('--standby: a count >= 0')
    if a.rehearse and a.backend != 'local':
        p.error('--rehearse: the local backend only')
    low, _, high = a.gap.partition('-')
    kinds = tuple(k for k in (a.kinds or '').split(',') if k)
    bad = [k for k in kinds if k not in KINDS[a.backend] + EXTRA_KINDS[a.backend]]
    if bad:
        p.error(f'--kinds: {a.backend} has {", ".join(KINDS[a.backend] + EXTRA_KINDS[a.backend])}, '
                f'not {", ".join(bad)}')
    options = Options(backend=a.backend, faults=a.faults, seed=a.seed, sync=a.sync, kinds=kinds,
                      tasks=tuple(t for t in (a.tasks or '').split(',') if t) or TASKS, plan=a.plan,
                      gap=(int(low), int(high or low)), steps=a.steps, checkpoint_steps=a.checkpoint_steps,
                      batch_size=a.batch_size, stall_secs=a.stall_secs, recover_secs=a.recover_secs,
                      baseline=a.baseline, dir=a.dir, json_out=a.json_out, overrides=tuple(a.overrides),
                      startup=a.startup, rehearse=a.rehearse, standby=a.standby, fill=a.fill)
    # Ctrl-C or SIGTERM (a background job ignores SIGINT): the launcher is stopped, the sshd or
    # engine this harness started too.
    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    result = run_chaos(options)
    print(result.summary())
    return 1 if result.broken else 0


if __name__ == '__main__':
    sys.exit(main())
