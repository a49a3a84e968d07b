"""A spec host placed by Ray node labels (`hosts.NAME.labels`), without Ray running: the selector
resolve_hosts gets from the spec, the actor options that carry it (Ray's `label_selector`, out of
the placement group), the actor made again going back to its node, and `launch plan`'s words."""
from __future__ import annotations

import sys
import types

import pytest

from cluster.spec import load_spec
from launch.backends.kind import Options
from launch.backends.ray import Ray, plan_ray
from launch.backends.ray.nodes import Ask, How, NodeFacts, cluster_words, resolve_hosts, spec_labels
from launch.backends.ray.placement import Where, options, wheres
from launch.errors import UsageError
from tests.harness.documented import check_documented

SPEC = """\
cluster:
  ps: [localhost:2222]
  worker: ["127.0.0.2:2223", "third:2224"]
hosts:
  third:
    labels: {tfcluster.io/host: n3}
train: {steps: 5, train_dir: runs/r}
"""
WHERE = cluster_words('127.0.0.1:6379')
N2 = NodeFacts('b' * 8, '127.0.0.2', 'n2', cpus=4, labels={'tfcluster.io/host': 'n2'})
N3 = NodeFacts('c' * 8, '127.0.0.3', 'n3', cpus=4, labels={'tfcluster.io/host': 'n3'})
N4 = NodeFacts('d' * 8, '127.0.0.4', 'n4', cpus=4, labels={'tfcluster.io/host': 'n3'})
ONE_CPU = Ask(1, 0)


def _spec(tmp_path, text: str = SPEC):
    path = tmp_path / 'spec.yaml'
    path.write_text(text)
    return load_spec(str(path))


class _Strategy:
    """Stands in for one of Ray's scheduling strategies: what it was made with."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


@pytest.fixture
def strategies(monkeypatch):
    """ray.util.scheduling_strategies without importing Ray (options() imports it when called)."""
    fake = types.ModuleType('ray.util.scheduling_strategies')
    fake.NodeAffinitySchedulingStrategy = type('NodeAffinity', (_Strategy,), {})
    fake.PlacementGroupSchedulingStrategy = type('PlacementGroup', (_Strategy,), {})
    monkeypatch.setitem(sys.modules, 'ray.util.scheduling_strategies', fake)
    return fake


def test_the_spec_gives_resolve_hosts_each_labelled_hosts_selector(tmp_path):
    spec = _spec(tmp_path)
    assert spec_labels(spec) == {'third': {'tfcluster.io/host': 'n3'}}
    places = resolve_hosts(spec, (N2, N3, N4), WHERE, spec_labels(spec))
    assert places['third'].how is How.LABELS and places['third'].nodes == (N3, N4)      # Ray picks of the two
    assert places['127.0.0.2'].how is How.NODE and places['localhost'].how is How.GROUP


def test_labels_no_node_has_are_the_documented_line(tmp_path):
    spec = _spec(tmp_path)
    with pytest.raises(UsageError) as e:
        resolve_hosts(spec, (N2,), WHERE, spec_labels(spec))
    line = str(e.value)
    assert line.endswith(': hosts.third.labels: no alive node of the Ray cluster at 127.0.0.1:6379 has '
                         'tfcluster.io/host=n3'), line
    check_documented('ray-labels-no-node', line)


def test_a_labelled_task_is_out_of_the_placement_group(tmp_path):
    spec = _spec(tmp_path)
    where, bundles = wheres(spec, resolve_hosts(spec, (N2, N3), WHERE, spec_labels(spec)))
    assert where == {'ps:0': Where(bundle=0), 'worker:0': Where(node_id=N2.node_id),
                     'worker:1': Where(selector=(('tfcluster.io/host', 'n3'),))}
    assert bundles == [{'CPU': 1.0}]        # the ps alone


def test_a_labelled_actor_is_scheduled_by_rays_label_selector(tmp_path, strategies):
    spec = _spec(tmp_path)
    task = spec.task('worker', 1)
    opts = options(None, 'run1', task, ONE_CPU, Where(selector=(('tfcluster.io/host', 'n3'), ('zone', 'b'))), None)
    assert opts['label_selector'] == {'tfcluster.io/host': 'n3', 'zone': 'b'}
    assert 'scheduling_strategy' not in opts        # Ray's default, which honours the selector
    assert opts['name'] == 'run1/worker-1' and opts['num_cpus'] == 1 and opts['max_restarts'] == 0


def test_a_labelled_actor_made_again_goes_back_to_the_node_it_was_placed_on(tmp_path, strategies):
    """Its address and port are in every task's TF_CONFIG: another matching node would not do."""
    task = _spec(tmp_path).task('worker', 1)
    opts = options(None, 'run1', task, ONE_CPU, Where(selector=(('tfcluster.io/host', 'n3'),)), None,
                   placed_on=N4.node_id)
    assert 'label_selector' not in opts
    strategy = opts['scheduling_strategy']
    assert isinstance(strategy, strategies.NodeAffinitySchedulingStrategy)
    assert strategy.args == (N4.node_id,) and strategy.kwargs == {'soft': False}


def test_pinned_and_grouped_actors_keep_their_strategies(tmp_path, strategies):
    spec = _spec(tmp_path)
    pinned = options(None, 'r', spec.task('worker', 0), ONE_CPU, Where(node_id=N2.node_id), None, placed_on='x')
    assert pinned['scheduling_strategy'].args == (N2.node_id,) and 'label_selector' not in pinned
    grouped = options(None, 'r', spec.task('ps', 0), ONE_CPU, Where(bundle=0), 'pg', placed_on='x')
    assert isinstance(grouped['scheduling_strategy'], strategies.PlacementGroupSchedulingStrategy)
    assert grouped['scheduling_strategy'].args == ('pg',) and 'label_selector' not in grouped


def test_launch_plan_says_a_labelled_task_goes_to_a_node_with_its_labels(tmp_path):
    spec = _spec(tmp_path, SPEC.replace('{tfcluster.io/host: n3}', '{tfcluster.io/host: n3, zone: b}'))
    plans = {p.name: p for p in plan_ray(spec, str(tmp_path))}
    said = {name: Ray().where(p, p.task, Options()) for name, p in plans.items()}
    assert said['worker:1'] == 'ray actor on a node labelled tfcluster.io/host=n3, zone=b (port chosen there)'
    assert said['worker:0'] == 'ray actor on the node 127.0.0.2 (port chosen there)'
    assert said['ps:0'].startswith("ray actor in the run's placement group")


def test_a_run_of_its_own_ray_refuses_labels_before_starting_ray(tmp_path):
    """The run's own Ray instance is one node, this machine, with no labels of the spec's: refused
    in the documented line before any Ray process starts."""
    from launch.backends.ray.backend import RayBackend
    spec = _spec(tmp_path, SPEC.replace('"127.0.0.2:2223"', 'localhost:2223'))
    backend = RayBackend(spec, None)
    with pytest.raises(UsageError) as e:
        backend.place(spec, list(plan_ray(spec, str(tmp_path))), 10)
    assert 'hosts.third.labels: no alive node of the Ray instance this run starts on this machine has ' \
           'tfcluster.io/host=n3' in str(e.value)
    assert backend._ray is None
