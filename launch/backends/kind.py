"""What a backend is to the launcher: one class per backend, in its own folder
(launch/backends/<name>/__init__.py), that carries everything the rest of `launch` asks of it:

- its capabilities (class attributes: where its tasks run, where their logs land, whether it
  isolates their ports, leaves resources behind, what it refuses), which the commands and the
  pre-flight read instead of comparing names;
- its command-line flags (`add_flags`, asked by launch/cli.py) and the typed options it reads
  back from them (`read_flags`), kept per backend in one `Options`;
- how it plans the tasks (`addresses`, `plan`, `where`), what it adds to a task's start
  (`inherits`, `start_text`);
- what runs them: the supervised Backend it makes (`make`), or the strategy of the scheduler it
  hands them to (`delegate`).

launch/run/registry.py only lists these classes; a new backend is its folder plus one line there.
(Anchors: dask-jobqueue's Job subclasses, torchelastic's rendezvous registry.)"""
from __future__ import annotations

import argparse
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from cluster.spec import ClusterSpec, TaskSpec
from launch.backends.base import Backend
from launch.backends.strategy import Strategy
from launch.planning.plan import TaskPlan


class Mode(str, enum.Enum):
    """Who owns a run's tasks: the launcher through a backend, or a scheduler it hands them to."""
    SUPERVISED = 'supervised'
    DELEGATED = 'delegated'

    def __str__(self) -> str:
        return self.value


SUPERVISED, DELEGATED = Mode.SUPERVISED, Mode.DELEGATED


class FlagPlace(str, enum.Enum):
    """Where on the command line a backend's flags go (launch/cli.py asks each backend at each)."""
    SPEC = 'spec'       # every command on a spec or a run, before --backend
    UP = 'up'           # `launch up`, after its own flags
    RENDER = 'render'   # `launch render`, after its own flags (a renderer reads them too)


T = TypeVar('T')


@dataclass(frozen=True)
class Options:
    """Each backend's own options, as it read them from the command line (Kind.read_flags), by
    backend name; a backend that read none has its options' defaults."""
    given: Mapping[str, object] = field(default_factory=dict)

    def of(self, name: str, cls: type[T]) -> T:
        value = self.given.get(name)
        return value if isinstance(value, cls) else cls()


class Kind:
    """One backend: override what differs from these defaults (a supervised backend that runs
    nothing here, logs nowhere here, isolates nothing, takes no flags and plans nothing)."""
    name: ClassVar[str]
    mode: ClassVar[Mode] = SUPERVISED
    summary: ClassVar[str] = ''             # what `--backend`'s help says of it ('': another's summary says it)
    # Capabilities.
    on_this_machine: ClassVar[bool] = False     # its tasks run here: they see this machine's files and ports
    logs_here: ClassVar[bool] = False           # its tasks' logs land in this machine's train_dir
    isolates_ports: ClassVar[bool] = False      # nothing outside reaches its tasks' ports (a private network)
    remembered: ClassVar[bool] = False          # a run remembers it (state file, events): no --backend needed later
    leaves_resources: ClassVar[bool] = False    # stopped tasks leave something (containers, a network) `down` removes
    places: ClassVar[bool] = False              # it picks each task's node and port as the run starts (its records say)
    # Why train.program / train.command / train.evaluator cannot run there ('': they can), with {code}
    # for what is missing, unless it is in one of the folders it holds all the same (`ships`).
    user_code_refusal: ClassVar[str] = ''
    ships: ClassVar[tuple[str, ...]] = ()
    netns_refusal: ClassVar[str] = ''           # why `isolation: netns` cannot apply ('': it can)
    places_by_labels: ClassVar[bool] = False    # it places a host's tasks by its `labels` (others refuse them)
    # It keeps warm standbys (supervise.standby, launch/backends/standby.py); others ignore the key,
    # saying why in `standby_refusal` (one clause: `launch plan` and `up` print it once).
    standbys: ClassVar[bool] = False
    standby_refusal: ClassVar[str] = ''
    # Its tasks' first start forks them from one TensorFlow import per host (Backend.preload).
    zygotes: ClassVar[bool] = False
    # The fields of its options that only it takes (`up` refuses them for another backend), and for what.
    exclusive: ClassVar[tuple[str, ...]] = ()
    options_label: ClassVar[str] = ''           # 'Slurm jobs'

    # -- the command line --------------------------------------------------------------------

    def add_flags(self, parser: argparse.ArgumentParser, place: FlagPlace) -> None:
        """Add its own flags to a command's parser, at `place`."""

    def read_flags(self, args: argparse.Namespace) -> object | None:
        """Its typed options from argparse's namespace (a flag its command lacks: the default); None: it takes none."""
        return None

    def given_exclusive(self, opts: Options) -> str | None:
        """The first of its exclusive options given, as a field name, else None."""
        own = opts.given.get(self.name)
        return next((f for f in self.exclusive if getattr(own, f, None) is not None), None)

    def check(self, spec: ClusterSpec, opts: Options) -> str | None:
        """Why its options' values cannot be used by `up` (one line), else None."""
        return None

    def unsupported(self, command: str, spec: ClusterSpec) -> str | None:
        """Why it cannot serve the command (one line), else None."""
        return None

    # -- planning ----------------------------------------------------------------------------

    def addresses(self, spec: ClusterSpec, opts: Options) -> dict[str, str]:
        """Where tasks reach each spec host (none: as the spec says)."""
        return {}

    def plan(self, spec: ClusterSpec, addresses: dict[str, str], counts: dict[str, int]) -> tuple[TaskPlan, ...] | None:
        """The task plans, with the GPU counts of the hosts where asked; None: it places the tasks itself."""
        return None

    def where(self, plan: TaskPlan, task: TaskSpec, opts: Options) -> str:
        """Where a planned task runs, as `launch plan` says it."""
        return ''

    def inherits(self, plan: TaskPlan) -> Mapping[str, str]:
        """What a task starts with beyond its plan's env (it counts against the OS's limits)."""
        return {}

    def start_text(self, plan: TaskPlan) -> str | None:
        """The text its start sends as one string (over SSH: the remote shell's command), if any."""
        return None

    # -- running -----------------------------------------------------------------------------

    def make(self, spec: ClusterSpec, opts: Options) -> Backend:
        """The supervised Backend that runs its tasks; only a supervised backend has one."""
        raise ValueError(f'the {self.name} backend is {self.mode}: no Backend runs its tasks')

    def delegate(self, spec: ClusterSpec, opts: Options) -> tuple[Strategy[Any], str]:
        """A delegated backend's strategy for `launch up`, and the effective spec its tasks read."""
        raise ValueError(f'the {self.name} backend is {self.mode}: the launcher runs its tasks')
