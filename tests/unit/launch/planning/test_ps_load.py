"""`launch plan`'s load of the ps tasks (launch/planning/ps_load.py), against figures worked out by
hand for the built-in model (4,273,192 bytes of weights; each trainable variable's moving average
beside it; placed by bytes): 1, 2 and 4 ps, a partitioned and an unpartitioned variable, a hot
one, sync and async, bfloat16 on the wire; and the JSON `launch plan --json` gives."""
from __future__ import annotations

import json
import os

import pytest

from cluster.checks.variables import Variable, builtin_variables, place_by_bytes
from cluster.spec import load_spec
from launch.cli import main
from launch.planning.ps_load import advice, builtin_load, load_of, warning
from tests.conftest import REPO

M = 4_273_192


def _spec(ps: int, *more: str):
    hosts = ', '.join(f'localhost:{3000 + i}' for i in range(ps))
    return load_spec(os.path.join(REPO, 'specs/local2.yaml'), [f'cluster.ps=[{hosts}]', *more])


@pytest.mark.parametrize('ps, held, weights, imbalance', [
    (1, [8_546_392], [M], 1.0),
    (2, [4_358_664, 4_187_728], [2_179_328, 2_093_864], 1.02),
    (4, [2_359_816, 1_807_872, 1_790_032, 2_588_672], [1_179_904, 903_936, 895_016, 1_294_336], 1.2116),
])
def test_bytes_per_ps_and_the_imbalance(ps, held, weights, imbalance):
    load = builtin_load(_spec(ps))
    assert [p.bytes for p in load.ps] == held          # weights + moving averages (+ the global step's 8)
    assert [p.weights_bytes for p in load.ps] == weights and load.weights_bytes == M
    assert round(load.imbalance, 4) == imbalance and load.hot == ()


def test_sync_moves_every_live_worker_s_share_per_global_step_async_one():
    sync, lone = builtin_load(_spec(2)), builtin_load(_spec(2, 'train.sync=false'))
    assert [p.in_per_step for p in sync.ps] == [2 * 2_179_328, 2 * 2_093_864] == [p.out_per_step for p in sync.ps]
    assert [p.in_per_step for p in lone.ps] == [2_179_328, 2_093_864]
    assert [p.accumulator_bytes for p in sync.ps] == [2_179_328, 2_093_864]      # one per weight, on its ps
    assert [p.accumulator_bytes for p in lone.ps] == [0, 0]
    assert sync.wire_bytes == lone.wire_bytes == M


def test_bfloat16_halves_what_crosses_and_towers_change_nothing():
    half = builtin_load(_spec(1, 'train.transfer_dtype=bfloat16', 'train.devices=2'))
    assert half.wire_bytes == M // 2 and half.ps[0].in_per_step == 2 * (M // 2)
    assert half.ps[0].bytes == 8_546_392        # the variables stay float32


def test_aggregating_fewer_gradients_still_moves_every_worker_s():
    """SyncReplicasOptimizer takes a gradient from every live worker each step and drops the late."""
    few = builtin_load(_spec(1, 'train.replicas_to_aggregate=1'))
    assert few.ps[0].in_per_step == 2 * M


def test_an_unpartitioned_variable_bigger_than_a_ps_s_share_is_hot():
    found = builtin_variables((24, 24, 3), 1)        # local3's weights whole, at 2 ps
    load = load_of('m', 'by bytes', found, place_by_bytes(found, 2), 2, workers=2, sync=True,
                   transfer_dtype='float32')
    local3 = next(p for p in load.placed if p.variable.name == 'cifar10/local3/weights')
    assert local3.ps == 1 and load.hot == ('cifar10/local3/weights',)
    assert [p.weights_bytes for p in load.ps] == [714_792, 3_558_400]
    assert round(load.imbalance, 4) == 1.6655


@pytest.mark.parametrize('override', ['train.program=tests.harness.paced_program:train',
                                      'train.command=[python, x.py]'])
def test_a_run_of_one_s_own_program_has_no_load_before_it_runs(override):
    assert builtin_load(_spec(1, override)) is None


def test_plan_json_gives_the_tasks_and_load_ps(capsys):
    assert main(['plan', os.path.join(REPO, 'specs/local2.yaml'), '--json']) == 0
    out = json.loads(capsys.readouterr().out)
    assert [t['task'] for t in out['tasks']] == ['ps:0', 'worker:0', 'worker:1']
    ps = out['load']['ps']
    assert [(p['task'], p['bytes']) for p in ps] == [('ps:0', 8_546_392)]
    assert out['load']['imbalance'] == 1.0 and out['load']['per_step']['worker_in'] == M
    assert len(out['load']['variables']) == 11


@pytest.mark.parametrize('ps, partitions, imbalance, now', [(3, 5, 1.0066, 1.1157), (4, 10, 1.0115, 1.2116)])
def test_the_advice_is_the_partition_count_that_evens_the_load_out(ps, partitions, imbalance, now):
    tip = advice(_spec(ps))
    assert (tip.partitions, round(tip.imbalance, 4), round(tip.now, 4)) == (partitions, imbalance, now)
    taken = builtin_load(_spec(ps, f'train.partitions={partitions}'))
    assert round(taken.imbalance, 4) == imbalance and advice(_spec(ps, f'train.partitions={partitions}')) is None


def test_no_advice_where_nothing_is_gained_and_up_warns_only_of_an_uneven_load():
    assert advice(_spec(1)) is None and advice(_spec(2)) is None       # 1.02 at 2 ps: nothing worth a change
    assert warning(builtin_load(_spec(4))) is None                       # 1.21: under UNEVEN
    line = warning(builtin_load(_spec(8)))
    assert line == ("warning: the ps tasks' load is uneven: ps:3 holds 1.60x the mean of the weights "
                    '(`launch plan` shows where each variable goes)')
    four = [Variable(f'v{i}', (25,)) for i in range(4)] + [Variable('small', (1,))]     # 100 B each, 4 B
    idle = load_of('m', 'by bytes', four, place_by_bytes(four, 5), 5, workers=2, sync=True, transfer_dtype='float32')
    assert round(idle.imbalance, 3) == 1.238 and warning(idle) == (
        "warning: the ps tasks' load is uneven: ps:4 hold(s) under 25% of a fair share of the weights "
        '(`launch plan` shows where each variable goes)')
