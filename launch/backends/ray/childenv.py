"""What a task's process starts with on a Ray node: its Python, its working directory, and the
key that tells which machine it runs on. (Its environment is a local task's, taken from the actor's
as the local backend takes the launcher's, plus the GPUs Ray gave the actor: actor.py.)

Pure, so that the rules are tested here without Ray: the backend passes in what the actor found
on its node and starts the task with what comes out.
"""
from __future__ import annotations

import os

from launch.planning.plan import DEFAULT_REMOTE_WORKDIR

GPUS_ENV = 'CUDA_VISIBLE_DEVICES'     # set for every task: to the GPUs Ray gave its actor, else empty


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
