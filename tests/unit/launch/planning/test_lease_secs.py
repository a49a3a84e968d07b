"""A task's lease (launch/planning/plan.py lease_secs): 5 s locally, longer for a run of hundreds of
tasks on one machine, whose starts can starve the launcher's renewals; SSH's is fixed."""
from __future__ import annotations

from launch.planning.plan import LEASE_SECS, lease_secs


def test_a_small_local_run_keeps_the_short_lease_and_a_big_one_grows_it():
    assert lease_secs('local', 3) == LEASE_SECS['local'] == 5
    assert lease_secs('local', 250) == 5
    assert lease_secs('local', 1000) == 20


def test_ssh_and_other_backends_keep_theirs_at_any_size():
    assert lease_secs('ssh', 1000) == LEASE_SECS['ssh']
    assert lease_secs('compose', 1000) == 20
