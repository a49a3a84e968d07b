"""Helpers of the tests of local, used by
tests/system/launch/backends/test_compose.py, tests/system/launch/backends/test_local.py,
tests/system/launch/run/test_disk.py, tests/system/launch/run/test_faults.py,
tests/system/launch/run/test_recovery.py: here, since no test module imports another."""
from __future__ import annotations

import json
import os
import subprocess
import sys




def checkpoint_step(train_dir: str) -> int:
    """The global step stored in the newest checkpoint, read by TensorFlow itself."""
    code = ('import sys, tensorflow as tf; '
            'print(tf.train.load_variable(tf.train.latest_checkpoint(sys.argv[1]), "global_step"))')
    out = subprocess.run([sys.executable, '-c', code, train_dir], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def worker_results(train_dir: str, n: int = 2) -> list[dict]:
    out = []
    for i in range(n):
        with open(os.path.join(train_dir, f'worker-{i}.json')) as f:
            out.append(json.load(f))
    return out

