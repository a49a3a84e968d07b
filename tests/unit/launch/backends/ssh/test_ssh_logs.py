"""The pace that caps how many logs of an SSH host are read fast at once (launch/backends/ssh/logs.py)."""
from __future__ import annotations

from launch.backends.ssh.logs import LOG_FAST_AT_ONCE, Pace


def test_at_most_so_many_logs_of_a_host_are_read_fast_at_once():
    pace = Pace()
    assert [pace.take() for _ in range(LOG_FAST_AT_ONCE + 2)] == [True] * LOG_FAST_AT_ONCE + [False] * 2
    pace.give()
    assert pace.take() and not pace.take()
