"""The spec files the repository ships (specs/ and examples/) are meant to be run as they are, and
side by side: the Fashion-MNIST run takes minutes, and a user tries a PSS example meanwhile. Two
of them on one port of one machine made the second refuse with a busy port; no two may share one.
Fast: the specs are only loaded."""
from __future__ import annotations

from pathlib import Path

import pytest

from cluster.spec import load_spec
from cluster.spec.model import same_machine_key
from tests.harness.parts import REPO

SHIPPED = sorted([*Path(REPO, 'specs').glob('*.yaml'), *Path(REPO, 'examples').glob('*.yaml')])


def test_the_shipped_specs_are_found():
    names = {p.name for p in SHIPPED}
    assert {'local2.yaml', 'fashion2.yaml', 'pss-keras.yaml', 'pss-loop.yaml', 'linear-program.yaml'} <= names, names


@pytest.mark.parametrize('path', SHIPPED, ids=lambda p: f'{p.parent.name}/{p.name}')
def test_a_shipped_spec_loads(path):
    assert load_spec(str(path), [], environ={}).tasks


def test_no_two_shipped_specs_use_one_port_of_one_machine():
    owners: dict[tuple[str, int], list[str]] = {}
    for path in SHIPPED:
        spec = load_spec(str(path), [], environ={})
        for key in sorted({(same_machine_key(t.host), t.port) for t in spec.tasks}):
            owners.setdefault(key, []).append(f'{path.parent.name}/{path.name}')
    shared = {f'{host}:{port}': specs for (host, port), specs in owners.items() if len(specs) > 1}
    assert not shared, f'ports that two shipped specs use on one machine (they cannot run side by side): {shared}'
