"""Shared fixtures: free ports, spec files, and a guard that fails any test leaving a task behind."""
from __future__ import annotations

import atexit
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import yaml

# The helpers in tests/harness/ assert as tests do: pytest's rewriting gives their failures the same detail.
pytest.register_assert_rewrite('tests.harness')

from tests.harness.parts import REPO, free_ports, task_processes, unavailable  # noqa: E402 (tests import REPO, free_ports from here)

# The harness modules that define fixtures (sshd: ssh_hosts; slurm: slurm_cluster; dockerd:
# docker_engine, compose_image, compose_project; data: synth_dir; disk: small_fs): a test names the
# fixture as an argument, imports nothing.
pytest_plugins = ['tests.harness.sshd', 'tests.harness.slurm', 'tests.harness.dockerd', 'tests.harness.data',
                  'tests.harness.disk', 'tests.harness.raycluster']

_session_dir = ''    # this pytest session's temporary root: every spec a test writes lies below it


def pytest_collection_modifyitems(config, items):
    """A benchmark's own check (`@pytest.mark.bench`: minutes of benchmark runs a user does not rely
    on) runs only when the marker expression names it (`python -m pytest -m bench`), never in the
    README's two tiers; pytest's summary counts it as deselected."""
    if 'bench' in (config.getoption('markexpr') or ''):
        return
    benches = [item for item in items if item.get_closest_marker('bench')]
    if benches:
        config.hook.pytest_deselected(items=benches)
        items[:] = [item for item in items if not item.get_closest_marker('bench')]


def pytest_sessionstart(session):
    global _session_dir
    _session_dir = str(session.config._tmp_path_factory.getbasetemp())


def project_processes() -> dict[int, str]:
    """pid -> command line of every running task or launcher of this test session (its spec lies
    under the session's temporary root, so another session's processes are never counted)."""
    return task_processes(_session_dir + os.sep)


# The user's index of runs (launch/records/index.py): every run a test starts is recorded in a
# temporary one, never in the real user's. A session-wide one for anything outside a test (set
# here, at import, before any launcher starts), and a fresh one per test (below), inherited by the
# launchers the test starts, so `launch list` of one test shows only that test's runs.
os.environ['TFCLUSTER_STATE_DIR'] = tempfile.mkdtemp(prefix='tfcluster-state-')
atexit.register(shutil.rmtree, os.environ['TFCLUSTER_STATE_DIR'], True)


@pytest.fixture(autouse=True)
def private_index_of_runs(tmp_path_factory, monkeypatch):
    """Each test its own, empty index of runs."""
    monkeypatch.setenv('TFCLUSTER_STATE_DIR', str(tmp_path_factory.mktemp('state')))


@pytest.fixture(autouse=True)
def no_stray_processes():
    """Fail the test if a task or launcher it started is still running shortly after it ends."""
    before = set(project_processes())
    yield
    deadline = time.monotonic() + 3
    while True:
        left = {p: c for p, c in project_processes().items() if p not in before}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f'processes left behind: {left}'


# -- the fast tier starts no process ----------------------------------------------------------------
# Python raises an audit event for every way it starts a process (subprocess.Popen, whence
# subprocess.run; os.system, os.posix_spawn, os.spawn*, os.fork: multiprocessing). One hook for
# the session records them while a test not marked `slow` runs; the test then fails naming each.
SPAWN_EVENTS = frozenset({'subprocess.Popen', 'os.system', 'os.posix_spawn', 'os.spawn', 'os.fork', 'os.forkpty'})
_spawned: list[str] | None = None    # a list while a fast test runs, else None
# The static checkers the fast tier runs over the source (tests/unit/test_architecture.py) and the docs
# (tests/unit/docs/test_docs.py: mkdocs build): short processes that read files and start no server, so they
# belong in the fast tier.
STATIC_CHECKERS = frozenset({'ruff', 'mypy', 'lint-imports', 'mkdocs'})


def _record_spawn(event: str, args: tuple) -> None:
    if _spawned is None or event not in SPAWN_EVENTS:
        return
    try:            # an exception here would abort the start itself: the test must fail, not the code under it
        what = {'subprocess.Popen': 1, 'os.system': 0, 'os.posix_spawn': 1, 'os.spawn': 2}.get(event)
        what = '(a fork)' if what is None else args[what]
        what = ' '.join(map(os.fsdecode, what)) if isinstance(what, (list, tuple)) else os.fsdecode(what)
    except Exception:
        what = repr(args)
    frame = sys._getframe(1)       # the innermost frame of this project's code: where it was started from
    while frame and not frame.f_code.co_filename.startswith(REPO + os.sep):
        frame = frame.f_back
    where = f' (from {os.path.relpath(frame.f_code.co_filename, REPO)}:{frame.f_lineno})' if frame else ''
    if os.path.basename(what.split(' ')[0]) not in STATIC_CHECKERS:
        _spawned.append(f'{event}: {what}{where}')


# Importing TensorFlow asks platform.processor(), which runs `uname -p` once per interpreter: ask
# it before the hook, so the first fast test to import TensorFlow is not taken to start a process.
platform.processor()
sys.addaudithook(_record_spawn)


@pytest.fixture(autouse=True)
def fast_tests_start_no_process(request):
    """A test not marked slow must start no process, nor may its function-scoped fixtures."""
    global _spawned
    if request.node.get_closest_marker('slow'):
        yield
        return
    _spawned = []
    try:
        yield
    finally:
        spawned, _spawned = _spawned, None
    if spawned:
        pytest.fail('a test not marked slow started processes (mark it @pytest.mark.slow):\n' + '\n'.join(spawned),
                    pytrace=False)


def write_spec(path, workers: int = 2, ps: int = 1, host: str = 'localhost', hosts: dict | None = None,
               task_hosts: list[str] | None = None, supervise: dict | None = None, top: dict | None = None,
               **train) -> str:
    """A spec file with free ports and a train_dir next to it; `train` overrides the defaults.
    `task_hosts` gives each task's host (ps tasks first, then workers) instead of `host` for all;
    `top` adds sections (env, tasks, gpus)."""
    ports = free_ports(ps + workers)
    where = list(task_hosts) if task_hosts else [host] * (ps + workers)
    assert len(where) == ps + workers, where
    settings = {'sync': True, 'steps': 12, 'batch_size': 8, 'data': 'synthetic',
                'train_dir': str(path / 'run'), 'log_every_secs': 1.0}
    settings.update(train)
    spec = {'cluster': {'ps': [f'{h}:{p}' for h, p in zip(where[:ps], ports[:ps])],
                        'worker': [f'{h}:{p}' for h, p in zip(where[ps:], ports[ps:])]},
            'train': settings}
    if supervise:
        spec['supervise'] = supervise
    return _write(path, spec, hosts, top)


def _write(path, spec: dict, hosts: dict | None, top: dict | None) -> str:
    """spec.yaml in `path`: `spec` with the `hosts` section and the `top` sections added."""
    if hosts:
        spec['hosts'] = hosts
    spec.update(top or {})
    file = path / 'spec.yaml'
    file.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(file)


def write_coordinator_spec(path, program: str = 'tests.harness.pss_programs:train',
                           evaluator: str | None = 'tests.harness.pss_programs:evaluate', host: str = 'localhost',
                           worker_hosts: tuple[str, str] | None = None, hosts: dict | None = None,
                           supervise: dict | None = None, top: dict | None = None, **train) -> str:
    """A coordinator spec (TF2 ParameterServerStrategy): 1 chief, 1 ps, 2 workers and, with an
    `evaluator` function, an evaluator, on free ports of `host` (the workers on `worker_hosts`
    where given); `train` overrides the defaults."""
    jobs = ['chief', 'ps', 'worker', 'worker'] + (['evaluator'] if evaluator else [])
    where = [host, host, *(worker_hosts or (host, host)), host]
    cluster: dict[str, list[str]] = {}
    for job, on, port in zip(jobs, where, free_ports(len(jobs))):
        cluster.setdefault(job, []).append(f'{on}:{port}')
    settings = {**({'program': program} if program else {}), 'steps': 100, 'batch_size': 16,
                'train_dir': str(path / 'run'), 'log_every_secs': 0.5, **({'evaluator': evaluator} if evaluator else {})}
    settings.update(train)
    spec: dict = {'cluster': cluster, 'train': settings,
                  'supervise': {'restart': 'on-failure', 'backoff_secs': 0.5, **(supervise or {})}}
    return _write(path, spec, hosts, top)


def need_fashion_mnist() -> str:
    """The Debian package's Fashion-MNIST folder; a one-line skip where dataset-fashion-mnist is
    not installed, a failure under CI=true (whose command installs it)."""
    from cluster.checks import data
    if not os.path.isdir(data.FASHION_MNIST_DIR):
        unavailable(f'{data.FASHION_MNIST_DIR} is missing: apt-get install {data.FASHION_MNIST_PACKAGE}',
                    'the CI command installs dataset-fashion-mnist')
    return data.FASHION_MNIST_DIR


def idx_bytes(array) -> bytes:
    """An IDX file of unsigned bytes holding the numpy `array` (its magic, dimensions, bytes)."""
    import struct
    import numpy as np
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f'>{array.ndim}I', *array.shape) + \
        array.astype(np.uint8).tobytes()


def write_idx_set(directory, train: int = 12, test: int = 6, side: int = 28, gz: bool = True, seed: int = 0) -> str:
    """The four IDX files of a small MNIST-like data set in `directory`: random images, labels
    0..9 in turn; gzip-compressed (`.gz`) or plain."""
    import gzip
    import numpy as np
    from cluster.checks import idx
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    for split, count in (('train', train), ('test', test)):
        images_name, labels_name = idx.base_names(split)
        images = rng.integers(0, 256, size=(count, side, side), dtype=np.uint8)
        for name, array in ((images_name, images), (labels_name, np.arange(count) % 10)):
            path = os.path.join(directory, name + ('.gz' if gz else ''))
            with (gzip.open(path, 'wb') if gz else open(path, 'wb')) as f:
                f.write(idx_bytes(array))
    return str(directory)


# The spec's env: as the backends' tests give it (values that need quoting, a number, a per-job
# override), and the line each task then logs (cluster/task.py environment_line).
TASK_ENV = {'env': {'TFC_TEST_WORDS': 'a b "c" $HOME \'d\'', 'TFC_TEST_NUM': 4, 'TFC_TEST_JOB': 'any'},
            'tasks': {'worker': {'env': {'TFC_TEST_JOB': 'worker'}}}}


def envs_through(backend, spec, plans, timeout: float = 60) -> dict[str, dict[str, str]]:
    """Each plan started through `backend` with `env` as its task (the plan's environment, as the
    backend passes it): task name -> the environment the task saw."""
    import dataclasses
    plans = [dataclasses.replace(p, argv=('env',)) for p in plans]
    records = []
    try:
        backend.prepare(plans, spec.to_yaml())
        records = [backend.start(p) for p in plans]
        deadline = time.monotonic() + timeout
        while any(backend.status(r).alive for r in records):
            assert time.monotonic() < deadline, 'the `env` tasks did not end'
            time.sleep(0.1)
        return {r.name: dict(line.split('=', 1) for line in backend.read_log(r) if '=' in line) for r in records}
    finally:
        backend.stop(records, grace=1)


def environment_words(job: str) -> list[str]:
    """What a task of `job` logs of TASK_ENV (each variable as name=repr(value))."""
    env = {**TASK_ENV['env'], **TASK_ENV['tasks'].get(job, {}).get('env', {})}
    return [f'{k}={str(v)!r}' for k, v in sorted(env.items())]


def run_by_hand(spec: str, env: dict | None = None, timeout: float = 240) -> tuple[list[int], list[str]]:
    """ps:0, worker:0 and worker:1 started as three `python -m cluster.task` processes, as a user
    would in three shells; (their exit codes, their outputs) once all have ended."""
    return run_tasks([([sys.executable, '-m', 'cluster.task', '--spec', spec, '--job', job, '--index', str(i)], env)
                      for job, i in (('ps', 0), ('worker', 0), ('worker', 1))], cwd=REPO, timeout=timeout)


def run_tasks(tasks: list[tuple[list[str], dict | None]], cwd, timeout: float = 150) -> tuple[list[int], list[str]]:
    """Every (argv, environment) started at once, as a scheduler starts a cluster's pods; (their
    exit codes, their outputs) once all have ended. None survives, whatever happens."""
    procs, files = [], []
    deadline = time.monotonic() + timeout
    try:
        for argv, env in tasks:
            # Each output into a file of its own: a pipe read only after the task before it has
            # ended could fill up and stop its task.
            files.append(tempfile.TemporaryFile('w+'))
            procs.append(subprocess.Popen(argv, cwd=cwd, env=env, stdout=files[-1], stderr=subprocess.STDOUT,
                                          text=True))
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for p in procs:
            p.kill()
            p.wait()
    outs = []
    for f in files:
        f.seek(0)
        outs.append(f.read())
        f.close()
    return [p.returncode for p in procs], outs


def check_trained(train_dir, codes: list[int], outs: list[str], steps: int) -> None:
    """1 ps and 2 workers all ended with 0, the chief wrote its last checkpoint, and the ps saw
    both workers done (the first output is the ps task's)."""
    assert codes == [0, 0, 0], '\n'.join(o[-3000:] for o in outs)
    with open(os.path.join(train_dir, 'checkpoint')) as f:
        assert re.search(rf'^model_checkpoint_path: ".*ckpt-{steps}"', f.read(), re.M)
    assert 'worker:0 is done' in outs[0] and 'worker:1 is done' in outs[0]


def launch(*args, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
    """Run the real `launch` command line to the end (the timeout only guards against a hang: a
    shared CI machine can run several times slower than usual)."""
    return subprocess.run([sys.executable, '-m', 'launch', *args], cwd=kw.pop('cwd', REPO), capture_output=True,
                          text=True, timeout=timeout, **kw)


def launch_bg(*args, **kw) -> subprocess.Popen:
    """Start `launch` in the background, its output readable line by line."""
    return subprocess.Popen([sys.executable, '-m', 'launch', *args], cwd=kw.pop('cwd', REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def read_until(proc: subprocess.Popen, needle: str, timeout: float = 180) -> list[str]:
    """Lines of proc's output up to the first containing `needle`; fails on timeout or exit. A
    launcher that goes silent is killed at the deadline (readline alone would wait for ever)."""
    lines = []
    expired = threading.Event()
    timer = threading.Timer(timeout, lambda: (expired.set(), proc.kill()))
    timer.start()
    try:
        while True:
            line = proc.stdout.readline()
            if not line:
                why = f'no {needle!r} within {timeout}s (killed it)' if expired.is_set() else \
                    f'launch exited ({proc.wait()}) before printing {needle!r}'
                pytest.fail(f'{why}:\n' + ''.join(lines))
            lines.append(line)
            if needle in line:
                return lines
    finally:
        timer.cancel()
