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

from cluster.spec import SpecError, load_spec
from launch.run import exposure
from launch.backends import netns
from launch.backends.base import tcp_listening
from launch.planning.plan import netns_name, plan_cluster, plan_compose
from tests.conftest import REPO, launch, launch_bg, project_processes, read_until, write_spec

needs_netns = pytest.mark.skipif(netns.unavailable() is not None or shutil.which('setpriv') is None,
                                 reason=f'network namespaces: {netns.unavailable() or "no setpriv"}')


def namespaces() -> set[str]:
    return set(os.listdir(netns.NETNS_DIR)) if os.path.isdir(netns.NETNS_DIR) else set()


@pytest.fixture(autouse=True)
def no_namespace_left():
    """Fail the test if a network namespace it made survives it (and remove it)."""
    before = namespaces()
    yield
    left = namespaces() - before
    for ns in left:
        subprocess.run(['ip', 'netns', 'delete', ns], capture_output=True)
    assert not left, f'network namespaces left behind: {left}'


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


# -- the spec and the plan ----------------------------------------------------------------------

def write(tmp_path, text: str) -> str:
    path = tmp_path / 'spec.yaml'
    path.write_text(text)
    return str(path)


LOCAL = 'cluster:\n  ps: [localhost:2222]\n  worker: [localhost:2223]\ntrain: {train_dir: runs/x}\n'


@pytest.mark.parametrize('value,expected', [
    ('maybe', "spec.yaml:6: isolation: expected one of none, netns, got 'maybe'"),
    ('no', 'got False (YAML reads a bare no or off as false: write none)'),
    ('[netns]', "expected one of none, netns, got ['netns']"),
])
def test_bad_isolation_values(tmp_path, value, expected):
    with pytest.raises(SpecError) as e:
        load_spec(write(tmp_path, LOCAL + f'\nisolation: {value}\n'))
    assert expected in str(e.value)


def test_isolation_names_the_remote_task_at_its_line(tmp_path):
    text = 'cluster:\n  ps: [localhost:2222]\n  worker: [127.0.0.2:2223]\nhosts:\n  127.0.0.2: {}\nisolation: netns\n'
    with pytest.raises(SpecError) as e:
        load_spec(write(tmp_path, text))
    assert str(e.value).startswith(f'{tmp_path}/spec.yaml:6: isolation: netns runs a local cluster')
    assert 'worker:0 is on 127.0.0.2 (SSH)' in str(e.value)


def test_isolation_round_trips_and_is_omitted_when_none(tmp_path):
    spec = load_spec(write(tmp_path, LOCAL + 'isolation: netns\n'))
    assert spec.isolation == 'netns' and yaml.safe_load(spec.to_yaml())['isolation'] == 'netns'
    assert load_spec(write(tmp_path, spec.to_yaml())).isolation == 'netns'
    plain = load_spec(write(tmp_path, LOCAL))
    assert plain.isolation == 'none' and 'isolation' not in plain.to_yaml()


def test_plan_puts_local_tasks_in_one_namespace_named_after_the_train_dir(tmp_path):
    spec = load_spec(write(tmp_path, LOCAL + 'isolation: netns\n'))
    plans = plan_cluster(spec)
    ns = netns_name(spec)
    assert {p.netns for p in plans} == {ns} and ns.startswith('tfcluster-') and len(ns) <= 32
    assert plans[0].argv[1:3] == ('-m', 'cluster.task')       # the wrapper is the backend's
    assert netns.wrap(ns, plans[0].argv)[:4] == ['ip', 'netns', 'exec', ns]
    other = load_spec(write(tmp_path, LOCAL.replace('runs/x', 'runs/y') + 'isolation: netns\n'))
    assert netns_name(other) != ns
    assert netns_name(spec, cwd='/elsewhere') != ns                  # an absolute path decides
    assert all(p.netns is None for p in plan_compose(spec))
    assert all(p.netns is None for p in plan_cluster(load_spec(write(tmp_path, LOCAL))))


def test_cap_sys_admin_is_read_from_the_effective_set():
    assert netns.has_cap_sys_admin('Name:\tpython\nCapEff:\t000001ffffffffff\n')
    assert not netns.has_cap_sys_admin('CapPrm:\t000001ffffffffff\nCapEff:\t0000000000000000\n')
    assert not netns.has_cap_sys_admin('CapEff:\t00000000001fffff\n')          # all up to CAP_SYS_ADMIN
    assert netns.has_cap_sys_admin('CapEff:\t0000000000200000\n')              # bit 21 alone


# -- the warning's logic (pure) -------------------------------------------------------------------

IP_ADDR = '''\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever preferred_lft forever
4: eth0    inet6 fd00::2/64 scope global nodad \\       valid_lft forever preferred_lft forever
4: eth0    inet6 fe80::fc:ff:fe00:1/64 scope link \\       valid_lft forever preferred_lft forever
5: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever
6: lo2    inet 127.0.0.2/8 scope host lo2\\       valid_lft forever preferred_lft forever
'''


def test_parse_ip_addr_keeps_non_loopback_addresses_once():
    assert exposure.parse_ip_addr(IP_ADDR) == ['192.0.2.2', 'fd00::2', 'fe80::fc:ff:fe00:1', '172.17.0.1']
    assert exposure.parse_ip_addr(IP_ADDR + IP_ADDR) == exposure.parse_ip_addr(IP_ADDR)
    assert exposure.parse_ip_addr('') == []


def plans_for(tmp_path, text: str, backend=None):
    spec = load_spec(write(tmp_path, text))
    return plan_compose(spec) if backend == 'compose' else plan_cluster(spec)


REMOTE = ('cluster:\n  ps: [node1:2222]\n  worker: [node1:2223, 127.0.0.2:2224]\n'
          'hosts:\n  node1: {}\n  127.0.0.2: {}\n')


@pytest.mark.parametrize('text,backend,addresses,expect', [
    (LOCAL, None, ['192.0.2.2', 'fd00::2'], ['port(s) 2222, 2223 of this machine at 192.0.2.2, fd00::2',
                                            'anyone who can reach them can run code in the tasks',
                                            'isolation: netns', 'firewall']),
    (LOCAL, None, None, ['port(s) 2222, 2223 of this machine at every address it has besides loopback']),
    (LOCAL, None, [], None),                                        # only loopback: nothing to say
    (LOCAL + 'isolation: netns\n', None, ['192.0.2.2'], None),     # out of reach
    (LOCAL, 'compose', ['192.0.2.2'], None),                        # an internal network
    (REMOTE, None, [], ['port(s) 2222, 2223 at node1', 'firewall']),
    (REMOTE, None, ['192.0.2.2'], ['port(s) 2224 of this machine at 192.0.2.2; port(s) 2222, 2223 at node1']),
])
def test_warning(tmp_path, text, backend, addresses, expect):
    found = exposure.warning(plans_for(tmp_path, text, backend), addresses)
    if expect is None:
        assert found is None
        return
    assert found is not None and '\n' not in found
    for part in expect:
        assert part in found, found
    assert ('isolation: netns' in found) == (text == LOCAL)     # SSH tasks cannot be isolated by the launcher
