"""The built-in CIFAR-10 model's variables and where the trainer puts them, without TensorFlow:
the same list, in the same order, with the same shapes as cluster/training/model.py builds, and
the one placement rule the trainer's device setter follows (cluster/training/placement.py
ByteBalance calls `least_loaded`), so that `launch plan` says where every byte lives before
anything starts. A test builds the real graph and checks both agree (tests/unit/cluster/training).

Pure: both sides import it."""
from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from cluster.checks.memory import CONV_FILTERS, LOCAL3, LOCAL4, pooled
from cluster.checks.data import NUM_CLASSES

DTYPE_BYTES = {'float32': 4, 'bfloat16': 2, 'float16': 2, 'float64': 8, 'int64': 8, 'int32': 4, 'int16': 2,
               'int8': 1, 'uint8': 1, 'uint16': 2, 'uint32': 4, 'uint64': 8, 'bool': 1, 'complex64': 8,
               'complex128': 16}
GLOBAL_STEP = 'global_step'
LOCAL3_WEIGHTS = 'cifar10/local3/weights'


@dataclass(frozen=True)
class Variable:
    """One variable (or one part of a partitioned one, `part_of` naming the whole)."""
    name: str
    shape: tuple[int, ...]
    dtype: str = 'float32'
    trainable: bool = True
    part_of: str | None = None

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


def slices(rows: int, parts: int) -> list[int]:
    """The rows of each part when `rows` are split into `parts` (TensorFlow's fixed-size
    partitioner: the first `rows % parts` parts one row more)."""
    base, extra = divmod(rows, parts)
    return [base + (i < extra) for i in range(parts)]


def builtin_variables(image_shape: tuple[int, int, int], partitions: int) -> list[Variable]:
    """The global step, then the model's variables in the order the graph creates them, for
    images of `image_shape` (height, width, channels) and the local3 weights in `partitions` row
    blocks (the trainer asks for one per ps task)."""
    height, width, channels = image_shape
    flat = pooled(pooled(height)) * pooled(pooled(width)) * CONV_FILTERS

    def layer(name: str, weights: tuple[int, ...], biases: int) -> list[Variable]:
        return [Variable(f'cifar10/{name}/weights', weights), Variable(f'cifar10/{name}/biases', (biases,))]
    local3 = ([Variable(f'{LOCAL3_WEIGHTS}/part_{i}', (rows, LOCAL3), part_of=LOCAL3_WEIGHTS)
               for i, rows in enumerate(slices(flat, partitions))] if partitions > 1
              else [Variable(LOCAL3_WEIGHTS, (flat, LOCAL3))])
    return [Variable(GLOBAL_STEP, (), 'int64', trainable=False),
            *layer('conv1', (5, 5, channels, CONV_FILTERS), CONV_FILTERS),
            *layer('conv2', (5, 5, CONV_FILTERS, CONV_FILTERS), CONV_FILTERS),
            *local3, Variable('cifar10/local3/biases', (LOCAL3,)),
            *layer('local4', (LOCAL3, LOCAL4), LOCAL4),
            *layer('softmax_linear', (LOCAL4, NUM_CLASSES), NUM_CLASSES)]


def least_loaded(loads: Sequence[int]) -> int:
    """The ps task with the fewest bytes so far; on a tie, the lowest index."""
    return min(range(len(loads)), key=loads.__getitem__)


def place_by_bytes(variables: Sequence[Variable], num_ps: int) -> list[int]:
    """The ps task of each variable, in order, as the trainer's device setter places them: each to
    the one holding the fewest bytes so far."""
    heap, places = [(0, index) for index in range(num_ps)], []     # (load, index): least_loaded's order
    for v in variables:
        load, index = heapq.heappop(heap)
        heapq.heappush(heap, (load + v.bytes, index))
        places.append(index)
    return places


def place_round_robin(variables: Sequence[Variable], num_ps: int) -> list[int]:
    """The ps task of each variable under TensorFlow's default placement: each in turn."""
    return [i % num_ps for i in range(len(variables))]
