"""What a task measures of its GPUs, for its telemetry (cluster/runtime/telemetry.py): how busy
the GPUs it may use were, and the memory it holds on them, read through NVML (the driver's own
management library, with `pip install 'tfcluster[gpu]'`: nvidia-ml-py).

The GPUs a task may use are CUDA_VISIBLE_DEVICES's (indexes or UUIDs, as the launcher or a
scheduler set them); unset, every GPU of its host. NVML numbers GPUs as the driver does, whatever
CUDA_VISIBLE_DEVICES says, so a UUID is matched by UUID and an index by index.

`busy` is the mean over those GPUs of NVML's utilisation (the share of its last sample period in
which a kernel ran); `memory` is what this process holds on them. In a container the driver's
process IDs are not the task's: where no process NVML lists on them is one this task can see,
it is all the memory in use on them.
No NVML, no driver, no GPU: no figures, and the task trains on."""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuFigures:
    busy: float         # share of the time a kernel ran, mean over the task's GPUs (0..1)
    memory: int         # bytes


def visible(env: str | None, count: int) -> list[int | str]:
    """The GPUs CUDA_VISIBLE_DEVICES names (`env`), as NVML indexes or UUIDs, on a host with
    `count` GPUs: unset, all of them; empty or a negative index, none (CUDA stops at the first
    entry it cannot use, and so does this)."""
    if env is None:
        return list(range(count))
    out: list[int | str] = []
    for entry in env.split(','):
        entry = entry.strip()
        if entry.isdigit() and int(entry) < count:
            out.append(int(entry))
        elif entry.startswith(('GPU-', 'MIG-')):
            out.append(entry)
        else:
            break
    return out


def pid_exists(pid: int) -> bool:
    """Whether a process of this PID namespace has `pid` (the task side has no psutil: the task
    image carries the runtime's requirements alone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return pid > 0


class Gpus:
    """This process's GPUs through NVML (`nvml`: the pynvml module; None: import it, if it is
    there). `take` gives None for a task with no GPU to measure."""

    def __init__(self, nvml: Any = None, environ: Mapping[str, str] = os.environ, pid: int | None = None,
                 seen: Callable[[int], bool] = pid_exists) -> None:
        self._nvml, self._seen = nvml, seen
        self._env = environ.get('CUDA_VISIBLE_DEVICES')
        self._pid = os.getpid() if pid is None else pid
        self._handles: list[Any] | None = None      # None: not opened yet; []: nothing to measure

    def _open(self) -> list[Any]:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module('pynvml')      # nvidia-ml-py: the gpu extra
            except ImportError:
                return []
        nvml = self._nvml
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            handles = []
            for gpu in visible(self._env, count):
                handles.append(nvml.nvmlDeviceGetHandleByUUID(gpu) if isinstance(gpu, str)
                               else nvml.nvmlDeviceGetHandleByIndex(gpu))
            return handles
        except Exception:       # noqa: BLE001 (no driver, no library, a UUID not there: no GPU figures)
            return []

    def take(self) -> GpuFigures | None:
        if self._handles is None:
            self._handles = self._open()
        if not self._handles:
            return None
        try:
            return GpuFigures(self._busy(self._handles), self._memory(self._handles))
        except Exception:       # noqa: BLE001 (a GPU gone, a driver restarted: a hint, left out)
            return None

    def _busy(self, handles: Sequence[Any]) -> float:
        rates = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]
        return sum(rates) / len(rates) / 100.0

    def _memory(self, handles: Sequence[Any]) -> int:
        listed = [p for h in handles for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(h)]
        if listed and not any(self._seen(p.pid) for p in listed):      # another PID namespace
            return sum(self._nvml.nvmlDeviceGetMemoryInfo(h).used for h in handles)
        return sum(p.usedGpuMemory or 0 for p in listed if p.pid == self._pid)
