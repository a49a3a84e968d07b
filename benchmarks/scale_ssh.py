"""The SSH rows of the scale benchmark: the same rehearsal as scale.py's local rows, through the SSH
backend to 1, 10 and 50 hosts of the many-host rig (tests/harness/hosts.py: loopback addresses
behind real sshds on this machine), tasks dealt round-robin over the hosts. What it adds to the
local figures is the SSH fan-out: start (a script per host), status snapshots, stops and log
following, over one connection per host. Each host's stand-ins run this checkout (a `python` that
sets PYTHONPATH: sshd passes none on)."""
from __future__ import annotations

import os
import sys

import yaml

import scale



def python_here(tmp: str, repo: str) -> str:
    """A `python` for the hosts that imports `repo`."""
    path = os.path.join(tmp, 'python-here')
    with open(path, 'w') as f:
        f.write(f'#!/bin/sh\nPYTHONPATH={repo} exec {sys.executable} "$@"\n')
    os.chmod(path, 0o755)
    return path


def write_spec(tmp: str, size: int, rig, free_ports, python: str) -> tuple[str, str, str, tuple[str, ...]]:
    """A spec of `size` tasks dealt over the rig's hosts; its train_dir relative, so each host has
    its own below its workdir and the launcher's is below `cwd`: (spec, rundir, cwd, launch args)."""
    hosts = len(rig.addresses)
    cwd = os.path.join(tmp, f'ssh-{size}-{hosts}')
    os.makedirs(cwd, exist_ok=True)
    ps, workers = scale.layout(size)
    ports = free_ports(size)
    where = [rig.addresses[i % hosts] for i in range(size)]
    spec = {'cluster': {'ps': [f'{h}:{p}' for h, p in zip(where[:ps], ports[:ps])],
                        'worker': [f'{h}:{p}' for h, p in zip(where[ps:], ports[ps:])]},
            'train': {'sync': False, 'steps': 100, 'batch_size': 16, 'data': 'synthetic', 'train_dir': 'run',
                      'log_every_secs': 2.0},
            'hosts': rig.host_settings(lambda a: os.path.join(cwd, f'host-{a}'), python=python)}
    path = os.path.join(cwd, 'spec.yaml')
    with open(path, 'w') as f:
        yaml.safe_dump(spec, f)
    return path, os.path.join(cwd, 'run', 'rehearsal'), cwd, ('--ssh-config', str(rig.ssh_config))


def bench(args, tmp: str, free_ports, env: dict, repo: str) -> list[dict]:
    """A row per (hosts, size) of args.scale_hosts x args.scale_ssh_sizes."""
    sys.path.insert(0, repo)            # the rig is the tests' harness
    from tests.harness.hosts import Rig

    print(f'\n== scale over SSH: the same rehearsal to {", ".join(map(str, args.scale_hosts))} hosts of the rig '
          '(loopback addresses behind real sshds; tasks round-robin over the hosts)')
    print(f'{"hosts":>5} {scale.HEAD}', flush=True)
    rows = []
    python = python_here(tmp, repo)
    for hosts in args.scale_hosts:
        with Rig(os.path.join(tmp, f'rig-{hosts}'), hosts) as rig:
            for size in args.scale_ssh_sizes:
                made = write_spec(tmp, size, rig, free_ports, python)
                r = scale.measured(size, lambda size=size, made=made: scale.run_size(size, tmp, free_ports, env, repo, made),
                                   lead=f'{hosts:>5} ')
                rows.append({'hosts': hosts, **r})
    return rows
