"""The chaos harness (tests/harness/chaos.py) in its short form: a few faults per backend on a real cluster
with `restart: on-failure`, and every invariant it checks (the run ends at the final step, one
restart per fault, no resume below the checkpoint that existed at the fault, nothing left). The
long runs docs/faults.md reports are `python -m tests.harness.chaos --backend B --faults N`. The fast tests
check that the invariants do catch what they are for, on made-up event logs."""
from __future__ import annotations

import os

import pytest

from tests.harness.chaos import SSH_LAYOUT, Options, run_chaos
from tests.harness.parts import unavailable
from tests.harness.sshd import SSHD


def chaos(tmp_path, parts: dict | None = None, **options):
    result = run_chaos(Options(dir=str(tmp_path / 'chaos'), **options), **(parts or {}))
    print(result.summary())
    assert not result.broken, result.summary()
    return result


# -- real clusters ---------------------------------------------------------------------------

@pytest.mark.slow
def test_local_cluster_mends_a_frozen_ps_a_lost_chief_and_a_lost_worker(tmp_path):
    """SIGSTOP of the ps (the stall watchdog restarts the cluster), kill -9 of the chief (a cluster
    restart from its checkpoint), kill -9 of the async non-chief worker (it alone starts again)."""
    result = chaos(tmp_path, backend='local', plan=(('ps:0', 'stop'), ('worker:0', 'kill'), ('worker:1', 'kill')),
                   stall_secs=6, steps=500)
    assert [bool(f.restart.get('tasks')) for f in result.faults] == [False, False, True]


@pytest.mark.slow
def test_a_local_rehearsal_mends_kills_and_freezes_as_a_real_run_does(tmp_path):
    """The chaos harness on stand-ins (`launch up --rehearse`): the same faults and invariants as
    a real run, nothing left (the stand-ins counted among the tasks)."""
    result = chaos(tmp_path, backend='local', rehearse=True, stall_secs=3, steps=3000,
                   plan=(('worker:1', 'kill'), ('ps:0', 'stop'), ('worker:0', 'kill'), ('ps:0', 'kill'),
                         ('worker:1', 'kill')), gap=(100, 200))
    assert [bool(f.restart.get('tasks')) for f in result.faults][:1] == [True]


@pytest.mark.slow
def test_ssh_cluster_mends_faults_killed_on_the_remote_host(tmp_path, request):
    if not os.path.exists(SSHD) or os.geteuid() != 0:
        unavailable(f'the SSH chaos test needs {SSHD} and root (to listen on {", ".join(sorted(set(SSH_LAYOUT)))})',
                    'sshd must run here')
    hosts = request.getfixturevalue('ssh_hosts')
    chaos(tmp_path, backend='ssh', plan=(('ps:0', 'kill'), ('worker:1', 'kill')), stall_secs=8, steps=400,
          parts={'ssh_hosts': hosts})


@pytest.mark.slow
def test_compose_cluster_mends_a_paused_and_a_killed_container(tmp_path, compose_image):
    chaos(tmp_path, backend='compose', plan=(('ps:0', 'pause'), ('worker:1', 'kill')), stall_secs=8, steps=400,
          parts={'compose_ready': True})

