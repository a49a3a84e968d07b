"""The many-host rig (issue #39): N emulated hosts on this machine, for tests and benchmarks of the
SSH backend at tens of hosts, started and torn down by one object (`Rig`) or fixture (`rig`).

- Loopback hosts: addresses 127.0.1.10, 127.0.1.11, ... (Linux routes all of 127/8 to lo without
  configuration), 16 behind each sshd (tests/harness/sshd.py; sshd's MAX_LISTEN_SOCKS is 16).
- Namespace hosts (`namespaces=K`), where a host needs network rules of its own: a network namespace
  each, a veth pair to this one (10.231.k.1 here, 10.231.k.2 there), its own sshd on port 22, and
  with `rate_mbit` a `tc tbf` rate limit each way. Tasks on a namespace host reach the launcher's
  side and every namespace host, not the loopback hosts (127/8 never leaves a namespace): put ps
  tasks there, and the tasks that reach them on the loopback hosts.
- `block(address, port)`: connections from the rig's tasks to address:port are refused (iptables
  REJECT with a TCP reset, matched on a cgroup that holds the loopback sshds and so every task
  they start), while the launcher's own still get through: a firewall that lets in the head node only,
  which is what a rehearsal must name in its table without failing its start-up.

`stop()` removes every rule, namespace, veth pair, cgroup and process the rig made, then asserts
none is left (`leftovers()`).
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.sshd import SSHHosts

log = logging.getLogger(__name__)

LOOPBACK_BASE = 10                   # the first loopback host is 127.0.1.10
SUBNET = '10.231'                    # namespace host k: 10.231.k.1 (this side), 10.231.k.2 (the host)
CGROUP_ROOT = Path('/sys/fs/cgroup/unified')
TBF_LATENCY = '50ms'
PER_SSHD = 16                        # addresses one sshd listens on at most (its MAX_LISTEN_SOCKS)
_ids = itertools.count()


def _ip(*args: str) -> str:
    return subprocess.run(['ip', *args], check=True, capture_output=True, text=True).stdout


def unavailable(namespaces: bool = True) -> str | None:
    """Why the rig's namespaces or port blocks cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return 'needs root'
    missing = [t for t in ('ip', 'iptables') + (('tc',) if namespaces else ()) if shutil.which(t) is None]
    if missing:
        return f'needs {", ".join(missing)}'
    if not (CGROUP_ROOT / 'cgroup.procs').exists():
        return f'needs a cgroup v2 hierarchy at {CGROUP_ROOT} (port blocks match on it)'
    return None


def _burst(rate_mbit: float) -> int:
    """tbf's bucket: a few ms of the rate, at least a couple of full frames."""
    return max(3200, int(rate_mbit * 1e6 / 8 / 250))


class NamespaceHost:
    """One host in a network namespace of its own, a veth pair to this side and its own sshd."""

    def __init__(self, tag: str, k: int, slot: int, tmp: Path, rate_mbit: float | None):
        self.ns, self.veth = f'{tag}-{k}', f'{tag[-9:]}v{k}'[-15:]
        self.gateway, self.address = f'{SUBNET}.{slot}.1', f'{SUBNET}.{slot}.2'
        self.rate_mbit = rate_mbit
        self.sshd = SSHHosts(tmp, [self.address], port=22, wrap=['ip', 'netns', 'exec', self.ns])

    def start(self) -> None:
        _ip('netns', 'add', self.ns)
        _ip('link', 'add', self.veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', self.ns)
        _ip('addr', 'add', f'{self.gateway}/24', 'dev', self.veth)
        _ip('link', 'set', self.veth, 'up')
        _ip('-n', self.ns, 'addr', 'add', f'{self.address}/24', 'dev', 'eth0')
        _ip('-n', self.ns, 'link', 'set', 'eth0', 'up')
        _ip('-n', self.ns, 'link', 'set', 'lo', 'up')
        if self.rate_mbit:
            for prefix, dev in ((['ip', 'netns', 'exec', self.ns], 'eth0'), ([], self.veth)):   # sends, gets
                subprocess.run([*prefix, 'tc', 'qdisc', 'add', 'dev', dev, 'root', 'tbf', 'rate',
                                f'{self.rate_mbit:g}mbit', 'burst', str(_burst(self.rate_mbit)), 'latency',
                                TBF_LATENCY], check=True, capture_output=True)
        self.sshd.start()

    def stop(self) -> None:
        try:
            self.sshd.stop()
        finally:
            if os.path.exists(f'/run/netns/{self.ns}'):
                pids = subprocess.run(['ip', 'netns', 'pids', self.ns], capture_output=True, text=True).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), 9)
                # Both ends of the pair now (a namespace's own links go only once the kernel's cleanup ran).
                subprocess.run(['ip', 'link', 'delete', self.veth], capture_output=True)
                _ip('netns', 'delete', self.ns)


class Rig:
    """`hosts` loopback hosts behind one sshd, and `namespaces` namespace hosts; see the module's doc."""

    def __init__(self, tmp_path, hosts: int, namespaces: int = 0, rate_mbit: float | None = None):
        if not 0 < hosts <= 240:
            raise ValueError('1 to 240 loopback hosts')
        self.dir = Path(tmp_path)
        self.tag = f'tfrig-{os.getpid()}-{next(_ids)}'
        addresses = [f'127.0.1.{LOOPBACK_BASE + i}' for i in range(hosts)]
        self.groups = [SSHHosts(self.dir / f'sshd-{i // PER_SSHD}', addresses[i:i + PER_SSHD])
                       for i in range(0, hosts, PER_SSHD)]
        used = {int(a.split('.')[2]) for a in _ip('-o', '-4', 'addr', 'show').split() if a.startswith(SUBNET + '.')} \
            if namespaces else set()
        slots = [s for s in range(1, 255) if s not in used][:namespaces]
        self.spaces = [NamespaceHost(self.tag, k, slot, self.dir / f'ns-{k}', rate_mbit) for k, slot in enumerate(slots)]
        self.cgroup = CGROUP_ROOT / self.tag
        self.rules: list[list[str]] = []
        self.ssh_config = self.dir / 'ssh_config'

    @property
    def addresses(self) -> list[str]:
        """Every host: the loopback ones, then the namespace ones."""
        return [a for g in self.groups for a in g.addresses] + [s.address for s in self.spaces]

    def sshd_of(self, address: str) -> SSHHosts:
        return next(s for s in self._servers() if address in s.addresses)

    def __enter__(self) -> Rig:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> Rig:
        try:
            if unavailable(namespaces=False) is None:
                self.cgroup.mkdir()
            for group in self.groups:
                group.start()
                if self.cgroup.is_dir():
                    (self.cgroup / 'cgroup.procs').write_text(str(group.pid))    # its sessions follow
            for space in self.spaces:
                space.start()
        except BaseException:
            self.stop()
            raise
        self.ssh_config.write_text('\n'.join(s.ssh_config.read_text() for s in self._servers()))
        return self

    def _servers(self) -> list[SSHHosts]:
        return [*self.groups, *(s.sshd for s in self.spaces)]

    def host_settings(self, workdir_of, python: str = sys.executable) -> dict:
        """The spec's `hosts` section: every host's port, user, key, python, and workdir_of(address)."""
        return {a: {'port': self.sshd_of(a).port, 'user': 'root', 'key': str(self.sshd_of(a).key_path),
                    'python': python, 'workdir': str(workdir_of(a))} for a in self.addresses}

    def block(self, address: str, port: int) -> None:
        """Refuse the rig's tasks' connections to address:port (the launcher's get through)."""
        if not self.cgroup.is_dir():
            raise RuntimeError(f'cannot block a port: {unavailable(namespaces=False)}')
        rule = ['OUTPUT', '-d', address, '-p', 'tcp', '--dport', str(port), '-m', 'cgroup', '--path', self.tag,
                '-m', 'comment', '--comment', self.tag, '-j', 'REJECT', '--reject-with', 'tcp-reset']
        subprocess.run(['iptables', '-I', *rule], check=True, capture_output=True)
        self.rules.append(rule)

    def session_processes(self) -> dict[int, int]:
        """Every process under the rig's sshds: sessions and the tasks they started."""
        out: dict[int, int] = {}
        for server in self._servers():
            out.update(server.session_processes())
        return out

    def stop(self) -> None:
        """Remove everything the rig made, then assert nothing is left."""
        errors = []
        for rule in self.rules:
            done = subprocess.run(['iptables', '-D', *rule], capture_output=True, text=True)
            if done.returncode:
                errors.append(done.stderr.strip())
        self.rules = []
        for server in [*self.groups, *self.spaces]:
            try:
                server.stop()
            except Exception as e:      # every part is stopped whatever one raised: said below
                errors.append(f'{server!r}: {e}')
        if self.cgroup.is_dir():
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()
        left = self.leftovers()
        assert not errors and not left, (errors, left)

    def leftovers(self) -> list[str]:
        """What of the rig's is still there: rules, namespaces, veth pairs, its cgroup, processes."""
        left = []
        rules = subprocess.run(['iptables', '-S', 'OUTPUT'], capture_output=True, text=True).stdout \
            if shutil.which('iptables') else ''
        left += [f'rule {r}' for r in rules.splitlines() if self.tag in r]
        spaces = os.listdir('/run/netns') if os.path.isdir('/run/netns') else []
        left += [f'netns {n}' for n in spaces if n.startswith(self.tag + '-')]
        links = _ip('-o', 'link', 'show') if self.spaces else ''
        left += [f'link {s.veth}' for s in self.spaces if f' {s.veth}@' in links or f' {s.veth}:' in links]
        if self.cgroup.exists():
            left.append(f'cgroup {self.cgroup}')
        left += [f'process {p}' for p in self.session_processes()]
        return left


@pytest.fixture
def rig10(tmp_path_factory):
    """Ten loopback hosts (127.0.1.10-19) behind one sshd; everything of it gone after."""
    with Rig(tmp_path_factory.mktemp('rig'), 10) as rig:
        yield rig
