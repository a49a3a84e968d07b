"""Helpers of the tests of idx, used by tests/system/cluster/training/test_idx.py,
tests/unit/cluster/training/test_idx.py: here, since no test module imports another."""
from __future__ import annotations



from cluster.checks import data

PACKAGE = data.FASHION_MNIST_DIR

