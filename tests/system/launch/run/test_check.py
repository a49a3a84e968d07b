"""`launch check` is `launch up`'s pre-flight (launch/run/preflight.py): whatever `up` refuses before
anything starts, `check` refuses too, with the same line and exit code 2, and writes nothing. The
train_dir cases go through `launch.cli.main` and start no process; a busy port needs the hosts'
probe, which `check` runs as a process (slow)."""
from __future__ import annotations

import os
import socket

import pytest
import yaml

from tests.conftest import launch, write_spec
from tests.harness.documented import check_documented, strip_prefix


@pytest.mark.slow
def test_a_busy_port_is_one_documented_line_for_check_and_up(tmp_path):
    spec = write_spec(tmp_path)
    port = int(yaml.safe_load(open(spec))['cluster']['worker'][1].rsplit(':', 1)[1])
    with socket.socket() as s:
        s.bind(('', port))
        s.listen()
        check = launch('check', spec, timeout=120)
        up = launch('up', spec, timeout=120)
    # the holder named where this machine shows it: here the test's own process
    line = f'worker:1: port {port} on localhost is already in use by pid {os.getpid()} ('
    assert (check.returncode, up.returncode) == (2, 2), check.stderr + up.stderr
    assert up.stderr.startswith(f'launch: error: {spec}: {line}') and up.stderr.count('\n') == 1, up.stderr
    # check ends with up's line (above it, as after every host's verdict: where the ports can be reached from)
    assert check.stderr.splitlines()[-1] == up.stderr.strip(), check.stderr
    assert all(x.startswith('launch: WARNING: ') for x in check.stderr.splitlines()[:-1]), check.stderr
    check_documented('port-in-use', strip_prefix(check.stderr.splitlines()[-1]))
    assert check.stdout == f'localhost: error: {up.stderr.split(": ", 3)[3]}', check.stdout   # every host's verdict, in the same words
    assert not os.path.exists(tmp_path / 'run')

