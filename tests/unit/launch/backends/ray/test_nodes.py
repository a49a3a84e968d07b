"""The Ray backend's pure checks of a spec against a cluster's nodes (launch/backends/ray/nodes.py):
which node each host is, what each task asks for, and the one-line refusals when the cluster could
never hold the run. Nodes are written out by hand as `ray.nodes()` gives them; no Ray runs."""
from __future__ import annotations

import pytest

from cluster.spec import TaskSpec, address, load_spec
from launch.backends.ray.nodes import (Ask, How, alive_nodes, asks, cluster_words, demand,
                                       resolve_hosts, resolve_name, shortfalls, strict_spread_refusal)
from launch.errors import UsageError

WHERE = cluster_words('127.0.0.1:6379')


def _entry(node_id: str, address: str, name: str, cpus: float, gpus: float = 0.0, alive: bool = True,
           labels: dict | None = None) -> dict:
    """One entry of ray.nodes(), with the keys the backend reads (and one it does not)."""
    resources = {'CPU': cpus, 'memory': 1e9, f'node:{address}': 1.0}
    if gpus:
        resources['GPU'] = gpus
    return {'NodeID': node_id, 'Alive': alive, 'NodeManagerAddress': address, 'NodeName': name,
            'Resources': resources, 'Labels': labels or {}, 'DeathReasonMessage': ''}


HEAD = _entry('aa' * 14, '127.0.0.1', 'head-box', 4, labels={'tfcluster.io/host': 'head'})
N2 = _entry('bb' * 14, '127.0.0.2', 'n2.example', 4, 1, labels={'tfcluster.io/host': 'n2', 'zone': 'a'})
N3 = _entry('cc' * 14, '127.0.0.3', 'n3', 2, labels={'tfcluster.io/host': 'n3', 'zone': 'a'})
GONE = _entry('dd' * 14, '127.0.0.4', 'n4', 64, 8, alive=False)
NODES = alive_nodes([N3, GONE, N2, HEAD])


def _spec(tmp_path, ps: list[str], workers: list[str], extra: str = ''):
    """A spec with these task hosts (ports made up) and `extra` appended (hosts:, train:)."""
    quoted = [f'"{address(h, 2000 + i)}"' for i, h in enumerate(ps)]
    text = ('cluster:\n'
            f'  ps: [{", ".join(quoted)}]\n'
            '  worker:\n' + ''.join(f'    - "{address(h, 3000 + i)}"\n' for i, h in enumerate(workers)) + extra)
    path = tmp_path / 'spec.yaml'
    path.write_text(text)
    return load_spec(str(path))


def _resolver(table: dict[str, list[str]]):
    return lambda name: table.get(name, [])


# -- the nodes ------------------------------------------------------------------------------------

def test_alive_nodes_drop_the_dead_and_keep_what_placing_needs():
    assert [n.address for n in NODES] == ['127.0.0.1', '127.0.0.2', '127.0.0.3']
    n2 = NODES[1]
    assert (n2.node_id, n2.name, n2.cpus, n2.gpus) == ('bb' * 14, 'n2.example', 4.0, 1.0)
    assert dict(n2.labels) == {'tfcluster.io/host': 'n2', 'zone': 'a'}
    assert NODES[0].gpus == 0.0             # no GPU key at all: none


def test_a_node_matches_a_selector_only_with_every_label():
    n2 = NODES[1]
    assert n2.matches({'zone': 'a'}) and n2.matches({'zone': 'a', 'tfcluster.io/host': 'n2'})
    assert not n2.matches({'zone': 'a', 'tfcluster.io/host': 'n3'}) and not n2.matches({'rack': '1'})


def test_the_cluster_is_named_by_its_address_or_as_the_embedded_instance():
    assert cluster_words('10.0.0.5:6379') == 'the Ray cluster at 10.0.0.5:6379'
    assert cluster_words(None) == 'the Ray instance this run starts on this machine'


# -- host -> node ---------------------------------------------------------------------------------

@pytest.mark.parametrize('host, hosts, resolved, node', [
    ('127.0.0.2', '', {}, '127.0.0.2'),                                     # the node's address
    ('n2.example', '', {}, '127.0.0.2'),                                    # the node's name
    ('alias', 'hosts:\n  alias: {address: 127.0.0.3}\n', {}, '127.0.0.3'),  # hosts.NAME.address, an address
    ('alias', 'hosts:\n  alias: {address: n3}\n', {}, '127.0.0.3'),         # ... or a node's name
    ('box', '', {'box': ['10.9.9.9', '127.0.0.3']}, '127.0.0.3'),           # what the name resolves to
    ('alias', 'hosts:\n  alias: {address: box}\n', {'box': ['127.0.0.2']}, '127.0.0.2'),    # ... its address's
])
def test_a_named_host_is_pinned_to_its_node(tmp_path, host, hosts, resolved, node):
    spec = _spec(tmp_path, [host], ['localhost'], hosts)
    places = resolve_hosts(spec, NODES, WHERE, resolver=_resolver(resolved))
    assert places[host].how is How.NODE and [n.address for n in places[host].nodes] == [node]


def test_an_address_before_a_name_before_resolving(tmp_path):
    """A node whose name is another node's address: the address wins, and nothing is resolved."""
    odd = alive_nodes([HEAD, N2, _entry('ee' * 14, '127.0.0.9', '127.0.0.2', 1)])
    spec = _spec(tmp_path, ['127.0.0.2'], ['localhost'])
    places = resolve_hosts(spec, odd, WHERE, resolver=_resolver({'127.0.0.2': ['127.0.0.9']}))
    assert places['127.0.0.2'].nodes[0].node_id == 'bb' * 14


@pytest.mark.parametrize('host', ['localhost', '127.0.0.1', '::1'])
def test_loopback_hosts_go_to_the_placement_group(tmp_path, host):
    spec = _spec(tmp_path, ['127.0.0.2'], [host, host])
    places = resolve_hosts(spec, NODES, WHERE, resolver=_resolver({}))
    assert places[host].how is How.GROUP and places[host].nodes == ()
    assert set(places) == {'127.0.0.2', host}


def test_labels_place_a_host_on_any_node_that_has_them(tmp_path):
    spec = _spec(tmp_path, ['head'], ['zone-a', 'localhost'], 'hosts:\n  head: {}\n  zone-a: {}\n')
    labels = {'head': {'tfcluster.io/host': 'head'}, 'zone-a': {'zone': 'a'}}
    places = resolve_hosts(spec, NODES, WHERE, labels=labels, resolver=_resolver({}))
    assert places['head'].how is How.LABELS and [n.address for n in places['head'].nodes] == ['127.0.0.1']
    assert [n.address for n in places['zone-a'].nodes] == ['127.0.0.2', '127.0.0.3']
    assert dict(places['zone-a'].selector) == {'zone': 'a'}


def test_labels_win_over_a_loopback_name(tmp_path):
    """The tests pin the head, 127.0.0.1, by its label: a loopback name with labels is placed by them."""
    spec = _spec(tmp_path, ['127.0.0.1'], ['localhost'])
    places = resolve_hosts(spec, NODES, WHERE, labels={'127.0.0.1': {'tfcluster.io/host': 'head'}})
    assert places['127.0.0.1'].how is How.LABELS and places['localhost'].how is How.GROUP


def test_a_host_that_is_no_node_is_one_line(tmp_path):
    spec = _spec(tmp_path, ['127.0.0.2'], ['127.0.0.3', '10.0.0.9', '10.0.0.9'])
    with pytest.raises(UsageError) as e:
        resolve_hosts(spec, NODES, WHERE, resolver=_resolver({}))
    assert str(e.value) == (f'{spec.path}:5: cluster.worker[1]: host 10.0.0.9 is no node of the Ray cluster at '
                            '127.0.0.1:6379 (alive nodes: 127.0.0.1, 127.0.0.2, 127.0.0.3)')


def test_a_cluster_with_many_nodes_is_not_listed_whole(tmp_path):
    many = alive_nodes([_entry(f'{i:02d}' * 14, f'10.1.0.{i}', f'm{i}', 1) for i in range(1, 10)])
    spec = _spec(tmp_path, ['nowhere'], ['localhost'])
    with pytest.raises(UsageError, match=r'\(alive nodes: 10\.1\.0\.1, .*, 10\.1\.0\.6 and 3 more\)$'):
        resolve_hosts(spec, many, WHERE, resolver=_resolver({}))
    with pytest.raises(UsageError, match=r'\(alive nodes: none\)$'):
        resolve_hosts(spec, (), WHERE, resolver=_resolver({}))


def test_a_selector_no_node_matches_is_one_line(tmp_path):
    spec = _spec(tmp_path, ['gpu-a'], ['localhost'], 'hosts:\n  gpu-a: {}\n')
    with pytest.raises(UsageError) as e:
        resolve_hosts(spec, NODES, WHERE, labels={'gpu-a': {'tfcluster.io/host': 'gpu-a'}})
    assert str(e.value) == (f'{spec.path}:6: hosts.gpu-a.labels: no alive node of the Ray cluster at '
                            '127.0.0.1:6379 has tfcluster.io/host=gpu-a')


def test_a_host_that_is_two_nodes_asks_for_labels(tmp_path):
    twins = alive_nodes([_entry('ab' * 14, '10.0.0.7', 'a', 1), _entry('cd' * 14, '10.0.0.7', 'b', 1)])
    spec = _spec(tmp_path, ['10.0.0.7'], ['localhost'])
    with pytest.raises(UsageError) as e:
        resolve_hosts(spec, twins, WHERE)
    assert str(e.value) == (f'{spec.path}:2: cluster.ps[0]: host 10.0.0.7 is 2 nodes of the Ray cluster at '
                            '127.0.0.1:6379 (abababab at 10.0.0.7, cdcdcdcd at 10.0.0.7): name the one meant with '
                            'hosts.10.0.0.7.labels')


def test_the_default_resolver_gives_a_numeric_address_itself():
    assert resolve_name('127.0.0.3') == ('127.0.0.3',)


# -- what a task asks for ---------------------------------------------------------------------------

@pytest.mark.parametrize('devices, worker', [
    ('auto', Ask(1, 0)),                    # auto asks no GPU: Ray gives out only what is asked
    ('3', Ask(3, 0)),                       # three CPU towers
    ('[gpu:0, gpu:1]', Ask(1, 2)),
    ('[cpu:0, gpu:1]', Ask(1, 1)),          # one GPU tower, whatever its index
])
def test_a_worker_asks_by_its_towers_and_the_others_one_cpu(tmp_path, devices, worker):
    spec = _spec(tmp_path, ['localhost'], ['localhost'], f'train:\n  devices: {devices}\n')
    assert asks(spec, spec.task('worker', 0)) == worker
    for job in ('ps', 'chief', 'evaluator'):
        assert asks(spec, TaskSpec(job, 0, 'localhost', 1)) == Ask(1, 0)


def test_an_ask_in_words_and_whether_a_node_holds_it():
    assert [Ask(1, 0).words(), Ask(2, 1).words(), Ask(1, 2).words()] == \
        ['1 CPU', '2 CPUs and 1 GPU', '1 CPU and 2 GPUs']
    head, n2, _ = NODES
    assert Ask(1, 1).fits(n2) and not Ask(1, 1).fits(head) and Ask(4, 0).fits(head) and not Ask(5, 0).fits(head)


# -- what the run asks against what the cluster has ------------------------------------------------

def _short(spec, labels=None, nodes=NODES) -> list[str]:
    places = resolve_hosts(spec, nodes, WHERE, labels=labels, resolver=_resolver({}))
    return shortfalls(spec, places, nodes, WHERE)


def test_only_what_cannot_fit_is_a_shortfall(tmp_path):
    spec = _spec(tmp_path, ['127.0.0.3'], ['127.0.0.2', 'localhost', 'localhost'], 'train:\n  devices: [gpu:0]\n')
    # three workers of one GPU each need 3 GPUs; the cluster has 1: only the total is short
    assert len(_short(spec)) == 1
    fits = _spec(tmp_path, ['127.0.0.3'], ['127.0.0.2', 'localhost'], 'train:\n  devices: 2\n')
    places = resolve_hosts(fits, NODES, WHERE)
    assert shortfalls(fits, places, NODES, WHERE) == []
    demand(fits, places, NODES, WHERE)          # no error


def test_more_gpus_than_the_cluster_has_is_one_line(tmp_path):
    spec = _spec(tmp_path, ['localhost'], ['localhost', 'localhost'], 'train:\n  devices: [gpu:0, gpu:1]\n')
    places = resolve_hosts(spec, NODES, WHERE)
    with pytest.raises(UsageError) as e:
        demand(spec, places, NODES, WHERE)
    assert str(e.value) == (f'{spec.path}:7: train.devices: 2 workers x 2 GPUs = 4 GPUs, but the Ray cluster at '
                            '127.0.0.1:6379 has 1 (127.0.0.2: 1)')


def test_gpus_asked_of_a_cluster_without_any(tmp_path):
    spec = _spec(tmp_path, ['localhost'], ['localhost'], 'train:\n  devices: [gpu:0]\n')
    cpus_only = alive_nodes([HEAD, N3])
    assert _short(spec, nodes=cpus_only)[0] == (f'{spec.path}:6: train.devices: 1 worker x 1 GPU = 1 GPU, but the '
                                                'Ray cluster at 127.0.0.1:6379 has no GPU')


def test_more_cpus_than_the_cluster_has_counts_every_role(tmp_path):
    spec = _spec(tmp_path, ['localhost'], ['localhost'] * 3, 'train:\n  devices: 3\n')
    assert not any('= 10 CPUs' in line for line in _short(spec))       # the three nodes have 10
    lines = _short(spec, nodes=alive_nodes([HEAD, N3]))
    assert lines[0] == (f'{spec.path}:1: cluster: 1 ps x 1 CPU + 3 workers x 3 CPUs = 10 CPUs, but the Ray cluster '
                        'at 127.0.0.1:6379 has 6 (127.0.0.1: 4, 127.0.0.3: 2)')


def test_the_tasks_pinned_to_a_node_are_checked_together(tmp_path):
    spec = _spec(tmp_path, ['127.0.0.1'], ['127.0.0.3', '127.0.0.3'], 'train:\n  devices: 2\n')
    assert _short(spec) == [f'{spec.path}:4: cluster.worker[0]: worker:0, worker:1 ask 4 CPUs of 127.0.0.3 '
                            'together, which has 2']


def test_one_pinned_task_over_its_node(tmp_path):
    spec = _spec(tmp_path, ['127.0.0.1'], ['127.0.0.2'], 'train:\n  devices: [gpu:0, gpu:1]\n')
    two_gpus = alive_nodes([HEAD, N2, _entry('ee' * 14, '127.0.0.5', 'n5', 1, 1)])
    assert _short(spec, nodes=two_gpus) == [f'{spec.path}:4: cluster.worker[0]: worker:0 asks 2 GPUs of 127.0.0.2, '
                                            'which has 1']


def test_the_largest_task_against_the_largest_node(tmp_path):
    """The cluster has 10 CPUs for the 7 asked, but no node has the 6 of one worker."""
    spec = _spec(tmp_path, ['localhost'], ['localhost'], 'train:\n  devices: 6\n')
    assert _short(spec) == [f'{spec.path}:4: cluster.worker[0]: worker:0 asks 6 CPUs, but no node of the Ray '
                            'cluster at 127.0.0.1:6379 has that much (127.0.0.1: 4 CPU, 0 GPU, 127.0.0.2: 4 CPU, '
                            '1 GPU, 127.0.0.3: 2 CPU, 0 GPU)']


def test_a_labelled_task_against_the_nodes_with_its_labels(tmp_path):
    """Two GPU nodes hold the two workers' GPUs, but the label allows only the one with a single GPU;
    both workers ask the same, so one line says it."""
    spec = _spec(tmp_path, ['localhost'], ['zone-a', 'zone-a'], 'train:\n  devices: [gpu:0, gpu:1]\n')
    big = _entry('ff' * 14, '127.0.0.6', 'n6', 4, 4, labels={'zone': 'b'})
    nodes = alive_nodes([HEAD, N2, N3, big])
    assert _short(spec, labels={'zone-a': {'zone': 'a'}}, nodes=nodes) == [
        f'{spec.path}:4: cluster.worker[0]: worker:0 asks 1 CPU and 2 GPUs, but no node of the Ray cluster at '
        '127.0.0.1:6379 with zone=a has that much (127.0.0.2: 4 CPU, 1 GPU, 127.0.0.3: 2 CPU, 0 GPU)']


def test_no_node_at_all_is_said_once_per_resource(tmp_path):
    spec = _spec(tmp_path, ['localhost'], ['localhost'])
    assert _short(spec, nodes=()) == [f'{spec.path}:1: cluster: 1 ps x 1 CPU + 1 worker x 1 CPU = 2 CPUs, but the '
                                      'Ray cluster at 127.0.0.1:6379 has no CPU']


def test_strict_spread_needs_a_node_per_task_of_the_group(tmp_path):
    spec = _spec(tmp_path, ['127.0.0.2'], ['localhost'] * 3)
    places = resolve_hosts(spec, NODES, WHERE)
    assert strict_spread_refusal(spec, places, NODES, WHERE) is None        # 3 grouped tasks, 3 nodes
    more = _spec(tmp_path, ['localhost'], ['localhost'] * 3)
    assert strict_spread_refusal(more, resolve_hosts(more, NODES, WHERE), NODES, WHERE) == (
        f'{more.path}: --ray-strategy STRICT_SPREAD puts each of the 4 tasks on loopback hosts on a node of its '
        'own, but the Ray cluster at 127.0.0.1:6379 has 3 alive nodes: use SPREAD, or name their hosts')
