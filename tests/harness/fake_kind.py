"""A backend that exists only in the tests: a launch/backends/kind.py Kind with a flag of its own,
capabilities set apart from every real backend's, and planning borrowed from `local`. `listed`
adds it to the registry for one test, as a contributor's one line in launch/run/registry.py would."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from cluster.spec import ClusterSpec, TaskSpec
from launch.backends.kind import FlagPlace, Kind, Options
from launch.backends.ssh import host_plans
from launch.planning.plan import TaskPlan
from launch.run import registry


@dataclass(frozen=True)
class FakeOptions:
    zone: str | None = None


class FakeKind(Kind):
    """Runs nothing: enough to be listed, planned, offered on the command line and judged by the pre-flight."""
    name = 'fake'
    summary = 'fake: a backend of the tests'
    on_this_machine = False
    netns_refusal = 'isolation: netns is not for the fake backend'
    user_code_refusal = 'the fake backend cannot run {code}'
    ships = ('examples',)
    exclusive = ('zone',)
    options_label = 'fake runs'

    def add_flags(self, parser: argparse.ArgumentParser, place: FlagPlace) -> None:
        if place is FlagPlace.UP:
            parser.add_argument('--fake-zone', dest='zone', metavar='ZONE', help='with --backend fake: where it runs')

    def read_flags(self, args: argparse.Namespace) -> FakeOptions:
        return FakeOptions(getattr(args, 'zone', None))

    def plan(self, spec: ClusterSpec, addresses: dict[str, str], counts: dict[str, int]) -> tuple[TaskPlan, ...]:
        return tuple(dataclasses.replace(p, backend=self.name) for p in host_plans(spec, addresses, counts))

    def where(self, plan: TaskPlan, task: TaskSpec, opts: Options) -> str:
        return f'fake zone {opts.of(self.name, FakeOptions).zone}'


class OpenFakeKind(FakeKind):
    """The fake, refusing nothing and running its tasks here."""
    name = 'openfake'
    on_this_machine = True
    netns_refusal = ''
    user_code_refusal = ''


def listed(monkeypatch, *kinds: Kind) -> None:
    """The registry with `kinds` added after the real backends, for one test."""
    monkeypatch.setattr(registry, 'BACKENDS', registry.BACKENDS + kinds)
    monkeypatch.setattr(registry, 'KINDS', {**registry.KINDS, **{k.name: k for k in kinds}})
