"""What one batch of the built-in CIFAR-10 model surely needs of a worker's memory, read from the
model's layer widths (which cluster/training/model.py builds from) and the images' shape: pure,
no TensorFlow, so the launcher's pre-flight refuses a batch that cannot fit before anything
starts, and a worker again as it starts (cluster/training/train.py)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from cluster.checks import data
from cluster.checks.data import IMAGE_SIZE, NUM_CLASSES
from cluster.runtime import hostinfo

if TYPE_CHECKING:
    from cluster.spec import ClusterSpec, TaskSpec

CONV_FILTERS = 64            # conv1 and conv2
LOCAL3, LOCAL4 = 384, 192   # the fully connected layers


def pooled(size: int) -> int:
    """A side after a 3x3 max-pool of stride 2, 'SAME' padding: 24 -> 12 -> 6, 28 -> 14 -> 7."""
    return -(-size // 2)



CIFAR10_SHAPE = (IMAGE_SIZE, IMAGE_SIZE, 3)      # the model's input on CIFAR-10: its 24x24 crops


def activation_floats_per_example(shape: tuple[int, int, int] = CIFAR10_SHAPE) -> int:
    """The float32 values per example a training step holds from the forward pass until the
    backward pass has used them, for images of `shape` (height, width, channels): the input and
    each layer's output as `inference` builds it (conv1 after ReLU, pool1, norm1, conv2 after
    ReLU, norm2, pool2, local3, local4, logits). The backward pass's own gradients come on top of
    these: this is a floor, not a forecast."""
    height, width, channels = shape
    area1 = pooled(height) * pooled(width)
    area2 = pooled(pooled(height)) * pooled(pooled(width))
    return (height * width * channels                  # the images
            + height * width * CONV_FILTERS            # conv1
            + 4 * area1 * CONV_FILTERS                 # pool1, norm1, conv2, norm2
            + area2 * CONV_FILTERS                     # pool2
            + LOCAL3 + LOCAL4 + NUM_CLASSES)


def bytes_per_example(shape: tuple[int, int, int] = CIFAR10_SHAPE) -> int:
    """The activations' bytes per example (float32) for images of `shape`: 313,384 for CIFAR-10's
    24x24x3 crops, 419,432 for Fashion-MNIST's 28x28x1 (conv1's output is the most of it)."""
    return 4 * activation_floats_per_example(shape)


# 313,384 bytes. Measured once (a single-process worker, batch 128, 512 and 2048, peak RSS): a
# batch costs 420-580 KiB per example more, and the process ~690 MiB before its first step; the
# estimate stays under both, so a batch it refuses surely cannot fit.
BYTES_PER_EXAMPLE = bytes_per_example()
RUNTIME_BYTES = 512 << 20       # TensorFlow, the graph and the input pipeline, at the least


def worker_bytes(batch_size: int, towers: int, shape: tuple[int, int, int] = CIFAR10_SHAPE) -> int:
    """The least memory a worker needs for `towers` towers (whose activations are in host memory,
    i.e. CPU towers) of `batch_size` examples of `shape` each: they all hold their activations at once."""
    return RUNTIME_BYTES + batch_size * towers * bytes_per_example(shape)


def host_memory_bytes(meminfo: str = '/proc/meminfo') -> int | None:
    """The machine's memory (MemTotal), or None where it cannot be read (not Linux)."""
    try:
        with open(meminfo) as f:
            for line in f:
                name, _, value = line.partition(':')
                if name == 'MemTotal':
                    number, _, unit = value.strip().partition(' ')
                    return int(number) * (1024 if unit.strip().lower() == 'kb' else 1)
    except (OSError, ValueError):
        return None
    return None


def host_towers(devices: str | int | tuple[str, ...], gpus: int) -> int:
    """How many of a worker's towers keep their activations in host memory (CPU towers), for a
    train.devices setting and a host with `gpus` GPUs ('auto' trains on every GPU, else on one CPU)."""
    if devices == 'auto':
        return 0 if gpus else 1
    if isinstance(devices, int):
        return devices
    return sum(1 for d in devices if str(d).startswith('cpu:'))


def _gib(n: float) -> str:
    return f'{n / (1 << 30):.1f} GiB'


def batch_memory_refusal(batch_size: int, towers: int, host_bytes: int | None, host: str = 'this machine',
                         shape: tuple[int, int, int] = CIFAR10_SHAPE) -> str | None:
    """Why a worker with `towers` CPU towers of `batch_size` examples of `shape` cannot train on a
    host with `host_bytes` of memory (one line), or None when it may."""
    if host_bytes is None or towers < 1:
        return None
    need = worker_bytes(batch_size, towers, shape)
    if need <= host_bytes:
        return None
    per_example = bytes_per_example(shape)
    most = max(0, (host_bytes - RUNTIME_BYTES) // (towers * per_example))
    tower_text = f' x {towers} towers' if towers > 1 else ''
    return (f'a batch of {batch_size:,}{tower_text} needs at least {_gib(need)} of memory (the CIFAR-10 model keeps '
            f'{per_example // 1000:,} KB of activations per {"x".join(map(str, shape))} example for the backward pass, plus '
            f'{_gib(RUNTIME_BYTES)} for TensorFlow), but {host} has {_gib(host_bytes)}: at most about {most:,} '
            'fits (docs/training.md)')


def gpus_here() -> int:
    """NVIDIA GPUs the driver lists on this machine (no process started): what 'auto' trains on."""
    return hostinfo.gpu_count(listing=False)


def check_batch_memory(spec: ClusterSpec, tasks: Iterable[TaskSpec]) -> None:
    """Raise the spec's error about train.batch_size if a worker among `tasks` (those that run
    on this machine) cannot hold one batch of the built-in model, on the images of the spec's
    data set, in this machine's memory."""
    if spec.train.program or spec.train.command or not any(t.job == 'worker' for t in tasks):
        return      # the user's code: its memory is its own
    shape = data.describe(spec.train.data, spec.train.train_dir).image_shape
    refusal = batch_memory_refusal(spec.train.batch_size, host_towers(spec.train.devices, gpus_here()),
                                   host_memory_bytes(), shape=shape)
    if refusal:
        raise spec.error('train.batch_size', refusal)
