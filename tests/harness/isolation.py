"""Helpers of the tests of isolation, used by
tests/system/launch/backends/test_isolation.py, tests/unit/launch/backends/test_isolation.py: here, since no
test module imports another."""
from __future__ import annotations

import os
import subprocess

import pytest

from launch.backends import netns


def namespaces() -> set[str]:
    return set(os.listdir(netns.NETNS_DIR)) if os.path.isdir(netns.NETNS_DIR) else set()


@pytest.fixture(autouse=True)
def no_namespace_left():
    """Fail the test if a network namespace it made survives it (and remove it)."""
    before = namespaces()
    yield
    left = namespaces() - before
    for ns in left:
        subprocess.run(['ip', 'netns', 'delete', ns], capture_output=True)
    assert not left, f'network namespaces left behind: {left}'

