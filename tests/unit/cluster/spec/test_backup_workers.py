"""train.backup_workers (#42): another spelling of replicas_to_aggregate that follows the live
workers; sync only, fewer than the workers, never beside replicas_to_aggregate; and the count of
the gradients a run's backup workers had dropped (launch/run/lifecycle.py dropped_gradients)."""
from __future__ import annotations

import dataclasses

import pytest
import yaml

from cluster.spec import SpecError, load_spec
from launch.run.lifecycle import dropped_gradients


def spec_of(tmp_path, **train):
    path = tmp_path / 'spec.yaml'
    path.write_text(yaml.safe_dump({'cluster': {'ps': ['localhost:2001'],
                                                'worker': ['localhost:2002', 'localhost:2003', 'localhost:2004']},
                                    'train': {'train_dir': str(tmp_path / 'run'), **train}}))
    return load_spec(str(path))


def test_backup_workers_leave_the_first_finishers_to_each_step(tmp_path):
    spec = spec_of(tmp_path, backup_workers=1)
    assert spec.replicas_to_aggregate == 2
    assert dataclasses.replace(spec, live=2).replicas_to_aggregate == 1      # follows a scale down
    assert spec_of(tmp_path).replicas_to_aggregate == 3


@pytest.mark.parametrize('train, says', [
    ({'backup_workers': 1, 'sync': False}, 'backup workers are for sync training'),
    ({'backup_workers': 1, 'replicas_to_aggregate': 2}, 'not both (backup_workers 1 means replicas_to_aggregate 2 of 3)'),
    ({'backup_workers': 3}, 'must be fewer than the workers (3), got 3'),
    ({'backup_workers': -1}, 'train.backup_workers')])
def test_backup_workers_that_cannot_be(tmp_path, train, says):
    with pytest.raises(SpecError, match=r'train\.backup_workers') as e:
        spec_of(tmp_path, **train)
    assert says in str(e.value)


def test_the_gradients_backup_workers_had_dropped(tmp_path):
    """3 workers, 2 aggregated a step, from step 10 to 40: 60 gradients taken of the 88 computed."""
    spec = spec_of(tmp_path, backup_workers=1)
    results = [{'local_steps': 30, 'first_global_step': 10}, {'local_steps': 30, 'first_global_step': 10},
               {'local_steps': 28, 'first_global_step': 11}]
    assert dropped_gradients(spec, results, 40) == 28
    assert dropped_gradients(spec_of(tmp_path), results, 40) is None         # every worker aggregated
    assert dropped_gradients(spec, [{'local_steps': 'many', 'first_global_step': 10}], 40) is None
    assert dropped_gradients(spec, [], 40) is None
