"""GPU slots: which physical GPUs each worker of a host gets. Pure: a spec and what is known of
each machine's GPU count in, an assignment out (or one line saying why it cannot be made).

`train.devices` names the towers of *one* worker. Each machine's workers, in index order, take
consecutive blocks of its GPUs, so co-located workers never share one:

- a list: `gpu:i` is the i-th GPU of the worker's block; the block has `highest i + 1` GPUs, and
  worker k of a machine gets physical GPUs `k * block + i` for each `gpu:i` it lists
  (`[gpu:0, gpu:1]`, two workers on a 4-GPU host: worker 0 gets 0,1 and worker 1 gets 2,3);
- `auto`: the machine's GPUs are split evenly among its workers, one tower per GPU (G GPUs, W
  workers: G // W each); a machine without GPUs trains on CPU towers;
- a number (CPU towers), every ps task, and a coordinator run's chief and evaluator: no GPU. The
  chief of ParameterServerStrategy only schedules functions on the workers, which run them; an
  evaluator that wants a GPU is left to a later change (it would take a slot of its own here).

A worker sees only its own GPUs (CUDA_VISIBLE_DEVICES), numbered from 0 there, which is how
cluster/training/train.py names its towers. A machine is the address its tasks are reached at (every
loopback name is this machine; two spec names of one ssh host are one machine).
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping

from cluster.spec import ClusterSpec, SpecError, TaskSpec, same_machine_key


@dataclass(frozen=True)
class Slot:
    """One task's GPUs: the physical indices on its machine (() none; None: `auto` on a machine
    whose count is unknown, where the worker would get share `block` of its machine's GPUs)."""
    machine: str
    gpus: tuple[int, ...] | None
    block: int = 0                  # the worker's position among its machine's workers
    count: int | None = None        # the machine's GPU count, where known
    workers: int = 0                # how many workers share the machine's GPUs

    def describe(self) -> str:
        """A short phrase for `launch plan` and `launch check`."""
        if self.gpus is None:
            return (f'block {self.block + 1} of {self.workers} of the GPUs of {self.machine} '
                    f'(count unknown: set gpus.{self.machine} in the spec, or run `launch check`)')
        if not self.gpus:
            return 'none (CPU towers)'
        count = (f'{_plural(self.count, "GPU")} there' if self.count is not None else
                 f'count unknown, not checked: set gpus.{self.machine} or run `launch check`')
        return f'{"GPU" if len(self.gpus) == 1 else "GPUs"} {",".join(map(str, self.gpus))} of {self.machine} ({count})'


def tower_gpus(devices: str | int | tuple[str, ...]) -> tuple[int, ...]:
    """The gpu:i indices of a train.devices list, in order (() for auto or CPU towers)."""
    if not isinstance(devices, tuple):
        return ()
    return tuple(int(d.split(':')[1]) for d in devices if d.startswith('gpu:'))


def wants_gpus(spec: ClusterSpec) -> bool:
    """Whether the workers' GPUs depend on the machines' counts (auto) or take any (a gpu list)."""
    return spec.train.devices == 'auto' or bool(tower_gpus(spec.train.devices))


def _plural(n: int, word: str) -> str:
    return f'{n} {word}{"" if n == 1 else "s"}'


def machine(host: str, machine_of: Mapping[str, str] | None = None) -> str:
    """The machine a spec host (or an address) is: `machine_of`'s address for it, every loopback
    name as localhost."""
    return same_machine_key((machine_of or {}).get(host, host))


def assign(spec: ClusterSpec, machine_of: Mapping[str, str] | None = None,
           counts: Mapping[str, int] | None = None) -> dict[str, Slot]:
    """Task name -> Slot for every task. `machine_of` maps a spec host to its machine (default: the
    host itself, loopback names as localhost); `counts` maps a host (or its machine) to the GPUs it
    said it has (Backend.gpu_counts), merged with the spec's `gpus:` (machine_counts); a machine
    neither gives is unknown. Raises SpecError (one line naming the host, its workers and the
    counts) when a machine has too few GPUs."""
    counts = machine_counts(spec, counts or {}, machine_of)
    by_machine: dict[str, list[TaskSpec]] = {}
    for t in spec.job_tasks('worker'):
        by_machine.setdefault(machine(t.host, machine_of), []).append(t)
    slots = {t.name: Slot(machine(t.host, machine_of), ()) for t in spec.tasks if t.job != 'worker'}
    problems: list[tuple[str, str, str]] = []
    for where, workers in by_machine.items():
        count = counts.get(where)
        gpus, problem = _share(spec.train.devices, len(workers), count)
        if problem:
            problems.append((where, ', '.join(t.name for t in workers), problem))
            continue
        for k, t in enumerate(workers):
            slots[t.name] = Slot(where, gpus[k] if gpus else None, k, count, len(workers))
    if problems:
        raise GPUShortage(spec.error('train.devices', '; '.join(f'{m} ({names}): {text}' for m, names, text in problems)),
                          problems)
    check_disjoint(spec, slots)
    return {t.name: slots[t.name] for t in spec.tasks}


class GPUShortage(SpecError):
    """Hosts with too few GPUs for their workers: `problems` holds (machine, its workers, why) each."""

    def __init__(self, error: SpecError, problems: list[tuple[str, str, str]]) -> None:
        super().__init__(str(error))
        self.problems = problems


def _has(count: int) -> str:
    return 'no GPU' if count == 0 else f'{_plural(count, "GPU")} (gpu:0..gpu:{count - 1})'


def _share(devices: str | int | tuple[str, ...], workers: int,
           count: int | None) -> tuple[list[tuple[int, ...]] | None, str | None]:
    """The GPUs of each of a machine's `workers` (None: unknown), or one line why they do not fit."""
    if devices == 'auto':
        if count is None:
            return None, None
        if count and count < workers:
            return None, (f'devices: auto gives each of the {workers} workers an equal share of the host\'s GPUs, '
                          f'but it has {_plural(count, "GPU")}: run at most {count} worker(s) there, or list the '
                          'towers (e.g. devices: [gpu:0])')
        share = count // workers
        return [tuple(range(k * share, (k + 1) * share)) for k in range(workers)], None
    listed = tower_gpus(devices)
    block = max(listed, default=-1) + 1
    if count is not None and block * workers > count:
        each = ', '.join(f'gpu:{i}' for i in listed)
        if workers == 1:
            return None, f'names {each} but the host has {_has(count)}'
        return None, (f'{workers} workers with {each} take a block of {_plural(block, "GPU")} each, '
                      f'{block * workers} in all, but the host has {_has(count)}')
    return [tuple(k * block + i for i in listed) for k in range(workers)], None


def check_disjoint(spec: ClusterSpec, slots: Mapping[str, Slot]) -> None:
    """No physical GPU given to two tasks: SpecError naming both, their machine and the GPU."""
    owner: dict[tuple[str, int], str] = {}
    for name, slot in slots.items():
        for gpu in slot.gpus or ():
            other = owner.setdefault((slot.machine, gpu), name)
            if other != name:
                raise spec.error('train.devices', f'{other} and {name} would both use GPU {gpu} of {slot.machine}')


def machine_counts(spec: ClusterSpec, found: Mapping[str, int], machine_of: Mapping[str, str] | None = None) -> dict[str, int]:
    """Machine -> the GPU count to plan with, from what the hosts said (`found`: a host or its
    machine -> count) and `gpus:`. A spec count may keep GPUs back from the run (fewer than the
    host has), never invent them: SpecError when it names more than the host has."""
    said = {machine(host, machine_of): n for host, n in found.items()}
    out = dict(said)
    for host, n in spec.gpus.items():
        where = machine(host, machine_of)
        has = said.get(where)
        if has is not None and n > has:
            raise spec.error(f'gpus.{host}', f'{host} has {_plural(has, "GPU")}, not {n}')
        out[where] = n
    return out


def scheduler_request(spec: ClusterSpec) -> int:
    """The GPUs each worker asks a scheduler for (Slurm, Kubernetes): one per gpu:N tower, the
    scheduler picks which and the worker numbers them from 0; `auto` asks for none."""
    return len(tower_gpus(spec.train.devices))
