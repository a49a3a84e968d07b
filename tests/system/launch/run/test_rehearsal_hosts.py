"""A rehearsal over SSH on the many-host rig (tests/harness/hosts.py): ten hosts, one of which lets
no task but the launcher reach a ps port. The rehearsal starts and ends (the launcher reaches every
task), its table names every pair that could not reach that ps, every host was reached over one
SSH connection for the whole run, and nothing is left behind (the rig's teardown asserts it).

Its time is not the hosts' (the rig and the SSH start of all ten take a few seconds): each worker
tries ps:1 for the stand-in's REACH_SECS (30 s), then to tell it "done" (CALL_SECS, 10 s), and
ps:1, told by none, serves on until --finish-timeout after the workers end (60 s by default; here
FINISH_SECS: the same warning and stop, a minute sooner)."""
from __future__ import annotations

import json
import os
import re
import sys

import pytest

from tests.conftest import REPO, launch, write_spec
from tests.harness.hosts import Rig, unavailable
from tests.harness.ssh import spec_ports

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(unavailable(namespaces=False)), reason=f'the rig: {unavailable(False)}')]

HOSTS = 10
WORKERS = 18
FINISH_SECS = 2     # --finish-timeout: ps:1, told "done" by no worker, is stopped this long after them


def python_of_this_tree(tmp_path) -> str:
    """A `python` for the hosts that imports this checkout (sshd passes no PYTHONPATH on)."""
    path = tmp_path / 'python'
    path.write_text(f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return str(path)


def connections(rig: Rig) -> dict[str, int]:
    """Connections each host's sshd accepted so far (its log: `Connection from ... on ADDR port`)."""
    out = {a: 0 for a in rig.addresses}
    for server in {id(rig.sshd_of(a)): rig.sshd_of(a) for a in rig.addresses}.values():
        for found in re.finditer(r'Connection from \S+ port \d+ on (\S+) port', server.log_path.read_text()):
            out[found[1]] = out.get(found[1], 0) + 1
    return out


def test_a_ten_host_rehearsal_names_the_ps_port_one_host_blocks(tmp_path):
    with Rig(tmp_path / 'rig', HOSTS) as rig:
        where = rig.addresses[:2] + [rig.addresses[i % HOSTS] for i in range(WORKERS)]   # ps:0, ps:1, workers
        hosts = rig.host_settings(lambda a: tmp_path / f'host-{a}', python=python_of_this_tree(tmp_path))
        spec = write_spec(tmp_path, workers=WORKERS, ps=2, task_hosts=where, hosts=hosts, train_dir='run',
                          sync=False, steps=100)
        blocked = spec_ports(spec)['ps:1']
        rig.block(rig.addresses[1], blocked)
        before = connections(rig)
        out = launch('up', spec, '--rehearse', '--ssh-config', str(rig.ssh_config),
                     '--finish-timeout', str(FINISH_SECS), cwd=str(tmp_path), timeout=400)
        opened = {a: n - before[a] for a, n in connections(rig).items()}
        said = out.stdout + out.stderr
        assert out.returncode == 0, said[-6000:]
        assert f'all {WORKERS + 2} servers are up' in said, said[-3000:]
        assert f'{2 * WORKERS - WORKERS} of {2 * WORKERS} link(s) reached' in said, said[-3000:]
        # the console groups the sources one peer cannot be reached from: five named, then a count
        assert (f'worker:0, worker:1, worker:2, worker:3, worker:4 and {WORKERS - 5} more cannot reach ps:1 '
                f'({rig.addresses[1]}:{blocked})') in said, said[-3000:]
        assert 'cannot reach ps:0' not in said
        assert f'ps:1 still running {FINISH_SECS}s after the workers finished' in said, said[-3000:]
        rehearsal = os.path.join(tmp_path, 'run', 'rehearsal')
        with open(os.path.join(rehearsal, 'run.json')) as f:     # the launcher's own
            summary = json.load(f)['rehearsal']
        assert summary['unreachable_count'] == WORKERS, summary
        with open(os.path.join(rehearsal, summary['links_file'])) as f:      # every link, one a line
            links = [json.loads(line) for line in f]
        assert {x['source'] for x in links if x['error']} == {f'worker:{w}' for w in range(WORKERS)}
        assert {x['target'] for x in links if x['error']} == {'ps:1'}
        assert opened == {a: 1 for a in rig.addresses}, opened      # one connection per host, kept
    assert not rig.leftovers()
