"""What a task starts with on a Ray node (launch/backends/ray/childenv.py): its Python and working
directory, and the machine key; and that none of the Ray backend's pure modules imports Ray, so
they load where it is not installed."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from launch.backends.ray import childenv
from launch.backends.ray.childenv import child_cwd, child_python, machine_key, read_machine_key


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
