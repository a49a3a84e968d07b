"""The stand-in's trainer in this process (cluster/rehearsal/standin.py Trainer): a chief's saves
name their step in the checkpoint index the launcher reads, a save the launcher asks for comes
at the next look, and a worker taken out of the live set leaves."""
from __future__ import annotations

import threading

import pytest

from cluster.rehearsal import standin
from cluster.rehearsal.standin import Trainer
from cluster.runtime import rundir
from cluster.runtime.membership import LIVE, Members
from cluster.spec import load_spec
from tests.conftest import write_spec


@pytest.fixture
def live():
    yield LIVE
    LIVE.set(None)


def _spec(tmp_path, steps, **train):
    spec = load_spec(write_spec(tmp_path, workers=3, ps=1, steps=steps, **train))
    (tmp_path / 'run').mkdir(exist_ok=True)
    return spec


def _saved(spec):
    return rundir.checkpoint_step(rundir.read_text(rundir.checkpoint_index_path(spec.train.train_dir)))


def test_the_chief_names_each_save_in_the_checkpoint_index(tmp_path):
    spec = _spec(tmp_path, 150, checkpoint_steps=50)
    Trainer(spec, spec.task('worker', 0), 0, saves=True, rate=5000).run()
    assert _saved(spec) == 150
    assert standin.start_step(spec) == 150      # where a restarted stand-in starts


def test_a_save_the_launcher_asks_for_comes_at_the_next_look(tmp_path, live, monkeypatch):
    monkeypatch.setattr(standin, 'LOOK_SECS', 0.05)
    spec = _spec(tmp_path, 10 ** 6, checkpoint_secs=3600)
    live.set(Members.parse('{"epoch": 1, "workers": {"0": 1, "1": 1, "2": 1}}', 3))
    saver = Trainer(spec, spec.task('worker', 1), 0, saves=True, rate=1000)     # saves as a chief, leaves as a worker
    worker = threading.Thread(target=saver.run, daemon=True)
    worker.start()
    assert _saved(spec) is None
    live.set(Members.parse('{"epoch": 1, "workers": {"0": 1, "1": 1, "2": 1}, "save": 1}', 3))
    deadline = threading.Event()
    while _saved(spec) is None and not deadline.wait(0.05):
        pass
    assert _saved(spec) > 0
    live.set(Members.parse('{"epoch": 2, "workers": {"0": 1}}', 3))      # let go: it ends at its next look
    worker.join(timeout=30)
    assert not worker.is_alive()


def test_a_worker_taken_out_of_the_live_set_leaves(tmp_path, live):
    spec = _spec(tmp_path, 10 ** 6)
    live.set(Members.parse('{"epoch": 2, "workers": {"0": 1, "2": 1}}', 3))
    Trainer(spec, spec.task('worker', 1), 0, saves=False, rate=1000).run()      # returns at once
    assert _saved(spec) is None
