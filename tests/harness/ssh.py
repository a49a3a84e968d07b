"""Helpers of the tests of ssh, used by
tests/system/cluster/runtime/test_task_group.py, tests/system/cluster/spec/test_secrets.py,
tests/system/cluster/test_coordinator.py, tests/system/launch/backends/test_ssh.py,
tests/system/launch/backends/test_ssh_hosts.py, tests/system/launch/run/test_elastic.py: here, since no test
module imports another."""
from __future__ import annotations

import sys
import time

import yaml

from tests.conftest import (launch, project_processes,
                            write_spec)

LAYOUT = ['127.0.0.2', '127.0.0.2', '127.0.0.3']      # ps:0, worker:0 (the chief), worker:1


def host_settings(ssh_hosts, tmp_path, **changes) -> dict:
    """The spec's `hosts` section for both addresses; changes: {'127.0.0.3': {'key': ...}}."""
    out = {}
    for address in ssh_hosts.addresses:
        settings = {'port': ssh_hosts.port, 'user': 'root', 'key': str(ssh_hosts.key_path),
                    'python': sys.executable, 'workdir': str(workdir(tmp_path, address))}
        settings.update(changes.get(address, {}))
        out[address] = settings
    return out


def workdir(tmp_path, address):
    return tmp_path / f'host-{address}'


def remote_spec(ssh_hosts, tmp_path, hosts: dict | None = None, **train) -> str:
    """A 1 ps + 2 worker spec on LAYOUT; train_dir is relative, so each host has its own below its
    workdir (and the launcher's state file lands in tmp_path/run: launch runs in tmp_path)."""
    train.setdefault('steps', 10)
    return write_spec(tmp_path, task_hosts=LAYOUT, hosts=hosts or host_settings(ssh_hosts, tmp_path),
                      train_dir='run', **train)


def run(ssh_hosts, tmp_path, *args, ssh_config=None, **kw):
    return launch(*args, '--ssh-config', str(ssh_config or ssh_hosts.ssh_config), cwd=str(tmp_path), **kw)


def spec_ports(spec: str) -> dict[str, int]:
    cluster = yaml.safe_load(open(spec))['cluster']
    return {f'{job}:{i}': int(a.rsplit(':', 1)[1]) for job in cluster for i, a in enumerate(cluster[job])}


def assert_nothing_left(ssh_hosts, timeout: float = 10):
    """No task or launcher of ours on any "host", and no SSH session left open under sshd."""
    deadline = time.monotonic() + timeout
    while (project_processes() or ssh_hosts.session_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not project_processes()
    assert not ssh_hosts.session_processes()


def task_rows(status_output: str) -> list[list[str]]:
    return [line.split() for line in status_output.splitlines() if line.startswith(('ps:', 'worker:'))]


# The remote command's own sshd session, found by walking up from the shell: killing it cuts the
# connection exactly while a command runs.
_CUT_MY_CONNECTION = ("p=$$; while [ \"$p\" -gt 1 ]; do case \"$(tr '\\0' ' ' < /proc/$p/cmdline)\" in "
                      "sshd:*) kill -KILL $p; sleep 5;; esac; p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2); done\n")

