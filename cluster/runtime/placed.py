"""Where a run's own program put its variables, read by `launch plan --from-run` to tell the ps
tasks' load of the next run of that program: `<train_dir>/variables.json`, written by a
coordinator run's chief (TF2 ParameterServerStrategy), or a TF1 program's newest checkpoint's
`.meta` graph (its Saver writes one; every variable node has its device there).

The chief records every variable as it is created (a `tf.variable_creator_scope` around the
user's program: ParameterServerStrategy has placed it by then, each variable, shard and optimizer
slot on a ps task), in creation order, and writes the file at each checkpoint and at the end. A
checkpoint alone could not say this: it holds names, shapes and dtypes, not the ps tasks, and not
the order the strategy placed them in.

The file: {"version": 1, "variables": [{"name", "shape", "dtype", "trainable", "device", "ps"}]},
`ps` the ps task's index, or null for a variable that lives elsewhere (the chief's own).
Pure, but for `Recorder.scope`, which the chief (with TensorFlow) enters; a .meta is read with
TensorBoard's copy of the protos."""
from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cluster.runtime import rundir, runjson

VERSION = 1
PS_DEVICE = re.compile(r'/job:ps/(?:replica:\d+/)?task:(\d+)')


@dataclass(frozen=True)
class PlacedVariable:
    name: str
    shape: tuple[int, ...]
    dtype: str
    trainable: bool
    device: str
    ps: int | None

    def to_json(self) -> dict:
        return {'name': self.name, 'shape': list(self.shape), 'dtype': self.dtype, 'trainable': self.trainable,
                'device': self.device, 'ps': self.ps}


def ps_of(device: str) -> int | None:
    """The ps task index a device string names, else None."""
    m = PS_DEVICE.search(device or '')
    return int(m.group(1)) if m else None


class Recorder:
    """The variables a program creates, in order (the chief's)."""

    def __init__(self, train_dir: str) -> None:
        self.train_dir = train_dir
        self.found: list[PlacedVariable] = []

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Record each variable created inside (needs TensorFlow)."""
        import tensorflow as tf

        def creator(next_creator: Any, **kwargs: Any) -> Any:
            variable = next_creator(**kwargs)
            self.note(variable)
            return variable
        with tf.variable_creator_scope(creator):
            yield

    def note(self, variable: Any) -> None:
        try:
            shape = tuple(int(d) if d is not None else 0 for d in variable.shape)
            device = str(getattr(variable, 'device', '') or '')
            self.found.append(PlacedVariable(str(variable.name), shape, variable.dtype.name,
                                             bool(getattr(variable, 'trainable', True)), device, ps_of(device)))
        except (AttributeError, TypeError, ValueError):     # an object that is not a plain variable: not ours
            pass

    def write(self) -> None:
        """The file, whole (atomically); nothing when no variable was created."""
        if self.found:
            rundir.write_atomically(rundir.variables_path(self.train_dir), runjson.dumps(
                {'version': VERSION, 'variables': [v.to_json() for v in self.found]}, indent=1))


def read(train_dir: str) -> list[PlacedVariable] | None:
    """The variables a run's program placed, from its variables.json; None where the run left
    none; ValueError naming the file for one that is not such a record."""
    path = rundir.variables_path(train_dir)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f'{path}: not readable as JSON ({e})') from None
    try:
        if data.get('version') != VERSION:
            raise ValueError(f'version {data.get("version")!r}, expected {VERSION}')
        return [PlacedVariable(str(v['name']), tuple(int(d) for d in v['shape']), str(v['dtype']),
                               bool(v['trainable']), str(v['device']), None if v['ps'] is None else int(v['ps']))
                for v in data['variables']]
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f'{path}: not a variables record ({e})') from None


# TensorFlow's DataType enum names -> the dtype names cluster/checks/variables.py sizes.
META_DTYPES = {'DT_FLOAT': 'float32', 'DT_DOUBLE': 'float64', 'DT_HALF': 'float16', 'DT_BFLOAT16': 'bfloat16',
               'DT_INT8': 'int8', 'DT_INT16': 'int16', 'DT_INT32': 'int32', 'DT_INT64': 'int64', 'DT_UINT8': 'uint8',
               'DT_UINT16': 'uint16', 'DT_UINT32': 'uint32', 'DT_UINT64': 'uint64', 'DT_BOOL': 'bool',
               'DT_COMPLEX64': 'complex64', 'DT_COMPLEX128': 'complex128'}
VARIABLE_OPS = ('VarHandleOp', 'VariableV2', 'Variable')
META_BYTES = 256 << 20      # a .meta larger than this is not read (a graph with embedded constants)


def newest_meta(train_dir: str) -> str | None:
    """The .meta of the newest checkpoint TensorFlow's index names in train_dir (a TF1 program's
    Saver writes one beside each checkpoint), if it is there."""
    step = rundir.checkpoint_step(rundir.read_text(rundir.checkpoint_index_path(train_dir)))
    path = os.path.join(train_dir, f'{rundir.CHECKPOINT_PREFIX}-{step}.meta') if step is not None else None
    return path if path is not None and os.path.isfile(path) else None


def read_meta(path: str) -> list[PlacedVariable]:
    """The variables of a TF1 graph's MetaGraphDef (a checkpoint's .meta), in the order the graph
    created them, each with the device its program's device setter gave it; read with
    TensorBoard's copy of TensorFlow's protos (no TensorFlow). ValueError naming the file for one
    that cannot be read as such."""
    from google.protobuf.message import DecodeError
    from tensorboard.compat.proto import meta_graph_pb2, types_pb2, variable_pb2
    try:
        if os.path.getsize(path) > META_BYTES:
            raise ValueError(f'larger than {META_BYTES >> 20} MiB')
        with open(path, 'rb') as f:
            meta = meta_graph_pb2.MetaGraphDef.FromString(f.read())
    except (OSError, ValueError, DecodeError) as e:
        raise ValueError(f'{path}: not readable as a TensorFlow meta graph ({e})') from None
    trainable = set()
    for value in meta.collection_def['trainable_variables'].bytes_list.value:
        trainable.add(variable_pb2.VariableDef.FromString(value).variable_name.split(':')[0])
    found = []
    for node in meta.graph_def.node:
        if node.op not in VARIABLE_OPS:
            continue
        dtype = META_DTYPES.get(types_pb2.DataType.Name(node.attr['dtype'].type), 'unknown')
        shape = tuple(max(int(d.size), 0) for d in node.attr['shape'].shape.dim)
        found.append(PlacedVariable(node.name, shape, dtype, node.name in trainable, node.device, ps_of(node.device)))
    return found


def recorded(train_dir: str) -> tuple[list[PlacedVariable], str] | None:
    """The variables a run of the user's program placed and the file that told them: its
    variables.json (a coordinator run), else its newest checkpoint's .meta (a TF1 program); None
    where it left neither. ValueError naming the file for one that cannot be read."""
    found = read(train_dir)
    if found is not None:
        return found, rundir.VARIABLES_FILE
    meta = newest_meta(train_dir)
    return (read_meta(meta), os.path.basename(meta)) if meta is not None else None
