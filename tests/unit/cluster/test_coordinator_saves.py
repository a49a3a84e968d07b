"""The PSS chief honours the launcher's requests for a checkpoint (the lease's Members.save), as
the TF1 chief does: what the launcher asks when a ps or worker got a preemption notice (#41)."""
from __future__ import annotations

import pytest
import yaml

from cluster.coordinator import CoordinatorContext
from cluster.runtime.membership import LIVE, Members
from cluster.spec import load_spec

CLUSTER = {'chief': ['localhost:3001'], 'ps': ['localhost:3002'], 'worker': ['localhost:3003']}


@pytest.fixture
def ctx(tmp_path):
    path = tmp_path / 'spec.yaml'
    path.write_text(yaml.safe_dump({'cluster': CLUSTER, 'train': {
        'program': 'tests.harness.pss_programs:train', 'steps': 20, 'train_dir': str(tmp_path / 'run')}}))
    spec = load_spec(str(path))
    LIVE.set(Members(0, {0: 0}, save=2))        # asked twice before this start: for the last cluster
    yield CoordinatorContext(spec, spec.chief)
    LIVE.set(None)


def test_a_request_made_before_the_start_is_not_this_chiefs(ctx):
    assert not ctx._save_asked(5)


def test_each_new_request_is_one_save(ctx, caplog):
    LIVE.set(Members(0, {0: 0}, save=3))
    with caplog.at_level('INFO'):
        assert ctx._save_asked(7)
    assert 'saving a checkpoint at global step 7: the launcher asked for one' in caplog.text
    assert not ctx._save_asked(8)       # the same request: saved already
