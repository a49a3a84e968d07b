"""A task forked by the start-up zygote waits until the middle process has gone (cluster/zygote.py
adopted), and gives up, saying so, when the middle never goes (the race of a middle gone first is
tested with real forks in tests/system/launch/backends/test_zygote.py)."""
from __future__ import annotations

import os

from cluster.zygote import adopted


def test_a_middle_that_stays_is_waited_for_no_longer_than_asked():
    assert adopted(os.getppid(), wait=0.05) is False
