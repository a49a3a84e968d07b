"""Helpers of the tests of compose, used by
tests/system/launch/backends/test_compose.py, tests/unit/launch/backends/test_compose.py: here, since no test
module imports another."""
from __future__ import annotations

import os

import yaml

from cluster.spec import load_spec
from launch.render.compose import render
from launch.planning.plan import compose_spec, plan_compose
from tests.conftest import REPO

COMPOSE_LOCAL2 = os.path.join(REPO, 'docker', 'compose.local2.yaml')


def rendered(spec_file: str) -> dict:
    spec = load_spec(spec_file)
    return yaml.safe_load(render(compose_spec(spec), list(plan_compose(spec))))

