"""`launch plan`'s load (launch/planning/ps_load.py, from cluster/checks/variables.py, no
TensorFlow) against the graph the trainer builds: the same variables, each on the same ps task,
and the same bytes per ps task as ps_bytes counts. What keeps model.py and the plan's list from
drifting apart."""
from __future__ import annotations

import os

import pytest

from cluster.spec import load_spec
from launch.planning.ps_load import builtin_load
from tests.conftest import REPO


@pytest.mark.parametrize('ps, sync, partitions', [(2, True, None), (3, False, None), (4, True, 10)])
def test_the_plan_places_every_variable_where_the_trainer_does(ps, sync, partitions):
    import tensorflow as tf
    from cluster.training import train
    from cluster.training.placement import ps_index
    hosts = ', '.join(f'localhost:{3000 + i}' for i in range(ps))
    spec = load_spec(os.path.join(REPO, 'specs/local2.yaml'), [f'cluster.ps=[{hosts}]', f'train.sync={str(sync).lower()}']
                     + ([f'train.partitions={partitions}'] if partitions else []))
    load = builtin_load(spec)
    with tf.Graph().as_default() as graph:
        train.build_graph(spec, spec.task('worker', 0), data_set=None)
        built = {}
        for var in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
            index = ps_index(var.op)
            built[var.op.name] = tf.DeviceSpec.from_string(var.device).task if index is None else index
    planned = {p.variable.name: p.ps for p in load.placed}
    assert {name: built[name] for name in planned} == planned
    averages = {name for name in built if name.endswith('/ExponentialMovingAverage')}
    assert set(built) == set(planned) | averages and len(averages) == len(planned) - 1     # all but the global step
    assert train.ps_bytes(spec) == [p.bytes for p in load.ps]
