"""Helpers of the tests of slurm, used by tests/system/cluster/test_coordinator.py,
tests/system/launch/backends/test_slurm.py, tests/unit/launch/backends/test_slurm.py: here, since no test module
imports another."""
from __future__ import annotations

import os
import socket
import types


from cluster.spec import load_spec
from launch.render import sbatch as slurm
from tests.conftest import project_processes


# -- the batch script ----------------------------------------------------------------------------

def _render(spec_path, **args) -> str:
    fields = {'name': None, 'partition': None, 'time_limit': None, 'port_base': None, **args}
    return slurm.render(load_spec(spec_path), types.SimpleNamespace(**fields))


def _sbatch_options(script: str) -> list[str]:
    return [line.split(None, 1)[1] for line in script.splitlines() if line.startswith('#SBATCH ')]


# -- against a real Slurm ------------------------------------------------------------------------

def _port_base(n: int = 3) -> int:
    """The first of n consecutive ports nobody listens on now."""
    for base in range(20000 + os.getpid() % 97 * 100, 32000, 7):
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(('', port))
        except OSError:
            continue
        return base
    raise RuntimeError('no free port range')


def _nothing_left(slurm_cluster, tmp_path) -> None:
    """Checked the moment the launcher exits: it returns only once the job has left the queue."""
    assert slurm_cluster.jobs() == []
    assert not {p: c for p, c in project_processes().items() if str(tmp_path) in c}

