"""Security: `isolation: netns` for real (a cluster trains out of everyone's reach, and leaves no
namespace behind), its refusals, and the warning about task ports the network can reach."""
from __future__ import annotations


import pytest
import yaml

from cluster.spec import SpecError, load_spec
from launch.run import exposure
from launch.backends import netns
from launch.planning.plan import netns_name, plan_cluster, plan_compose
from tests.harness.isolation import no_namespace_left  # noqa: F401 (an autouse fixture: no test leaves a namespace)


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

