"""What a task's process starts with on a Ray node: its environment, its Python, its working
directory, and the key that tells which machine it runs on. The actor that starts the task is a Ray
worker process, whose environment Ray has filled for the actor, not for the task; these decide
what of it the task keeps.

Pure, so that the rules are tested here without Ray: the actor passes in its own environment, its
GPU ids and paths, and starts the task with what comes out.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from cluster.runtime.messages import channel_env
from launch.backends.local.backend import inherited
from launch.planning.plan import DEFAULT_REMOTE_WORKDIR

# What Ray sets in an actor's process for the actor's own sake, which a task must not take with it:
# OMP_NUM_THREADS is the actor's CPUs (1 for most tasks), and would hold TensorFlow's thread pools
# to one thread. A spec that sets one of these still gets its value (the plan's env).
RAY_SETS = ('OMP_NUM_THREADS',)
GPUS_ENV = 'CUDA_VISIBLE_DEVICES'


def child_env(actor_environ: Mapping[str, str], plan_env: Mapping[str, str], gpu_ids: Sequence[str],
              log_path: str) -> dict[str, str]:
    """The task's environment: what a local task would take of the actor's environment
    (local.backend.inherited) less RAY_SETS, then the plan's (the spec's `env` and the launcher's
    own variables), then the GPUs Ray gave the actor, and the channel beside `log_path`.

    CUDA_VISIBLE_DEVICES is always set: to the GPU ids Ray gave the actor, or empty when it gave
    none. Ray leaves the variable alone in an actor that asked for no GPU, and a ps started with
    it unset would see, and take memory on, every GPU of the node."""
    env = {name: value for name, value in inherited(actor_environ).items() if name not in RAY_SETS}
    env.update(plan_env)
    env[GPUS_ENV] = ','.join(str(i) for i in gpu_ids)
    env.update(channel_env(log_path))
    return env


def child_python(configured: str | None, actor_python: str) -> str:
    """The Python that runs the task: the host's `python` in the spec, else the one that runs the
    actor (the node's Ray runs in it, so it is there; tfcluster and TensorFlow must be too)."""
    return configured or actor_python


def child_cwd(shared: bool, launcher_cwd: str, workdir: str | None, home: str) -> str:
    """Where the task runs. On a node that shares the launcher's filesystem, where the launcher
    runs, so the spec's relative paths (the train_dir, the data) mean the same files; elsewhere the
    host's `workdir` (absolute, or relative to `home`: `~/` may begin it), else
    DEFAULT_REMOTE_WORKDIR in `home`, as over SSH. `home` is the node's, not the launcher's."""
    if shared:
        return os.path.abspath(launcher_cwd)
    where = workdir or DEFAULT_REMOTE_WORKDIR
    if where == '~' or where.startswith('~/'):
        where = where[2:]
    return os.path.normpath(os.path.join(home, where))


def machine_key(boot_id: str, net_namespace: str) -> str:
    """One key per machine and network namespace, which Ray's node ids are not: several nodes of
    one machine (127.0.0.1, .2, .3 in the tests) share its ports, since TensorFlow binds every
    address, so tasks with the same key need distinct ports. `net_namespace` is the link
    /proc/self/ns/net points to ('net:[4026531840]')."""
    return f'{boot_id.strip()}/{net_namespace.strip()}'


def read_machine_key(proc: str = '/proc') -> str:
    """This process's machine_key, read from `proc` (the actor calls it on its node)."""
    with open(os.path.join(proc, 'sys', 'kernel', 'random', 'boot_id'), encoding='ascii') as f:
        boot_id = f.read()
    return machine_key(boot_id, os.readlink(os.path.join(proc, 'self', 'ns', 'net')))
