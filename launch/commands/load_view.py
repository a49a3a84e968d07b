"""What `launch plan` prints of the ps tasks' load (launch/planning/ps_load.py): the model and how
it is placed, a line per ps task (what it holds, its accumulators, what it receives and sends per
step), how uneven that is and which variables are hot, what each worker moves per step, and the
variables, the largest first. Pure."""
from __future__ import annotations

from launch.planning.link_time import FORMULA, Prediction
from launch.planning.ps_load import Load

SHOWN_VARIABLES = 20     # more are counted, and all are in --json


def mb(n: int) -> str:
    return f'{n / 1e6:.2f} MB'


def lines(load: Load) -> list[str]:
    unit = 'global step' if load.sync else 'step of a worker'
    out = [f'load: {load.model}, {mb(load.weights_bytes)} of weights, placed {load.placement} over '
           f'{len(load.ps)} ps task(s) ({load.transfer_dtype} on the wire)']
    averages = any(p.average_bytes for p in load.placed)
    for p in load.ps:
        extra = f' + {mb(p.accumulator_bytes)} of sync accumulators' if p.accumulator_bytes else ''
        beside = ' and their moving averages' if averages else ''
        out.append(f'  {p.task}: holds {mb(p.bytes)} (weights {mb(p.weights_bytes)}{beside})'
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


def rate_text(mbit: float) -> str:
    return f'{mbit / 1e3:g} Gbit/s' if mbit >= 1e3 else f'{mbit:g} Mbit/s'


def link_lines(p: Prediction, compute_from: str | None) -> list[str]:
    """The step on links of a rate (launch/planning/link_time.py), and where its compute came from."""
    if p.bound_images_per_sec is None:
        return [f'links: every task runs on {p.busiest_host}: nothing crosses a link, so {rate_text(p.rate_mbit)} links '
                'change nothing']
    out = [f'links: {rate_text(p.rate_mbit)} each way, one per host: the busiest ({p.busiest_host}) moves its part of '
           f'each {p.unit} in {p.link_secs * 1e3:.1f} ms; the links alone allow at most '
           f'{p.bound_images_per_sec:,.0f} images/s']
    if p.secs is None or p.compute_secs is None or p.images_per_sec is None:
        out.append('  the compute is not known before a run: `--from-run RUN` takes it from a run of this spec')
    else:
        out.append(f'  predicted: one {p.unit} takes {p.secs * 1e3:.1f} ms (compute {p.compute_secs * 1e3:.1f} ms, '
                   f'from {compute_from}): {p.images_per_sec:,.0f} images/s; {FORMULA}')
    return out
