"""`launch up --backend slurm` following a job that Slurm requeued (the batch script's trap after a
preemption notice, #41): the next attempt begins and its logs are followed, since the script
adds SLURM_RESTART_COUNT to its attempt; a script without notices keeps its folder. Slurm's
answers are a table here; tests/system/launch/render/test_sbatch_preemption.py has a real one."""
from __future__ import annotations

import os
import threading
import types

import pytest

from cluster.spec import load_spec
from launch.backends.slurm import job as slurm_job
from tests.conftest import REPO

LOCAL2 = os.path.join(REPO, 'specs', 'local2.yaml')


class FakeLife:
    """What SubmittedJob uses of the lifecycle, recording the calls."""
    def __init__(self) -> None:
        self.attempt, self.signum = 1, 0
        self.interrupted = threading.Event()
        self.said: list[str] = []
        self.console = types.SimpleNamespace(say=self.said.append)
        self.followed: list[str] = []
        self.attempts: list[str] = []
        self.events: list = []

    def emit(self, event) -> None:
        self.events.append(event)

    def task_started(self, task, **where) -> None:
        pass

    def follow(self, name, lines, on_line=None, channel=None, group='') -> None:
        self.followed.append(f'{name}@{self.attempt}')

    def unfollow(self, names) -> None:
        pass

    def next_attempt(self, cause, from_step) -> None:
        self.attempts.append(cause)
        self.attempt += 1

    def checkpoint_step(self):
        return 40


def watch(monkeypatch, tmp_path, *overrides: str, states) -> FakeLife:
    answers = iter(states)
    monkeypatch.setattr(slurm_job, 'job_info', lambda job: dict(zip(('JobState', 'Restarts'), next(answers))))
    monkeypatch.setattr(slurm_job, 'in_queue', lambda job: False)
    monkeypatch.setattr(slurm_job, 'POLL_SECS', 0)
    spec = load_spec(LOCAL2, [f'train.train_dir={tmp_path}', *overrides])
    life = FakeLife()
    job = slurm_job.SubmittedJob(types.SimpleNamespace(spec=spec, train_dir=str(tmp_path)), life, '17')
    assert job._watch()['JobState'] == 'COMPLETED'
    return life


@pytest.mark.parametrize('requeues', [1, 2])
def test_a_requeued_job_is_the_next_attempt_and_its_logs_are_followed(monkeypatch, tmp_path, requeues):
    life = watch(monkeypatch, tmp_path, 'supervise.restart=on-failure',
                 states=[('RUNNING', '0'), ('PENDING', str(requeues)), ('RUNNING', str(requeues)),
                         ('COMPLETED', str(requeues))])
    assert life.attempts == [f'job 17 requeued by Slurm (restart {n})' for n in range(1, requeues + 1)]
    assert life.attempt == 1 + requeues
    assert sorted(life.followed) == sorted(f'{t}@{1 + requeues}' for t in ('ps:0', 'worker:0', 'worker:1'))
    assert any(f'attempt {1 + requeues} resumes from the newest checkpoint' in line for line in life.said)
    assert [(e.kind, e.cause) for e in life.events] == [('preempted', 'job 17 requeued by Slurm')]


def test_without_notices_a_requeue_keeps_the_attempt(monkeypatch, tmp_path):
    life = watch(monkeypatch, tmp_path, states=[('RUNNING', '0'), ('PENDING', '1'), ('COMPLETED', '1')])
    assert life.attempts == [] and life.attempt == 1 and life.followed == []
    assert 'job 17 was requeued by Slurm (a node failure, or scontrol requeue)' in life.said
