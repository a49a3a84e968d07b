"""Helpers of the tests of render_roles, used by
tests/system/launch/render/test_render_roles.py, tests/unit/launch/render/test_render_roles.py: here, since no
test module imports another."""
from __future__ import annotations


import yaml

from cluster.spec import load_spec
PROGRAM = 'examples.linear_program:train'


def pss_spec(tmp_path, evaluator: bool = True, workers: int = 2, ps: int = 1, overrides=(), **train):
    """The coordinator spec of the brief: chief, ps, workers and (optionally) an evaluator."""
    cluster = {'chief': ['localhost:2231'], 'ps': [f'localhost:{2232 + i}' for i in range(ps)],
               'worker': [f'localhost:{2240 + i}' for i in range(workers)]}
    settings = {'program': PROGRAM, 'steps': 50, 'train_dir': 'runs/pss', **train}
    if evaluator:
        cluster['evaluator'] = ['localhost:2235']
        settings['evaluator'] = PROGRAM
    path = tmp_path / 'pss.yaml'
    path.write_text(yaml.safe_dump({'cluster': cluster, 'train': settings}))
    return load_spec(str(path), list(overrides))

