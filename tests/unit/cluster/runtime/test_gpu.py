"""A task's GPU figures (cluster/runtime/gpu.py). No GPU is here: the arithmetic is checked against
a stand-in for NVML's module (the calls pynvml makes, answering as a two-GPU host would), and
the real pynvml, where the test extra installed it, is checked to give no figures on a host
without a driver, the task training on."""
from __future__ import annotations

import types

import pytest

from cluster.runtime import telemetry
from cluster.runtime.gpu import GpuFigures, Gpus, visible


@pytest.mark.parametrize('env, count, gpus', [
    (None, 2, [0, 1]),              # unset: every GPU of the host
    ('', 2, []),                    # empty: none
    ('1', 2, [1]),
    ('1,0', 2, [1, 0]),
    ('0,-1,1', 2, [0]),             # CUDA stops at the first entry it cannot use
    ('3', 2, []),                   # no such GPU
    ('GPU-8f3a', 2, ['GPU-8f3a']),  # a UUID, matched by UUID
])
def test_the_gpus_a_task_may_use_are_cuda_visible_devices(env, count, gpus):
    assert visible(env, count) == gpus


class TwoGpus:
    """pynvml as a host with two GPUs answers: GPU 0 70% busy, GPU 1 30%; this process (pid 7)
    holds 3 GiB on GPU 1; GPU 0 has 5 GiB in use by another (pid 99)."""
    GIB = 1 << 30

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return {'GPU-b': 1}[uuid]

    def nvmlDeviceGetUtilizationRates(self, h: int):
        return types.SimpleNamespace(gpu=(70, 30)[h], memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int):
        return [types.SimpleNamespace(pid=(99, 7)[h], usedGpuMemory=(5, 3)[h] * self.GIB)]

    def nvmlDeviceGetMemoryInfo(self, h: int):
        return types.SimpleNamespace(used=(5, 3)[h] * self.GIB)


@pytest.mark.parametrize('env, figures', [
    ({}, GpuFigures(0.5, 3 << 30)),                                   # both GPUs: the mean busy, its own memory
    ({'CUDA_VISIBLE_DEVICES': '1'}, GpuFigures(0.3, 3 << 30)),
    ({'CUDA_VISIBLE_DEVICES': 'GPU-b'}, GpuFigures(0.3, 3 << 30)),
    ({'CUDA_VISIBLE_DEVICES': '0'}, GpuFigures(0.7, 0)),              # another's memory is not its
    ({'CUDA_VISIBLE_DEVICES': ''}, None),
])
def test_a_task_measures_the_gpus_it_may_use(env, figures):
    assert Gpus(TwoGpus(), env, pid=7, seen=lambda pid: pid in (7, 99)).take() == figures


def test_in_another_pid_namespace_the_memory_in_use_on_its_gpus_counts():
    """In a container the driver's process IDs are not the task's (it is pid 7 here, the driver's
    7 and 99 are no process it can see): all the memory in use on its GPUs counts."""
    gpus = Gpus(TwoGpus(), {'CUDA_VISIBLE_DEVICES': '0'}, pid=7, seen=lambda pid: False)
    assert gpus.take() == GpuFigures(0.7, 5 << 30)


def test_no_driver_no_figures_and_the_sampler_leaves_them_out(tmp_path):
    """The real pynvml (the test extra's nvidia-ml-py) on this host without an NVIDIA driver: no
    figures, no error; a sample then carries no GPU keys, and the pulse stays as it was."""
    pytest.importorskip('pynvml', reason='nvidia-ml-py (the gpu extra) is not installed')
    assert Gpus().take() is None

    class Sink:
        def sample(self, sample):
            pass
    sample = telemetry.Sampler(Sink()).take()
    assert sample.gpu is None and sample.gpu_memory is None
    assert 'gpu' not in sample.to_json() and 'gmem' not in sample.to_json()


def test_a_gpu_that_fails_while_measured_leaves_the_figures_out():
    class Gone(TwoGpus):
        def nvmlDeviceGetUtilizationRates(self, h: int):
            raise RuntimeError('GPU is lost')
    assert Gpus(Gone(), {}, pid=7).take() is None
