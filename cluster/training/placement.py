"""Where a worker's graph puts things: its towers' devices, each variable's ps task, and where the
weights it reads and the gradients it sends are cast (`train.transfer_dtype`).

Every worker decides placement on its own, from the spec alone; each must come out the same, so
nothing here may depend on anything but the spec and the order the variables are built in.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from cluster.checks.variables import least_loaded
from cluster.spec import ClusterSpec, TaskSpec

v1 = tf.compat.v1


def tower_devices(spec: ClusterSpec, task: TaskSpec) -> list[str]:
    """The devices a worker builds its towers on, as TF device names of that worker."""
    devices = spec.train.devices
    prefix = f'/job:worker/task:{task.index}'
    if devices == 'auto':
        gpus = tf.config.list_physical_devices('GPU')
        return [f'{prefix}/device:GPU:{i}' for i in range(len(gpus))] or [f'{prefix}/device:CPU:0']
    if isinstance(devices, int):
        return [f'{prefix}/device:CPU:{i}' for i in range(devices)]
    # A list: GPUs are renumbered from 0 because the task only sees its own (CUDA_VISIBLE_DEVICES).
    out, gpu = [], 0
    for d in devices:
        kind, _ = d.split(':')
        if kind == 'gpu':
            out.append(f'{prefix}/device:GPU:{gpu}')
            gpu += 1
        else:
            out.append(f'{prefix}/device:CPU:{d.split(":")[1]}')
    return out


def cpu_device_count(spec: ClusterSpec) -> int:
    """Logical CPU devices a worker's server must create for its CPU towers."""
    devices = spec.train.devices
    if isinstance(devices, int):
        return devices
    if isinstance(devices, tuple):
        return 1 + max([int(d.split(':')[1]) for d in devices if d.startswith('cpu:')], default=0)
    return 1


class ByteBalance:
    """A replica_device_setter ps strategy: each variable to the ps task holding the fewest bytes
    so far (greedy), instead of round-robin, which puts the model's few large weights wherever
    their turn falls. A variable colocated with another (a moving average, a slot) counts there."""

    def __init__(self, num_ps: int) -> None:
        self.loads = [0] * num_ps

    def __call__(self, op: tf.Operation) -> int:
        colocated = ps_index(op)
        if colocated is not None:
            return colocated
        index = least_loaded(self.loads)       # the rule launch plan's load follows (cluster/checks/variables.py)
        self.loads[index] += _variable_bytes(op)
        return index


def ps_index(op: tf.Operation) -> int | None:
    """The ps task of the op `op` is colocated with (a moving average with its variable), if any."""
    mine = b'loc:@' + op.name.encode()
    other = [g[5:].decode() for g in op.colocation_groups() if g != mine]
    return tf.DeviceSpec.from_string(op.graph.get_operation_by_name(other[0]).device).task if other else None


def _variable_bytes(op: tf.Operation) -> int:
    try:
        shape, dtype = tf.TensorShape(op.get_attr('shape')), tf.as_dtype(op.get_attr('dtype'))
    except ValueError:      # a hash table or another stateful op without a static shape
        return 0
    return (shape.num_elements() or 0) * dtype.size


class WeightReads:
    """How a worker's towers read the variables, and how its gradients go back (`read` is the
    `read` of model.inference, `send_gradients` wraps what is applied).

    Each variable is read once per step on the worker's CPU and that value is shared by every
    tower: a read per tower would pull the model from the ps tasks once per tower. With
    `transfer_dtype: bfloat16` the read is cast to bfloat16 on the variable's ps task and back to
    float32 on the worker, and each gradient is cast to bfloat16 on the worker and back to
    float32 on its variable's ps task: the bytes on the wire halve both ways, while the variables,
    the accumulators of sync mode, the updates and the moving averages stay float32 on the ps (so
    rounding never accumulates in the weights; each step's forward pass and gradient carry
    bfloat16's 8 bits of precision)."""

    def __init__(self, device: str, transfer_dtype: str) -> None:
        self.device, self.half = device, transfer_dtype == 'bfloat16'
        self.values: dict[str, object] = {}

    def __call__(self, var: Any) -> tf.Tensor:
        """The value the towers use of `var`, a variable or a partitioned one (read once)."""
        if var.name not in self.values:
            parts = [var] if isinstance(var, tf.Variable) else list(var)     # a partitioned one: its parts
            with v1.device(self.device):
                values = [self._pull(part) for part in parts]
                self.values[var.name] = values[0] if len(values) == 1 else tf.concat(values, axis=0)
        return self.values[var.name]

    def _pull(self, part: tf.Variable) -> tf.Tensor:
        if not self.half:
            return tf.identity(part)
        with v1.device(part.device):
            half = tf.cast(part, tf.bfloat16)
        return tf.cast(half, tf.float32)

    def send_gradients(self, grads: list[tuple]) -> list[tuple]:
        if not self.half:
            return grads
        out = []
        for grad, var in grads:
            if isinstance(grad, tf.Tensor):
                half = tf.cast(grad, tf.bfloat16)
                with v1.device(var.device):
                    grad = tf.cast(half, tf.float32)
            out.append((grad, var))
        return out
