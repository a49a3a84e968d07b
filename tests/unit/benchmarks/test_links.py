"""The emulated links of `benchmarks/bench.py --only links`: the token bucket of their rate limits.
The model they are held against is `launch plan --link`'s (tests/unit/launch/planning/test_link_time.py)."""
from __future__ import annotations

import os
import sys

from tests.conftest import REPO

sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
import links  # noqa: E402


def test_the_bucket_holds_several_segments_and_2_ms_at_high_rates():
    assert links.burst_bytes(100) == 256 << 10
    assert links.burst_bytes(10000) == 2_500_000
