"""What the launcher knows of the Ray backend without Ray running (launch/backends/ray/__init__.py,
connect.py, placement.py): its flag and the refusals before any connection, the plans before
placement, the placement group's bundles, the spec as placed, and that no module of the package
imports Ray when loaded (Ray takes over a second to import; other commands need none of it)."""
from __future__ import annotations

import ast
import socket
import sys
from pathlib import Path

import pytest

from cluster.runtime.contract import TASK_MODULE
from cluster.spec import load_spec
from launch.backends.kind import Options
from launch.backends.ray import Ray, RayOptions, connect, plan_ray
from launch.backends.ray.nodes import HostPlace, How, NodeFacts
from launch.backends.ray.placement import Where, placed_spec, wheres
from launch.errors import UsageError
from tests.harness.documented import check_documented

PACKAGE = Path(__file__).resolve().parents[5] / 'launch' / 'backends' / 'ray'


def _spec(tmp_path, text: str):
    path = tmp_path / 'spec.yaml'
    path.write_text(text)
    return load_spec(str(path))


SPEC = ('cluster:\n  ps: [localhost:2222]\n  worker: ["127.0.0.2:2223", "127.0.0.3:2224"]\n'
        'train: {steps: 5, devices: 2, train_dir: runs/r}\n')


def test_no_module_of_the_package_imports_ray_when_loaded():
    for module in PACKAGE.glob('*.py'):
        tree = ast.parse(module.read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
        froms = {n.module for n in top if isinstance(n, ast.ImportFrom)}
        assert not {n for n in names | froms if n and (n == 'ray' or n.startswith('ray.'))}, module.name


def test_the_address_comes_from_the_flag_then_the_environment_else_the_run_starts_its_own(monkeypatch):
    monkeypatch.delenv('RAY_ADDRESS', raising=False)
    assert connect.address_given(None) == (None, '')
    monkeypatch.setenv('RAY_ADDRESS', '10.0.0.5:6379')
    assert connect.address_given(None) == ('10.0.0.5:6379', 'RAY_ADDRESS')
    assert connect.address_given('127.0.0.1:1') == ('127.0.0.1:1', '--ray-address')


def test_a_ray_client_address_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv('RAY_ADDRESS', raising=False)
    line = Ray().check(_spec(tmp_path, SPEC), Options({'ray': RayOptions('ray://head:10001')}))
    assert line is not None and '\n' not in line
    assert line.startswith('--ray-address ray://head:10001: Ray Client addresses are not supported')
    check_documented('ray-client-address', line)


def test_without_ray_installed_the_line_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(connect, 'installed', lambda: False)
    line = Ray().unsupported('up', _spec(tmp_path, SPEC))
    assert line == f"--backend ray needs Ray, which is not installed for {sys.executable}: {connect.EXTRA}"
    check_documented('ray-not-installed', line)
    assert Ray().unsupported('plan', _spec(tmp_path, SPEC)) is None     # planning needs no Ray


def test_nothing_at_the_address_is_one_line_naming_it():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]       # bound, not listening: refused
        with pytest.raises(UsageError) as e:
            connect.answers(f'127.0.0.1:{port}', '--ray-address')
    assert str(e.value).startswith(f'no Ray cluster answers at 127.0.0.1:{port} (--ray-address): ')
    check_documented('ray-no-cluster', str(e.value))


def test_the_plans_run_the_task_module_in_the_launchers_folder_with_no_gpus_of_their_own(tmp_path):
    plans = plan_ray(_spec(tmp_path, SPEC), str(tmp_path))
    assert [p.backend for p in plans] == ['ray'] * 3
    assert all(p.cwd == str(tmp_path) and TASK_MODULE in p.argv for p in plans)
    assert all('CUDA_VISIBLE_DEVICES' not in p.env for p in plans)     # the actor sets Ray's GPUs


def test_pinned_tasks_name_their_node_and_the_others_share_a_spread_group(tmp_path):
    spec = _spec(tmp_path, SPEC)
    n2, n3 = NodeFacts('b' * 8, '127.0.0.2', cpus=4), NodeFacts('c' * 8, '127.0.0.3', cpus=4)
    places = {'localhost': HostPlace('localhost', How.GROUP), '127.0.0.2': HostPlace('127.0.0.2', How.NODE, (n2,)),
              '127.0.0.3': HostPlace('127.0.0.3', How.NODE, (n3,))}
    where, bundles = wheres(spec, places)
    assert where == {'ps:0': Where(bundle=0), 'worker:0': Where(node_id='b' * 8), 'worker:1': Where(node_id='c' * 8)}
    assert bundles == [{'CPU': 1.0}]        # a ps asks one CPU, no GPU


def test_the_spec_as_placed_names_each_tasks_node_and_port(tmp_path):
    spec = _spec(tmp_path, SPEC)
    facts = {'ps:0': {'address': '127.0.0.1'}, 'worker:0': {'address': '127.0.0.2'},
             'worker:1': {'address': '127.0.0.3'}}
    placed = placed_spec(spec, facts, {'ps:0': 2222, 'worker:0': 20001, 'worker:1': 2224})
    assert [t.address for t in placed.tasks] == ['127.0.0.1:2222', '127.0.0.2:20001', '127.0.0.3:2224']
    plans = plan_ray(placed, str(tmp_path))
    assert '"127.0.0.2:20001"' in plans[0].env['TF_CONFIG']      # every task's cluster is the placed one


def test_a_run_of_its_own_ray_refuses_a_host_that_is_not_this_machine_before_starting_ray(tmp_path):
    """With no address the run's Ray instance would have one node, this machine: a task pinned
    elsewhere is refused before any Ray process starts."""
    from launch.backends.ray.backend import RayBackend
    spec = _spec(tmp_path, SPEC.replace('127.0.0.2:2223', '127.0.0.9:2223'))
    backend = RayBackend(spec, None)
    with pytest.raises(UsageError) as e:
        backend.place(spec, list(plan_ray(spec, str(tmp_path))), 10)
    assert 'cluster.worker[0]: host 127.0.0.9 is no node of the Ray instance this run starts on this machine' in str(e.value)
    assert backend._ray is None         # nothing joined, nothing started
