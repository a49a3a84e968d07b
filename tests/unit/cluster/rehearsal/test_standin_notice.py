"""The stand-in takes a preemption notice as the real chief does (cluster/runtime/notice.py): it
saves at the step it reached and exits EXIT_PREEMPTED, so launcher tests of preemption can run on
stand-ins, without TensorFlow. In this process, its exit made visible."""
from __future__ import annotations

import pytest

from cluster.rehearsal.standin import Trainer
from cluster.runtime import notice, rundir
from cluster.runtime.contract import EXIT_PREEMPTED
from cluster.spec import load_spec
from tests.conftest import write_spec


class Exited(Exception):
    pass


def test_a_preempted_chief_stand_in_saves_where_it_is_and_exits_preempted(tmp_path, monkeypatch):
    def exit_now(code, level, message):
        raise Exited(code, message)
    monkeypatch.setattr(notice, 'exit_now', exit_now)
    spec = load_spec(write_spec(tmp_path, steps=1000))
    (tmp_path / 'run').mkdir()
    chief = Trainer(spec, spec.task('worker', 0), 40, saves=True)
    chief.step = 57
    with pytest.raises(Exited) as e:
        chief.preempted()
    assert e.value.args == (EXIT_PREEMPTED, 'preemption notice received: saved a checkpoint at global step 57, '
                                            'exiting')
    assert rundir.checkpoint_step(rundir.read_text(rundir.checkpoint_index_path(spec.train.train_dir))) == 57
