"""The emulated links of `benchmarks/bench.py --only links`: the cost model (fast) and the
namespaces, veth pairs and rate limits on this machine (real, root), which must give the rate
asked for and leave nothing behind, also when the benchmark is stopped."""
from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
import links  # noqa: E402

MODEL = 4.27e6      # the CIFAR-10 model's float32 bytes


def test_on_a_link_without_cost_the_model_predicts_the_unlimited_rate():
    for mode in ('sync', 'async'):
        assert links.predict(mode, 2, 64, 600.0, MODEL, 1.0, 1e12) == pytest.approx(600.0, rel=1e-6)


def test_sync_pays_every_pull_and_push_through_the_busiest_link():
    # 1 Gbit/s = 125 MB/s: 4.27 MB takes 34.2 ms; a step of 2 x 64 images computes in 128/600 s.
    step = 128 / 600 + 2 * 2 * MODEL / 125e6
    assert links.predict('sync', 2, 64, 600.0, MODEL, 1.0, 1000) == pytest.approx(128 / step)
    # Two ps tasks with about half the bytes each: the workers' own links bound it (max(2 x 0.5, 1)).
    step = 128 / 600 + 2 * 1 * MODEL / 125e6
    assert links.predict('sync', 2, 64, 600.0, MODEL, 0.5, 1000) == pytest.approx(128 / step)
    # Half the bytes on the wire (bfloat16) cost half the link time.
    assert links.predict('sync', 2, 64, 600.0, MODEL / 2, 1.0, 1000) > links.predict('sync', 2, 64, 600.0, MODEL, 1.0, 1000)


def test_async_is_capped_by_the_busiest_ps_link():
    # Fast compute, slow link, 3 workers: the ps link carries one model per update each way, so
    # 125e6 / 4.27e6 updates/s, fewer than the 3 workers' own links would allow.
    assert links.predict('async', 3, 64, 1e9, MODEL, 1.0, 1000) == pytest.approx(125e6 / MODEL * 64)
    cycle = 128 / 600 + 2 * MODEL / 125e6
    assert links.predict('async', 2, 64, 600.0, MODEL, 1.0, 1000) == pytest.approx(2 / cycle * 64)


def test_the_bucket_holds_several_segments_and_2_ms_at_high_rates():
    assert links.burst_bytes(100) == 256 << 10
    assert links.burst_bytes(10000) == 2_500_000


def test_the_overlapped_bound_hides_transfers_behind_compute():
    # Compute 213 ms a step; pulls and pushes of 34 ms each way on a 1 Gbit/s link fit behind it.
    assert links.predict('sync', 2, 64, 600.0, MODEL, 0.5, 1000, overlap=True) == pytest.approx(600.0)
    assert links.predict('async', 2, 64, 600.0, MODEL, 1.0, 1000, overlap=True) == pytest.approx(600.0)
    # A 100 Mbit/s link: 342 ms each way, longer than the compute, so the link sets the pace.
    assert links.predict('sync', 2, 64, 600.0, MODEL, 1.0, 100, overlap=True) == pytest.approx(128 / (2 * MODEL / 12.5e6))
    for mode in ('sync', 'async'):
        assert links.predict(mode, 2, 64, 600.0, MODEL, 1.0, 1000) < links.predict(mode, 2, 64, 600.0, MODEL, 1.0, 1000,
                                                                                   overlap=True)
