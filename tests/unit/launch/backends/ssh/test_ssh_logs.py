"""The pace that caps how many logs of an SSH host are read fast at once (launch/backends/ssh/logs.py)."""
from __future__ import annotations

from launch.backends.ssh.logs import LOG_FAST_AT_ONCE, pace as new_pace


def test_at_most_so_many_logs_of_a_host_are_read_fast_at_once():
    pace = new_pace()
    assert [pace.acquire(blocking=False) for _ in range(LOG_FAST_AT_ONCE + 2)] == [True] * LOG_FAST_AT_ONCE + [False] * 2
    pace.release()
    assert pace.acquire(blocking=False) and not pace.acquire(blocking=False)
