"""The Slurm backend: the layout rules and the batch script as pure functions (tables, no Slurm),
then a few runs against a real single-node Slurm (tests/harness/slurm.py): a job that trains to the end,
one cancelled with scancel, one stopped with Ctrl-C; and `--backend slurm` where no Slurm is."""
from __future__ import annotations

import dataclasses
import os

import pytest

from cluster.env.slurm import SlurmEnvError, expand_hostlist, expand_tasks_per_node, resolve
from cluster.spec import load_spec
from launch.render import sbatch as slurm
from launch.backends.slurm.job import first_failure, name_ranks
from tests.conftest import write_spec
from tests.harness.slurm_jobs import _render, _sbatch_options


# -- host lists and tasks per node ---------------------------------------------------------------

@pytest.mark.parametrize('text, hosts', [
    ('vm', ['vm']),
    ('n1,n2', ['n1', 'n2']),
    ('node[01-03,7],gpu1', ['node01', 'node02', 'node03', 'node7', 'gpu1']),
    ('x[8-10]', ['x8', 'x9', 'x10']),                   # no padding: 9 then 10, in numeric order
    ('x[098-101]', ['x098', 'x099', 'x100', 'x101']),   # the padding of the first number is kept
    ('r[1-2]n[1-2]', ['r1n1', 'r1n2', 'r2n1', 'r2n2']),  # as `scontrol show hostnames` gives them
    ('a[1-2],b[5],c', ['a1', 'a2', 'b5', 'c']),
    ('node-[3-4].cluster', ['node-3.cluster', 'node-4.cluster']),
])
def test_hostlist_expands_like_scontrol(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize('text', ['', 'a,,b', 'x[]', 'x[1-', 'x]', 'x[3-1]', 'x[a-b]', 'x[[1]]'])
def test_bad_hostlist_is_one_line(text):
    with pytest.raises(ValueError, match='not a Slurm host list') as e:
        expand_hostlist(text)
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('text, counts', [
    ('3', [3]), ('2(x3),1', [2, 2, 2, 1]), ('1,2,1', [1, 2, 1]), ('4(x2)', [4, 4]),
])
def test_tasks_per_node_expands(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize('text', ['', 'x', '2(3)', '2(x)', '-1'])
def test_bad_tasks_per_node_is_an_error(text):
    with pytest.raises(ValueError, match='tasks-per-node'):
        expand_tasks_per_node(text)


# -- the layout --------------------------------------------------------------------------------

def _spec(tmp_path, ps: int, workers: int):
    return load_spec(write_spec(tmp_path, ps=ps, workers=workers))


def _step(rank: int, nodelist: str, tasks: str, **extra) -> dict[str, str]:
    return {'SLURM_STEP_ID': '0', 'SLURM_PROCID': str(rank), 'SLURM_STEP_NODELIST': nodelist,
            'SLURM_STEP_TASKS_PER_NODE': tasks, **extra}


def _layout(spec) -> list[tuple[str, str, int]]:
    return [(t.name, t.host, t.port) for t in spec.tasks]


# (ps, workers, nodelist, tasks per node, port base) -> every task's (name, host, port), by rank
LAYOUTS = {
    'one node': (1, 2, 'vm', '3', 8888,
                 [('ps:0', 'vm', 8888), ('worker:0', 'vm', 8889), ('worker:1', 'vm', 8890)]),
    'one task per node': (1, 2, 'n[1-3]', '1(x3)', 2222,
                          [('ps:0', 'n1', 2222), ('worker:0', 'n2', 2222), ('worker:1', 'n3', 2222)]),
    'uneven, ps slice spans nodes': (2, 3, 'a[1-3]', '1,3,1', 9000,
                                     [('ps:0', 'a1', 9000), ('ps:1', 'a2', 9000), ('worker:0', 'a2', 9001),
                                      ('worker:1', 'a2', 9002), ('worker:2', 'a3', 9000)]),
    'repeated counts': (1, 6, 'gpu[1-3],cpu7', '2(x3),1', 8888,
                        [('ps:0', 'gpu1', 8888), ('worker:0', 'gpu1', 8889), ('worker:1', 'gpu2', 8888),
                         ('worker:2', 'gpu2', 8889), ('worker:3', 'gpu3', 8888), ('worker:4', 'gpu3', 8889),
                         ('worker:5', 'cpu7', 8888)]),
    # Slurm's node order, not string order (TensorFlow's resolver would put node10 first)
    'node9 before node10': (1, 1, 'node[9-10]', '1(x2)', 8888, [('ps:0', 'node9', 8888), ('worker:0', 'node10', 8888)]),
}


@pytest.mark.parametrize('case', LAYOUTS)
def test_every_rank_sees_the_same_layout_and_finds_itself(tmp_path, case):
    ps, workers, nodelist, tasks, base, expected = LAYOUTS[case]
    spec = _spec(tmp_path, ps, workers)
    for rank, (name, host, port) in enumerate(expected):
        local = sum(1 for _, h, _ in expected[:rank] if h == host)
        placed, me = resolve(spec, _step(rank, nodelist, tasks, SLURMD_NODENAME=host, SLURM_LOCALID=str(local)),
                             port_base=base)
        assert _layout(placed) == expected
        assert (me.name, me.host, me.port) == (name, host, port)
        assert placed.train == spec.train and not placed.hosts
    assert me.is_chief is (workers == 1)


def test_job_variables_stand_in_for_step_ones(tmp_path):
    spec = _spec(tmp_path, 1, 1)
    env = {'SLURM_STEP_ID': '0', 'SLURM_PROCID': '1', 'SLURM_JOB_NODELIST': 'c[1-2]', 'SLURM_TASKS_PER_NODE': '1(x2)'}
    placed, me = resolve(spec, env)
    assert _layout(placed) == [('ps:0', 'c1', 8888), ('worker:0', 'c2', 8888)] and me.name == 'worker:0'


# environment -> what the one-line error says
BAD_ENVS = {
    'not in a job': ({}, 'not inside an srun job step'),
    'the batch shell itself': ({'SLURM_PROCID': '0', 'SLURM_JOB_NODELIST': 'vm', 'SLURM_TASKS_PER_NODE': '3'},
                               'not inside an srun job step'),
    'too few ranks': (_step(0, 'vm', '2'), 'the Slurm step has 2 task(s) but the spec has 1 ps + 2 worker(s) = 3: '
                                           'run it with `srun --ntasks=3`'),
    'too many ranks': (_step(0, 'n[1-2]', '2(x2)'), 'has 4 task(s)'),
    'bad host list': (_step(0, 'n[1-', '3'), 'not a Slurm host list'),
    'counts for other nodes': (_step(0, 'n[1-2]', '3'), '2 node(s) (n1,n2) but tasks per node for 1'),
    'cyclic distribution': (_step(1, 'n[1-2]', '2,1', SLURMD_NODENAME='n2', SLURM_LOCALID='0'),
                            '--distribution=block'),
    'rank outside the step': (_step(5, 'vm', '3'), 'SLURM_PROCID=5 is outside'),
}


@pytest.mark.parametrize('case', BAD_ENVS)
def test_bad_slurm_environment_is_one_line(tmp_path, case):
    env, words = BAD_ENVS[case]
    with pytest.raises(SlurmEnvError) as e:
        resolve(_spec(tmp_path, 1, 2), env)
    assert words in str(e.value) and '\n' not in str(e.value)


def test_port_base_must_leave_room_for_a_node_s_tasks(tmp_path):
    with pytest.raises(SlurmEnvError, match='must lie in 1..65535'):
        resolve(_spec(tmp_path, 1, 2), _step(0, 'vm', '3'), port_base=65534)


def test_script_carries_the_effective_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(tmp_path, ps=1, workers=2, steps=77)
    script = _render(spec, name='my job!')
    assert _sbatch_options(script)[0] == '--job-name=my_job_'
    assert '8888' in script and '--time' not in script and '--partition' not in script
    body = script.split(f"<<'{slurm.SPEC_MARK}'\n", 1)[1].split(f'\n{slurm.SPEC_MARK}\n', 1)[0]
    (tmp_path / 'carried.yaml').write_text(body)
    carried = load_spec(str(tmp_path / 'carried.yaml'))
    original = load_spec(spec)
    assert (carried.num_ps, carried.num_workers, carried.train.steps) == (1, 2, 77)
    assert dataclasses.replace(carried.train, train_dir='') == dataclasses.replace(original.train, train_dir='')
    assert os.path.isabs(carried.train.train_dir)


def test_srun_lines_name_the_tasks(tmp_path):
    spec = load_spec(write_spec(tmp_path, ps=1, workers=3))
    lines = ['srun: launch/slurm: _step_signal: Terminating StepId=1.0', 'srun: error: vm: task 2: Killed',
             'srun: error: vm: tasks 0-1,3: Terminated', 'srun: error: vm: task 9: Killed']
    assert [name_ranks(line, spec) for line in lines] == [
        lines[0], 'srun: error: vm: task 2 (worker:1): Killed',
        'srun: error: vm: tasks 0-1,3 (ps:0, worker:0, worker:2): Terminated', lines[3]]
    assert first_failure(lines, spec) == 'worker:1 (Killed)'
    assert first_failure(lines[:1], spec) is None

