"""The many-host rig (tests/harness/hosts.py): more loopback hosts than one sshd listens on, a
namespace host with its own address, sshd and rate limit, a port block that refuses the rig's tasks
but not this process, and nothing of it left after."""
from __future__ import annotations

import socket

import pytest

from tests.harness.hosts import Rig, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(unavailable()), reason=f'the rig: {unavailable()}')]


def test_twenty_loopback_hosts_and_a_namespace_host_answer_a_block_holds_and_nothing_is_left(tmp_path):
    with socket.socket() as listener:
        with Rig(tmp_path, 20, namespaces=1, rate_mbit=50) as rig:
            assert len(rig.addresses) == 21 and len({id(rig.sshd_of(a)) for a in rig.addresses}) == 3
            ns_host = rig.addresses[-1]
            for address in (rig.addresses[0], rig.addresses[19], ns_host):
                done = rig.sshd_of(address).ssh(address, 'hostname -I')
                assert done.returncode == 0, done.stderr
            assert rig.sshd_of(ns_host).ssh(ns_host, 'hostname -I').stdout.split() == [ns_host]   # its own network
            listener.bind((rig.addresses[2], 0))
            listener.listen()
            port = listener.getsockname()[1]
            rig.block(rig.addresses[2], port)
            probe = f'python3 -c "import socket; socket.create_connection((\'{rig.addresses[2]}\', {port}), 5)"'
            refused = rig.sshd_of(rig.addresses[0]).ssh(rig.addresses[0], probe)
            assert refused.returncode != 0 and 'Connection refused' in refused.stderr, refused
            socket.create_connection((rig.addresses[2], port), 5).close()      # the launcher's side gets through
        assert rig.leftovers() == []
