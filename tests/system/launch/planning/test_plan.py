"""Tests for launch/planning/plan.py: a spec in, one TaskPlan per task out; tables, no processes."""
import os

import pytest

from launch.backends.probes import GPU_COUNT_SH, parse_gpu_count


# -- how a host says how many GPUs it has -----------------------------------------------------

@pytest.mark.slow
def test_gpu_count_shell_snippet_runs_and_parses():
    import subprocess
    out = subprocess.run(['sh', '-c', GPU_COUNT_SH], capture_output=True, text=True, check=True).stdout
    count = parse_gpu_count(out)
    expected = len(os.listdir('/proc/driver/nvidia/gpus')) if os.path.isdir('/proc/driver/nvidia/gpus') else None
    assert count is not None and (expected is None or count == expected), out
    assert parse_gpu_count('noise\ntfcluster-gpus 3\n{"json": 1}') == 3
    assert parse_gpu_count('tfcluster-gpus x') is None and parse_gpu_count('') is None

