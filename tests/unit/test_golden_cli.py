"""The `launch` command line's behaviour, pinned in golden files (issue 38: a restructuring must
change none of it): for about ninety command lines, run in this process, the exit code, standard
output and standard error, byte for byte but for what varies from machine to machine (the
temporary directory, this checkout, the Python, the index of runs, the home directory, the version),
which is replaced by a placeholder. Help texts, usage errors, the one-line errors of bad input (exit
2), `launch plan` (text and JSON) of the shipped specs, and `launch render` in every format.
Nothing here starts a process (the commands that would are left out).

Each case is one file, tests/data/golden/cli/<case>.txt. After a change that is meant to change the
output, rewrite them and read the diff:

    TFCLUSTER_GOLDEN_WRITE=1 python -m pytest tests/unit/test_golden_cli.py

Otherwise a mismatch fails with a unified diff of the file against the output."""
from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness.golden import check_golden, normalizer, run_cli

GOLDEN = Path(__file__).resolve().parents[1] / 'data' / 'golden' / 'cli'
SPECS = ('fashion2', 'local2-async', 'local2', 'pss-keras', 'pss-loop', 'two-hosts')
FORMATS = ('sbatch', 'jobset', 'trainjob', 'tfjob')

VALID = """cluster:
  ps: [localhost:2001]
  worker: [localhost:2002, localhost:2003]
train:
  steps: 5
  batch_size: 8
  train_dir: {tmp}/run
"""
COORDINATOR = """cluster:
  chief: [localhost:2011]
  ps: [localhost:2012]
  worker: [localhost:2013, localhost:2014]
  evaluator: [localhost:2015]
train:
  program: mytrain:train
  evaluator: mytrain:evaluate
  train_dir: {tmp}/run
"""


def spec(tmp: Path, text: str = VALID, name: str = 'spec.yaml') -> str:
    """A spec file in tmp (its `{tmp}` replaced), its path."""
    file = tmp / name
    file.write_text(text.replace('{tmp}', str(tmp)))
    return str(file)


def valid_with(**train: object) -> str:
    """The valid spec with train keys added (as YAML flow values)."""
    return VALID + ''.join(f'  {key}: {value}\n' for key, value in train.items())


def coordinator(tmp: Path, text: str = COORDINATOR) -> str:
    (tmp / 'mytrain.py').write_text('def train(ctx):\n    pass\n\n\ndef evaluate(ctx):\n    pass\n')
    return spec(tmp, text)


def binary(tmp: Path) -> str:
    """A spec file that is not text."""
    file = tmp / 'spec.yaml'
    file.write_bytes(b'\x00\xff\xfe\x80garbage')
    return str(file)


def state(tmp: Path, text: str) -> str:
    path = spec(tmp)
    (tmp / 'run').mkdir()
    (tmp / 'run' / 'launch-state.json').write_text(text)
    return path


Argv = Callable[[Path], list[str]]


def fixed(*words: str) -> Argv:
    """A command line that needs no file of its own."""
    return lambda tmp: list(words)


HELP: dict[str, Argv] = {'help': fixed('--help'), 'help-short': fixed('-h'), 'version': fixed('--version')}
HELP.update({f'help-{command}': fixed(command, '--help') for command in (
    'up', 'scale', 'status', 'down', 'logs', 'debug', 'plan', 'eval', 'check', 'report', 'list', 'compose',
    'render', 'download')})

USAGE: dict[str, Argv] = {
    'usage-no-command': lambda t: [],
    'usage-unknown-command': lambda t: ['launhc'],
    'usage-unknown-top-flag': lambda t: ['--bogus', 'plan', 'x.yaml'],
    'usage-up-no-spec': lambda t: ['up'],
    'usage-plan-no-spec': lambda t: ['plan'],
    'usage-up-unknown-flag': lambda t: ['up', spec(t), '--bogus'],
    'usage-plan-unknown-flag': lambda t: ['plan', spec(t), '--wrokers', '2'],
    'usage-bad-backend': lambda t: ['up', spec(t), '--backend', 'kubernetes'],
    'usage-render-no-format': lambda t: ['render', spec(t)],
    'usage-render-bad-format': lambda t: ['render', spec(t), '--format', 'helm'],
    'usage-scale-no-workers': lambda t: ['scale', spec(t)],
    'usage-scale-workers-not-int': lambda t: ['scale', spec(t), '--workers', 'two'],
    'usage-up-timeout-not-number': lambda t: ['up', spec(t), '--start-timeout', 'soon'],
    'usage-logs-attempt-not-int': lambda t: ['logs', spec(t), '--attempt', 'last'],
    'usage-set-without-value-arg': lambda t: ['plan', spec(t), '--set'],
    'usage-set-on-list': lambda t: ['list', '--set', 'train.steps=5'],
    'usage-extra-argument': lambda t: ['plan', spec(t), 'extra'],
    'usage-render-port-base-not-int': lambda t: ['render', spec(t), '--format', 'sbatch', '--port-base', 'x'],
}

BAD_INPUT: dict[str, Argv] = {
    'bad-missing-spec': lambda t: ['up', str(t / 'nope.yaml')],
    'bad-missing-spec-plan': lambda t: ['plan', str(t / 'nope.yaml')],
    'bad-spec-is-directory': lambda t: ['plan', str(t)],
    'bad-binary-spec': lambda t: ['plan', binary(t)],
    'bad-yaml-syntax': lambda t: ['up', spec(t, 'cluster:\n  ps: [localhost:2222\n  worker: [a:1]\n')],
    'bad-yaml-tab': lambda t: ['plan', spec(t, 'cluster:\n\tps: [localhost:2222]\n')],
    'bad-not-a-mapping': lambda t: ['plan', spec(t, '- a\n- b\n')],
    'bad-empty-spec': lambda t: ['plan', spec(t, '')],
    'bad-duplicate-key': lambda t: ['plan', spec(t, 'cluster:\n  ps: [localhost:1]\ncluster:\n  ps: [a:2]\n')],
    'bad-unknown-top-key': lambda t: ['plan', spec(t, VALID + 'trian: {}\n')],
    'bad-unknown-train-key': lambda t: ['up', spec(t, valid_with(stesp=5))],
    'bad-no-cluster': lambda t: ['plan', spec(t, 'train:\n  steps: 5\n')],
    'bad-no-worker': lambda t: ['plan', spec(t, 'cluster:\n  ps: [localhost:1]\n')],
    'bad-unknown-job': lambda t: ['plan', spec(t, 'cluster:\n  ps: [a:1]\n  worker: [a:2]\n  master: [a:3]\n')],
    'bad-malformed-address': lambda t: ['plan', spec(t, 'cluster:\n  ps: [localhost:1]\n  worker: [localhost]\n')],
    'bad-port-out-of-range': lambda t: ['plan', spec(t, 'cluster:\n  ps: [a:1]\n  worker: [a:70000]\n')],
    'bad-port-zero': lambda t: ['plan', spec(t, 'cluster:\n  ps: [a:0]\n  worker: [a:2]\n')],
    'bad-same-address-twice': lambda t: ['plan', spec(t, 'cluster:\n  ps: [a:2001]\n  worker: [a:2001]\n')],
    'bad-steps-zero': lambda t: ['plan', spec(t, VALID.replace('steps: 5', 'steps: 0'))],
    'bad-steps-text': lambda t: ['plan', spec(t, VALID.replace('steps: 5', 'steps: many'))],
    'bad-sync-not-bool': lambda t: ['plan', spec(t, valid_with(sync='maybe'))],
    'bad-transfer-dtype': lambda t: ['plan', spec(t, valid_with(transfer_dtype='float16'))],
    'bad-negative-learning-rate': lambda t: ['plan', spec(t, valid_with(learning_rate=-0.1))],
    'bad-unknown-device': lambda t: ['plan', spec(t, valid_with(devices='[tpu:0]'))],
    'bad-device-twice': lambda t: ['plan', spec(t, valid_with(devices='[cpu:0, cpu:0]'))],
    'bad-too-many-replicas': lambda t: ['plan', spec(t, valid_with(replicas_to_aggregate=3))],
    'bad-train-dir-tilde': lambda t: ['plan', spec(t, VALID.replace('{tmp}/run', '~/run'))],
    'bad-restart-policy': lambda t: ['plan', spec(t, VALID + 'supervise:\n  restart: always\n')],
    'bad-stall-too-short': lambda t: ['plan', spec(t, VALID + 'supervise:\n  stall_secs: 1\n')],
    'bad-unreachable-zero': lambda t: ['plan', spec(t, VALID + 'supervise:\n  unreachable_secs: 0\n')],
    'bad-negative-max-restarts': lambda t: ['plan', spec(t, VALID + 'supervise:\n  max_restarts: -1\n')],
    'bad-unknown-host-key': lambda t: ['plan', spec(t, VALID + 'hosts:\n  localhost:\n    usr: me\n')],
    'bad-set-without-equals': lambda t: ['plan', spec(t), '--set', 'train.steps'],
    'bad-set-without-value': lambda t: ['plan', spec(t), '--set', 'train.steps='],
    'bad-set-bad-value': lambda t: ['plan', spec(t), '--set', 'train.steps=abc'],
    'bad-set-unknown-key': lambda t: ['up', spec(t), '--set', 'train.stpes=5'],
    'bad-set-unknown-section': lambda t: ['plan', spec(t), '--set', 'trian.steps=5'],
    'bad-ssh-config-missing': lambda t: ['plan', spec(t), '--ssh-config', str(t / 'none')],
    'bad-program-not-module-function': lambda t: ['plan', spec(t, valid_with(program='train.py'))],
    'bad-program-and-command': lambda t: ['plan', spec(t, valid_with(program='a:b', command="'python a.py'"))],
    'bad-command-open-quote': lambda t: ['plan', spec(t, valid_with(command='\'python "a.py\''))],
    'bad-two-chiefs': lambda t: ['plan', coordinator(t, COORDINATOR.replace('[localhost:2011]',
                                                                           '[localhost:2011, localhost:2016]'))],
    'bad-chief-without-program': lambda t: ['plan', coordinator(t, COORDINATOR.replace(
        '  program: mytrain:train\n', ''))],
    'bad-evaluator-without-chief': lambda t: ['plan', coordinator(t, COORDINATOR.replace(
        '  chief: [localhost:2011]\n', ''))],
    'bad-two-evaluators': lambda t: ['plan', coordinator(t, COORDINATOR.replace('[localhost:2015]',
                                                                               '[localhost:2015, localhost:2017]'))],
    'bad-scale-coordinator': lambda t: ['scale', coordinator(t), '--workers', '1'],
    'bad-jobset-name': lambda t: ['render', spec(t), '--format', 'jobset', '--name', 'Run_1'],
    'bad-trainjob-name-too-long': lambda t: ['render', spec(t), '--format', 'trainjob', '--name', 'r' * 50],
    'bad-jobset-claim': lambda t: ['render', spec(t), '--format', 'jobset', '--pvc', 'My_Claim'],
    'bad-tfjob-claim': lambda t: ['render', spec(t), '--format', 'tfjob', '--pvc', 'claim-'],
    'bad-env-from-unset': lambda t: ['plan', spec(t, VALID + 'env:\n  API_TOKEN: {from_env: TFC_GOLDEN_NEVER_SET}\n')],
    'bad-env-jobset-variable': lambda t: ['render', spec(t, VALID + 'env:\n  JOB_COMPLETION_INDEX: 1\n'),
                                          '--format', 'jobset'],
    'bad-status-no-such-run': lambda t: ['status', 'no-such-run-1'],
    'bad-logs-no-such-run': lambda t: ['logs', 'no-such-run-1'],
    'bad-report-no-such-run': lambda t: ['report', 'no-such-run-1'],
    'bad-logs-unknown-task': lambda t: ['logs', spec(t), 'worker:7'],
    'bad-logs-never-started': lambda t: ['logs', spec(t)],
    'bad-status-never-started': lambda t: ['status', spec(t)],
    'bad-status-corrupt-state': lambda t: ['status', state(t, '{"tasks": [')],
    'bad-down-older-state': lambda t: ['down', state(t, '{"spec": "s", "launcher_pid": 1, "tasks": [{"pid": 4242}]}')],
    'bad-link-rate': lambda t: ['plan', spec(t), '--link', 'fast'],
    'bad-link-own-program': lambda t: ['plan', coordinator(t), '--link', '1gbit'],
    'bad-from-run-no-such-run': lambda t: ['plan', spec(t), '--from-run', 'no-such-run-1'],
    'list-empty': lambda t: ['list'],
    'list-empty-json': lambda t: ['list', '--json'],
    'list-empty-dir': lambda t: ['list', str(t)],
}

PLANS: dict[str, Argv] = {}
for _name in SPECS:
    PLANS[f'plan-{_name}'] = fixed('plan', f'specs/{_name}.yaml')
    PLANS[f'plan-{_name}-json'] = fixed('plan', f'specs/{_name}.yaml', '--json')
PLANS.update({
    'plan-tmp-spec': lambda t: ['plan', spec(t)],
    'plan-set-steps': lambda t: ['plan', spec(t), '--set', 'train.steps=50', '--set', 'train.sync=false'],
    'plan-coordinator': lambda t: ['plan', coordinator(t)],
    'plan-link': fixed('plan', 'specs/two-hosts.yaml', '--link', '1gbit'),
    'plan-link-json': fixed('plan', 'specs/two-hosts.yaml', '--link', '10gbit', '--json'),
})
RENDERS: dict[str, Argv] = {}
for _format in FORMATS:
    for _name in ('local2', 'pss-loop'):
        RENDERS[f'render-{_name}-{_format}'] = fixed('render', f'specs/{_name}.yaml', '--format', _format)
RENDERS.update({
    'render-sbatch-options': lambda t: ['render', 'specs/local2.yaml', '--format', 'sbatch', '--name', 'golden',
                                        '--partition', 'gpu', '--time-limit', '1:00:00', '--port-base', '9000'],
    'render-jobset-options': lambda t: ['render', 'specs/local2-async.yaml', '--format', 'jobset', '--name', 'golden',
                                        '--image', 'reg.example/tfc:1', '--namespace', 'ml', '--pvc', 'runs'],
    'render-trainjob-options': lambda t: ['render', 'specs/local2.yaml', '--format', 'trainjob', '--pvc', 'runs',
                                          '--namespace', 'ml'],
    'render-tfjob-options': lambda t: ['render', 'specs/local2.yaml', '--format', 'tfjob', '--image', 'x/y:2'],
})

CASES: dict[str, Argv] = {**HELP, **USAGE, **BAD_INPUT, **PLANS, **RENDERS}
REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def launch_here(monkeypatch, tmp_path):
    """The command line as a user at the repository root sees it, at a fixed terminal width."""
    monkeypatch.setenv('COLUMNS', '100')
    monkeypatch.setenv('LINES', '50')
    monkeypatch.delenv('TFC_GOLDEN_NEVER_SET', raising=False)
    monkeypatch.chdir(REPO)
    return tmp_path


@pytest.mark.parametrize('case', sorted(CASES))
def test_command_line_output_is_as_golden(launch_here, case):
    argv = CASES[case](launch_here)
    result = run_cli(argv)
    normal = normalizer(launch_here, REPO)
    text = (f'$ launch {normal(shlex.join(argv))}\n'
            f'exit: {result.code}\n'
            f'--- stdout\n{normal(result.out)}'
            f'--- stderr\n{normal(result.err)}')
    check_golden(GOLDEN / f'{case}.txt', text)


def test_the_golden_set_is_about_ninety_lines_and_none_is_stale():
    """Every golden file has its case (a removed case leaves no file behind to mislead)."""
    assert len(CASES) >= 90, len(CASES)
    if os.environ.get('TFCLUSTER_GOLDEN_WRITE') or not GOLDEN.is_dir():
        return
    stale = sorted(p.stem for p in GOLDEN.glob('*.txt') if p.stem not in CASES)
    assert not stale, stale
