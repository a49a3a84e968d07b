"""Secrets in a spec's env: and values a task could never be started with (issue 31, findings 7
and 8): through the real command line, the code that writes the spec copy, and the report.

A secret-looking name's value (KEY, TOKEN, SECRET, PASSWORD, ...) and any value taken from the
launcher's environment (`{from_env: NAME}`) appear nowhere the launcher prints or writes: `launch
plan [--json]`, the spec copy (mode 0600) and the report. A value over the OS's limits is one line
naming its key, exit 2, nothing written. None of these tests starts TensorFlow.
"""
from __future__ import annotations

import os

import pytest

from tests.conftest import write_spec
from tests.harness.parts import GRPC_STANDIN


# A user's command (the classic TF1 flags) that serves on its port as a TensorFlow task would and
# prints the token it was given every way a program does: print, a value in two writes with a
# pause between, stderr; worker:1 then fails with it in its error. It starts no TensorFlow.
PRINTING = GRPC_STANDIN + '''\
token, password = os.environ['API_TOKEN'], os.environ['DB_PASSWORD']
time.sleep(1)       # the launcher sees every task serve first
print('worker', a.task_index, 'has the token', token, 'and', password, flush=True)
sys.stdout.write('in two writes: ' + token[:6])
sys.stdout.flush()
time.sleep(0.3)
sys.stdout.write(token[6:] + '\\n')
print('on stderr:', token, file=sys.stderr, flush=True)
time.sleep(3)       # a test reads every process's command line meanwhile
if a.task_index == '1':
    raise RuntimeError('the service refused ' + token)
'''
TOKEN = 'tok-9f8e7d6c5b4a'          # from the launcher's environment
PASSWORD = 'pw-literal-31337'       # a literal of the spec, under a secret-looking name


def _printing_spec(tmp_path, **changes) -> str:
    (tmp_path / 'job.py').write_text(PRINTING)
    env = {'API_TOKEN': {'from_env': 'TFC_TEST_TOKEN'}, 'DB_PASSWORD': PASSWORD}
    if os.environ.get('PYTHONPATH'):    # the tree under test, for SSH tasks too (sshd passes no environment)
        env['PYTHONPATH'] = os.environ['PYTHONPATH']
    return write_spec(tmp_path, command=['python', str(tmp_path / 'job.py')], top={'env': env}, **changes)


def _cmdlines_holding(*values: str) -> list[str]:
    """The command line of every process of this machine that holds one of `values`."""
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                line = f.read().replace(b'\0', b' ').decode(errors='replace')
        except OSError:
            continue
        if any(v in line for v in values):
            found.append(f'{pid}: {line[:200]}')
    return found


def _files_holding(root, *values: str) -> list[str]:
    """Every file under `root` whose bytes hold one of `values` (the job's own source aside)."""
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if name == 'job.py' or os.path.islink(path):
                continue
            with open(path, 'rb') as f:
                data = f.read()
            if any(v.encode() in data for v in values):
                found.append(path)
    return found


def _check_printed_lines_masked(text: str) -> None:
    assert TOKEN not in text and PASSWORD not in text, text
    assert 'has the token *** and ***' in text and 'in two writes: ***' in text, text
    assert 'on stderr: ***' in text and 'the service refused ***' in text, text


@pytest.mark.slow
def test_a_secret_the_user_s_command_prints_is_masked_in_logs_console_and_records(tmp_path):
    """Local tasks: each value the spec hides that the user's own command prints is `***` in its
    log file, on the console, in the failure's cause (events.jsonl, run.json, the report) and in
    `launch logs`; the command still got the real values (it printed them)."""
    from tests.conftest import launch as launch_cli
    spec = _printing_spec(tmp_path)
    env = {**os.environ, 'TFC_TEST_TOKEN': TOKEN}
    result = launch_cli('up', spec, env=env, timeout=180)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    _check_printed_lines_masked(out)
    assert _files_holding(tmp_path / 'run', TOKEN, PASSWORD) == []
    with open(tmp_path / 'run' / 'run.json') as f:
        assert 'the service refused ***' in f.read()
    for environ in (env, {k: v for k, v in env.items() if k != 'TFC_TEST_TOKEN'}):
        logs = launch_cli('logs', spec, env=environ, timeout=60)
        assert logs.returncode == 0, logs.stderr
        _check_printed_lines_masked(logs.stdout)


@pytest.mark.slow
def test_over_ssh_no_secret_is_on_a_command_line_and_what_the_command_prints_is_masked(ssh_hosts, tmp_path):
    """SSH tasks: while they run, no process of the host (the wrapper, the task, sshd's sessions)
    has a hidden value on its command line, which every user of the host can read (`ps`): the
    environment travels in a file of mode 0600 that the wrapper reads and removes. What the
    user's command prints is masked in the remote logs, on the console and in `launch logs`."""
    from tests.conftest import launch as launch_cli, launch_bg, read_until
    from tests.harness.ssh import LAYOUT, host_settings, workdir
    spec = _printing_spec(tmp_path, task_hosts=LAYOUT, hosts=host_settings(ssh_hosts, tmp_path), train_dir='run')
    env = {**os.environ, 'TFC_TEST_TOKEN': TOKEN}
    ssh = ['--ssh-config', str(ssh_hosts.ssh_config)]
    proc = launch_bg('up', spec, *ssh, cwd=str(tmp_path), env=env)
    try:
        seen = read_until(proc, 'has the token', timeout=120)
        on_command_lines = _cmdlines_holding(TOKEN, PASSWORD)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert on_command_lines == [], on_command_lines
    out = ''.join(seen) + rest
    assert proc.returncode == 1, out
    _check_printed_lines_masked(out)
    for address in ssh_hosts.addresses:
        assert _files_holding(workdir(tmp_path, address), TOKEN, PASSWORD) == []     # logs; no env file left
    logs = launch_cli('logs', spec, *ssh, cwd=str(tmp_path), env=env, timeout=60)
    assert logs.returncode == 0, logs.stderr
    _check_printed_lines_masked(logs.stdout)

