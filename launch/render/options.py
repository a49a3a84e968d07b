"""What a renderer takes beyond the spec: the options of `launch render`, typed once by
launch/cli.py. `launch up --backend slurm` renders its batch script with the sbatch renderer's
(the Slurm backend's own options, launch/backends/slurm/, make them)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RenderOptions:
    """Every renderer option; None: the renderer's default. Each renderer reads the ones its entry
    in launch/render/__init__.py lists."""
    name: str | None = None             # the job's name (default: from the spec file's name)
    image: str | None = None            # Kubernetes: the container image
    namespace: str | None = None        # Kubernetes: the namespace
    pvc: str | None = None              # Kubernetes: the claim the workers' train_dir is on
    partition: str | None = None        # Slurm: the partition
    time_limit: str | None = None       # Slurm: the job's time limit
    port_base: int | None = None        # Slurm: the first port of each node's tasks
