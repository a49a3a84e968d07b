"""Where a task learns its place (its job, its index, every task's address) when no --job/--index
names it in the spec's cluster: the registry of placement sources `python -m cluster.task --place NAME`
chooses from. `--slurm` and `--jobset` are the old spellings of `--place slurm|jobset`.

A source is a name, the words its help and errors use, and one function from the spec's path, the
`--set` overrides, the environment and the port base to (spec, task). A new scheduler's environment
is one entry here and one pure module beside this one, as `slurm.py` and `jobset.py` are.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cluster.spec import DEFAULT_SPEC, TF_CONFIG_ENV, ClusterSpec, TaskSpec, load_spec, read_tf_config

TF_CONFIG, SLURM, JOBSET = 'tf_config', 'slurm', 'jobset'

Resolve = Callable[[str | None, Sequence[str], Mapping[str, str], int], tuple[ClusterSpec, TaskSpec]]


@dataclass(frozen=True)
class Source:
    what: str           # for --help: what places the task
    where: str          # for errors: `--slurm takes the task from WHERE: drop --job and --index`
    resolve: Resolve


def _tf_config(path: str | None, overrides: Sequence[str], env: Mapping[str, str],
               port_base: int) -> tuple[ClusterSpec, TaskSpec]:
    """TF_CONFIG names the cluster and the task (Kubeflow's TFJob, SageMaker, Vertex); the spec,
    if any, gives the train settings."""
    cluster, job, index = read_tf_config(env[TF_CONFIG_ENV])
    spec = load_spec(path, list(overrides), cluster=cluster)
    return spec, spec.task(job, index)


def _slurm(path: str | None, overrides: Sequence[str], env: Mapping[str, str],
           port_base: int) -> tuple[ClusterSpec, TaskSpec]:
    """The spec's ps/worker counts, placed where srun started the ranks (cluster/env/slurm.py)."""
    from cluster.env import slurm
    return slurm.resolve(load_spec(path or DEFAULT_SPEC, list(overrides)), env, port_base)


def _jobset(path: str | None, overrides: Sequence[str], env: Mapping[str, str],
            port_base: int) -> tuple[ClusterSpec, TaskSpec]:
    """A JobSet pod's labels and variables (cluster/env/jobset.py); the spec, if any, gives the
    train settings."""
    from cluster.env import jobset
    place = jobset.place(env)
    spec = load_spec(path, list(overrides), cluster=place.cluster, cluster_source='the JobSet environment')
    return spec, spec.task(place.job, place.index)


SOURCES: dict[str, Source] = {
    TF_CONFIG: Source('$TF_CONFIG', '$TF_CONFIG', _tf_config),
    SLURM: Source("an srun step's environment", "Slurm's environment", _slurm),
    JOBSET: Source("a JobSet pod's environment", "the JobSet pod's environment", _jobset),
}
