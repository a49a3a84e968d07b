"""A real single-node Slurm for the Slurm backend's tests: munged, slurmctld and slurmd (Debian's
`slurm-wlm` and `munge`, run as root), with their key, config, state, spool and logs in one
temporary directory and their ports chosen free, so nothing of the machine's own configuration
is read or changed. Tests and the launcher reach it through SLURM_CONF (`SlurmCluster.env`).

Without the programs the tests skip with one line, or fail under CI=true, where they must run.

Pitfalls met on the way (Slurm 22.05, munge 0.5.15, in a container without systemd):
- A node declared with more CPUs than the machine has is set INVAL ("Low socket*core*thread
  count") and takes no job; `SlurmdParameters=config_overrides` makes slurmd trust the config,
  so a 2-core machine can offer the 8 CPUs that several 3-task jobs need.
- Without systemd nothing starts munged; as root it needs --force. Its socket is not at the
  default path here, so `AuthInfo=socket=...` tells Slurm (daemons and client commands, which
  read the same slurm.conf) where it is; cred/munge uses the same setting.
- slurmctld must run on the host that `SlurmctldHost` names: the machine's short host name (with
  its address in parentheses); the node is that name too, so slurmd finds itself without -N and
  the names srun gives the tasks (SLURM_STEP_NODELIST) resolve on this machine.
- No cgroups in a container: `ProctrackType=proctrack/linuxproc` and `TaskPlugin=task/none`.
- slurmd logs mpi/pmix errors at start ("can not load PMIx library"): harmless with MpiDefault=none.
- A job whose --output file cannot be opened (a missing directory) fails before its script runs,
  with nothing but a line in slurmd's log.
- A requeued job may start again only once its job credential has expired (`cred_expire` in
  AuthInfo, 120 s by default): slurmd refuses the job's batch script until then ("Job N already
  killed, do not launch batch job"), and the job FAILs, so `scontrol update StartTime=now` does not
  hurry it. cred_expire=20 here (a step's credential is used within milliseconds of being made).
- `slurmstepd` (one per job step) daemonizes away from slurmd: stopping the daemons leaves a
  running step alive. Teardown cancels every job first, waits for the queue to empty, and then
  kills any slurmstepd still carrying this cluster's SLURM_CONF in its environment.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.parts import free_ports, unavailable

DAEMONS = ('munged', 'slurmctld', 'slurmd')
CLIENTS = ('munge', 'sbatch', 'srun', 'squeue', 'scontrol', 'scancel', 'sinfo')
START_TIMEOUT = 60
KILL_WAIT = 10          # slurm.conf KillWait: SIGTERM to a cancelled job's tasks, SIGKILL this much later

# Between fork and exec of a daemon: ask for SIGTERM when pytest dies (PR_SET_PDEATHSIG), so a
# killed test session leaves no Slurm running. argv: PARENT_PID PROGRAM ARGS...
_DEATHSIG_WRAPPER = (
    'import ctypes, os, signal, sys\n'
    'if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0) != 0:\n'
    '    sys.exit("prctl(PR_SET_PDEATHSIG) failed")\n'
    'if os.getppid() != int(sys.argv[1]):\n'
    '    sys.exit("the test session ended before the daemon started")\n'
    'os.execv(sys.argv[2], sys.argv[2:])\n'
)


class SlurmUnavailable(Exception):
    """Slurm could not be started here; the message says why in one line."""


def _find(program: str) -> str | None:
    return shutil.which(program) or shutil.which(program, path='/usr/sbin:/sbin')


def missing_programs() -> list[str]:
    return [p for p in DAEMONS + CLIENTS if _find(p) is None]


def _free_ports(n: int) -> list[int]:
    try:
        return free_ports(n)
    except RuntimeError as e:
        raise SlurmUnavailable(str(e)) from None


def _node_name() -> str:
    """This machine's short host name, which must resolve (tasks reach each other by it)."""
    name = socket.gethostname().split('.')[0]
    try:
        socket.gethostbyname(name)
    except OSError:
        raise SlurmUnavailable(f'this machine\'s host name {name!r} does not resolve (add it to /etc/hosts)') from None
    return name


SLURM_CONF = '''\
ClusterName=tfcluster-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket},cred_expire=20
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait={kill_wait}
InactiveLimit=0
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={node} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
'''


class SlurmCluster:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = str(self.root / 'slurm.conf')
        self.socket = str(self.root / 'munge' / 'munge.socket')
        self.env = {'SLURM_CONF': self.conf}
        self.node = ''
        self._procs: dict[str, subprocess.Popen] = {}

    # -- clients ------------------------------------------------------------------------
    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster."""
        return subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def jobs(self) -> list[str]:
        """The ids of the jobs in the queue (pending, running or completing)."""
        out = self.run('squeue', '-h', '-o', '%i')
        return out.stdout.split() if out.returncode == 0 else [f'(squeue failed: {out.stderr.strip()})']

    def wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.jobs():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    # -- life -----------------------------------------------------------------------------
    def start(self) -> None:
        self.node = _node_name()
        for sub in ('munge', 'state', 'spool', 'log'):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / 'munge', 0o700)
        key = self.root / 'munge' / 'munge.key'
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, slurmd_port = _free_ports(2)
        Path(self.conf).write_text(SLURM_CONF.format(node=self.node, ctld_port=ctld_port, slurmd_port=slurmd_port,
                                                     socket=self.socket, root=self.root, kill_wait=KILL_WAIT))
        munge_dir = self.root / 'munge'
        self._spawn('munged', '--foreground', '--force', f'--socket={self.socket}', f'--key-file={key}',
                    f'--pid-file={munge_dir}/munged.pid', f'--log-file={munge_dir}/munged.log',
                    f'--seed-file={munge_dir}/munged.seed')
        self._wait('munged', lambda: self.run('munge', '-n', '-S', self.socket).returncode == 0)
        self._spawn('slurmctld', '-D', '-f', self.conf)
        self._wait('slurmctld', lambda: 'UP' in self.run('scontrol', 'ping').stdout)
        self._spawn('slurmd', '-D', '-f', self.conf)
        self._wait('slurmd', lambda: self.run('sinfo', '-h', '-N', '-o', '%t').stdout.strip() == 'idle')

    def _spawn(self, name: str, *args: str) -> None:
        with open(self.root / 'log' / f'{name}.out', 'ab') as out:
            self._procs[name] = subprocess.Popen(
                [sys.executable, '-c', _DEATHSIG_WRAPPER, str(os.getpid()), _find(name), *args],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, **self.env})

    def _wait(self, name: str, ready) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._procs[name].poll() is not None:
                raise SlurmUnavailable(f'{name} exited ({self._procs[name].returncode}): {self._last_log(name)}')
            try:
                if ready():
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(0.2)
        raise SlurmUnavailable(f'{name} not ready within {START_TIMEOUT}s: {self._last_log(name)}')

    def _last_log(self, name: str) -> str:
        lines = []
        for path in (self.root / 'log' / f'{name}.out', self.root / 'log' / f'{name}.log',
                     self.root / 'munge' / 'munged.log'):
            if path.name.startswith(name) and path.exists():
                lines += [line.strip() for line in path.read_text(errors='replace').splitlines() if 'error' in line.lower()]
        return (lines or ['(no error in its log)'])[-1][:300]

    def stop(self) -> list[str]:
        """Cancel every job, stop the daemons; the problems met (empty: a clean stop)."""
        problems = []
        if 'slurmd' in self._procs and self._procs['slurmd'].poll() is None:
            self.wait_empty(10)         # a job srun made ends a moment after srun returns
            ids = [j for j in self.jobs() if j.isdigit()]
            if ids:
                problems.append(f'jobs left in the queue at the end: {", ".join(ids)}')
                self.run('scancel', *ids)
                if not self.wait_empty(KILL_WAIT + 30):
                    problems.append(f'jobs still queued after scancel: {self.jobs()}')
        for name in reversed(DAEMONS):
            proc = self._procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                problems.append(f'{name} ignored SIGTERM for 20s: killed')
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        strays = self._stray_steps()
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if strays:
            problems.append(f'slurmstepd processes left: {strays}')
        return problems

    def _stray_steps(self) -> list[int]:
        """slurmstepd processes of this cluster (its SLURM_CONF in their environment)."""
        mark = f'SLURM_CONF={self.conf}'.encode()
        found = []
        for entry in os.listdir('/proc'):
            if not entry.isdigit():
                continue
            try:
                with open(f'/proc/{entry}/cmdline', 'rb') as f:
                    if not f.read().startswith(b'slurmstepd'):
                        continue
                with open(f'/proc/{entry}/environ', 'rb') as f:
                    if mark in f.read().split(b'\0'):
                        found.append(int(entry))
            except OSError:
                continue
        return found


def _unavailable(why: str):
    unavailable(f'Slurm tests need a single-node Slurm: {why}', 'it must run here')


@pytest.fixture(scope='session')
def slurm_cluster(tmp_path_factory):
    """A running single-node Slurm; its jobs are cancelled and its daemons stopped at the end."""
    missing = missing_programs()
    if missing:
        _unavailable(f'{", ".join(missing)} not found (apt-get install slurm-wlm munge)')
    if os.geteuid() != 0:
        _unavailable('its daemons run as root here, and the tests do not')
    cluster = SlurmCluster(tmp_path_factory.mktemp('slurm'))
    try:
        cluster.start()
    except SlurmUnavailable as e:
        cluster.stop()
        _unavailable(str(e))
    yield cluster
    problems = cluster.stop()
    assert not problems, f'Slurm did not stop cleanly: {"; ".join(problems)}'
