"""Secrets in a spec's env: and values a task could never be started with (issue 31, findings 7
and 8): through the real command line, the code that writes the spec copy, and the report.

A secret-looking name's value (KEY, TOKEN, SECRET, PASSWORD, ...) and any value taken from the
launcher's environment (`{from_env: NAME}`) appear nowhere the launcher prints or writes: `launch
plan [--json]`, the spec copy (mode 0600) and the report. A value over the OS's limits is one line
naming its key, exit 2, nothing written. None of these tests starts TensorFlow.
"""
from __future__ import annotations

import json
import os
import stat
import time
import types

import pytest
import yaml

from cluster.spec import load_spec
from launch.cli import main
from tests.conftest import write_spec

SECRET = 'hunter2-s3cret'               # a literal in the spec, under a secret-looking name
REFERENCED = 'from-the-environment-77'  # a value the spec takes from the launcher's environment
ENV = {'env': {'API_TOKEN': SECRET, 'MODEL_FROM': {'from_env': 'TFC_TEST_SOURCE'}, 'OMP_NUM_THREADS': 3},
       'tasks': {'worker': {'env': {'DB_PASSWORD': SECRET + '-w'}}}}


@pytest.fixture
def launch(capsys, monkeypatch):
    """The real `launch` command line, in this process (a fast test starts none): its exit code
    and what it printed; the variable MODEL_FROM refers to is set unless `source` is None."""
    def run(*args: str, source: str | None = REFERENCED) -> types.SimpleNamespace:
        if source is None:
            monkeypatch.delenv('TFC_TEST_SOURCE', raising=False)
        else:
            monkeypatch.setenv('TFC_TEST_SOURCE', source)
        code = main(list(args))
        out, err = capsys.readouterr()
        return types.SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return run


def _no_value(text: str) -> None:
    assert SECRET not in text and REFERENCED not in text, text


def test_plan_shows_no_hidden_value(tmp_path, launch):
    spec = write_spec(tmp_path, top=ENV)
    out = launch('plan', spec)
    assert out.returncode == 0, out.stderr
    _no_value(out.stdout + out.stderr)
    assert '  env:  API_TOKEN=***' in out.stdout and '  env:  MODEL_FROM=***' in out.stdout
    assert '  env:  DB_PASSWORD=***' in out.stdout and '  env:  OMP_NUM_THREADS=3' in out.stdout

    out = launch('plan', spec, '--json')
    assert out.returncode == 0, out.stderr
    _no_value(out.stdout)
    tasks = {t['task']: t['env'] for t in json.loads(out.stdout)['tasks']}
    assert tasks['ps:0']['API_TOKEN'] == tasks['ps:0']['MODEL_FROM'] == '***' and 'DB_PASSWORD' not in tasks['ps:0']
    assert tasks['worker:1']['DB_PASSWORD'] == '***' and tasks['worker:1']['OMP_NUM_THREADS'] == '3'
    assert not (tmp_path / 'run').exists()


def test_a_reference_the_launcher_lacks_is_one_line_exit_2_where_its_value_is_needed(tmp_path, launch):
    spec = write_spec(tmp_path, top=ENV)
    line = next(i for i, text in enumerate(open(spec), 1) if 'MODEL_FROM' in text)
    for command in ('plan', 'up', 'check'):
        out = launch(command, spec, source=None)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr == (f"launch: error: {spec}:{line}: env.MODEL_FROM: from_env: TFC_TEST_SOURCE is not set in "
                              "the launcher's environment (export TFC_TEST_SOURCE=... before running launch)\n")
        assert not (tmp_path / 'run').exists()
    # what needs no value works without it: `status` of a spec that never ran says so, exit 3
    out = launch('status', spec, source=None)
    assert out.returncode == 3, out.stdout + out.stderr


def test_the_spec_copy_holds_references_is_0600_and_still_gives_tasks_their_values(tmp_path, monkeypatch):
    """The copy `launch up` writes (registry.tasks_spec_yaml, written by the local backend's
    prepare) holds each hidden value as a reference to the variable the launcher sets in the task:
    a task reading it finds the value in its own environment, and one started by hand without it
    still starts (the value is then not set)."""
    from launch.backends.local import LocalBackend
    from launch.planning.plan import plan_cluster
    from launch.run.launching import Options, tasks_spec_yaml
    monkeypatch.setenv('TFC_TEST_SOURCE', REFERENCED)
    spec = load_spec(write_spec(tmp_path, top=ENV))
    plans = list(plan_cluster(spec))
    old = os.umask(0o022)
    try:
        LocalBackend().prepare(plans, tasks_spec_yaml(spec, None, Options()))
    finally:
        os.umask(old)
    copy = tmp_path / 'run' / 'spec.yaml'
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600
    text = copy.read_text()
    _no_value(text)
    written = yaml.safe_load(text)
    assert written['env'] == {'API_TOKEN': {'from_env': 'API_TOKEN'}, 'MODEL_FROM': {'from_env': 'MODEL_FROM'},
                              'OMP_NUM_THREADS': '3'}
    assert written['tasks'] == {'worker': {'env': {'DB_PASSWORD': {'from_env': 'DB_PASSWORD'}}}}
    worker = next(p for p in plans if p.name == 'worker:1')
    assert worker.env['API_TOKEN'] == SECRET and worker.env['MODEL_FROM'] == REFERENCED
    assert worker.env['DB_PASSWORD'] == SECRET + '-w'

    # a task started with the plan's environment reads the copy back to the same values ...
    as_task = load_spec(str(copy), environ=worker.env)
    assert as_task.task_env('worker') == spec.task_env('worker')
    # ... and by hand, without them, it still loads: what it lacks is not set
    from cluster.task import environment_line
    by_hand = load_spec(str(copy), environ={})
    assert 'API_TOKEN' not in by_hand.task_env('worker')
    line = environment_line(by_hand, by_hand.task('worker', 1), {'MODEL_FROM': 'x'})
    assert line == ('environment: API_TOKEN=(not set) DB_PASSWORD=(not set) MODEL_FROM=*** '
                    "OMP_NUM_THREADS=(not set)")


def test_the_report_of_a_run_dir_holding_a_secret_shows_none(tmp_path, launch):
    """A run directory as an older version left it: the spec copy with the values in plain text."""
    train_dir = tmp_path / 'run'
    train_dir.mkdir()
    spec = write_spec(tmp_path, top={'env': {'API_TOKEN': SECRET, 'PLAIN': 'shown-value'},
                                     'tasks': {'ps': {'env': {'MY_SECRET_KEY': SECRET}}}})
    (train_dir / 'spec.yaml').write_text(open(spec).read())
    (train_dir / 'events.jsonl').write_text(json.dumps(
        {'time': '2026-11-23T21:08:43.000+00:00', 'run': 'r-1', 'attempt': 1, 'event': 'run_started',
         'spec': spec, 'backend': 'local', 'train_dir': str(train_dir), 'launcher_pid': 1}) + '\n')
    out = launch('report', str(train_dir), '-o', str(tmp_path / 'report.html'))
    assert out.returncode == 0, out.stdout + out.stderr
    page = (tmp_path / 'report.html').read_text()
    assert SECRET not in page
    assert 'API_TOKEN: &#x27;***&#x27;' in page and 'MY_SECRET_KEY: &#x27;***&#x27;' in page
    assert 'PLAIN: shown-value' in page


def test_a_recorded_set_option_holds_a_reference_not_the_value(tmp_path, monkeypatch):
    """What `launch up` records of --set (events.jsonl, replayed by `launch status RUN`)."""
    from cluster.spec.load import recorded_override
    assert recorded_override(f'env.API_TOKEN={SECRET}') == 'env.API_TOKEN={"from_env": "API_TOKEN"}'
    assert recorded_override(f'tasks.worker.env={{DB_PASSWORD: {SECRET}, N: 2}}') == \
        'tasks.worker.env={"DB_PASSWORD": {"from_env": "DB_PASSWORD"}, "N": 2}'
    for kept in ('env.N=2', 'train.steps=5', 'env.API_TOKEN=null', 'env.API_TOKEN={from_env: X}'):
        assert recorded_override(kept) == kept
    monkeypatch.setenv('API_TOKEN', SECRET)
    spec = load_spec(write_spec(tmp_path), [recorded_override(f'env.API_TOKEN={SECRET}')])
    assert spec.env['API_TOKEN'] == SECRET and spec.env_from == {'API_TOKEN': 'API_TOKEN'}


def _spec_text(tmp_path, env_lines: str, name: str = 'spec.yaml', hosts: str = '') -> str:
    path = tmp_path / name
    path.write_text('cluster: {ps: [localhost:24001], worker: [localhost:24002]}\n'
                    f'train: {{train_dir: {tmp_path / "run"}}}\n{hosts}env:\n{env_lines}')
    return str(path)


def test_one_value_over_the_per_string_limit_is_refused_at_load(tmp_path, launch):
    spec = _spec_text(tmp_path, '  SMALL: 1\n  BIG: ' + 'x' * 1_000_000 + '\n')
    for command in ('plan', 'up'):
        out = launch(command, spec)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr == (f'launch: error: {spec}:5: env.BIG: a value of 1,000,000 bytes exceeds the OS limit '
                              'of 131,072 bytes for one environment string (BIG=value); pass large data in a file '
                              'and its path here\n')
        assert not (tmp_path / 'run').exists()


def test_values_over_arg_max_together_are_refused_at_plan(tmp_path, launch):
    """18 values of 120,000 bytes (one anchored value, repeated by aliases): each fits, not all."""
    lines = '  V00: &v ' + 'y' * 120_000 + '\n' + ''.join(f'  V{i:02}: *v\n' for i in range(1, 18))
    spec = _spec_text(tmp_path, lines)
    for command in ('plan', 'up'):
        out = launch(command, spec)
        assert out.returncode == 2, out.stdout + out.stderr
        assert out.stderr.count('\n') == 1 and f'{spec}:4: env.V00: ps:0: its command line and environment come ' \
            'to 2,' in out.stderr, out.stderr
        assert f'over the OS limit of {os.sysconf("SC_ARG_MAX"):,} bytes (ARG_MAX)' in out.stderr
        assert not (tmp_path / 'run').exists()


def test_an_ssh_task_s_environment_is_no_part_of_its_start_command(tmp_path, launch):
    """Over SSH the remote shell gets the task's start command as one string, within the OS's
    limit for one string (128 KiB); the environment travels in a file beside the task's log, so
    values a local process takes, together over that limit, start an SSH task too (before, they
    were refused: they made the start command too long, and were on it for `ps` to show)."""
    from launch.backends.ssh.backend import start_script_size_text
    from launch.planning.plan import plan_cluster
    hosts = 'hosts: {node1: {address: 10.0.0.5}}\n'
    spec = _spec_text(tmp_path, '  A: ' + 'a' * 70_000 + '\n  B: ' + 'b' * 70_000 + '\n', hosts=hosts)
    text = open(spec).read().replace('localhost:24002', 'node1:24002')
    open(spec, 'w').write(text)
    out = launch('plan', spec)
    assert out.returncode == 0, out.stderr[:500]
    remote = next(p for p in plan_cluster(load_spec(spec)) if p.task.host == 'node1')
    script = start_script_size_text(remote)
    assert 'aaaa' not in script and len(script) < 4096


def test_set_options_are_applied_in_linear_time(tmp_path, launch):
    """20,000 --set options through the command line: ~1 s here; before, argparse's scan of every
    later option and the spec's scan of every recorded key made it ~30 s (50,000: minutes)."""
    spec = write_spec(tmp_path)
    options = [f'--set=env.V{i}={i}' if i % 2 else f'env.V{i}={i}' for i in range(10_000)]
    argv = [x for o in options for x in ((o,) if o.startswith('--set=') else ('--set', o))]
    argv += ['--set', 'train.steps=9'] * 10_000 + ['--json']
    t0 = time.perf_counter()
    out = launch('plan', spec, *argv)
    assert time.perf_counter() - t0 < 8
    assert out.returncode == 0, out.stderr
    env = json.loads(out.stdout)['tasks'][0]['env']
    assert [k for k in env if k.startswith('V')] == [f'V{i}' for i in range(10_000)] and env['V7'] == '7'
    assert load_spec(spec, ['train.steps=9']).train.steps == 9


def test_set_options_are_taken_before_argparse_as_it_would_take_them():
    from cluster.spec.load import take_overrides
    assert take_overrides(['plan', 's.yaml', '--set', 'a=1', '--json', '--set=b=2', '--', '--set', 'c=3']) == \
        (['plan', 's.yaml', '--json', '--', '--set', 'c=3'], ['a=1', 'b=2'])
    assert take_overrides(['plan', '--set']) == (['plan', '--set'], [])     # argparse says what is missing


def test_set_where_a_command_takes_none_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        main(['list', '--set', 'train.steps=1'])
    assert e.value.code == 2 and 'unrecognized arguments: --set' in capsys.readouterr().err


# --------------------------------------------------------------------------- lines the user's code prints

def test_a_masker_hides_every_value_long_enough_wherever_it_is_in_a_line():
    from cluster.runtime.masking import MIN_CHARS, Masker
    masker = Masker([SECRET, 'abc', 'hunter2', 'line-one\nline-two', ''])
    assert MIN_CHARS == 4
    assert masker.text(f'token={SECRET}; again {SECRET}.') == 'token=***; again ***.'     # the longer value whole
    assert masker.text('hunter2 alone') == '*** alone'
    assert masker.text('abc is too short to be told from text') == 'abc is too short to be told from text'
    assert masker.text('a key over lines: line-one') == 'a key over lines: ***'         # masked line by line
    assert masker.data(f'b {SECRET}\n'.encode()) == b'b ***\n'
    assert not Masker(['abc', '']) and Masker(['abc', '']).text('abc') == 'abc'


def test_a_masked_stream_masks_a_value_written_in_pieces_and_passes_errors_on(tmp_path):
    """print() writes its words and its newline apart, a program may write a value in two
    pieces: the stream masks whole lines; a write that ends a line reaches the file at once, so a
    full disk's error still reaches the writer (the pulse notes it: cluster/runtime/pulse.py)."""
    import io
    from cluster.runtime.masking import Masker, MaskedStream
    under = io.StringIO()
    stream = MaskedStream(under, Masker([SECRET]))
    print('token', SECRET[:4], end='', file=stream)
    stream.write(SECRET[4:] + ' end\nnext ')
    assert under.getvalue() == 'token *** end\n'           # the partial line waits for its end
    stream.flush()
    assert under.getvalue() == 'token *** end\nnext '

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(28, 'No space left on device')
    with pytest.raises(OSError):
        MaskedStream(Full(), Masker([SECRET])).write('a line\n')


def test_launch_logs_shows_no_hidden_value_a_task_printed(tmp_path, launch):
    """A log as the task of an older version (or a child that wrote past the task's masking)
    left it: `launch logs` masks each value the spec hides, whether the spec holds it or the
    launcher's environment gives it (where it is set: the task masked it at the source anyway)."""
    spec = write_spec(tmp_path, top=ENV)
    logs = tmp_path / 'run' / 'logs'
    logs.mkdir(parents=True)
    (logs / 'worker-1.log').write_text(f'the token is {SECRET}\nthe model from {REFERENCED}\n'
                                       f'the password {SECRET}-w; a thread count 3\n')
    out = launch('logs', spec, 'worker:1')
    assert out.returncode == 0, out.stderr
    assert out.stdout == 'the token is ***\nthe model from ***\nthe password ***; a thread count 3\n'
