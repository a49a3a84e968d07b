"""What a task starts with on a Ray node (launch/backends/ray/childenv.py): the environment it takes
from the actor that starts it, its Python and working directory, and the machine key; and that none
of the Ray backend's pure modules imports Ray, so they load where it is not installed."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from cluster.runtime.messages import CHANNEL_ENV, channel_beside
from launch.backends.ray import childenv
from launch.backends.ray.childenv import child_cwd, child_env, child_python, machine_key, read_machine_key

# An actor's environment as Ray 2.60 leaves it in a worker process (abridged), with the node's own.
ACTOR = {'PATH': '/opt/venv/bin:/usr/bin', 'HOME': '/home/ray', 'LANG': 'C.UTF-8', 'PYTHONPATH': '/srv/code',
         'VIRTUAL_ENV': '/opt/venv', 'TFCLUSTER_PROFILE': '1', 'OMP_NUM_THREADS': '1',
         'RAY_RAYLET_PID': '4242', 'RAY_NODE_ID': 'ab' * 14, 'RAY_ADDRESS': '127.0.0.1:6379',
         'RAY_JOB_ID': '01000000', 'CUDA_VISIBLE_DEVICES': '0,1,2,3', 'SECRET_TOKEN': 'x'}
PLAN = {'PYTHONUNBUFFERED': '1', 'TF_CONFIG': '{"cluster": {}}', 'RUN_ENV': 'mine'}
LOG = 'runs/r/logs/worker-0.log'


def test_the_task_takes_what_a_local_task_would_of_the_actor():
    env = child_env(ACTOR, PLAN, [], LOG)
    assert {k: env[k] for k in ('PATH', 'HOME', 'LANG', 'PYTHONPATH', 'VIRTUAL_ENV', 'TFCLUSTER_PROFILE')} == \
        {k: ACTOR[k] for k in ('PATH', 'HOME', 'LANG', 'PYTHONPATH', 'VIRTUAL_ENV', 'TFCLUSTER_PROFILE')}
    assert not [k for k in env if k.startswith('RAY_') or k == 'SECRET_TOKEN']
    assert {k: env[k] for k in PLAN} == PLAN


def test_rays_thread_count_is_dropped_unless_the_spec_sets_one():
    assert 'OMP_NUM_THREADS' not in child_env(ACTOR, PLAN, [], LOG)
    assert child_env(ACTOR, {**PLAN, 'OMP_NUM_THREADS': '8'}, [], LOG)['OMP_NUM_THREADS'] == '8'


def test_the_plan_wins_over_the_actor():
    assert child_env(ACTOR, {'PATH': '/usr/local/bin'}, [], LOG)['PATH'] == '/usr/local/bin'


@pytest.mark.parametrize('gpu_ids, visible', [
    ([], ''),               # no GPU asked: none seen, though the actor's variable names four
    (['2'], '2'),
    (['0', '3'], '0,3'),    # Ray's ids, in the order it gave them
    ([1, 2], '1,2'),        # ids as numbers, as older Rays gave them
])
def test_the_task_sees_the_gpus_ray_gave_its_actor_and_no_other(gpu_ids, visible):
    assert child_env(ACTOR, PLAN, gpu_ids, LOG)['CUDA_VISIBLE_DEVICES'] == visible


def test_the_channel_lies_beside_the_log():
    assert child_env(ACTOR, PLAN, [], LOG)[CHANNEL_ENV] == channel_beside(LOG)


def test_the_hosts_python_else_the_actors():
    assert child_python('/opt/tf/bin/python', '/usr/bin/python3') == '/opt/tf/bin/python'
    assert child_python(None, '/usr/bin/python3') == '/usr/bin/python3'


@pytest.mark.parametrize('shared, workdir, cwd', [
    (True, 'ignored', '/work/project'),         # a shared filesystem: where the launcher runs
    (False, None, '/home/ray/tfcluster'),       # as over SSH: tfcluster in the home
    (False, 'jobs/tf', '/home/ray/jobs/tf'),
    (False, '~/jobs', '/home/ray/jobs'),        # the node's home, not the launcher's
    (False, '~', '/home/ray'),
    (False, '/scratch/tf', '/scratch/tf'),
])
def test_where_the_task_runs(shared, workdir, cwd):
    assert child_cwd(shared, '/work/project/', workdir, '/home/ray') == cwd


def test_the_machine_key_is_the_boot_and_the_network_namespace(tmp_path):
    assert machine_key('1f0e-77\n', 'net:[4026531840]') == '1f0e-77/net:[4026531840]'
    (tmp_path / 'sys' / 'kernel' / 'random').mkdir(parents=True)
    (tmp_path / 'sys' / 'kernel' / 'random' / 'boot_id').write_text('5e1d-ab\n')
    (tmp_path / 'self' / 'ns').mkdir(parents=True)
    os.symlink('net:[4026532001]', tmp_path / 'self' / 'ns' / 'net')
    assert read_machine_key(str(tmp_path)) == '5e1d-ab/net:[4026532001]'


def test_no_pure_module_of_the_ray_backend_imports_ray():
    """Ray takes over a second to import and may be missing: only the modules that talk to a
    cluster may import it, and those not at module level. The pure ones never do."""
    package = Path(childenv.__file__).parent
    offenders = []
    for path in sorted(package.glob('*.py')):
        if path.stem not in ('__init__', 'nodes', 'childenv'):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ''] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            offenders += [f'{path.name}:{node.lineno}: {n}' for n in names if n.split('.')[0] == 'ray']
    assert offenders == []
