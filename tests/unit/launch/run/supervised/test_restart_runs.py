"""Restarts of the whole cluster, driven end to end in this process over the scripted backend
(tests/harness/golden.py), their files pinned byte for byte: a task lost while the cluster starts
again is one more fault, restarted under the same policy or given up once the restarts are spent.
These pin what the restart of the cluster did as a procedure (issue 38), now that it is a plan."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.golden import GatedBackend, Start, check_golden, drive, progress, run_text, saved

GOLDEN = Path(__file__).resolve().parents[4] / 'data' / 'golden' / 'restarts'
REPO = str(Path(__file__).resolve().parents[5])
ORDER = ['ps:0', 'worker:0', 'worker:1']
SPEC = """cluster:
  ps: [localhost:2001]
  worker: [localhost:2002, localhost:2003]
train:
  steps: 100
  batch_size: 8
  train_dir: {tmp}/run
supervise:
  restart: on-failure
  max_restarts: 3
  backoff_secs: 0.1
"""
WORKERS_DONE = ('worker:0', 'worker:1')


def lost_while_starting() -> GatedBackend:
    """The ps is lost; while the cluster starts again a worker dies before it serves (a new fault:
    the cluster restarts once more); the third attempt finishes."""
    return GatedBackend({
        'ps:0': [Start(code=-9, after=('worker:0',)), Start(), Start(code=0, after=WORKERS_DONE)],
        'worker:0': [Start((progress(40), saved(40))), Start(), Start((progress(50), progress(100)), 0)],
        'worker:1': [Start(), Start(code=1, early=True), Start(code=0, after=('worker:0',))]},
        ORDER, checkpoint_step=40)


def lost_until_given_up() -> GatedBackend:
    """The ps is lost, then lost again each time the cluster starts again: once the restarts are
    spent, the run is given up with one line."""
    return GatedBackend({
        'ps:0': [Start(code=-9, after=('worker:0',)), Start(code=-9, early=True)],
        'worker:0': [Start((progress(40), saved(40)))]}, ORDER, checkpoint_step=40)


RUNS = {'lost-while-starting': lost_while_starting, 'lost-until-given-up': lost_until_given_up}


@pytest.mark.parametrize('case', sorted(RUNS))
def test_restart_files_are_as_golden(tmp_path, monkeypatch, case):
    monkeypatch.chdir(REPO)
    spec = tmp_path / 'spec.yaml'
    spec.write_text(SPEC.replace('{tmp}', str(tmp_path)))
    files = drive(str(spec), RUNS[case]())
    check_golden(GOLDEN / f'{case}.txt', run_text(files, tmp_path, REPO))
