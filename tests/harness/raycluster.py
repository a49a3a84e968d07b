"""A real multi-node Ray cluster on this one machine for the Ray backend's slow tests: a head and
two more nodes on 127.0.0.2 and 127.0.0.3 (loopback addresses standing in for hosts), each a
`ray start --block` of its own, labelled `tfcluster.io/host=head|n2|n3`. A test may add a node of
its own (`add_node`) and stop it (`stop_node`) without touching the shared three. The test session
never imports ray: every question to the cluster is a short `python -c` (a pytest process that
called ray.init would be a Ray driver, and its actors would live as long as it).

Without ray (`pip install -e '.[ray]'`) the tests skip with one line, or fail under CI=true.

Measured here (Ray 2.60.0, 2 shared cores): the three nodes are up and seen with their labels in
13-18 s (one after another); they hold about 960 MiB resident (every process naming the temp dir,
before any task); a node stopped by SIGTERM is seen DEAD 1.3 s later, one killed (SIGKILL to its
process group) 7 s later (the health check's 5 s initial delay for a new node, then 3 missed 1 s
checks); the actors of a driver that exits are gone from `ray list actors` within 1 s (the first
`ray list` after the exit already shows none).

Pitfalls met on the way:
- The head cannot be on 127.0.0.1: `ray start` replaces 127.0.0.1/localhost by the machine's own
  address (192.0.2.2 here), which is also the address a driver on this machine looks for a local
  raylet at. So the head runs on that address (read back from ray.nodes(); `nodes['head']`,
  `address`), and only the other nodes use loopback addresses (127.0.0.2 is not "localhost").
- Ray 2.60 turns token authentication on by itself once ~/.ray/auth_token exists, which any local
  `ray.init()` without a cluster writes: a `ray start` then demands a token its clients do not
  send ("InvalidAuthToken"). RAY_AUTH_MODE=disabled for the nodes and every client (`env`).
- Ray's unix sockets live under --temp-dir, and a socket path must stay under 108 bytes: pytest's
  tmp_path is too deep, so the temp dir is a short `mkdtemp(prefix='rt', dir='/tmp')`. A non-head
  node takes the head's temp dir from the GCS anyway; it is passed to every node all the same.
- Nodes started together fail: one started before the head's GCS answers times out, and two
  joining at once in one temp dir clash ("The current node timed out during startup"). They are
  started one at a time, each waited for.
- Three nodes on one machine collide on the ports Ray does not choose at random: the dashboard
  agent's HTTP port (52365 for every node) and the worker port range (10002-19999 for every
  node). Every port is chosen here: the head's GCS, dashboard and Ray Client ports, and per node
  the agent's (HTTP and gRPC), the metrics', the runtime-env agent's, the node manager's, the
  object manager's and a worker range of its own.
- `--labels` is hidden from 2.60's `ray start --help` but works; the labels are read back from
  `ray.nodes()` ('Labels') before a node counts as up, and nodes are named by label throughout.
- SIGTERM to `ray start --block` drains the node first (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S,
  30 s by default) and then stops its processes; the GCS marks a drained node DEAD at once. SIGTERM
  to its whole process group instead kills the raylet under the drain and left the GCS and the
  `ray start` running (still there 10 s later): only `ray start` gets it. A node killed outright is found by the GCS's
  health check (RAY_health_check_period_ms, _timeout_ms, _failure_threshold: 3 s, 10 s and 5 by
  default), shortened here to 1 s, 1 s and 3.
- `ray list actors` prints 'No resource in the cluster', not '[]', when there is none, even with
  --format json.
- Ray's daemons ask for SIGKILL when their parent dies (PR_SET_PDEATHSIG), so a `ray start` killed
  takes its node with it; a wrapper asks the same of `ray start` for the test session, so a killed
  pytest leaves no Ray behind (tried: kill -9 of pytest, nothing naming the temp dir 15 s later).
- `ray stop` is never run: it stops every Ray process of the machine, other sessions' included.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.harness.parts import free_ports, processes_naming, unavailable

START_TIMEOUT = 90
STOP_WAIT = 15
LABEL = 'tfcluster.io/host'
WORKER_PORTS = 200          # a node's own range of ports for its workers
NODES = (('head', ''), ('n2', '127.0.0.2'), ('n3', '127.0.0.3'))     # '': the address Ray gives the head

# Between fork and exec of `ray start`: ask for SIGTERM when pytest dies (PR_SET_PDEATHSIG), so a
# killed test session leaves no node running. argv: PARENT_PID PROGRAM ARGS...
_DEATHSIG_WRAPPER = (
    'import ctypes, os, signal, sys\n'
    'if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0) != 0:\n'
    '    sys.exit("prctl(PR_SET_PDEATHSIG) failed")\n'
    'if os.getppid() != int(sys.argv[1]):\n'
    '    sys.exit("the test session ended before the node started")\n'
    'os.execv(sys.argv[2], sys.argv[2:])\n'
)

# Waits, as a Ray driver of its own, until each node named in WANT (JSON: label -> alive) is
# alive or dead as wanted, and prints the seconds it took and the nodes (label -> [alive, ip]);
# exit 1 at the deadline. A label never seen counts as dead. argv: GCS_ADDRESS DEADLINE_S WANT
_WATCH_NODES = '''\
import json, sys, time
import ray
address, deadline, want = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3])
start = time.monotonic()
ray.init(address=address, logging_level='ERROR', log_to_driver=False, configure_logging=False)
def state():
    now = {}
    for n in ray.nodes():
        label, alive = n.get('Labels', {}).get(LABEL), bool(n['Alive'])
        if label is not None and (alive or label not in now):
            now[label] = [alive, n['NodeManagerAddress']]
    return now
def met(now):
    return all(now.get(label, [False])[0] == alive for label, alive in want.items())
now = state()
while not met(now) and time.monotonic() - start < deadline:
    time.sleep(0.1)
    now = state()
print(json.dumps({'seconds': time.monotonic() - start, 'nodes': now}))
sys.exit(0 if met(now) else 1)
'''.replace('LABEL', repr(LABEL))

# The head of a driver script run by `RayCluster.run_driver`: CODE follows, with `ray` imported
# and connected to the cluster in the 'tfcluster' namespace (argv: GCS_ADDRESS NAMESPACE).
DRIVER_HEAD = '''\
import json, sys
import ray
ray.init(address=sys.argv[1], namespace=sys.argv[2], logging_level='ERROR', log_to_driver=False)
'''


class RayUnavailable(Exception):
    """The Ray cluster could not be started; the message says why."""


@dataclass
class Node:
    """One `ray start --block` process and the node it runs."""
    name: str
    ip: str
    proc: subprocess.Popen
    log: Path
    ports: dict[str, int] = field(default_factory=dict)


def ray_missing() -> str:
    """Why Ray cannot be used here ('' where it can)."""
    if importlib.util.find_spec('ray') is None:
        return 'the ray package is not importable'
    if shutil.which('ray') is None:
        return 'no ray program on PATH'
    return ''


class RayCluster:
    """The cluster a test gets: `address` (the GCS, HEAD_IP:PORT, for --ray-address and ray.init),
    `dashboard` (http://127.0.0.1:PORT, for `ray list` and job submission), `temp_dir`, `nodes`
    (label -> address of the nodes running now) and `env` (for a launcher or a driver)."""

    def __init__(self, temp_dir: str):
        self.temp_dir = temp_dir
        self.address = ''
        self.dashboard = ''
        self.nodes: dict[str, str] = {}
        self._nodes: dict[str, Node] = {}
        self._extra: list[str] = []
        self.start_seconds = 0.0
        # Worker port ranges: one block per node, from a base chosen at random in Ray's default
        # range, so two clusters (two xdist workers) seldom share one (Ray skips a port in use).
        self._worker_base = random.randrange(10100, 20000 - 20 * WORKER_PORTS, WORKER_PORTS)
        self._spawned = 0
        self._labels: dict[str, str] = {}      # ip -> label of every node started, stopped ones too

    @property
    def env(self) -> dict[str, str]:
        """The environment for a launcher or a driver: no RAY_ADDRESS (tests name --ray-address)."""
        env = {k: v for k, v in os.environ.items() if k != 'RAY_ADDRESS'}
        env.update(RAY_USAGE_STATS_ENABLED='0', RAY_AUTH_MODE='disabled')
        return env

    # -- questions ---------------------------------------------------------------------------
    def watch(self, want: dict[str, bool], timeout: float) -> tuple[bool, float, dict]:
        """Wait until each node (by its label) is alive (or dead) as wanted: (met, the seconds it
        took, label -> [alive, ip])."""
        out = subprocess.run(
            [sys.executable, '-c', _WATCH_NODES, self.address, str(timeout), json.dumps(want)],
            capture_output=True, text=True, env=self.env, timeout=timeout + 60, stdin=subprocess.DEVNULL)
        try:
            report = json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            return False, 0.0, {'error': (out.stderr.strip().splitlines() or ['(nothing)'])[-1][:300]}
        return out.returncode == 0, report['seconds'], report['nodes']

    def node_alive(self, ip: str) -> bool:
        label = self._labels.get(ip)
        return label is not None and self.watch({label: True}, timeout=0)[0]

    def alive_actors(self, namespace: str | None = 'tfcluster') -> list[dict]:
        """The actors alive now (in `namespace`; None: in any), from the dashboard's state API."""
        argv = ['ray', 'list', 'actors', '--address', self.dashboard, '--filter', 'state=ALIVE',
                '--format', 'json', '--limit', '10000']
        out = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60,
                             stdin=subprocess.DEVNULL)
        assert out.returncode == 0, f'ray list actors failed: {out.stderr.strip()[-500:]}'
        text = out.stdout.strip()
        actors = [] if text in ('', 'No resource in the cluster') else json.loads(text)   # the CLI's 'none'
        return [a for a in actors if namespace is None or a.get('ray_namespace') == namespace]

    def run_driver(self, code: str, timeout: float = 120,
                   namespace: str = 'tfcluster') -> subprocess.CompletedProcess:
        """Run `code` as a Ray driver of this cluster (DRIVER_HEAD connects it first)."""
        return subprocess.run([sys.executable, '-c', DRIVER_HEAD + code, self.address, namespace],
                              capture_output=True, text=True, env=self.env, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    # -- life --------------------------------------------------------------------------------
    def start(self) -> None:
        started = time.monotonic()
        gcs, dash, client = free_ports(3)
        self.address, self.dashboard = f'127.0.0.1:{gcs}', f'http://127.0.0.1:{dash}'
        self._spawn('head', NODES[0][1], ['--head', f'--port={gcs}', '--include-dashboard=true',
                                          '--dashboard-host=127.0.0.1', f'--dashboard-port={dash}',
                                          f'--ray-client-server-port={client}'])
        head_ip = self._wait_ready(['head'])['head'][1]     # a node started before the GCS times out
        self._nodes['head'].ip = self.nodes['head'] = head_ip
        self._labels[head_ip] = 'head'
        self.address = f'{head_ip}:{gcs}'
        for name, ip in NODES[1:]:       # one at a time: two nodes starting at once in one temp dir clash
            self._spawn(name, ip, [f'--address={self.address}'])
            self._wait_ready([name])
        self.start_seconds = time.monotonic() - started

    def add_node(self, ip: str = '127.0.0.4', label: str = 'n4', labels: dict[str, str] | None = None) -> Node:
        """One more node, labelled `label` (and `labels` besides), alive when this returns; stopped at
        the end if no test did."""
        node = self._spawn(label, ip, [f'--address={self.address}'], labels or {})
        self._extra.append(label)
        self._wait_ready([label])
        return node

    def stop_node(self, node: Node, sig: int = signal.SIGTERM) -> float:
        """Stop a node (SIGTERM to its `ray start`: a drain, then a stop; SIGKILL to its process
        group: a node lost) and wait until the GCS sees it dead: the seconds that took."""
        started = time.monotonic()
        if sig == signal.SIGKILL:
            _killpg(node.proc.pid)
        else:
            node.proc.send_signal(sig)
        met, _, nodes = self.watch({node.name: False}, timeout=60)
        assert met, f'node {node.name} ({node.ip}) still alive 60 s after signal {sig}: {nodes}'
        seconds = time.monotonic() - started
        self._end(node)
        return seconds

    def _spawn(self, name: str, ip: str, args: list[str], labels: dict[str, str] | None = None) -> Node:
        if name in self._nodes:
            raise RayUnavailable(f'a node named {name} is there already')
        ports = dict(zip(('agent', 'agent_grpc', 'metrics', 'runtime_env', 'node_manager', 'object_manager'),
                         free_ports(6)))
        low = self._worker_base + WORKER_PORTS * (self._spawned % 20)
        self._spawned += 1
        argv = ['ray', 'start', '--block', *([f'--node-ip-address={ip}'] if ip else []), f'--labels={",".join(f"{k}={v}" for k, v in {LABEL: name, **(labels or {})}.items())}',
                f'--node-name={name}', '--num-cpus=8', '--object-store-memory=100000000', '--disable-usage-stats',
                f'--temp-dir={self.temp_dir}', f'--dashboard-agent-listen-port={ports["agent"]}',
                f'--dashboard-agent-grpc-port={ports["agent_grpc"]}', f'--metrics-export-port={ports["metrics"]}',
                f'--runtime-env-agent-port={ports["runtime_env"]}', f'--node-manager-port={ports["node_manager"]}',
                f'--object-manager-port={ports["object_manager"]}',
                f'--min-worker-port={low}', f'--max-worker-port={low + WORKER_PORTS - 1}', *args]
        env = {**self.env, 'RAY_health_check_period_ms': '1000', 'RAY_health_check_timeout_ms': '1000',
               'RAY_health_check_failure_threshold': '3'}
        log = Path(self.temp_dir) / f'start-{name}.log'
        with open(log, 'ab') as out:
            proc = subprocess.Popen([sys.executable, '-c', _DEATHSIG_WRAPPER, str(os.getpid()),
                                     shutil.which('ray') or 'ray', *argv[1:]],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
        node = Node(name, ip, proc, log, ports)
        self._nodes[name] = node
        self.nodes[name] = ip
        self._labels[ip] = name
        return node

    def _wait_ready(self, labels: list[str]) -> dict[str, list]:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            dead = [n for n in self._nodes.values() if n.proc.poll() is not None]
            if dead:
                raise RayUnavailable(f'ray start for {dead[0].name} exited ({dead[0].proc.returncode}): '
                                     f'{self._tails()}')
            left = deadline - time.monotonic()
            if left <= 0:
                raise RayUnavailable(f'nodes not all up with their labels in {START_TIMEOUT}s: {self._tails()}')
            met, _, nodes = self.watch({label: True for label in labels}, timeout=min(left, 20))
            if met:
                return nodes

    def _tails(self) -> str:
        raylets = sorted(Path(self.temp_dir).glob('session_latest/logs/raylet*.out'))
        return ' | '.join([f'{n.name}: {_tail(n.log)}' for n in self._nodes.values()]
                          + [f'{p.name}: {_tail(p, 2)}' for p in raylets])

    def _end(self, node: Node) -> list[str]:
        """Stop one `ray start --block` (if it still runs): SIGTERM, STOP_WAIT s, then SIGKILL."""
        self._nodes.pop(node.name, None)
        self.nodes.pop(node.name, None)
        if node.name in self._extra:
            self._extra.remove(node.name)
        problems = []
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
        try:
            node.proc.wait(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired:
            problems.append(f'{node.name} ignored SIGTERM for {STOP_WAIT}s: killed')
        _killpg(node.proc.pid)      # whatever of its session is left
        node.proc.wait()
        return problems

    def stop(self) -> list[str]:
        """Stop every node, the head last; the problems met (empty: a clean stop)."""
        problems: list[str] = []
        order = [n for n in self._nodes.values() if n.name in self._extra]
        order += [n for n in self._nodes.values() if n.name not in self._extra and n.name != 'head']
        order += [n for n in self._nodes.values() if n.name == 'head']
        for node in order:
            problems += self._end(node)
        left = _wait_gone(self.temp_dir, STOP_WAIT)
        if left:
            problems.append(f'processes left naming {self.temp_dir}: {sorted(left.values())[:5]}')
            for pid in left:
                _kill(pid)
        return problems

    def rss_bytes(self) -> int:
        """The resident memory of every process naming this cluster's temp dir (its daemons, its workers)."""
        total = 0
        for pid in processes_naming(self.temp_dir):
            try:
                with open(f'/proc/{pid}/statm') as f:
                    total += int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
            except (OSError, IndexError, ValueError):
                continue
        return total


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return ' / '.join(path.read_text(errors='replace').strip().splitlines()[-lines:])[-600:]
    except OSError:
        return '(no log)'


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_gone(text: str, timeout: float) -> dict[int, str]:
    """The processes still naming `text` after up to `timeout` s (Ray's daemons exit a moment
    after their `ray start`)."""
    deadline = time.monotonic() + timeout
    left = processes_naming(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = processes_naming(text)
    return left


@pytest.fixture(scope='module')
def ray_cluster():
    """A running three-node Ray cluster (head, n2, n3); every node is stopped at the end of the
    module that asked for it: an idle cluster holds about 1 GB and some CPU, which the rest of a
    serial slow tier should not pay for (a second module starts its own, 15 s)."""
    missing = ray_missing()
    if missing:
        unavailable(f'ray is not installed: {missing} (pip install -e \'.[ray]\')', 'CI installs it: .ci/run')
    cluster = RayCluster(tempfile.mkdtemp(prefix='rt', dir='/tmp'))
    try:
        cluster.start()
    except BaseException:
        problems = cluster.stop()
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)
        if problems:
            pytest.fail(f'Ray did not start, nor stop cleanly: {"; ".join(problems)}')
        raise
    yield cluster
    problems = cluster.stop()
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    assert not problems, f'the Ray cluster did not stop cleanly: {"; ".join(problems)}'
