"""What `launch plan` prints of the ps tasks' load (launch/planning/ps_load.py): the model and how
it is placed, a line per ps task (what it holds, its accumulators, what it receives and sends per
step), how uneven that is and which variables are hot, what each worker moves per step, and the
variables, the largest first. Pure."""
from __future__ import annotations

from launch.planning.ps_load import Load

SHOWN_VARIABLES = 20     # more are counted, and all are in --json


def mb(n: int) -> str:
    return f'{n / 1e6:.2f} MB'


def lines(load: Load) -> list[str]:
    unit = 'global step' if load.sync else 'step of a worker'
    out = [f'load: {load.model}, {mb(load.weights_bytes)} of weights, placed {load.placement} over '
           f'{len(load.ps)} ps task(s) ({load.transfer_dtype} on the wire)']
    for p in load.ps:
        extra = f' + {mb(p.accumulator_bytes)} of sync accumulators' if p.accumulator_bytes else ''
        out.append(f'  {p.task}: holds {mb(p.bytes)} (weights {mb(p.weights_bytes)} and their moving averages)'
                   f'{extra}; per {unit} receives {mb(p.in_per_step)}, sends {mb(p.out_per_step)}')
    hot = ', '.join(load.hot) if load.hot else 'none'
    out.append(f'  imbalance {load.imbalance:.2f} (the busiest ps task\'s weights / the mean); hot: {hot}')
    out.append(f'  each worker, each step: reads {mb(load.wire_bytes)} of weights and sends '
               f'{mb(load.wire_bytes)} of gradients, whatever its towers')
    largest = sorted(load.placed, key=lambda p: -p.variable.bytes)
    for placed in largest[:SHOWN_VARIABLES]:
        v = placed.variable
        out.append(f'    {v.name}  {"x".join(map(str, v.shape)) or "scalar"}  {v.bytes:,} B  ps:{placed.ps}')
    if len(largest) > SHOWN_VARIABLES:
        out.append(f'    ... {len(largest) - SHOWN_VARIABLES} more (--json lists all)')
    return out
