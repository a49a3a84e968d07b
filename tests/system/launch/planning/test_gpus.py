"""GPU slots and task environments: the planner's tables (launch/planning/gpus.py), the spec's `env:`,
`tasks:` and `gpus:` sections, and how each renderer passes them on. Pure: no processes, except
`launch plan` itself and docker-compose's own validation of a rendered file."""
import os
import shutil
import subprocess

import pytest
import yaml

from launch.render import sbatch as slurm
from launch.render.compose import render as render_compose
from launch.planning.plan import compose_spec, plan_compose
from tests.harness.gpus import Args, spec_of


# -- the renderers ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_compose_reserves_each_workers_gpus_and_passes_env(tmp_path):
    spec = spec_of(tmp_path, ['localhost:2223', 'localhost:2224'], ['gpu:0', 'gpu:1'], {'localhost': 4},
                   extra={'env': {'FOO': 'a $b "c"'}})
    text = render_compose(compose_spec(spec), list(plan_compose(spec)))
    services = yaml.safe_load(text)['services']
    devices = {name: s.get('deploy', {}).get('resources', {}).get('reservations', {}).get('devices')
               for name, s in services.items()}
    assert devices['ps-0'] is None
    assert devices['worker-0'] == [{'driver': 'nvidia', 'device_ids': ['0', '1'], 'capabilities': ['gpu']}]
    assert devices['worker-1'] == [{'driver': 'nvidia', 'device_ids': ['2', '3'], 'capabilities': ['gpu']}]
    assert services['worker-1']['environment']['CUDA_VISIBLE_DEVICES'] == '0,1'
    assert all(s['environment']['FOO'] == 'a $$b "c"' for s in services.values())    # $$: compose's literal $
    if shutil.which('docker-compose') is None:
        print('docker-compose is not installed: the file was not validated by it')
        return
    path = tmp_path / 'compose.yaml'
    path.write_text(text)
    checked = subprocess.run(['docker-compose', '-f', str(path), '--project-directory', str(tmp_path), 'config'],
                             capture_output=True, text=True, timeout=60, env={**os.environ, 'TFCLUSTER_USER': '0:0'})
    assert checked.returncode == 0, checked.stderr
    resolved = yaml.safe_load(checked.stdout)['services']
    assert resolved['worker-1']['deploy']['resources']['reservations']['devices'][0]['device_ids'] == ['2', '3']
    assert resolved['worker-0']['environment']['FOO'] == 'a $$b "c"'     # as it reads the file: $$ is one $


@pytest.mark.slow
def test_sbatch_exports_the_env_of_every_task_and_of_each_job(tmp_path):
    spec = spec_of(tmp_path, ['localhost:2223'], extra={'env': {'A': "it's"}, 'tasks': {'ps': {'env': {'P': '1'}}}})
    script = slurm.render(spec, Args())
    assert "export A='it'\"'\"'s'" in script.splitlines()
    wrapper = slurm.rank_wrapper(slurm.exports(spec.job_env['ps']))
    assert 'trap "" TERM; export P=1; else' in wrapper
    out = subprocess.run(['bash', '-c', wrapper, 'tfcluster-task', '1', str(tmp_path), 'sh', '-c', 'echo "$P"'],
                         env={**os.environ, 'SLURM_PROCID': '0'}, check=True)
    assert out.returncode == 0 and (tmp_path / 'ps-0.log').read_text() == '1\n'


@pytest.mark.slow
@pytest.mark.parametrize('given, seen', [('3,4', '3,4'), (None, '')])
def test_a_slurm_worker_keeps_the_gpus_slurm_bound_to_it_and_none_else(tmp_path, given, seen):
    wrapper = slurm.rank_wrapper(slurm.PS_GPUS, slurm.WORKER_GPUS)
    env = {k: v for k, v in os.environ.items() if k != 'CUDA_VISIBLE_DEVICES'}
    env.update({'SLURM_PROCID': '1', **({'CUDA_VISIBLE_DEVICES': given} if given else {})})
    subprocess.run(['bash', '-c', wrapper, 'tfcluster-task', '1', str(tmp_path), 'sh', '-c',
                    'echo "${CUDA_VISIBLE_DEVICES-unset}"'], env=env, check=True)
    assert (tmp_path / 'worker-0.log').read_text() == f'{seen}\n'

