"""Where each task of a spec runs inside a Slurm job step, from Slurm's environment alone.

`srun` starts one process per rank and tells each only about itself (SLURM_PROCID) and about the
step's shape (its node list and how many tasks each node runs). Every task works out the whole
layout from that, the same on every node, without talking to the others:

- ranks are dealt to nodes in node-list order, a block per node (srun's default `block`
  distribution): node 1 gets ranks 0..n1-1, node 2 the next n2, and so on;
- a task listens on `port_base + its position among the tasks of its node`;
- jobs take contiguous slices of the ranks in RANK_ORDER: ps:0.., then the chief and the
  evaluator of a coordinator run (one task each, where the spec has them), then worker:0... A TF1
  spec is ps:0.. then worker:0.. (worker:0, its chief, is rank num_ps), as it always was; in a
  coordinator run the chief is rank num_ps, the evaluator (if any) rank num_ps + 1, and worker:0
  (no chief there: it only serves) the next rank.

Why the tasks that take no GPU first and the workers last: a job whose workers ask for GPUs is a
heterogeneous Slurm job, ranks numbered across its components in order (launch/render/sbatch.py);
with every GPU-less task before the workers it needs two components, one asking no GPU and one
asking each worker's, whatever roles the spec has. The ps stay first, so a TF1 layout is unchanged.

These are the rules of TensorFlow's SlurmClusterResolver, with one difference: it sorts the node
names as strings, which puts node10 before node9, while Slurm numbers ranks in its own node-list
order; this module follows the node list as Slurm gives it, so a task's computed place is where
srun really put it (checked against SLURMD_NODENAME and SLURM_LOCALID when they are set).

Pure: an environment mapping in, tasks out; nothing is read from the system.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from cluster.spec import JOBS, ClusterSpec, TaskSpec
from cluster.spec.model import emptied

DEFAULT_PORT_BASE = 8888        # as TensorFlow's SlurmClusterResolver
RANK_ORDER = ('ps', 'chief', 'evaluator', 'worker')     # the jobs' slices of the ranks, in order


class SlurmEnvError(ValueError):
    """Slurm's environment does not describe a step this spec can run in; one line."""


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets: 'a[1,2],b' -> ['a[1,2]', 'b']."""
    parts, depth, current = [], 0, ''
    for c in text:
        if c == '[':
            depth += 1
            if depth > 1:
                raise ValueError('nested "["')
        elif c == ']':
            depth -= 1
            if depth < 0:
                raise ValueError('"]" without "["')
        if c == ',' and depth == 0:
            parts.append(current)
            current = ''
        else:
            current += c
    if depth:
        raise ValueError('"[" without "]"')
    parts.append(current)
    if any(not p for p in parts):
        raise ValueError('an empty name')
    return parts


def _expand_range(body: str) -> list[str]:
    """'01-03,7' -> ['01', '02', '03', '7']: a range keeps the zero padding of its first number."""
    out = []
    for item in body.split(','):
        low, sep, high = item.partition('-')
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f'bad range {item!r}')
        if not sep:
            out.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f'range {item!r} goes down')
        out.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list -> host names, in order, duplicates kept:
    'node[01-03,7],gpu1' -> ['node01', 'node02', 'node03', 'node7', 'gpu1']. Several bracket
    groups in one name multiply out, the leftmost varying slowest ('r[1-2]n[1-2]' -> r1n1, r1n2,
    r2n1, r2n2). Raises ValueError (one line) on text that is not a host list."""
    hosts: list[str] = []
    try:
        for part in _split_top(text.strip()):
            names, pos = [''], 0
            for m in re.finditer(r'\[([^\]]*)\]', part):
                literal = part[pos:m.start()]
                names = [n + literal + v for n in names for v in _expand_range(m.group(1))]
                pos = m.end()
            hosts.extend(n + part[pos:] for n in names)
    except ValueError as e:
        raise ValueError(f'not a Slurm host list: {text!r} ({e})') from None
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks-per-node list -> one count per node: '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.strip().split(','):
        m = re.fullmatch(r'(\d+)(?:\(x(\d+)\))?', part.strip())
        if m is None:
            raise ValueError(f'not a Slurm tasks-per-node list: {text!r} (expected e.g. "2(x3),1")')
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


@dataclasses.dataclass(frozen=True)
class Placement:
    """One rank's place: its node, its position among that node's tasks, and its port."""
    rank: int
    host: str
    local: int
    port: int


def placements(hosts: list[str], counts: list[int], port_base: int) -> list[Placement]:
    """Every rank of a step, block-distributed over `hosts` (`counts[i]` tasks on hosts[i])."""
    out: list[Placement] = []
    for host, count in zip(hosts, counts):
        out.extend(Placement(len(out), host, local, port_base + local) for local in range(count))
    return out


def job_of(rank: int, num_ps: int) -> tuple[str, int]:
    """A TF1 spec's slices: ranks 0..num_ps-1 are the ps tasks, the rest the workers. (With a chief
    or an evaluator, ask rank_tasks.)"""
    return ('ps', rank) if rank < num_ps else ('worker', rank - num_ps)


def rank_tasks(spec: ClusterSpec) -> tuple[tuple[str, int], ...]:
    """(job, index) of every rank of the step, rank 0 first: each job of RANK_ORDER the spec has,
    a contiguous slice each (see the module doc)."""
    return tuple((job, index) for job in RANK_ORDER for index in range(len(spec.job_tasks(job))))


def rank_task(spec: ClusterSpec, rank: int) -> tuple[str, int]:
    """(job, index) of one rank (IndexError outside the step)."""
    return rank_tasks(spec)[rank]


def counts_text(spec: ClusterSpec) -> str:
    """'1 ps + 2 worker(s)', '1 chief + 1 ps + 2 worker(s) + 1 evaluator': the spec's tasks, for messages."""
    parts = [f'{len(spec.job_tasks(job))} {job}' + ('(s)' if job == 'worker' else '')
             for job in JOBS if spec.job_tasks(job)]
    return ' + '.join(parts)


def _get(env: Mapping[str, str], *names: str) -> str:
    for name in names:
        if env.get(name):
            return env[name]
    raise SlurmEnvError(f'${names[0]} is not set: not inside an srun job step (start the tasks with '
                        '`srun`, as the batch script of `launch render --format sbatch` does)')


def resolve(spec: ClusterSpec, env: Mapping[str, str],
            port_base: int = DEFAULT_PORT_BASE) -> tuple[ClusterSpec, TaskSpec]:
    """The spec with every task at its Slurm host and port, and this process's task. The spec's
    task counts decide the layout (rank_tasks); its hosts and ports are replaced. Raises
    SlurmEnvError (one line) when the environment is not an srun step of as many tasks as the spec has."""
    if not (env.get('SLURM_STEP_ID') or env.get('SLURM_STEPID')):    # the batch script's own shell
        raise SlurmEnvError('$SLURM_STEP_ID is not set: not inside an srun job step (the batch script '
                            'itself is no task: start the tasks with `srun`, as the script of '
                            '`launch render --format sbatch` does)')
    rank_text = _get(env, 'SLURM_PROCID')
    try:
        rank = int(rank_text)
        hosts = expand_hostlist(_get(env, 'SLURM_STEP_NODELIST', 'SLURM_JOB_NODELIST', 'SLURM_NODELIST'))
        counts = expand_tasks_per_node(_get(env, 'SLURM_STEP_TASKS_PER_NODE', 'SLURM_TASKS_PER_NODE'))
    except ValueError as e:
        if isinstance(e, SlurmEnvError):
            raise
        raise SlurmEnvError(f'Slurm environment: {e}') from None
    if len(hosts) != len(counts):
        raise SlurmEnvError(f'Slurm environment: {len(hosts)} node(s) ({",".join(hosts)}) but tasks per node '
                            f'for {len(counts)} ({",".join(map(str, counts))})')
    layout = rank_tasks(spec)
    wanted = len(layout)
    total = sum(counts)
    if total != wanted:
        raise SlurmEnvError(f'{spec.path}: the Slurm step has {total} task(s) but the spec has {counts_text(spec)} '
                            f'= {wanted}: run it with `srun --ntasks={wanted}`')
    if not 0 <= rank < total:
        raise SlurmEnvError(f'Slurm environment: SLURM_PROCID={rank} is outside the step\'s {total} task(s)')
    if not 1 <= port_base <= 65536 - max(counts):
        raise SlurmEnvError(f'port base {port_base}: the ports {port_base}..{port_base + max(counts) - 1} '
                            'must lie in 1..65535')
    places = placements(hosts, counts, port_base)
    mine = places[rank]
    node, local = env.get('SLURMD_NODENAME'), env.get('SLURM_LOCALID')
    if (node and node != mine.host) or (local and local.isdigit() and int(local) != mine.local):
        raise SlurmEnvError(f'Slurm put rank {rank} on {node} as local task {local}, but block order puts it on '
                            f'{mine.host} as local task {mine.local}: start the step with '
                            '`srun --distribution=block`')
    by_rank = [TaskSpec(*layout[p.rank], p.host, p.port) for p in places]
    tasks = tuple(sorted(by_rank, key=lambda t: (JOBS.index(t.job), t.index)))    # the spec's own order
    placed = dataclasses.replace(spec, tasks=tasks, hosts=emptied(spec.hosts))
    return placed, by_rank[rank]
