"""Security: `isolation: netns` for real (a cluster trains out of everyone's reach, and leaves no
namespace behind), its refusals, and the warning about task ports the network can reach."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from cluster.spec import load_spec
from launch.run import exposure
from launch.backends import netns
from launch.backends.base import tcp_listening
from launch.planning.plan import netns_name
from tests.conftest import REPO, launch, launch_bg, project_processes, read_until, write_spec
from tests.harness.isolation import namespaces
from tests.harness.isolation import no_namespace_left  # noqa: F401 (an autouse fixture: no test leaves a namespace)

needs_netns = pytest.mark.skipif(netns.unavailable() is not None or shutil.which('setpriv') is None,
                                 reason=f'network namespaces: {netns.unavailable() or "no setpriv"}')


def isolated_spec(tmp_path, **train) -> str:
    spec = write_spec(tmp_path, **train)
    data = yaml.safe_load(open(spec))
    data['isolation'] = 'netns'
    with open(spec, 'w') as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return spec


def ports_of(spec: str) -> list[int]:
    return [t.port for t in load_spec(spec).tasks]


def connects(host: str, port: int) -> bool:
    return tcp_listening(host, port, timeout=2)


@contextlib.contextmanager
def own_namespace(name: str, address: str | None = None):
    """A namespace of the test's own, optionally with one veth interface that has `address`."""
    subprocess.run(['ip', 'netns', 'add', name], check=True)
    try:
        ip = ['ip', '-n', name]
        subprocess.run([*ip, 'link', 'set', 'lo', 'up'], check=True)
        if address:
            subprocess.run([*ip, 'link', 'add', 'tfa', 'type', 'veth', 'peer', 'name', 'tfb'], check=True)
            subprocess.run([*ip, 'addr', 'add', f'{address}/24', 'dev', 'tfa'], check=True)
            for dev in ('tfa', 'tfb'):
                subprocess.run([*ip, 'link', 'set', dev, 'up'], check=True)
        yield name
    finally:
        subprocess.run(['ip', 'netns', 'delete', name], check=True)


# -- for real ------------------------------------------------------------------------------------

@pytest.mark.slow
@needs_netns
def test_isolated_cluster_trains_and_nothing_outside_reaches_it(tmp_path):
    spec = isolated_spec(tmp_path, steps=100)
    ns = netns_name(load_spec(spec))
    ports = ports_of(spec)
    outside = ['127.0.0.1', '::1'] + [a for a in exposure.machine_addresses() or [] if not a.startswith('fe80:')]
    assert ns not in namespaces()
    proc = launch_bg('up', spec)
    try:
        lines = read_until(proc, 'servers are up')
        assert ns in namespaces()
        # From this machine's own network (loopback and every other address): refused.
        reached = [(a, p) for a in outside for p in ports if connects(a, p)]
        assert not reached, f'task ports reachable from outside the namespace: {reached}'
        # From inside the namespace: every task port connects.
        probe = 'import socket, sys\nfor p in sys.argv[1:]: socket.create_connection(("127.0.0.1", int(p)), 2).close()'
        inside = subprocess.run(['ip', 'netns', 'exec', ns, sys.executable, '-c', probe, *map(str, ports)],
                                capture_output=True, text=True, timeout=30)
        assert inside.returncode == 0, inside.stderr
        # The launcher's own view: status asks from inside too (the ps serves until the end).
        status = launch('status', spec, timeout=60)
        ps_row = next(line for line in status.stdout.splitlines() if line.startswith('ps:0'))
        assert ps_row.split()[4:6] == ['yes', 'yes'], status.stdout
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = ''.join(lines) + out
    assert proc.returncode == 0, output
    assert 'global step 100' in output and 'WARNING' not in output, output
    assert ns not in namespaces()
    assert not project_processes()


@pytest.mark.slow
@needs_netns
def test_down_after_a_killed_launcher_stops_the_tasks_and_removes_the_namespace(tmp_path):
    spec = isolated_spec(tmp_path)
    ns = netns_name(load_spec(spec))
    proc = launch_bg('up', spec)
    try:
        read_until(proc, 'started 3 tasks')
    finally:
        proc.kill()             # no tear-down: the tasks and the namespace are left
        proc.wait()
    assert ns in namespaces() and netns.pids(ns)
    down = launch('down', spec, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert ns not in namespaces()
    assert not project_processes()


@pytest.mark.slow
@needs_netns
def test_isolation_is_refused_without_cap_sys_admin(tmp_path):
    """A process without CAP_SYS_ADMIN (any non-root user; here root with every capability dropped,
    as this test's Python lives under /root) gets one line, exit 2, and nothing starts."""
    spec = isolated_spec(tmp_path)
    result = subprocess.run(['setpriv', '--inh-caps=-all', '--bounding-set=-all', sys.executable, '-m', 'launch',
                             'up', spec], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count('\n') == 1 and spec in result.stderr, result.stderr
    assert 'isolation: netns needs root (CAP_SYS_ADMIN)' in result.stderr
    assert os.listdir(tmp_path) == ['spec.yaml']


@pytest.mark.slow
@needs_netns
def test_down_removes_a_namespace_a_killed_launcher_left(tmp_path):
    spec = isolated_spec(tmp_path)
    ns = netns_name(load_spec(spec))
    assert netns.create(ns)
    result = launch('down', spec, timeout=60)
    assert result.returncode == 0, result.stderr
    assert ns not in namespaces()


@pytest.mark.slow
@needs_netns
def test_check_warns_once_about_reachable_ports_and_not_when_isolated(tmp_path):
    """In a namespace of the test's own with one non-loopback address, so the warning is the same
    on any machine: `launch check` names that address; isolated, it says nothing."""
    spec = write_spec(tmp_path)
    env = {**os.environ, 'PYTHONPATH': REPO}
    with own_namespace(f'tfcluster-test-{os.getpid()}', '198.51.100.7') as ns:
        def check(*extra):
            return subprocess.run(['ip', 'netns', 'exec', ns, sys.executable, '-m', 'launch', 'check', spec, *extra],
                                  cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
        plain = check()
        isolated = check('--set', 'isolation=netns')
    assert plain.returncode == 0, plain.stdout + plain.stderr
    warnings = [line for line in plain.stderr.splitlines() if line.startswith('launch: WARNING:')]
    assert len(warnings) == 1 and '198.51.100.7' in warnings[0], plain.stderr
    assert 'anyone who can reach them can run code' in warnings[0] and 'isolation: netns' in warnings[0]
    assert '127.0.0.1' not in warnings[0]
    assert isolated.returncode == 0 and 'WARNING' not in isolated.stderr, isolated.stdout + isolated.stderr
    assert 'in network namespace tfcluster-' in isolated.stdout


@pytest.mark.slow
def test_machine_addresses_lists_only_non_loopback_ones():
    if netns.unavailable():
        pytest.skip(netns.unavailable())
    code = 'from launch.run.exposure import machine_addresses; print(machine_addresses())'
    env = {**os.environ, 'PYTHONPATH': REPO}
    with own_namespace(f'tfcluster-test-{os.getpid()}') as ns:
        bare = subprocess.run(['ip', 'netns', 'exec', ns, sys.executable, '-c', code], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=30)
    assert bare.stdout.strip() == '[]', bare.stdout + bare.stderr


# -- refusals through the command line (nothing starts) -----------------------------------------

@pytest.mark.slow
def test_isolation_with_ssh_hosts_is_a_spec_error(tmp_path):
    spec = write_spec(tmp_path, task_hosts=['localhost', 'localhost', 'node2'], hosts={'node2': {'user': 'u'}})
    result = launch('plan', spec, '--set', 'isolation=netns', timeout=60)
    assert result.returncode == 2 and result.stderr.count('\n') == 1, result.stderr
    assert '--set isolation=netns: isolation: netns runs a local cluster' in result.stderr
    assert 'worker:1 is on node2 (SSH)' in result.stderr


@pytest.mark.slow
def test_isolation_with_compose_says_its_network_is_internal(tmp_path):
    spec = isolated_spec(tmp_path)
    for args in (('plan', spec, '--backend', 'compose'), ('compose', spec)):
        result = launch(*args, timeout=60)
        assert result.returncode == 2 and result.stderr.count('\n') == 1, result.stderr
        assert f'{spec}: isolation: netns is for local processes' in result.stderr
        assert 'internal network' in result.stderr
    assert os.listdir(tmp_path) == ['spec.yaml']
