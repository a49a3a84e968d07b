"""The SSH backend through the real `launch` command line, against a real OpenSSH server that
answers on 127.0.0.2 and 127.0.0.3 (tests/harness/sshd.py): no mocks. Both "hosts" are listed under the
spec's `hosts`, so every task goes through SSH although it runs on this machine; each host has its
own workdir under tmp_path, and since TF's servers listen on all interfaces every task has its own
port."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from cluster.runtime import messages
from tests.conftest import (TASK_ENV, environment_words, envs_through, free_ports, launch_bg, project_processes,
                            read_until, write_spec)
from tests.harness.ssh import LAYOUT, _CUT_MY_CONNECTION, assert_nothing_left, host_settings, remote_spec, run, spec_ports, task_rows, workdir

pytestmark = pytest.mark.slow     # a real sshd (the ssh_hosts fixture) and real launchers


def ssh_config_with_known_hosts(ssh_hosts, tmp_path, known_hosts) -> str:
    """The fixture's ssh_config, with UserKnownHostsFile pointing at `known_hosts`."""
    path = tmp_path / 'ssh_config'
    path.write_text(ssh_hosts.ssh_config.read_text().replace(str(ssh_hosts.known_hosts), str(known_hosts)))
    return str(path)


# -- a whole cluster over SSH -------------------------------------------------------------------

def test_remote_cluster_trains_to_the_end(ssh_hosts, tmp_path):
    spec = remote_spec(ssh_hosts, tmp_path)
    result = run(ssh_hosts, tmp_path, 'up', spec)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    for name in ('ps:0', 'worker:0', 'worker:1'):
        assert f'[{name}]' in out, out
    assert re.search(r'^\[worker:0\] .*step 10/10', out, re.M), out
    # The closing summary has figures from both remote workers' hosts.
    assert re.search(r'done in .*: global step 10, \d+ images/s in all, final loss', out), out
    chief_run = workdir(tmp_path, '127.0.0.2') / 'run'
    assert (chief_run / 'checkpoint').is_file()
    assert (chief_run / 'spec.yaml').is_file() and (workdir(tmp_path, '127.0.0.3') / 'run' / 'spec.yaml').is_file()
    assert (chief_run / 'logs' / 'worker-0.rc').read_text().strip() == '0'
    assert not (tmp_path / 'run' / 'launch-state.json').exists()

    logs = run(ssh_hosts, tmp_path, 'logs', spec, timeout=60)
    assert logs.returncode == 0, logs.stderr
    assert re.search(r'^\[worker:1\] .*step 10/10', logs.stdout, re.M), logs.stdout
    assert '[ps:0]' in logs.stdout
    one = run(ssh_hosts, tmp_path, 'logs', spec, 'worker:1', timeout=60)
    assert one.returncode == 0 and 'step 10/10' in one.stdout, one.stdout + one.stderr
    assert '[worker:' not in one.stdout          # one task: its lines as they are

    status = run(ssh_hosts, tmp_path, 'status', spec, timeout=60)
    assert status.returncode == 0 and 'no cluster' in status.stdout, status.stdout + status.stderr
    rows = task_rows(status.stdout)
    assert len(rows) == 3 and all(r[-2:] == ['no', 'no'] for r in rows), status.stdout
    down = run(ssh_hosts, tmp_path, 'down', spec, timeout=60)
    assert down.returncode == 0 and 'nothing to stop' in down.stdout
    assert_nothing_left(ssh_hosts)


def test_status_logs_and_down_after_the_launcher_is_killed(ssh_hosts, tmp_path):
    spec = remote_spec(ssh_hosts, tmp_path, steps=100000)
    proc = launch_bg('up', spec, '--ssh-config', str(ssh_hosts.ssh_config), cwd=str(tmp_path))
    try:
        read_until(proc, 'servers are up')
        status = run(ssh_hosts, tmp_path, 'status', spec, timeout=60)
        rows = task_rows(status.stdout)
        assert len(rows) == 3 and all(r[2] == 'ssh' and r[-2:] == ['yes', 'yes'] for r in rows), status.stdout
        proc.kill()                   # the launcher dies; its tasks, detached on their hosts, do not
        proc.wait()
        assert len(project_processes()) >= 3
        logs = run(ssh_hosts, tmp_path, 'logs', spec, 'worker:1', timeout=60)
        assert 'worker:1 serving on 127.0.0.3' in logs.stdout, logs.stdout + logs.stderr
        down = run(ssh_hosts, tmp_path, 'down', spec, timeout=60)
        assert down.returncode == 0 and 'stopped 3 task(s)' in down.stdout, down.stdout + down.stderr
        assert not project_processes()
        status = run(ssh_hosts, tmp_path, 'status', spec, timeout=60)
        assert all(r[-2:] == ['no', 'no'] for r in task_rows(status.stdout)), status.stdout
        again = run(ssh_hosts, tmp_path, 'down', spec, timeout=60)
        assert again.returncode == 0 and 'nothing' in again.stdout
    finally:
        proc.kill()
        proc.wait()
        run(ssh_hosts, tmp_path, 'down', spec, timeout=60)
    assert_nothing_left(ssh_hosts)


def test_a_remote_task_dying_at_start_up_fails_the_run(ssh_hosts, tmp_path):
    # The launcher checks a data directory only for local workers: the remote ones find out.
    spec = remote_spec(ssh_hosts, tmp_path)
    result = run(ssh_hosts, tmp_path, 'up', spec, '--set', 'train.data=/nonexistent')
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r'error: worker:\d exited with code 2 during start-up', result.stdout), result.stdout
    assert 'data directory /nonexistent does not exist' in result.stdout      # the log's last lines
    assert_nothing_left(ssh_hosts)


def test_backend_polls_once_per_host_quotes_values_and_stops_process_groups(ssh_hosts, tmp_path, monkeypatch):
    """In-process, with `sleep` standing in for the tasks: one status command per host for all its
    tasks, env values that survive any quoting, each task in its own session, SIGTERM to the group."""
    from cluster.spec import load_spec
    from launch.planning.plan import plan_cluster
    from launch.backends.ssh import SSHBackend

    spec = load_spec(remote_spec(ssh_hosts, tmp_path))
    tricky = 'a b  "double" \'single\' $HOME ${PATH} `id` $(id) \\ ; & | * ? ~ \t tab\nnewline é'
    plans = [dataclasses.replace(p, argv=('sh', '-c', 'printf "%s\\n" "$X"; exec sleep 300'), env={'X': tricky})
             for p in plan_cluster(spec)]
    # A host's snapshot must not expire while the other host answers, however slow this machine.
    monkeypatch.setattr('launch.backends.ssh.backend.SNAPSHOT_TTL', 30.0)
    backend = SSHBackend(spec, ssh_config=str(ssh_hosts.ssh_config))
    commands = []
    real_run = backend._run
    backend._run = lambda host, script, **kw: (commands.append(host), real_run(host, script, **kw))[1]
    records = []
    try:
        backend.prepare(plans, spec.to_yaml())
        records = [backend.start(p) for p in plans]
        for r in records:
            leader = ssh_hosts.ssh(r.host, f'ps -o sid=,pgid= -p {r.pid}').stdout.split()
            assert leader == [str(r.handle.group)] * 2         # its own session and process group,
            assert r.pid != r.handle.group                     # whose leader is the wrapper, not the task
            assert open(r.handle.pidfile).read().strip() == str(r.handle.group)
        deadline = time.monotonic() + 10
        while len(list(backend.read_log(records[2]))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert '\n'.join(backend.read_log(records[2])) == tricky
        commands.clear()
        assert [backend.status(r).state for r in records] == ['running'] * 3
        assert sorted(commands) == ['127.0.0.2', '127.0.0.3']   # not one per task
        commands.clear()
        backend.stop(records, grace=5)
        assert sorted(commands) == ['127.0.0.2', '127.0.0.3']
        assert [(backend.status(r).state, backend.status(r).exit_code) for r in records] == [('ended', -signal.SIGTERM)] * 3
        assert not any(backend.status(r).alive for r in records)
    finally:
        backend.stop(records, grace=1)
        backend.close()
    assert_nothing_left(ssh_hosts)


def test_a_hosts_watcher_tells_an_end_without_a_command_and_a_cut_one_falls_back_to_snapshots(ssh_hosts, tmp_path):
    """Each host's task watcher (launch/backends/ssh/watch.py) answers status once it has spoken:
    no command is run to see the tasks running, nor one killed on its host (with its wrapper's rc);
    with its connection cut, status is answered by snapshots again, never "gone"; closed, it
    leaves no process or session on the host."""
    from cluster.spec import load_spec
    from launch.planning.plan import plan_cluster
    from launch.backends.ssh import SSHBackend

    spec = load_spec(remote_spec(ssh_hosts, tmp_path))
    plans = [dataclasses.replace(p, argv=('sleep', '300'), env={}) for p in plan_cluster(spec)]
    backend = SSHBackend(spec, ssh_config=str(ssh_hosts.ssh_config))
    commands = []
    real_run = backend._run
    backend._run = lambda host, script, **kw: (commands.append(host), real_run(host, script, **kw))[1]
    records = []

    def quiet_round(want):
        """Rounds of status until they see `want` and run no command for a second (longer than a
        snapshot answers status: SNAPSHOT_TTL)."""
        deadline, quiet_since = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            commands.clear()
            seen = [(backend.status(r).state, backend.status(r).exit_code) for r in records]
            if commands or seen != want:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 1.0:
                return
            time.sleep(0.05)
        raise AssertionError(f'no quiet second: {seen}, commands {commands}')

    try:
        backend.prepare(plans, spec.to_yaml())
        records = [backend.start(p) for p in plans]
        quiet_round([('running', None)] * 3)
        ssh_hosts.ssh(records[2].host, f'kill -KILL {records[2].pid}')
        quiet_round([('running', None)] * 2 + [('ended', -signal.SIGKILL)])
        backend._drop('127.0.0.2')           # cuts the watcher's connection with it
        seen = [backend.status(r) for r in records[:2]]
        assert [o.state for o in seen] in (['running'] * 2, ['unknown'] * 2), seen
        quiet_round([('running', None)] * 2 + [('ended', -signal.SIGKILL)])   # watching again
    finally:
        backend._run = real_run
        backend.stop(records, grace=1)
        backend.close()
    assert_nothing_left(ssh_hosts)


def test_an_ssh_task_gets_the_spec_env_quoted(ssh_hosts, tmp_path):
    """The spec's env: (values needing quotes, a per-job override) reaches each remote task as the
    local backend gives it, beside the task's own login environment; a secret too, while the spec
    copy uploaded to each host holds only a reference to it and is its owner's alone (0600)."""
    from cluster.spec import load_spec
    from launch.planning.plan import plan_cluster
    from launch.backends.ssh import SSHBackend

    top = {**TASK_ENV, 'env': {**TASK_ENV['env'], 'TFC_TEST_TOKEN': "a 'secret' $x"}}
    spec = load_spec(write_spec(tmp_path, task_hosts=LAYOUT, hosts=host_settings(ssh_hosts, tmp_path),
                                train_dir='run', top=top))
    backend = SSHBackend(spec, ssh_config=str(ssh_hosts.ssh_config))
    try:
        seen = envs_through(backend, spec, list(plan_cluster(spec)))
    finally:
        backend.close()
    for task, job in (('ps:0', 'ps'), ('worker:0', 'worker'), ('worker:1', 'worker')):
        env = seen[task]
        assert [f'{k}={env.get(k)!r}' for k in sorted(TASK_ENV['env'])] == environment_words(job), env
        assert env['TFC_TEST_TOKEN'] == "a 'secret' $x", env
        assert env.get('CUDA_VISIBLE_DEVICES') == ('' if job == 'ps' else None)     # auto, the count not asked
        assert json.loads(env['TF_CONFIG'])['task']['type'] == job
    for address in ssh_hosts.addresses:
        copy = workdir(tmp_path, address) / 'run' / 'spec.yaml'
        assert 'secret' not in copy.read_text() and stat.S_IMODE(os.stat(copy).st_mode) == 0o600
    assert_nothing_left(ssh_hosts)


def test_a_status_query_cut_short_is_a_lost_connection_not_dead_tasks(ssh_hosts, tmp_path):
    """The connection dies while a status query runs: that is an SSH error (retried by the
    supervisor), never "the tasks are gone" (which would read as killed hard); the next query
    connects anew and finds the tasks still running."""
    from cluster.spec import load_spec
    from launch.planning.plan import plan_cluster
    from launch.backends.ssh import SSHBackend

    spec = load_spec(remote_spec(ssh_hosts, tmp_path))
    plans = [dataclasses.replace(p, argv=('sleep', '300'), env={}) for p in plan_cluster(spec)]
    backend = SSHBackend(spec, ssh_config=str(ssh_hosts.ssh_config))
    records = []
    try:
        backend.prepare(plans, spec.to_yaml())
        records = [backend.start(p) for p in plans]
        real_run = backend._run
        backend._run = lambda host, script, **kw: real_run(host, _CUT_MY_CONNECTION + script, **kw)
        seen = backend.status(records[0])
        assert seen.state == 'unknown' and re.match(r'127\.0\.0\.2: lost the SSH connection', seen.error), seen
        backend._run = real_run
        backend._invalidate('127.0.0.2')
        assert [backend.status(r).state for r in records] == ['running'] * 3
    finally:
        backend.stop(records, grace=1)
        backend.close()
    assert_nothing_left(ssh_hosts)


# -- errors: each produced for real, each naming the host and the cause ---------------------------

def _case(name, ssh_hosts, tmp_path):
    """(hosts section, ssh_config or None, bad host, expected cause, context manager to hold)."""
    bad = '127.0.0.3'
    hosts = host_settings(ssh_hosts, tmp_path)
    config = None
    if name == 'closed port':
        hosts[bad]['port'] = free_ports(1)[0]
        cause = 'unreachable: connection refused at root@127.0.0.3'
    elif name == 'no sshd at the address':
        hosts['127.0.0.9'] = dict(hosts[bad], workdir=str(workdir(tmp_path, '127.0.0.9')))
        bad = '127.0.0.9'
        cause = 'unreachable: connection refused at root@127.0.0.9'
    elif name == 'wrong key':
        hosts[bad]['key'] = str(ssh_hosts.wrong_key(tmp_path))
        cause = 'authentication refused for root@127.0.0.3'
    elif name == 'unknown host key':
        known = tmp_path / 'known_hosts'
        known.write_text(ssh_hosts.known_hosts.read_text().replace('[127.0.0.3]', '[127.0.0.4]'))
        config = ssh_config_with_known_hosts(ssh_hosts, tmp_path, known)
        cause = f'host key unknown: [127.0.0.3]:{ssh_hosts.port} is not in {known}'
    elif name == 'changed host key':
        other = ssh_hosts.other_host_key_known_hosts(tmp_path / 'other_known_hosts')
        config = ssh_config_with_known_hosts(ssh_hosts, tmp_path, other)
        cause = 'host key changed'
        bad = None                   # both hosts
    elif name == 'python without tensorflow':
        venv = tmp_path / 'venv'          # a Python without this project's packages
        subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
        hosts[bad]['python'] = str(venv / 'bin' / 'python')
        cause = (f'python {venv}/bin/python on root@127.0.0.3:{ssh_hosts.port} cannot import tensorflow nor '
                 f'cluster: install tensorflow and tfcluster there, or set hosts.127.0.0.3.python')
    elif name == 'wrong python':
        hosts[bad]['python'] = '/nonexistent/bin/python3'
        cause = 'python /nonexistent/bin/python3 not found on root@127.0.0.3'
    else:
        raise AssertionError(name)
    return hosts, config, bad, cause


ERROR_CASES = ['closed port', 'no sshd at the address', 'wrong key', 'unknown host key', 'changed host key',
               'wrong python', 'python without tensorflow']


@pytest.mark.parametrize('case', ERROR_CASES)
def test_check_and_up_name_the_host_and_cause(ssh_hosts, tmp_path, case):
    hosts, config, bad, cause = _case(case, ssh_hosts, tmp_path)
    layout = ['127.0.0.2', '127.0.0.2', bad] if bad == '127.0.0.9' else LAYOUT
    spec = write_spec(tmp_path, task_hosts=layout, hosts=hosts, train_dir='run')
    check = run(ssh_hosts, tmp_path, 'check', spec, ssh_config=config, timeout=180)
    assert check.returncode == 2, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    bad_hosts = [bad] if bad else ['127.0.0.2', '127.0.0.3']
    for host in bad_hosts:
        assert any(line.startswith(f'{host}: error: ') and cause in line for line in lines), check.stdout
    if bad:
        assert any(line.startswith('127.0.0.2: ok: ') for line in lines), check.stdout

    up = run(ssh_hosts, tmp_path, 'up', spec, ssh_config=config, timeout=180)
    assert up.returncode == 2, up.stdout + up.stderr
    assert up.stderr.count('\n') == 1 and 'pre-flight failed' in up.stderr, up.stderr
    assert check.stderr.splitlines()[-1] == up.stderr.strip(), (check.stderr, up.stderr)    # one pre-flight
    for host in bad_hosts:
        assert f'{host}: error: ' in up.stderr and cause in up.stderr, up.stderr
    assert not any(workdir(tmp_path, h).exists() for h in ('127.0.0.2', '127.0.0.3'))   # nothing started
    assert_nothing_left(ssh_hosts)


def test_a_remote_port_in_use(ssh_hosts, tmp_path):
    spec = remote_spec(ssh_hosts, tmp_path)
    port = spec_ports(spec)['worker:1']
    with socket.socket() as s:
        s.bind(('127.0.0.3', port))
        s.listen()
        check = run(ssh_hosts, tmp_path, 'check', spec, timeout=180)
        up = run(ssh_hosts, tmp_path, 'up', spec, timeout=180)
    line = f'worker:1: port {port} on 127.0.0.3 is already in use'
    assert check.returncode == 2
    assert f'127.0.0.3: error: {line}' in check.stdout.splitlines(), check.stdout
    assert '127.0.0.2: ok: ' in check.stdout
    assert up.returncode == 2 and up.stderr == f'launch: error: {spec}: {line}\n', up.stderr
    assert check.stderr.splitlines()[-1] == up.stderr.strip(), check.stderr
    assert_nothing_left(ssh_hosts)


def test_check_reports_every_bad_host(ssh_hosts, tmp_path):
    hosts = host_settings(ssh_hosts, tmp_path, **{'127.0.0.2': {'python': '/no/python'},
                                                  '127.0.0.3': {'key': str(ssh_hosts.wrong_key(tmp_path))}})
    spec = remote_spec(ssh_hosts, tmp_path, hosts=hosts)
    check = run(ssh_hosts, tmp_path, 'check', spec, timeout=180)
    assert check.returncode == 2
    assert sorted(check.stdout.splitlines()) == [
        f'127.0.0.2: error: python /no/python not found on root@127.0.0.2:{ssh_hosts.port} (exit 127); '
        f'set hosts.127.0.0.2.python',
        f'127.0.0.3: error: authentication refused for root@127.0.0.3:{ssh_hosts.port} '
        f'(tried {tmp_path / "wrong_key"}); check hosts.127.0.0.3.key and user'], check.stdout
    assert_nothing_left(ssh_hosts)


def test_check_imports_tensorflow_where_up_only_finds_it(ssh_hosts, tmp_path):
    """A TensorFlow that is installed but cannot load (here: a stand-in whose import fails the way
    a missing CUDA library does) fails `launch check`, which imports it; `launch up` only finds it,
    and reports the task dying at start-up with its log lines instead."""
    broken = tmp_path / 'broken' / 'tensorflow'
    broken.mkdir(parents=True)
    (broken / '__init__.py').write_text('raise ImportError("libcudart.so.12: cannot open shared object file")\n')
    python = tmp_path / 'python-broken-tf'
    python.write_text(f'#!/bin/sh\nPYTHONPATH={broken.parent} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    hosts = host_settings(ssh_hosts, tmp_path, **{'127.0.0.3': {'python': str(python)}})
    spec = remote_spec(ssh_hosts, tmp_path, hosts=hosts)
    check = run(ssh_hosts, tmp_path, 'check', spec, timeout=180)
    assert check.returncode == 2, check.stdout + check.stderr
    assert (f'127.0.0.3: error: python {python} on root@127.0.0.3:{ssh_hosts.port} cannot import tensorflow '
            f'(ImportError: libcudart.so.12: cannot open shared object file)') in check.stdout, check.stdout
    assert re.search(r'^127\.0\.0\.2: ok: .*tensorflow \d', check.stdout, re.M), check.stdout
    up = run(ssh_hosts, tmp_path, 'up', spec, timeout=180)
    assert up.returncode != 0
    assert 'error: worker:1 exited with code 1 during start-up' in up.stdout, up.stdout + up.stderr
    assert 'ImportError: libcudart.so.12' in up.stdout and 'Terminated' not in up.stdout, up.stdout
    assert_nothing_left(ssh_hosts)


def test_check_passes_and_insecure_flag_accepts_an_unknown_host_key(ssh_hosts, tmp_path):
    spec = remote_spec(ssh_hosts, tmp_path)
    check = run(ssh_hosts, tmp_path, 'check', spec, timeout=180)
    assert check.returncode == 0, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    assert len(lines) == 2 and all(': ok: root@127.0.0.' in line and 'tensorflow' in line for line in lines)
    empty = tmp_path / 'empty_known_hosts'
    empty.write_text('')
    config = ssh_config_with_known_hosts(ssh_hosts, tmp_path, empty)
    assert run(ssh_hosts, tmp_path, 'check', spec, ssh_config=config, timeout=180).returncode == 2
    insecure = run(ssh_hosts, tmp_path, 'check', spec, '--insecure-accept-any-host-key', ssh_config=config, timeout=180)
    assert insecure.returncode == 0, insecure.stdout + insecure.stderr
    assert 'WARNING: SSH host keys are NOT checked' in insecure.stderr
    assert empty.read_text() == ''               # nothing learnt, nothing saved
    assert_nothing_left(ssh_hosts)


def test_plan_shows_where_and_how_remote_tasks_run(ssh_hosts, tmp_path):
    hosts = host_settings(ssh_hosts, tmp_path)
    del hosts['127.0.0.3']               # listed in the ssh config only: it decides user and port
    spec = write_spec(tmp_path, task_hosts=LAYOUT, hosts=hosts, train_dir='run')
    plan = run(ssh_hosts, tmp_path, 'plan', spec, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.count(f'(ssh root@127.0.0.2:{ssh_hosts.port})') == 2
    assert plan.stdout.count(f'(ssh root@127.0.0.3:{ssh_hosts.port})') == 1
    assert f'cwd:  {workdir(tmp_path, "127.0.0.2")}' in plan.stdout
    assert 'cwd:  tfcluster' in plan.stdout and 'run:  python3 -m cluster.task' in plan.stdout
    assert "env:  TF_CONFIG='{" in plan.stdout


def _sshd_connections(ssh_hosts) -> list[int]:
    """The per-connection sshd processes (`sshd: root@notty`), not the tasks they started."""
    out = []
    for pid in ssh_hosts.session_processes():
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                if f.read().startswith(b'sshd:'):
                    out.append(pid)
        except OSError:
            pass
    return out


def _up_and_kill_remote_worker(ssh_hosts, tmp_path, spec, before=lambda proc: []) -> tuple[int, str]:
    """`launch up` of a remote spec; once it trains (and `before(proc)` has added its lines),
    kill -9 of worker:1 on 127.0.0.3: its own process, the pid the state file records and its log
    prints, not its shell wrapper. (exit code, the whole output); `launch down` whatever happens."""
    proc = launch_bg('up', spec, '--ssh-config', str(ssh_hosts.ssh_config), cwd=str(tmp_path))
    try:
        # Every server up, as the launcher says: past the start, where a lost task ends a first start.
        lines = read_until(proc, 'servers are up')
        lines += before(proc)
        with open(tmp_path / 'run' / 'launch-state.json') as f:
            worker = next(t for t in json.load(f)['tasks'] if t['name'] == 'worker:1')
        assert worker['host'] == '127.0.0.3'
        with open(f'/proc/{worker["pid"]}/cmdline', 'rb') as f:
            assert b'cluster.task' in f.read()
        os.kill(worker['pid'], signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
        run(ssh_hosts, tmp_path, 'down', spec, timeout=60)
    return proc.returncode, ''.join(lines) + out


def test_remote_faults_a_dropped_connection_and_a_lost_worker(ssh_hosts, tmp_path):
    """Every SSH connection of the launcher is cut mid-run (a transient fault: retried, not a
    failure), then the remote non-chief worker is killed (async: tolerated); the run ends at the
    requested step with exit 0 and nothing left on either host. The kill follows the cut at once:
    a run of a few hundred steps takes seconds, and one that waited for progress over the new
    connections first could be over before the kill (worker:1 gone, nothing to kill)."""
    spec = remote_spec(ssh_hosts, tmp_path, steps=400, sync=False, learning_rate=0.05)

    def cut_connections(proc) -> list[str]:
        for pid in _sshd_connections(ssh_hosts):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:      # a connection that closed since it was listed
                pass
        return []
    code, out = _up_and_kill_remote_worker(ssh_hosts, tmp_path, spec, before=cut_connections)
    assert code == 0, out
    assert 'worker:1 was killed by SIGKILL; training goes on with 1 worker(s)' in out
    # The last progress was read over new connections: the run's end, at the step asked for.
    assert re.search(r'done in .*global step 4\d\d.*\(lost worker:1\)', out), out
    assert_nothing_left(ssh_hosts)


def test_one_remote_kill_is_one_restart_and_the_worker_rejoins(ssh_hosts, tmp_path):
    """kill -9 of a remote async worker (its own pid, which the state file records, not a wrapper's)
    with `restart: on-failure`: one fault, one restart, one new copy (its port was free), and the
    run's summary says the worker finished, not that it was lost. 400 steps: the kill comes at the
    first progress line, seconds before the end, and the new copy has time to rejoin."""
    spec = remote_spec(ssh_hosts, tmp_path, steps=400, sync=False, learning_rate=0.05,
                       supervise={'restart': 'on-failure', 'max_restarts': 3})
    code, out = _up_and_kill_remote_worker(ssh_hosts, tmp_path, spec)
    assert code == 0, out
    assert out.count('restart 1/3: worker:1 was killed by SIGKILL') == 1, out
    assert 'restart 2/3' not in out and 'already in use' not in out, out
    assert re.search(r'done in .*global step 40\d', out) and 'lost worker:1' not in out, out
    events = [json.loads(line) for line in open(tmp_path / 'run' / 'events.jsonl')]
    assert [e['task'] for e in events if e['event'] == 'task_lost'] == ['worker:1'], events
    assert len([e for e in events if e['event'] == 'restart']) == 1
    # Its log keeps both starts; its channel, emptied on its host as it started again, the second's records alone.
    attempt = workdir(tmp_path, '127.0.0.3') / 'run' / 'logs' / 'attempt-1'
    served = [m for m in map(messages.read, open(attempt / 'worker-1.log')) if isinstance(m, messages.Serving)]
    recorded = [messages.read(r) for r in open(attempt / f'worker-1{messages.CHANNEL_SUFFIX}')]
    assert len(served) == 2 and [m for m in recorded if isinstance(m, messages.Serving)] == served[1:], recorded
    assert_nothing_left(ssh_hosts)
