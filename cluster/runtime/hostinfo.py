"""Facts about the machine a process runs on, read the same way by a task and by the launcher."""
from __future__ import annotations

import os
import shutil
import subprocess

NVIDIA_GPUS_DIR = '/proc/driver/nvidia/gpus'
SMI_TIMEOUT = 30            # seconds `nvidia-smi -L` may take


def gpu_count(listing: bool = True) -> int:
    """The NVIDIA GPUs of this machine: the driver's /proc entries first (no process started), else,
    with `listing`, the lines of `nvidia-smi -L`; 0 without either. The SSH backend asks a remote
    host the same two questions in shell (launch/backends/probes.py: GPU_COUNT_SH)."""
    try:
        return len(os.listdir(NVIDIA_GPUS_DIR))
    except OSError:
        pass
    smi = shutil.which('nvidia-smi') if listing else None
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, '-L'], capture_output=True, text=True, timeout=SMI_TIMEOUT).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith('GPU '))
