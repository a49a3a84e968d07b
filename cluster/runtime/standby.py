"""Warm standbys, the contract between the launcher and `python -m cluster.standby`.

A standby is a process that has already imported TensorFlow and the task runtime, and waits to be
told which task to become. A restart then costs no process start and no import. Each waits in a
slot of a folder on its host (`standby_dir`), through four files:

- `S.ready`: the standby wrote it once it had imported (a `Ready`); it touches it every
  HEARTBEAT_SECS, so a standby whose file is older than FRESH_SECS is frozen or gone: never used;
- `S.become`: the launcher writes it (a `Become`: the task's command line, environment, folder and
  log), whole, under a temporary name first, mode 0600 (the environment may hold hidden values);
- `S.became`: the standby wrote it once it is the task (a `Became`: its pid and where the task's
  lines start in the log). A launcher that sees none within BECOME_SECS kills the standby and
  starts the task cold;
- `S.log`: what the standby printed before it became a task.

What TensorFlow reads at import must be the same in the standby and the task (`import_key`);
everything else of the task's environment (TF_CONFIG, CUDA_VISIBLE_DEVICES, the lease, the
channel) is applied when it becomes the task, before TensorFlow reads it.

Pure: no TensorFlow, nothing started; the launcher imports it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STANDBY_MODULE = 'cluster.standby'
STANDBY_DIR = 'standby'         # under the train_dir, a folder per host (standby_dir)

HEARTBEAT_SECS = 1.0    # how often a waiting standby touches its ready file
FRESH_SECS = 3.0        # a ready file older than this: the standby is frozen, stopped or gone
POLL_SECS = 0.02        # how often a waiting standby looks for its become file
BECOME_SECS = 2.0       # how long the launcher waits for `became` before it starts the task cold

# What TensorFlow (and Python) read at import: a standby serves only a task that agrees on these.
IMPORT_ENV = frozenset({'TF_USE_LEGACY_KERAS', 'KERAS_BACKEND', 'TF_ENABLE_ONEDNN_OPTS', 'LD_LIBRARY_PATH',
                        'LD_PRELOAD', 'PYTHONPATH', 'PYTHONHASHSEED', 'OMP_NUM_THREADS', 'MALLOC_ARENA_MAX'})
IMPORT_PREFIXES = ('TF_CPP_', 'PYTHON', 'CUDA_', 'XLA_', 'TF_XLA_', 'TF_GPU_', 'KMP_', 'GLIBC_')
UNKEYED = frozenset({'CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER'})   # read at the first device use, not import


def import_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment that TensorFlow or Python reads at import (IMPORT_ENV)."""
    return {k: v for k, v in env.items()
            if k not in UNKEYED and (k in IMPORT_ENV or k.startswith(IMPORT_PREFIXES))}


def import_key(python: str, cwd: str, env: Mapping[str, str], keras: bool) -> str:
    """What a standby and the task it becomes must agree on: the interpreter, the folder (the
    import path), the import-time environment, and whether Keras was imported with TensorFlow."""
    text = json.dumps([python, os.path.abspath(cwd), sorted(import_env(env).items()), keras], allow_nan=False)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def standby_dir(train_dir: str, host: str) -> str:
    """The folder of one host's standby slots (a host's own, also where train_dirs are shared)."""
    return os.path.join(train_dir, STANDBY_DIR, host.replace('/', '_'))


@dataclass(frozen=True)
class SlotFiles:
    """The files of one slot (the module's docstring)."""
    ready: str
    become: str
    became: str
    log: str


def slot_files(folder: str, slot: str) -> SlotFiles:
    base = os.path.join(folder, slot)
    return SlotFiles(base + '.ready', base + '.become', base + '.became', base + '.log')


def standby_argv(python: str, folder: str, slot: str, run: str, key: str, keras: bool,
                 lease: str, lease_secs: float) -> tuple[str, ...]:
    """The command line of a standby waiting in `slot` of `folder` for run `run`. It leaves by
    itself once the run's `lease` file (the tasks' lease, LEASE_ENV) is `lease_secs` old, as a
    task does: a launcher that died leaves no standby behind."""
    return (python, '-m', STANDBY_MODULE, '--dir', folder, '--slot', slot, '--run', run, '--key', key,
            '--lease', lease, '--lease-secs', f'{lease_secs:g}') + (('--keras',) if keras else ())


ZYGOTE_MODULE = 'cluster.zygote'
ZYGOTE_READY = 'ready'      # the zygote's first line: {"ready": pid, "imported": secs, "rss_kb": kb}


def zygote_argv(python: str, folder: str, run: str, key: str, keras: bool, lease: str,
                lease_secs: float) -> tuple[str, ...]:
    """The command line of a start-up zygote (cluster/zygote.py) for tasks of import key `key`,
    beside the standbys of its host (`folder`, standby_dir): it imports once and forks each task it
    is sent on its stdin. It leaves on its stdin's end (its launcher closed it, or died) or once the
    run's `lease` is `lease_secs` old. The tasks it forks keep this command line."""
    return (python, '-m', ZYGOTE_MODULE, '--dir', folder, '--run', run, '--key', key, '--lease', lease,
            '--lease-secs', f'{lease_secs:g}') + (('--keras',) if keras else ())


def _record(cls: Any, text: str) -> Any:
    """A record of `cls` from its JSON text; ValueError if it is not one."""
    try:
        data = json.loads(text)
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})
    except (TypeError, AttributeError) as e:
        raise ValueError(f'not a {cls.__name__} record: {e}') from None


@dataclass(frozen=True)
class Ready:
    """A standby that has imported and waits: `imported` seconds its imports took, `rss_kb` its
    peak resident memory then."""
    pid: int
    key: str
    run: str
    imported: float
    rss_kb: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), allow_nan=False)

    @classmethod
    def parse(cls, text: str) -> Ready:
        return _record(cls, text)


@dataclass(frozen=True)
class Become:
    """What the launcher tells a standby: become the task `argv` runs (`python -m cluster.task ...`),
    with exactly `env`, in `cwd`, its output appended to `log`. With `keep_env`, `env` is set over
    the standby's own environment instead of replacing it: a launcher that cannot know the whole
    environment a cold start gets (SSH: what sshd gives a login) sends only the task's names, and
    the standby, started the way a task is, holds the rest already."""
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    log: str
    keep_env: bool = False

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), allow_nan=False)

    @classmethod
    def parse(cls, text: str) -> Become:
        become = _record(cls, text)
        return dataclasses.replace(become, argv=tuple(become.argv))

    def task_args(self) -> list[str]:
        """The task's own arguments (after `python -m cluster.task`); ValueError for another command."""
        argv: Sequence[str] = self.argv
        if len(argv) < 3 or list(argv[1:3]) != ['-m', 'cluster.task']:
            raise ValueError(f'a standby becomes only a cluster.task, not {" ".join(argv[:3])}')
        return list(argv[3:])


@dataclass(frozen=True)
class Became:
    """A standby that is now the task: its pid, and the offset in the log where the task's lines start."""
    pid: int
    offset: int

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), allow_nan=False)

    @classmethod
    def parse(cls, text: str) -> Became:
        return _record(cls, text)
