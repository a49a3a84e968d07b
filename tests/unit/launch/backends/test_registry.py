"""A backend is one unit (launch/backends/kind.py): every backend the registry lists declares its
capabilities and its flags, the registry is only the list, and a backend added to the list gets
its flags onto the command line and is refused or accepted by the pre-flight by what it declares,
with no other file touched (the fake of tests/harness/fake_kind.py)."""
from __future__ import annotations

import argparse
import ast
import contextlib
import io
from pathlib import Path

import pytest

from cluster.spec import SpecError, load_spec
from launch import cli
from launch.backends.kind import DELEGATED, SUPERVISED, FlagPlace, Kind, Mode, Options
from launch.errors import UsageError
from launch.run import launching, preflight, registry
from tests.harness.fake_kind import FakeKind, FakeOptions, OpenFakeKind, listed

REPO = Path(__file__).resolve().parents[4]
CAPABILITIES = ('on_this_machine', 'logs_here', 'isolates_ports', 'remembered', 'leaves_resources')


def _spec(tmp_path: Path, **train: object) -> str:
    lines = ['cluster:', '  ps: [localhost:2222]', '  worker: [localhost:2223, localhost:2224]', 'train:',
             f'  train_dir: {tmp_path / "run"}', '  data: synthetic']
    lines += [f'  {key}: {value}' for key, value in train.items()]
    path = tmp_path / 'spec.yaml'
    path.write_text('\n'.join(lines) + '\n')
    return str(path)


def _help(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        cli.parse_args(argv + ['--help'])
    return out.getvalue()


@pytest.mark.parametrize('kind', registry.BACKENDS, ids=lambda k: k.name)
def test_every_backend_declares_its_capabilities_and_its_flags(kind):
    assert isinstance(kind, Kind) and kind.name and isinstance(kind.mode, Mode)
    assert type(kind).__module__ == f'launch.backends.{kind.name}', 'a backend is its folder: launch/backends/<name>/'
    assert all(isinstance(getattr(kind, c), bool) for c in CAPABILITIES)
    assert '{code}' in kind.user_code_refusal or not kind.user_code_refusal
    for place in FlagPlace:
        parser = argparse.ArgumentParser()
        kind.add_flags(parser, place)
        own = kind.read_flags(parser.parse_args([]))
        assert all(hasattr(own, f) for f in kind.exclusive), 'its exclusive options are fields of its options'
    assert bool(kind.exclusive) == bool(kind.options_label)
    if kind.mode == SUPERVISED:
        assert kind.plan(load_spec(str(REPO / 'specs' / 'local2.yaml')), {}, {})
    else:
        assert kind.mode == DELEGATED and kind.plan(load_spec(str(REPO / 'specs' / 'local2.yaml')), {}, {}) is None


def test_the_registry_only_lists_the_backends():
    """No class, no backend's name, nothing but the list and the look-ups by name."""
    tree = ast.parse((REPO / 'launch' / 'run' / 'registry.py').read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    assert {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} == {'names', 'kind', 'remembered'}
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not literals & set(registry.KINDS)
    assert registry.names() == tuple(k.name for k in registry.BACKENDS) and len(set(registry.names())) == 5
    assert registry.kind(None) is registry.KINDS[registry.DEFAULT]


def test_a_backend_added_to_the_list_gets_its_flags_into_the_command_line(monkeypatch, tmp_path):
    before = _help(['up'])
    assert '--fake-zone' not in before
    listed(monkeypatch, FakeKind())
    after = _help(['up'])
    assert '--fake-zone ZONE' in after and 'with --backend fake: where it runs' in after
    assert '{local,ssh,compose,slurm,ray,fake}' in after and 'fake: a backend of the tests' in ' '.join(after.split())
    assert '--fake-zone' not in _help(['plan']), 'only where the backend adds it'
    spec = _spec(tmp_path)
    opts = cli.options(cli.parse_args(['up', spec, '--backend', 'fake', '--fake-zone', 'z1']))
    assert opts.of('fake', FakeOptions) == FakeOptions('z1')
    plans = launching.plans(load_spec(spec), 'fake', opts)
    assert {p.backend for p in plans} == {'fake'}
    assert registry.kind('fake').where(plans[0], plans[0].task, opts) == 'fake zone z1'


def test_its_own_flags_are_refused_for_another_backend(monkeypatch, tmp_path):
    listed(monkeypatch, FakeKind())
    spec = load_spec(_spec(tmp_path))
    given = Options({'fake': FakeOptions('z1')})
    with pytest.raises(UsageError, match=r'^--zone is for fake runs: add --backend fake, or drop it$'):
        launching.check_options(spec, 'up', None, given)
    launching.check_options(spec, 'up', 'fake', given)


def test_the_preflight_refuses_or_accepts_a_new_backend_by_its_capabilities(monkeypatch, tmp_path):
    listed(monkeypatch, FakeKind(), OpenFakeKind())
    spec = load_spec(_spec(tmp_path), ['isolation=netns'])
    with pytest.raises(UsageError, match='isolation: netns is not for the fake backend'):
        preflight.check_isolation(spec, 'plan', 'fake')
    preflight.check_isolation(spec, 'plan', 'openfake')
    missing = load_spec(_spec(tmp_path), ['train.command=[/no/such/program, --flag]'])
    with pytest.raises(SpecError, match='the fake backend cannot run /no/such/program'):
        launching.check_user_code_place(missing, 'plan', 'fake')
    launching.check_user_code_place(missing, 'plan', 'openfake')
    # Where its tasks run decides whether the program must be found here.
    preflight.check_user_code(missing, launching.plans(missing, 'fake', Options()))
    with pytest.raises(SpecError, match='/no/such/program'):
        preflight.check_user_code(missing, launching.plans(missing, 'openfake', Options()))
