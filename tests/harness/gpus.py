"""Helpers of the tests of gpus, used by tests/system/launch/planning/test_gpus.py,
tests/unit/launch/planning/test_gpus.py: here, since no test module imports another."""

import yaml

from cluster.spec import load_spec
from launch.planning import gpus

PS = ['localhost:2222']


def spec_of(tmp_path, workers, devices='auto', gpu_counts=None, extra=None, overrides=()):
    raw = {'cluster': {'ps': PS, 'worker': workers},
           'train': {'devices': devices, 'train_dir': str(tmp_path / 'run')}}
    if gpu_counts is not None:
        raw['gpus'] = gpu_counts
    raw.update(extra or {})
    path = tmp_path / 'spec.yaml'
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return load_spec(str(path), list(overrides))


def given(tmp_path, workers, devices, counts=None, gpu_counts=None, machine_of=None):
    """worker name -> its physical GPUs (None: unknown)."""
    spec = spec_of(tmp_path, workers, devices, gpu_counts)
    slots = gpus.assign(spec, machine_of, counts)
    assert slots['ps:0'].gpus == ()
    return {name: slot.gpus for name, slot in slots.items() if name.startswith('worker')}


class Args:
    name = partition = time_limit = port_base = None

