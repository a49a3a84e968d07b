"""How long a step takes on links of a given rate (`launch plan --link RATE`), from the ps tasks'
load (ps_load.py) and the hosts the spec puts the tasks on.

The model:
- Each host has one link of the rate each way (full duplex). In a round (sync: one global step, in
  which every live worker pulls the weights and pushes its gradients; async: one update of each
  worker) a host sends what its tasks send to tasks on other hosts: a ps task its weights to each
  worker elsewhere, a worker its gradients to each ps task elsewhere; it receives as much. The
  busiest host's bytes over the rate is the round's link time `l`. Tasks on one host talk over
  its loopback, which costs nothing here.
- A step overlaps most of its transfers with its compute `c`: TensorFlow pulls every weight when
  the step starts and pushes each gradient as soon as it is computed, so the large weights travel
  while the first layers compute. What cannot overlap is the start and the end of a step, taken as
  EXPOSED of the shorter of the two: T = max(c, l) + EXPOSED * min(c, l). (The serial model,
  T = c + 2l, missed by up to 58% once the compute was fast; the overlapped bound alone, max(c, l),
  by up to 17%: benchmarks/links.py, docs/performance.md.)
- sync: c is a global step's images over the cluster's images/s with unlimited links, R0;
  images/s = the step's images / T.
- async: each worker cycles on its own: c = W x its batch / R0 (the W workers share R0), l = its
  own link's bytes; and the busiest host caps the updates of all at W / l_round.

R0 is the compute: measured by a run (its record's images/s, `--from-run`), else unknown, and the
plan then says the least a step takes on the links alone. Pure."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from cluster.spec import ClusterSpec
from launch.planning.ps_load import Load

EXPOSED = 0.5       # the share of the shorter of compute and transfer that overlaps nothing (fitted: links)
RATE_UNITS = {'': 1.0, 'k': 1e-3, 'm': 1.0, 'g': 1e3, 't': 1e6}      # per Mbit/s
RATE_RE = re.compile(r'^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:bit|b|bps|bit/s)?\s*$', re.IGNORECASE)


def parse_rate(text: str) -> float:
    """A link rate in Mbit/s from `1gbit`, `10gbit`, `100mbit`, `2.5g` or a bare number of Mbit/s;
    ValueError naming what it expected."""
    m = RATE_RE.match(text)
    mbit = float(m.group(1)) * RATE_UNITS[m.group(2).lower()] if m else 0.0
    if mbit <= 0:
        raise ValueError(f'--link: expected a rate such as 1gbit, 10gbit or 100mbit (bits per second, '
                         f'each way), got {text!r}')
    return mbit


@dataclass(frozen=True)
class Traffic:
    """What a round moves over each host's link (each way), and a worker's own link per update."""
    by_host: dict[str, int]
    worker_bytes: int           # the busiest worker host's share of its own update (its pulls, or its pushes)

    @property
    def busiest(self) -> tuple[str, int]:
        return max(self.by_host.items(), key=lambda kv: (kv[1], kv[0]))


def traffic(load: Load, spec: ClusterSpec) -> Traffic:
    """The bytes each host sends (and receives) per round for `load` (the module's docstring)."""
    return traffic_of(load.ps_wire_bytes, [t.host for t in spec.job_tasks('ps')],
                      [t.host for t in spec.job_tasks('worker')][:load.workers])


def traffic_of(per_ps: list[int], ps_hosts: list[str], workers: list[str]) -> Traffic:
    """The bytes each host sends per round: ps task i, on ps_hosts[i], serves per_ps[i] bytes (as
    transferred) to each worker, on its host of `workers`."""
    by_host: dict[str, int] = {h: 0 for h in ps_hosts + workers}
    worst_worker = 0
    for w in workers:
        away = sum(b for b, h in zip(per_ps, ps_hosts) if h != w)      # its pulls (and its pushes)
        by_host[w] += away
        worst_worker = max(worst_worker, away)
    for b, h in zip(per_ps, ps_hosts):
        by_host[h] += b * sum(1 for w in workers if w != h)
    return Traffic(by_host, worst_worker)


def step_secs(compute: float, link: float, exposed: float = EXPOSED) -> float:
    """A step of `compute` seconds whose transfers take `link`, all but `exposed` of the shorter
    overlapped (0: the overlapped bound)."""
    return max(compute, link) + exposed * min(compute, link)


@dataclass(frozen=True)
class Prediction:
    """A step on links of `rate_mbit`: its link time, and with a known compute its time and rate."""
    rate_mbit: float
    unit: str                       # 'global step' (sync) or 'update' (async, one worker's)
    link_secs: float                # the busiest link's time per round
    busiest_host: str
    bound_images_per_sec: float | None      # what the links alone allow, whatever the compute (None: no link)
    compute_secs: float | None = None
    secs: float | None = None
    images_per_sec: float | None = None

    def to_json(self) -> dict:
        return {'rate_mbit': self.rate_mbit, 'unit': self.unit, 'link_secs': round(self.link_secs, 6),
                'busiest_host': self.busiest_host, 'bound_images_per_sec': None if self.bound_images_per_sec is None else round(self.bound_images_per_sec, 1),
                'compute_secs': None if self.compute_secs is None else round(self.compute_secs, 6),
                'step_secs': None if self.secs is None else round(self.secs, 6),
                'images_per_sec': None if self.images_per_sec is None else round(self.images_per_sec, 1),
                'formula': FORMULA}


FORMULA = 'T = max(c, l) + 0.5 * min(c, l); l = the busiest host\'s bytes per round / the rate'


def predict(load: Load, spec: ClusterSpec, rate_mbit: float, worker_images: int,
            unlimited_images_per_sec: float | None = None, exposed: float = EXPOSED) -> Prediction:
    """The step on links of `rate_mbit` for `load`; `worker_images` is what one worker takes a step
    (batch_size x towers); with the cluster's images/s on unlimited links, the step's time and rate."""
    return predict_traffic(traffic(load, spec), load.sync, load.workers, rate_mbit, worker_images,
                           unlimited_images_per_sec, exposed)


def predict_traffic(moved: Traffic, sync: bool, w: int, rate_mbit: float, worker_images: int,
                    unlimited_images_per_sec: float | None = None, exposed: float = EXPOSED) -> Prediction:
    """predict, for the traffic `moved` of `w` live workers."""
    r = rate_mbit * 1e6 / 8
    host, round_bytes = moved.busiest
    link = round_bytes / r
    if sync:
        images = w * worker_images
        bound = images / link if link else None
        if not unlimited_images_per_sec:
            return Prediction(rate_mbit, 'global step', link, host, bound)
        compute = images / unlimited_images_per_sec
        secs = step_secs(compute, link, exposed)
        return Prediction(rate_mbit, 'global step', link, host, bound, compute, secs, images / secs)
    cap = w / link if link else float('inf')        # updates/s the busiest host allows
    bound = cap * worker_images if link else None
    if not unlimited_images_per_sec:
        return Prediction(rate_mbit, 'update', link, host, bound)
    compute = w * worker_images / unlimited_images_per_sec
    cycle = step_secs(compute, moved.worker_bytes / r, exposed)
    updates = min(w / cycle, cap)
    return Prediction(rate_mbit, 'update', link, host, bound, compute, w / updates, updates * worker_images)


MAX_PS_TRIED = 64       # the most ps tasks the advice tries


@dataclass(frozen=True)
class PsAdvice:
    """A ps count, each task on a host of its own, that takes the ps links off the critical path."""
    num_ps: int
    now: Prediction
    then: Prediction

    def line(self) -> str:
        def secs(p: Prediction) -> float:
            return p.secs if p.secs is not None else p.link_secs
        what = 'a step' if self.now.secs is not None else 'the links\' share of a step'
        return (f'advice: {self.num_ps} ps task(s), each on a host of its own, bring {what} from '
                f'{secs(self.now) * 1e3:.0f} to {secs(self.then) * 1e3:.0f} ms on these links: the busiest link moves '
                f'max(M, n x M / k) per {self.now.unit} (the model M over k ps tasks, to n workers; BytePS, OSDI\'20)')

    def to_json(self) -> dict:
        return {'num_ps': self.num_ps, 'prediction': self.then.to_json()}


def ps_advice(now: Prediction, per_ps_of: Callable[[int], list[int]], workers: list[str], sync: bool,
              worker_images: int, unlimited_images_per_sec: float | None) -> PsAdvice | None:
    """The fewest ps tasks k (each on a host of its own, `per_ps_of(k)` their bytes as transferred)
    within 5% of the shortest link time any count up to MAX_PS_TRIED gives, when that beats `now`
    by more than 5%; else None."""
    tried = {}
    for k in range(1, MAX_PS_TRIED + 1):
        moved = traffic_of(per_ps_of(k), [f'(ps host {i})' for i in range(k)], workers)
        tried[k] = predict_traffic(moved, sync, len(workers), now.rate_mbit, worker_images, unlimited_images_per_sec)
    if not now.link_secs:       # every task on one host: no link to shorten
        return None
    best = min(p.link_secs for p in tried.values())
    k = min(k for k, p in tried.items() if p.link_secs <= best * 1.05)
    return PsAdvice(k, now, tried[k]) if tried[k].link_secs < now.link_secs * 0.95 else None
