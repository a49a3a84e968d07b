"""The emulated links of `benchmarks/bench.py --only links`: the namespaces, veth pairs and rate
limits on this machine (real, root), which must give the rate asked for and leave nothing behind,
also when the benchmark is stopped. (The cost model they are held against is tested in
tests/unit/launch/planning/test_link_time.py.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, os.path.join(REPO, 'benchmarks'))
import links  # noqa: E402


def ours() -> list[str]:
    return sorted(n for n in (os.listdir('/run/netns') if os.path.isdir('/run/netns') else [])
                  if n.startswith(links.PREFIX))


needs_root = pytest.mark.skipif(bool(links.netns.unavailable()), reason=f'emulated links: {links.netns.unavailable()}')


@pytest.mark.slow
@needs_root
def test_a_link_carries_the_rate_asked_for_and_leaves_nothing():
    before = ours()
    with links.Links(2, 200) as net:
        assert set(ours()) - set(before) == {*net.hosts, net.hub}
        mbit, rtt_ms = net.measure(total=16 << 20)
        assert 150 < mbit < 210, mbit       # tbf gives about the rate, never much more
        assert 0 < rtt_ms < 5
    with links.Links(2, None) as net:
        assert net.measure(total=16 << 20)[0] > 400     # no limit: far past the 200 Mbit/s above
    assert ours() == before


@pytest.mark.slow
@needs_root
@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_benchmark_removes_its_namespaces(sig):
    code = ('import sys, time; sys.path.insert(0, "benchmarks"); import links\n'
            'with links.Links(3, 100):\n    print("up", flush=True); time.sleep(60)\n')
    proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == 'up'
        assert [n for n in ours() if n.startswith(f'{links.PREFIX}-{proc.pid}-')]
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert not [n for n in ours() if n.startswith(f'{links.PREFIX}-{proc.pid}-')]


@pytest.mark.slow
@needs_root
def test_namespaces_of_a_killed_benchmark_are_removed_by_the_next():
    code = ('import os, sys; sys.path.insert(0, "benchmarks"); import links\n'
            'links.Links(2, None).__enter__(); os._exit(0)\n')      # gone without cleaning up
    proc = subprocess.Popen([sys.executable, '-c', code], cwd=REPO)
    assert proc.wait(timeout=60) == 0
    left = [n for n in ours() if n.startswith(f'{links.PREFIX}-{proc.pid}-')]
    assert len(left) == 3       # two hosts and the hub
    assert set(left) <= set(links.remove_stale())
    assert not [n for n in ours() if n.startswith(f'{links.PREFIX}-{proc.pid}-')]

