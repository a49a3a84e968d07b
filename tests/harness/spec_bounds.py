"""Helpers of the tests of spec_bounds, used by
tests/system/cluster/spec/test_spec_bounds.py, tests/unit/cluster/spec/test_spec_bounds.py: here, since no test
module imports another."""
from __future__ import annotations


import yaml

from tests.conftest import free_ports


def _write(tmp_path, text, name='spec.yaml') -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def _valid(tmp_path, **train) -> str:
    ps, worker = free_ports(2)
    settings = {'steps': 5, 'batch_size': 8, 'train_dir': str(tmp_path / 'run'), **train}
    return _write(tmp_path, yaml.safe_dump({'cluster': {'ps': [f'localhost:{ps}'], 'worker': [f'localhost:{worker}']},
                                            'train': settings}, sort_keys=False))


def _laughs(levels: int) -> str:
    """A 'billion laughs': each level a list of nine aliases of the level before."""
    names = 'abcdefghijklmnop'[:levels]
    lines = [f'{names[0]}: &{names[0]} [x, x, x, x, x, x, x, x, x]']
    for prev, name in zip(names, names[1:]):
        lines.append(f'{name}: &{name} [' + ', '.join([f'*{prev}'] * 9) + ']')
    return '\n'.join(lines) + '\n'

