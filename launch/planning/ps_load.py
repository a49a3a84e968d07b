"""How much of the model each ps task holds and moves, before anything starts (`launch plan`'s
load): every variable with its bytes and the ps task the trainer puts it on, the bytes per ps task
and how uneven they are (the busiest over the mean), the variables too big for any ps to share
(hot: one ps holds all of it and serves it whole every step), and the bytes each step moves.

Exact for the built-in trainer: its variables (cluster/checks/variables.py, checked against the
built graph by a test) placed by its rule (each to the ps task holding the fewest bytes so far).
Each trainable variable has a moving average beside it on its ps task (in both modes); in sync
mode also a gradient accumulator of its size (memory, not a variable: no checkpoint holds it).
Per step each worker reads every weight once, whatever its towers, and sends one gradient per
weight; with train.transfer_dtype bfloat16 both cross as half the bytes.

Pure: no TensorFlow."""
from __future__ import annotations

from dataclasses import dataclass

from cluster.checks import data, variables
from cluster.checks.data import DataError
from cluster.checks.variables import Variable
from cluster.runtime.placed import PlacedVariable
from cluster.spec import ClusterSpec

PLACEMENT_BY_BYTES = 'by bytes'      # the built-in trainer's: each variable to the least loaded ps task
UNEVEN = 1.25           # `up` warns of a busiest ps task holding more than this times the mean
IDLE = 0.25             # ... or of one holding less than this share of the mean
BETTER_BY = 0.02        # advice only for a partition count that evens the load by more than this
MAX_PARTITIONS = 256    # the most blocks the advice tries (a plan of 1,000 ps tasks stays quick)


@dataclass(frozen=True)
class Placed:
    """A variable, the ps task it lives on, and what sits beside it there."""
    variable: Variable
    ps: int
    average_bytes: int          # its moving average's (trainable ones)
    accumulator_bytes: int      # its sync gradient accumulator's (sync, trainable ones)


@dataclass(frozen=True)
class PsLoad:
    """One ps task: the bytes of variables it holds (what a checkpoint saves of it: weights,
    moving averages, the global step), its weights alone, its accumulators' memory, and the bytes
    it receives and sends per global step (the gradients in, the weights out)."""
    task: str
    bytes: int
    weights_bytes: int
    accumulator_bytes: int
    in_per_step: int
    out_per_step: int


@dataclass(frozen=True)
class Load:
    """The load of a run's ps tasks (the module's docstring)."""
    model: str
    placement: str
    placed: tuple[Placed, ...]
    ps: tuple[PsLoad, ...]
    weights_bytes: int          # every trainable variable's
    wire_bytes: int             # what one worker reads per step (and sends back): weights as transferred
    imbalance: float            # the busiest ps task's weights over the mean
    hot: tuple[str, ...]        # variables, not split, bigger than a fair share of one ps
    sync: bool
    workers: int                # the live workers
    transfer_dtype: str

    @property
    def ps_wire_bytes(self) -> list[int]:
        """Each ps task's weights as transferred (halved with bfloat16): what it serves a worker a step."""
        share = self.wire_bytes / self.weights_bytes if self.weights_bytes else 1.0
        return [int(p.weights_bytes * share) for p in self.ps]

    def to_json(self) -> dict:
        return {'model': self.model, 'placement': self.placement, 'weights_bytes': self.weights_bytes,
                'imbalance': round(self.imbalance, 4), 'hot': list(self.hot), 'sync': self.sync,
                'workers': self.workers, 'transfer_dtype': self.transfer_dtype,
                'per_step': {'unit': 'global step' if self.sync else 'worker step',
                             'worker_in': self.wire_bytes, 'worker_out': self.wire_bytes},
                'ps': [{'task': p.task, 'bytes': p.bytes, 'weights_bytes': p.weights_bytes,
                        'accumulator_bytes': p.accumulator_bytes, 'in_per_step': p.in_per_step,
                        'out_per_step': p.out_per_step} for p in self.ps],
                'variables': [{'name': p.variable.name, 'shape': list(p.variable.shape), 'dtype': p.variable.dtype,
                               'bytes': p.variable.bytes, 'part_of': p.variable.part_of, 'ps': f'ps:{p.ps}',
                               'average_bytes': p.average_bytes, 'accumulator_bytes': p.accumulator_bytes}
                              for p in self.placed]}


def load_of(model: str, placement: str, found: list[Variable], places: list[int], num_ps: int, workers: int,
            sync: bool, transfer_dtype: str, averages: bool = True) -> Load:
    """The load of `found` variables placed on `places` (a ps index each); `averages`: the built-in
    trainer's moving average beside each trainable one."""
    wire = variables.DTYPE_BYTES[transfer_dtype] / variables.DTYPE_BYTES['float32']
    placed = tuple(Placed(v, ps, v.bytes if v.trainable and averages else 0, v.bytes if v.trainable and sync else 0)
                   for v, ps in zip(found, places))
    weights = sum(p.variable.bytes for p in placed if p.variable.trainable)
    per_ps = []
    for index in range(num_ps):
        mine = [p for p in placed if p.ps == index]
        own = sum(p.variable.bytes for p in mine if p.variable.trainable)
        moved = int(own * wire) * (workers if sync else 1)     # sync: every live worker, each global step
        per_ps.append(PsLoad(f'ps:{index}', sum(p.variable.bytes + p.average_bytes for p in mine), own,
                             sum(p.accumulator_bytes for p in mine), moved, moved))
    mean = weights / num_ps
    hot = tuple(p.variable.name for p in placed if num_ps > 1 and p.variable.trainable
                and p.variable.part_of is None and p.variable.bytes > mean)
    return Load(model, placement, placed, tuple(per_ps), weights, int(weights * wire),
                max(p.weights_bytes for p in per_ps) / mean if mean else 1.0, hot, sync, workers, transfer_dtype)


def builtin_load(spec: ClusterSpec) -> Load | None:
    """The load of the built-in trainer's run of `spec`; None for a run of the user's own program
    or command, or whose data set cannot be told from its name."""
    train = spec.train
    if spec.coordinator or train.program or train.command:
        return None
    try:
        described = data.describe(train.data, train.train_dir)
    except DataError:
        return None
    found = variables.builtin_variables(described.image_shape, spec.partitions)
    return load_of(f'the built-in CIFAR-10 model on {described.name} ({described.shape_text})', PLACEMENT_BY_BYTES,
                   found, variables.place_by_bytes(found, spec.num_ps), spec.num_ps, spec.live_workers,
                   train.sync, train.transfer_dtype)


def per_ps_wire_bytes(spec: ClusterSpec, num_ps: int) -> list[int]:
    """The built-in model's weights on each of `num_ps` ps tasks, as transferred (train.partitions,
    else one local3 block per ps task): what a link advice tries. Only for a spec builtin_load
    gives a load of."""
    shape = data.describe(spec.train.data, spec.train.train_dir).image_shape
    found = variables.builtin_variables(shape, spec.train.partitions or num_ps)
    load = load_of('', PLACEMENT_BY_BYTES, found, variables.place_by_bytes(found, num_ps), num_ps, 1, False,
                   spec.train.transfer_dtype)
    return load.ps_wire_bytes


def run_load(spec: ClusterSpec, recorded: list[PlacedVariable], run: str) -> Load | None:
    """The load of a coordinator program's variables as a run of it placed them (its
    variables.json: cluster/runtime/placed.py): each worker step reads every trainable variable and
    sends a gradient for each, as an async step does. Variables off the ps tasks, and of a dtype
    whose size is not known, are left out. None where no variable was on a ps task."""
    on_ps = [v for v in recorded if v.ps is not None and v.ps < spec.num_ps and v.dtype in variables.DTYPE_BYTES]
    if not on_ps:
        return None
    found = [Variable(v.name, v.shape, v.dtype, v.trainable) for v in on_ps]
    return load_of(f'your program\'s {len(found)} variables on the ps tasks, as run {run} placed them', 'as that run did',
                   found, [v.ps for v in on_ps if v.ps is not None], spec.num_ps, spec.live_workers, False,
                   'float32', averages=False)


@dataclass(frozen=True)
class Advice:
    """A train.partitions that evens the ps tasks' load out, and the imbalance it gives."""
    partitions: int
    imbalance: float
    now: float

    def line(self, num_ps: int) -> str:
        return (f'advice: train.partitions: {self.partitions} evens the {num_ps} ps tasks out to {self.imbalance:.2f} '
                f'(now {self.now:.2f}): the local3 weights in {self.partitions} blocks, placed by bytes')

    def to_json(self) -> dict:
        return {'partitions': self.partitions, 'imbalance': round(self.imbalance, 4)}


def imbalance_with(spec: ClusterSpec, image_shape: tuple[int, int, int], partitions: int) -> float:
    """The built-in model's imbalance over the spec's ps tasks with local3 in `partitions` blocks."""
    found = variables.builtin_variables(image_shape, partitions)
    return load_of('', PLACEMENT_BY_BYTES, found, variables.place_by_bytes(found, spec.num_ps), spec.num_ps,
                   1, False, 'float32').imbalance


def advice(spec: ClusterSpec) -> Advice | None:
    """The partition count, up to 4 blocks per ps task (MAX_PARTITIONS), that evens the built-in model's load out
    best (the fewest blocks on a tie), when that beats today's by more than BETTER_BY; else None."""
    if spec.num_ps < 2 or spec.coordinator or spec.train.program or spec.train.command:
        return None
    try:
        shape = data.describe(spec.train.data, spec.train.train_dir).image_shape
    except DataError:
        return None
    now = imbalance_with(spec, shape, spec.partitions)
    best = min(range(1, min(4 * spec.num_ps, MAX_PARTITIONS) + 1),
               key=lambda p: (round(imbalance_with(spec, shape, p), 4), p))
    then = imbalance_with(spec, shape, best)
    return Advice(best, then, now) if then < now - BETTER_BY else None


def warning(load: Load) -> str | None:
    """`up`'s one line for ps tasks whose load is uneven (the busiest over UNEVEN times the mean) or
    idle (one under IDLE of it); None when it is even enough."""
    mean = load.weights_bytes / len(load.ps)
    busiest = max(load.ps, key=lambda p: p.weights_bytes)
    idle = [p.task for p in load.ps if p.weights_bytes < IDLE * mean]
    if load.imbalance <= UNEVEN and not idle:
        return None
    what = (f'{busiest.task} holds {load.imbalance:.2f}x the mean of the weights' if load.imbalance > UNEVEN
            else f'{", ".join(idle)} hold(s) under {IDLE:.0%} of a fair share of the weights')
    return f'warning: the ps tasks\' load is uneven: {what} (`launch plan` shows where each variable goes)'
