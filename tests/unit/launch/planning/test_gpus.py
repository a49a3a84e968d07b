"""GPU slots and task environments: the planner's tables (launch/planning/gpus.py), the spec's `env:`,
`tasks:` and `gpus:` sections, and how each renderer passes them on. Pure: no processes, except
`launch plan` itself and docker-compose's own validation of a rendered file."""
import json
import types

import pytest
import yaml

from cluster.spec import SpecError, load_spec
from cluster.task import environment_line
from launch.planning import gpus
from launch.render import sbatch as slurm
from launch.backends.slurm import job as slurm_run
from launch.render import tfjob
from launch.cli import main
from launch.planning.plan import plan_cluster, plan_compose
from tests.harness.gpus import Args, PS, given, spec_of


W = 'worker:'
# (workers' hosts, devices, counts the hosts said, gpus: in the spec) -> each worker's GPUs
TABLE = [
    # one host
    (['h:1'], ['gpu:0'], {'h': 1}, None, {W + '0': (0,)}),
    (['h:1', 'h:2'], ['gpu:0', 'gpu:1'], {'h': 4}, None, {W + '0': (0, 1), W + '1': (2, 3)}),
    (['h:1', 'h:2'], ['gpu:0'], {'h': 2}, None, {W + '0': (0,), W + '1': (1,)}),
    (['h:1', 'h:2'], ['gpu:1'], {'h': 4}, None, {W + '0': (1,), W + '1': (3,)}),
    (['h:1', 'h:2'], ['gpu:0', 'cpu:0'], None, {'h': 2}, {W + '0': (0,), W + '1': (1,)}),
    (['h:1', 'h:2'], 3, {'h': 8}, None, {W + '0': (), W + '1': ()}),
    (['h:1', 'h:2'], ['cpu:0', 'cpu:1'], {'h': 8}, None, {W + '0': (), W + '1': ()}),
    # auto: an even split, one tower per GPU; no GPU: CPU towers
    (['h:1', 'h:2'], 'auto', {'h': 4}, None, {W + '0': (0, 1), W + '1': (2, 3)}),
    (['h:1', 'h:2'], 'auto', {'h': 5}, None, {W + '0': (0, 1), W + '1': (2, 3)}),
    (['h:1', 'h:2'], 'auto', {'h': 0}, None, {W + '0': (), W + '1': ()}),
    (['h:1', 'h:2'], 'auto', None, {'h': 2}, {W + '0': (0,), W + '1': (1,)}),
    (['h:1', 'h:2'], 'auto', None, None, {W + '0': None, W + '1': None}),
    # two hosts: each numbers its own GPUs from 0
    (['a:1', 'b:1'], ['gpu:0', 'gpu:1'], {'a': 2, 'b': 2}, None, {W + '0': (0, 1), W + '1': (0, 1)}),
    (['a:1', 'b:1', 'a:2'], ['gpu:0'], {'a': 2, 'b': 1}, None, {W + '0': (0,), W + '1': (0,), W + '2': (1,)}),
    # mixed counts with auto: each host split among its own workers
    (['a:1', 'a:2', 'b:1'], 'auto', {'a': 4, 'b': 2}, None, {W + '0': (0, 1), W + '1': (2, 3), W + '2': (0, 1)}),
    (['a:1', 'b:1'], 'auto', {'a': 8, 'b': 0}, None, {W + '0': tuple(range(8)), W + '1': ()}),
    # a count unknown: the block the worker would get is still shown for a list
    (['a:1', 'a:2'], ['gpu:0', 'gpu:1'], None, None, {W + '0': (0, 1), W + '1': (2, 3)}),
    # every loopback name is one machine
    (['localhost:1', '127.0.0.1:2'], ['gpu:0'], {'localhost': 2}, None, {W + '0': (0,), W + '1': (1,)}),
]


@pytest.mark.parametrize('workers, devices, counts, gpu_counts, expected', TABLE,
                         ids=[f'{"+".join(w)}-{d}-{c}-{g}' for w, d, c, g, _ in TABLE])
def test_each_worker_of_a_host_gets_its_own_gpus(tmp_path, workers, devices, counts, gpu_counts, expected):
    assert given(tmp_path, workers, devices, counts, gpu_counts) == expected


def test_two_names_of_one_machine_share_its_gpus(tmp_path):
    """node1 and node2 are one machine by their address (an ssh config's HostName): one split."""
    out = given(tmp_path, ['node1:1', 'node2:1'], ['gpu:0'], {'10.0.0.5': 2},
                machine_of={'node1': '10.0.0.5', 'node2': '10.0.0.5'})
    assert out == {W + '0': (0,), W + '1': (1,)}


SHORT = [
    (['h:1'], ['gpu:0'], {'h': 0}, 'h (worker:0): names gpu:0 but the host has no GPU'),
    (['h:1'], ['gpu:0', 'gpu:2'], {'h': 2}, 'h (worker:0): names gpu:0, gpu:2 but the host has 2 GPUs (gpu:0..gpu:1)'),
    (['h:1', 'h:2'], ['gpu:0', 'gpu:1'], {'h': 2},
     'h (worker:0, worker:1): 2 workers with gpu:0, gpu:1 take a block of 2 GPUs each, 4 in all, but the host has '
     '2 GPUs (gpu:0..gpu:1)'),
    (['h:1', 'h:2', 'h:3'], 'auto', {'h': 2}, 'h (worker:0, worker:1, worker:2): devices: auto gives each of the 3 '
     'workers an equal share of the host\'s GPUs, but it has 2 GPUs'),
]


@pytest.mark.parametrize('workers, devices, counts, words', SHORT, ids=[s[3][:30] for s in SHORT])
def test_too_few_gpus_is_one_line_naming_the_host_its_workers_and_the_counts(tmp_path, workers, devices, counts,
                                                                             words):
    spec = spec_of(tmp_path, workers, devices)
    with pytest.raises(gpus.GPUShortage) as e:
        gpus.assign(spec, None, counts)
    text = str(e.value)
    assert '\n' not in text and text.startswith(f'{spec.path}:') and 'train.devices: ' in text, text
    assert words in text, text


def test_every_short_host_is_named(tmp_path):
    spec = spec_of(tmp_path, ['a:1', 'b:1', 'c:1'], ['gpu:0'])
    with pytest.raises(gpus.GPUShortage) as e:
        gpus.assign(spec, None, {'a': 0, 'b': 1, 'c': 0})
    assert [m for m, _, _ in e.value.problems] == ['a', 'c']


def test_a_spec_count_may_hold_gpus_back_but_never_invent_them(tmp_path):
    spec = spec_of(tmp_path, ['node1:1'], 'auto', {'node1': 2})
    assert gpus.machine_counts(spec, {'node1': 4}) == {'node1': 2}
    with pytest.raises(SpecError, match=r'spec.yaml:\d+: gpus.node1: node1 has 1 GPU, not 2'):
        gpus.machine_counts(spec, {'node1': 1})


def test_the_plan_gives_the_gpus_through_cuda_visible_devices(tmp_path):
    spec = spec_of(tmp_path, ['localhost:2223', 'localhost:2224'], ['gpu:0', 'gpu:1'], {'localhost': 4})
    ps, w0, w1 = plan_cluster(spec)
    assert (ps.env['CUDA_VISIBLE_DEVICES'], w0.env['CUDA_VISIBLE_DEVICES'], w1.env['CUDA_VISIBLE_DEVICES']) == \
        ('', '0,1', '2,3')
    # in a container the reserved GPUs are the only ones, numbered from 0
    cps, c0, c1 = plan_compose(spec)
    assert (c0.slot.gpus, c1.slot.gpus) == ((0, 1), (2, 3))
    assert (c0.env['CUDA_VISIBLE_DEVICES'], c1.env['CUDA_VISIBLE_DEVICES'], cps.env['CUDA_VISIBLE_DEVICES']) == \
        ('0,1', '0,1', '')


def test_compose_workers_share_the_engine_machine_whatever_hosts_the_spec_names(tmp_path):
    spec = spec_of(tmp_path, ['node1:2223', 'node2:2224'], ['gpu:0'])
    assert [p.slot.gpus for p in plan_compose(spec, {'localhost': 2})][1:] == [(0,), (1,)]
    with pytest.raises(gpus.GPUShortage, match='localhost'):
        plan_compose(spec, {'localhost': 1})


def test_launch_plan_of_two_workers_on_a_two_gpu_host_shows_disjoint_gpus(tmp_path, capsys):
    def launch_plan(*args):
        code = main(['plan', *args])
        out, err = capsys.readouterr()
        return types.SimpleNamespace(returncode=code, stdout=out, stderr=err)

    spec = tmp_path / 'spec.yaml'
    spec.write_text(yaml.safe_dump({'cluster': {'ps': PS, 'worker': ['localhost:2223', 'localhost:2224']},
                                    'train': {'devices': 'auto', 'train_dir': str(tmp_path / 'run')},
                                    'gpus': {'localhost': 2}}))
    out = launch_plan(str(spec))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert '  gpus: GPU 0 of localhost (2 GPUs there)' in lines and '  gpus: GPU 1 of localhost (2 GPUs there)' in lines
    assert [x for x in lines if 'CUDA_VISIBLE_DEVICES' in x] == [
        "  env:  CUDA_VISIBLE_DEVICES=''", '  env:  CUDA_VISIBLE_DEVICES=0', '  env:  CUDA_VISIBLE_DEVICES=1']
    as_json = json.loads(launch_plan(str(spec), '--json').stdout)
    assert [t['gpus'] for t in as_json['tasks']] == [[], [0], [1]]
    # without a count, plan says which block each worker would get, and that it does not know
    unknown = launch_plan(str(spec), '--set', 'gpus.localhost=null')
    assert 'block 2 of 2 of the GPUs of localhost (count unknown' in unknown.stdout, unknown.stdout
    short = launch_plan(str(spec), '--set', 'train.devices=[gpu:0, gpu:1]')
    assert short.returncode == 2 and short.stdout == '', short
    assert short.stderr.count('\n') == 1 and 'localhost (worker:0, worker:1): 2 workers' in short.stderr


# -- env: and tasks: in the spec ------------------------------------------------------------------

def test_env_for_every_task_and_per_job(tmp_path):
    spec = spec_of(tmp_path, ['localhost:2223'], extra={
        'env': {'OMP_NUM_THREADS': 4, 'SHARED': 'x', 'RATE': 0.5},
        'tasks': {'worker': {'env': {'SHARED': 'worker', 'ONLY_W': 'a b'}}, 'ps': {'env': {'ONLY_PS': '1'}}}})
    assert spec.task_env('ps') == {'OMP_NUM_THREADS': '4', 'SHARED': 'x', 'RATE': '0.5', 'ONLY_PS': '1'}
    assert spec.task_env('worker') == {'OMP_NUM_THREADS': '4', 'SHARED': 'worker', 'RATE': '0.5', 'ONLY_W': 'a b'}
    ps, worker = plan_cluster(spec)
    assert ps.env['ONLY_PS'] == '1' and 'ONLY_W' not in ps.env and worker.env['ONLY_W'] == 'a b'
    assert ps.env['TF_CONFIG'] and worker.env['PYTHONUNBUFFERED'] == '1'
    # the effective spec carries it, and reads back the same
    again = tmp_path / 'again.yaml'
    again.write_text(spec.to_yaml())
    assert load_spec(str(again)).task_env('worker') == spec.task_env('worker')


def test_env_overrides(tmp_path):
    spec = spec_of(tmp_path, ['localhost:2223'], extra={'env': {'A': '1', 'B': '2'}},
                   overrides=['env.A=changed', 'env.B=null', 'env.C=3', 'tasks.worker.env.D=4'])
    assert spec.task_env('worker') == {'A': 'changed', 'C': '3', 'D': '4'}
    assert spec.task_env('ps') == {'A': 'changed', 'C': '3'}
    # a user's TF logging wins over the launcher's default; the launcher's own names cannot be set
    assert plan_cluster(spec_of(tmp_path, ['localhost:2223'], extra={'env': {'TF_CPP_MIN_LOG_LEVEL': '0'}}))[1] \
        .env['TF_CPP_MIN_LOG_LEVEL'] == '0'


BAD_ENV = [
    ({'env': {'1X': 'a'}}, 'env.1X', 'not a valid environment variable name'),
    ({'env': {'A-B': 'a'}}, 'env.A-B', 'not a valid environment variable name'),
    ({'env': {'A': True}}, 'env.A', 'expected a string or a number, got True (quote it: "true")'),
    ({'env': {'A': [1]}}, 'env.A', 'expected a string or a number'),
    ({'env': {'A': {'b': 1}}}, 'env.A', 'expected a string or a number'),
    ({'env': ['A=1']}, 'env', 'expected a mapping of variable name to value'),
    ({'env': {'TF_CONFIG': '{}'}}, 'env.TF_CONFIG', 'cannot be set in a spec'),
    ({'env': {'CUDA_VISIBLE_DEVICES': '0'}}, 'env.CUDA_VISIBLE_DEVICES', 'the launcher gives each worker its own GPUs'),
    ({'tasks': {'worker': {'env': {'TFCLUSTER_LEASE': 'x'}}}}, 'tasks.worker.env.TFCLUSTER_LEASE', 'cannot be set'),
    ({'tasks': {'master': {'env': {}}}}, 'tasks.master', 'unknown key; expected one of chief, ps, worker, evaluator'),
    ({'tasks': {'chief': {'env': {'A': 1}}}}, 'tasks.chief', 'the cluster has no chief task'),
    ({'tasks': {'worker': {'gpus': 1}}}, 'tasks.worker.gpus', 'unknown key; expected one of env'),
    ({'gpus': {'node9': 2}}, 'gpus.node9', 'no task runs on node9'),
    ({'gpus': {'localhost': -1}}, 'gpus.localhost', 'expected a whole number >= 0'),
    ({'gpus': {'localhost': 'two'}}, 'gpus.localhost', 'expected a number of GPUs'),
    ({'gpus': {'localhost': 1, '127.0.0.1': 2}}, 'gpus.127.0.0.1', 'the same machine as another entry'),
    ({'train': {'devices': ['auto', 'gpu:0'], 'train_dir': 'r'}}, 'train.devices[0]', 'auto cannot be mixed with a list'),
]


@pytest.mark.parametrize('extra, key, words', BAD_ENV, ids=[b[1] for b in BAD_ENV])
def test_bad_env_and_gpus_are_one_line_naming_file_line_and_key(tmp_path, extra, key, words):
    with pytest.raises(SpecError) as e:
        spec_of(tmp_path, ['localhost:2223'], extra=extra)
    text = str(e.value)
    assert '\n' not in text and text.startswith(f'{tmp_path / "spec.yaml"}:') and f': {key}: ' in text, text
    assert words in text, text


def test_the_task_says_what_it_got(tmp_path):
    spec = spec_of(tmp_path, ['localhost:2223'], extra={'env': {'FOO': 'a b', 'API_TOKEN': 's3cret', 'GONE': '1'}})
    worker, ps = spec.task('worker', 0), spec.task('ps', 0)
    environ = {'FOO': 'a b', 'API_TOKEN': 's3cret', 'CUDA_VISIBLE_DEVICES': '2,3'}
    assert environment_line(spec, worker, environ) == \
        "environment: CUDA_VISIBLE_DEVICES=2,3 API_TOKEN=*** FOO='a b' GONE=(not set)"
    assert 'CUDA' not in environment_line(spec, ps, environ)
    assert environment_line(spec_of(tmp_path, ['localhost:2223']), worker, {'CUDA_VISIBLE_DEVICES': ''}) == ''


def test_tfjob_passes_env_per_job(tmp_path):
    spec = spec_of(tmp_path, ['localhost:2223'], extra={'env': {'A': '1'}, 'tasks': {'worker': {'env': {'B': 'x y'}}}})
    job = tfjob.tfjob(spec)
    env = {kind: r['template']['spec']['containers'][0].get('env') for kind, r in job['spec']['tfReplicaSpecs'].items()}
    assert env == {'PS': [{'name': 'A', 'value': '1'}],
                   'Worker': [{'name': 'A', 'value': '1'}, {'name': 'B', 'value': 'x y'}]}


SBATCH = [
    # devices, ps, workers -> the #SBATCH lines that ask for tasks and GPUs, and srun's step
    ('auto', 1, 2, ['--ntasks=3'], '--ntasks=3'),
    (2, 1, 2, ['--ntasks=3'], '--ntasks=3'),
    (['gpu:0', 'gpu:1'], 1, 2, ['--ntasks=1', 'hetjob', '--ntasks=2', '--gpus-per-task=2'], '--het-group=0,1'),
    (['gpu:0'], 2, 4, ['--ntasks=2', 'hetjob', '--ntasks=4', '--gpus-per-task=1'], '--het-group=0,1'),
    (['gpu:3', 'cpu:0'], 1, 1, ['--ntasks=1', 'hetjob', '--ntasks=1', '--gpus-per-task=1'], '--het-group=0,1'),
]


@pytest.mark.parametrize('devices, ps, workers, asks, step', SBATCH, ids=[f'{s[0]}-{s[1]}ps-{s[2]}w' for s in SBATCH])
def test_sbatch_asks_slurm_for_each_workers_gpus_and_none_for_the_ps(tmp_path, devices, ps, workers, asks, step):
    raw = {'cluster': {'ps': [f'localhost:{2000 + i}' for i in range(ps)],
                       'worker': [f'localhost:{3000 + i}' for i in range(workers)]},
           'train': {'devices': devices, 'train_dir': str(tmp_path / 'run')}}
    (tmp_path / 'spec.yaml').write_text(yaml.safe_dump(raw))
    script = slurm.render(load_spec(str(tmp_path / 'spec.yaml')), Args()).splitlines()
    sbatch = [x.removeprefix('#SBATCH ') for x in script if x.startswith('#SBATCH ')]
    assert [x for x in sbatch if x.startswith(('--ntasks', 'hetjob', '--gpus', '--gres'))] == asks
    srun = next(x for x in script if x.startswith('srun '))
    assert srun.startswith(f'srun {step} --distribution=block ')
    wrapper = next(x for x in script if "bash -c 'if" in x)
    assert 'trap "" TERM; export CUDA_VISIBLE_DEVICES=; else' in wrapper      # ps: never a GPU
    assert 'export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES-}"; fi' in wrapper
    if 'hetjob' in asks:     # srun numbers each component's tasks from 0: its lines cannot name them
        spec = load_spec(str(tmp_path / 'spec.yaml'))
        line = 'srun: error: node2: task 1: Exited with exit code 3'
        assert slurm_run.name_ranks(line, spec) == line and slurm_run.first_failure([line], spec) is None


def test_a_gpu_given_twice_is_refused_naming_both_tasks(tmp_path):
    """The planner's last check, whatever produced the slots (e.g. two names of one machine
    planned apart): one physical GPU never goes to two tasks."""
    spec = spec_of(tmp_path, ['node1:1', 'node2:1'], ['gpu:0'])
    slots = {'worker:0': gpus.Slot('10.0.0.5', (0,)), 'worker:1': gpus.Slot('10.0.0.5', (0,))}
    with pytest.raises(SpecError, match=r'train.devices: worker:0 and worker:1 would both use GPU 0 of 10.0.0.5'):
        gpus.check_disjoint(spec, slots)
    gpus.check_disjoint(spec, {**slots, 'worker:1': gpus.Slot('10.0.0.6', (0,))})
