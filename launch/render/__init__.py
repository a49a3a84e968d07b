"""The renderers: every format `launch render` writes, by name, with what each reads.

A renderer is a pure function, spec and options in, text out. `launch render` and its help ask
this table, never a format's name: a new format is one module plus one entry here. (The compose
file, launch/render/compose.py, is `launch compose`'s and the compose backend's: it renders task
plans, not a spec with options, and is no entry here.)
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

from cluster.spec import ClusterSpec
from launch.render import jobset, sbatch, tfjob, trainjob
from launch.render.options import RenderOptions

__all__ = ['KUBERNETES_ONLY', 'RENDERERS', 'RenderOptions', 'Renderer', 'option_refusal', 'takers']

_SLURM = ('name', 'partition', 'time_limit', 'port_base')
_KUBERNETES = ('name', 'image', 'namespace', 'pvc')
KUBERNETES_ONLY = ('pvc', 'image', 'namespace')     # refused by the other formats, in this order


@dataclass(frozen=True)
class Renderer:
    name: str                                               # the --format value
    render: Callable[[ClusterSpec, RenderOptions], str]
    description: str                                        # one clause of --format's help
    options: tuple[str, ...]                                # the RenderOptions fields it reads


RENDERERS: dict[str, Renderer] = {r.name: r for r in (
    Renderer('sbatch', sbatch.render, 'a Slurm batch script (`launch up --backend slurm` submits it)', _SLURM),
    Renderer('jobset', jobset.render, 'a Kubernetes JobSet (jobset.x-k8s.io/v1alpha2) to `kubectl apply -f`',
             _KUBERNETES),
    Renderer('trainjob', trainjob.render, 'a Kubeflow Trainer v2 TrainingRuntime and TrainJob to `kubectl apply -f`',
             _KUBERNETES),
    Renderer('tfjob', tfjob.render, 'a Kubeflow TFJob (kubeflow.org/v1, Training Operator 1.9) to `kubectl apply -f`',
             _KUBERNETES),
)}


def takers(option: str) -> tuple[str, ...]:
    """The formats that read `option` (a RenderOptions field), in the table's order."""
    return tuple(name for name, r in RENDERERS.items() if option in r.options)


def option_refusal(name: str, opts: RenderOptions) -> str | None:
    """One line about a Kubernetes-only option given to another format, else None. (The Slurm
    options given to a Kubernetes format are unused, not refused.)"""
    for option in KUBERNETES_ONLY:
        if option not in RENDERERS[name].options and getattr(opts, option) is not None:
            return (f'--{option} is for the Kubernetes formats ({", ".join(takers(option))}), '
                    f'not --format {name}')
    return None
