"""The Ray harness itself: three labelled nodes, a node of a test's own stopped and seen dead, an
actor placed on a named node, and a driver's actors gone once the driver exits."""
from __future__ import annotations

import signal
import time

import pytest

# An actor on n2 (NodeAffinitySchedulingStrategy, hard), which says where it runs.
_PLACE_ON_N2 = '''
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
n2 = [n['NodeID'] for n in ray.nodes() if n['Alive'] and n['NodeManagerAddress'] == '127.0.0.2'][0]
@ray.remote(num_cpus=1)
class Where:
    def ip(self):
        return ray.util.get_node_ip_address()
actor = Where.options(name='where', scheduling_strategy=NodeAffinitySchedulingStrategy(n2, soft=False)).remote()
print(json.dumps({'ip': ray.get(actor.ip.remote(), timeout=60)}))
'''


@pytest.mark.slow
def test_three_nodes_are_alive_with_their_labels(ray_cluster):
    want = {name: True for name in ('head', 'n2', 'n3')}
    met, _, nodes = ray_cluster.watch(want, timeout=10)
    assert met, nodes
    assert [nodes[name][1] for name in ('n2', 'n3')] == ['127.0.0.2', '127.0.0.3'], nodes
    print(f'3 nodes up in {ray_cluster.start_seconds:.1f}s, {ray_cluster.rss_bytes() / 2**20:.0f} MiB resident')


@pytest.mark.slow
def test_a_node_added_then_stopped_is_seen_dead(ray_cluster):
    node = ray_cluster.add_node('127.0.0.4', 'n4')
    assert ray_cluster.node_alive('127.0.0.4')
    seconds = ray_cluster.stop_node(node)
    assert not ray_cluster.node_alive('127.0.0.4')
    assert 'n4' not in ray_cluster.nodes
    print(f'n4 seen DEAD {seconds:.1f}s after SIGTERM')


@pytest.mark.slow
def test_a_node_killed_is_seen_dead_by_the_health_check(ray_cluster):
    node = ray_cluster.add_node('127.0.0.5', 'n5')
    seconds = ray_cluster.stop_node(node, signal.SIGKILL)
    assert not ray_cluster.node_alive('127.0.0.5')
    print(f'n5 seen DEAD {seconds:.1f}s after SIGKILL')


@pytest.mark.slow
def test_an_actor_placed_on_n2_runs_there_and_dies_with_its_driver(ray_cluster):
    out = ray_cluster.run_driver(_PLACE_ON_N2, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert '{"ip": "127.0.0.2"}' in out.stdout.splitlines()
    ended = time.monotonic()
    actors = ray_cluster.alive_actors()
    while actors and time.monotonic() - ended < 60:
        time.sleep(0.2)
        actors = ray_cluster.alive_actors()
    assert actors == []
    print(f'the exited driver\'s actor gone in {time.monotonic() - ended:.1f}s')
