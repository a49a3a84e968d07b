"""The built-in model's variables as the launcher knows them without TensorFlow, and the trainer's
placement rule, against figures worked out by hand (cluster/checks/variables.py; the same list
against the built graph: tests/unit/cluster/training/test_load_parity.py)."""
from __future__ import annotations

import pytest

from cluster.checks.variables import Variable, builtin_variables, least_loaded, place_by_bytes, place_round_robin, slices

CIFAR, FASHION = (24, 24, 3), (28, 28, 1)


def test_the_model_s_weights_by_hand():
    found = builtin_variables(CIFAR, 1)
    assert [v.name for v in found][:3] == ['global_step', 'cifar10/conv1/weights', 'cifar10/conv1/biases']
    assert found[0].bytes == 8 and not found[0].trainable
    # conv1 5x5x3x64, conv2 5x5x64x64, local3 2304x384, local4 384x192, softmax 192x10, and their biases
    assert sum(v.bytes for v in found if v.trainable) == 4 * (4800 + 64 + 102400 + 64 + 884736 + 384 + 73728 + 192
                                                              + 1920 + 10) == 4_273_192
    assert sum(v.bytes for v in builtin_variables(FASHION, 1) if v.trainable) == 5_538_344    # 3136x384 local3


def test_partitioned_rows_follow_tensorflow_s_fixed_size_partitioner():
    assert slices(2304, 1) == [2304] and slices(2304, 4) == [576] * 4
    assert slices(3136, 3) == [1046, 1045, 1045]
    parts = [v for v in builtin_variables(FASHION, 3) if v.part_of]
    assert [v.shape for v in parts] == [(1046, 384), (1045, 384), (1045, 384)]
    assert {v.part_of for v in parts} == {'cifar10/local3/weights'}


@pytest.mark.parametrize('ps, expected', [
    (1, {0: 'all'}),
    # 2 ps: the global step, conv1's biases, conv2's weights and local3's second block on ps:0
    (2, {0: ['global_step', 'cifar10/conv1/biases', 'cifar10/conv2/weights', 'cifar10/local3/weights/part_1']}),
    (4, {1: ['cifar10/conv1/weights', 'cifar10/local3/weights/part_2'],
         3: ['cifar10/conv2/weights', 'cifar10/local3/weights/part_3']}),
])
def test_each_variable_goes_to_the_ps_holding_the_fewest_bytes_so_far(ps, expected):
    found = builtin_variables(CIFAR, ps)
    places = place_by_bytes(found, ps)
    for index, names in expected.items():
        on = [v.name for v, p in zip(found, places) if p == index]
        assert on == ([v.name for v in found] if names == 'all' else names), (index, on)


def test_a_tie_goes_to_the_lowest_index_and_round_robin_takes_turns():
    assert least_loaded([5, 3, 3]) == 1 and least_loaded([0, 0]) == 0
    same = [Variable(f'v{i}', (10,)) for i in range(5)]
    assert place_by_bytes(same, 2) == [0, 1, 0, 1, 0]
    assert place_round_robin(same, 3) == [0, 1, 2, 0, 1]
