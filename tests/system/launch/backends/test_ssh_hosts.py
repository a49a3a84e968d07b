"""Hardening of the SSH backend, against the real OpenSSH server of tests/harness/sshd.py (no mocks):
ssh config aliases and `hosts.X.address`, what the uploaded spec carries, a start that fails half
way, a server without SFTP, a host that cannot be reached in `launch status`, and GPUs a host
does not have."""
from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys

import pytest
import yaml

from cluster.spec import load_spec
from launch.planning.plan import plan_cluster, state_path
from tests.conftest import free_ports, write_spec
from tests.harness.sshd import SSHHosts
from tests.harness.ssh import assert_nothing_left, host_settings, remote_spec, run, spec_ports, task_rows, workdir

pytestmark = pytest.mark.slow     # a real sshd and real launchers


def alias_ssh_config(ssh_hosts, tmp_path, aliases: dict[str, str]) -> str:
    """An ssh config that knows the fixture's addresses only by alias: `Host nodeA` with
    `HostName 127.0.0.2` (and the fixture's port, user, key and known_hosts)."""
    blocks = {block.splitlines()[0].split()[1]: block
              for block in ssh_hosts.ssh_config.read_text().strip().split('\n\n')}
    text = '\n\n'.join(blocks[address].replace(f'Host {address}\n', f'Host {alias}\n', 1)
                       for alias, address in aliases.items())
    path = tmp_path / 'alias_ssh_config'
    path.write_text(text + '\n')
    return str(path)


def test_ssh_config_aliases_train_and_the_uploaded_spec_holds_only_addresses(ssh_hosts, tmp_path):
    """The spec names nodeA and nodeB, which only the ssh config resolves (HostName); nodeB also
    has an explicit `address:` (127.0.0.4: TF's servers listen on every interface), which wins.
    TF_CONFIG, the tasks' ClusterSpec and the launcher's readiness probe use those addresses, and
    the spec uploaded to each host has no user, key, port or workdir of any host."""
    config = alias_ssh_config(ssh_hosts, tmp_path, {'nodeA': '127.0.0.2', 'nodeB': '127.0.0.3'})
    hosts = {'nodeA': {'python': sys.executable, 'workdir': str(workdir(tmp_path, 'nodeA')), 'user': 'root',
                       'port': ssh_hosts.port},
             'nodeB': {'python': sys.executable, 'workdir': str(workdir(tmp_path, 'nodeB')), 'address': '127.0.0.4',
                       'key': str(ssh_hosts.key_path)}}
    spec = write_spec(tmp_path, task_hosts=['nodeA', 'nodeA', 'nodeB'], hosts=hosts, train_dir='run', steps=20)
    ports = spec_ports(spec)

    plan = run(ssh_hosts, tmp_path, 'plan', spec, ssh_config=config, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert f'ps:0  nodeA:{ports["ps:0"]} -> 127.0.0.2:{ports["ps:0"]}  (ssh root@nodeA:{ssh_hosts.port})' \
        in plan.stdout, plan.stdout
    assert f'worker:1  nodeB:{ports["worker:1"]} -> 127.0.0.4:{ports["worker:1"]}  ' \
           f'(ssh root@nodeB:{ssh_hosts.port})' in plan.stdout, plan.stdout
    assert f'"worker": ["127.0.0.2:{ports["worker:0"]}", "127.0.0.4:{ports["worker:1"]}"]' in plan.stdout

    check = run(ssh_hosts, tmp_path, 'check', spec, ssh_config=config, timeout=180)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith('nodeA: ok: root@127.0.0.2:'), check.stdout

    up = run(ssh_hosts, tmp_path, 'up', spec, ssh_config=config)
    assert up.returncode == 0, up.stdout + up.stderr
    assert re.search(r'^\[worker:0\] .*step 20/20', up.stdout, re.M), up.stdout
    assert f'worker:1 serving on 127.0.0.4:{ports["worker:1"]}' in up.stdout, up.stdout

    for name in ('nodeA', 'nodeB'):
        text = (workdir(tmp_path, name) / 'run' / 'spec.yaml').read_text()
        uploaded = yaml.safe_load(text)
        assert set(uploaded) == {'cluster', 'train', 'supervise'}, text
        assert uploaded['cluster'] == {'ps': [f'127.0.0.2:{ports["ps:0"]}'],
                                       'worker': [f'127.0.0.2:{ports["worker:0"]}', f'127.0.0.4:{ports["worker:1"]}']}
        for secret in (str(ssh_hosts.key_path), str(tmp_path), 'nodeA', 'nodeB', 'user', 'key:',
                       f': {ssh_hosts.port}'):
            assert secret not in text, (secret, text)
    assert_nothing_left(ssh_hosts)


def test_a_start_that_fails_half_way_stops_what_it_started(ssh_hosts, tmp_path):
    """worker:1's start command launches it, then its SSH connection dies before the answer comes
    back (for real: the command kills its own sshd session). The launcher cannot know its pid from
    that answer, so the backend stops it through its pidfile, and the run stops the two tasks it
    had started on the other host: nothing is left, and no state file claims otherwise."""
    from launch.run.console import Console
    from launch.run.lifecycle import Lifecycle
    from launch.run.supervised import SupervisedRun
    from launch.backends.ssh import SSHBackend
    from tests.harness.ssh import _CUT_MY_CONNECTION

    spec = load_spec(remote_spec(ssh_hosts, tmp_path))
    plans = [dataclasses.replace(p, argv=('sleep', '300'), env={}) for p in plan_cluster(spec)]
    backend = SSHBackend(spec, ssh_config=str(ssh_hosts.ssh_config))
    real_run = backend._run

    def cut_after_start(host, script, **kw):
        if host == '127.0.0.3' and 'setsid nohup' in script:
            script += '\n' + _CUT_MY_CONNECTION
        return real_run(host, script, **kw)

    backend._run = cut_after_start
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp_path)          # the state file lands in tmp_path/run, as for `launch up` run there
    try:
        code = Lifecycle(spec, Console(stream=out)).up(SupervisedRun(spec, spec.to_yaml(), plans,
                                                                     {'ssh': backend})).exit_code
    finally:
        os.chdir(cwd)
        backend.close()
    assert code == 1, out.getvalue()
    assert re.search(r'error: 127\.0\.0\.3: lost the SSH connection: .*; stopped worker:1, which had started',
                     out.getvalue()), out.getvalue()
    assert (workdir(tmp_path, '127.0.0.3') / 'run' / 'logs' / 'worker-1.rc').read_text().strip() == '143'
    for name in ('ps-0', 'worker-0'):
        assert (workdir(tmp_path, '127.0.0.2') / 'run' / 'logs' / f'{name}.rc').read_text().strip() == '143'
    assert not (tmp_path / state_path(spec)).exists()
    assert_nothing_left(ssh_hosts)


def test_a_server_without_sftp_is_named_in_one_line(tmp_path):
    with SSHHosts(tmp_path / 'sshd', sftp=False) as nosftp:
        spec = remote_spec(nosftp, tmp_path)
        check = run(nosftp, tmp_path, 'check', spec, timeout=180)
        up = run(nosftp, tmp_path, 'up', spec, timeout=180)
        assert check.returncode == 2, check.stdout + check.stderr
        for host in nosftp.addresses:
            assert (f'{host}: error: the SSH server at root@{host}:{nosftp.port} offers no SFTP subsystem; '
                    'tfcluster needs it to upload the spec and read logs: add `Subsystem sftp` to its '
                    'sshd_config') in check.stdout.splitlines(), check.stdout
        assert up.returncode == 2, up.stdout + up.stderr
        assert up.stderr.count('\n') == 1 and 'offers no SFTP subsystem' in up.stderr, up.stderr
        assert 'Channel closed' not in check.stdout + up.stderr
        assert not any(workdir(tmp_path, h).exists() for h in nosftp.addresses)     # nothing started
        assert_nothing_left(nosftp)


def test_status_shows_tasks_of_an_unreachable_host_as_unknown_and_down_keeps_them(ssh_hosts, tmp_path):
    """Tasks (stand-ins: `sleep`) run on both hosts, as a launcher that died left them; then the
    spec points 127.0.0.3 at a port nothing listens on. `status` says `?` and why, not "yes";
    `down` cannot stop worker:1, says so and keeps the state file for a later `down`."""
    from launch.backends.ssh import SSHBackend
    from launch.run.state import LaunchState

    spec_file = remote_spec(ssh_hosts, tmp_path)
    spec = load_spec(spec_file)
    plans = [dataclasses.replace(p, argv=('sleep', '300'), env={}) for p in plan_cluster(spec)]
    backend = SSHBackend(spec, ssh_config=str(ssh_hosts.ssh_config))
    gone = subprocess.run(['sh', '-c', 'echo $$'], capture_output=True, text=True).stdout.strip()
    try:
        backend.prepare(plans, spec.to_yaml())
        state = LaunchState(spec=spec_file, launcher_pid=int(gone), launcher_ident='gone', started=0.0,
                            tasks=[backend.start(p) for p in plans])
    finally:
        backend.close()
    state.save(str(tmp_path / state_path(spec)))
    closed = f'hosts.127.0.0.3.port={free_ports(1)[0]}'
    try:
        status = run(ssh_hosts, tmp_path, 'status', spec_file, '--set', closed, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        rows = {r[0]: r for r in task_rows(status.stdout)}
        assert rows['ps:0'][4:6] == ['yes', 'no'] and rows['worker:0'][4:6] == ['yes', 'no'], status.stdout
        line = next(x for x in status.stdout.splitlines() if x.startswith('worker:1'))
        assert rows['worker:1'][4] == '?', status.stdout
        assert re.search(r'unknown: 127\.0\.0\.3: unreachable: connection refused at root@127\.0\.0\.3:\d+$',
                         line), status.stdout
        down = run(ssh_hosts, tmp_path, 'down', spec_file, '--set', closed, timeout=60)
        assert down.returncode == 1 and 'could not stop worker:1' in down.stderr, down.stdout + down.stderr
        assert (tmp_path / state_path(spec)).exists()
    finally:
        down = run(ssh_hosts, tmp_path, 'down', spec_file, timeout=60)
    assert down.returncode == 0 and 'stopped' in down.stdout, down.stdout + down.stderr
    assert not (tmp_path / state_path(spec)).exists()
    assert_nothing_left(ssh_hosts)


def test_gpus_a_host_does_not_have_are_refused(ssh_hosts, tmp_path):
    """These machines have no GPU: `devices: [gpu:0]` is refused by check and up, per host with
    workers (both here), before anything starts; the ps-only side needs none."""
    spec = remote_spec(ssh_hosts, tmp_path, devices=['gpu:0'])
    check = run(ssh_hosts, tmp_path, 'check', spec, timeout=180)
    up = run(ssh_hosts, tmp_path, 'up', spec, timeout=180)
    assert (check.returncode, up.returncode) == (2, 2), check.stdout + check.stderr + up.stdout + up.stderr
    assert up.stderr.count('\n') == 1 and check.stderr == up.stderr, (check.stderr, up.stderr)   # one pre-flight
    for host, worker in (('127.0.0.2', 'worker:0'), ('127.0.0.3', 'worker:1')):
        assert f'{host} ({worker}): names gpu:0 but the host has no GPU' in up.stderr, up.stderr
    assert not any(workdir(tmp_path, h).exists() for h in ('127.0.0.2', '127.0.0.3'))
    # a host with only ps tasks needs no GPU
    ps_only = write_spec(tmp_path, task_hosts=['127.0.0.3', '127.0.0.2', '127.0.0.2'],
                         hosts=host_settings(ssh_hosts, tmp_path), train_dir='run', devices=['gpu:0'])
    check = run(ssh_hosts, tmp_path, 'check', ps_only, timeout=180)
    assert check.returncode == 2 and check.stderr.count('\n') == 1, check.stderr
    assert '127.0.0.2 (worker:' in check.stderr and '127.0.0.3' not in check.stderr, check.stderr
    assert_nothing_left(ssh_hosts)
