"""The files a run writes, pinned in golden files (issue 38: a restructuring of the supervisor
must change none of them): events.jsonl, run.json, launch-state.json where one is left, and the
launcher's own console lines, of four runs driven in this process over a scripted backend
(tests/harness/golden.py) — one that finishes, one that fails, one interrupted by Ctrl-C and one
restarted from its checkpoint after losing its ps. The backend releases what each task says in
plan order, on conditions rather than times, so every run writes the same lines in the same order.

What varies from run to run is replaced: times (`<TIME>`), durations (`<SECS>`, a recovery's phases too), the run's id
(`<RUN>`), the launcher's pid (`<PID>`), the temporary directory (`<TMP>`) and this checkout
(`<REPO>`). The task lines the console echoes are left out (their threads interleave with the
launcher's lines); the launcher's own lines are kept.

After a change meant to change these files, rewrite them and read the diff:

    TFCLUSTER_GOLDEN_WRITE=1 python -m pytest tests/unit/test_golden_runs.py
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.harness.golden import GatedBackend, RunFiles, Start, check_golden, drive, normalizer, progress, saved
from tests.harness.parts import REPO

GOLDEN = Path(__file__).resolve().parents[1] / 'data' / 'golden' / 'runs'
ORDER = ['ps:0', 'worker:0', 'worker:1']
SPEC = """cluster:
  ps: [localhost:2001]
  worker: [localhost:2002, localhost:2003]
train:
  steps: 100
  batch_size: 8
  train_dir: {tmp}/run
"""
RESTART = SPEC + 'supervise:\n  restart: on-failure\n  max_restarts: 2\n  backoff_secs: 0.1\n'
WORKERS_DONE = ('worker:0', 'worker:1')

VARYING = [
    (re.compile(r'"(time|started|ended)": "[^"]*"'), r'"\1": "<TIME>"'),
    (re.compile(r'"seconds": [0-9.]+'), '"seconds": "<SECS>"'),
    (re.compile(r'"phases": \{[^}]*\}'), '"phases": "<SECS each>"'),
    (re.compile(r'"launcher_pid": \d+'), '"launcher_pid": "<PID>"'),
    (re.compile(r'\bspec-\d{8}-\d{6}\b'), '<RUN>'),
    (re.compile(r'\b\d+\.\d+s\b'), '<SECS>s'),
    (re.compile(r'launcher pid \d+'), 'launcher pid <PID>'),
]


def clean(tmp_path):
    return SPEC, GatedBackend({'ps:0': [Start(code=0, after=WORKERS_DONE)],
                               'worker:0': [Start((progress(50), progress(100)), 0)],
                               'worker:1': [Start(code=0, after=('worker:0',))]}, ORDER), None


def failed(tmp_path):
    return SPEC, GatedBackend({'ps:0': [Start(code=-9, after=('worker:0',))],
                               'worker:0': [Start((progress(30),))]}, ORDER, checkpoint_step=20), None


def interrupted(tmp_path):
    backend = GatedBackend({'worker:0': [Start((progress(10), progress(20)))]}, ORDER)
    return SPEC, backend, lambda console: 'servers are up' in console and ('worker:0', 1) in backend.read


def restarted(tmp_path):
    return RESTART, GatedBackend({
        'ps:0': [Start(code=-9, after=('worker:0',)), Start(code=0, after=WORKERS_DONE)],
        'worker:0': [Start((progress(40), saved(40))), Start((progress(50), progress(100)), 0)],
        'worker:1': [Start(), Start(code=0, after=('worker:0',))]}, ORDER, checkpoint_step=40), None


RUNS = {'clean-finish': clean, 'failure': failed, 'interrupt': interrupted, 'restart': restarted}


def golden_text(files: RunFiles, tmp_path: Path) -> str:
    paths = normalizer(tmp_path, REPO)

    def normal(text: str) -> str:
        text = paths(text)
        for pattern, placeholder in VARYING:
            text = pattern.sub(placeholder, text)
        return text
    state = '(none)\n' if files.launch_state is None else normal(files.launch_state)
    launcher = ''.join(line for line in files.console.splitlines(keepends=True) if line.startswith('[launch]'))
    return (f'state: {files.state}\nexit: {files.exit_code}\n'
            f'--- console (the launcher\'s lines)\n{normal(launcher)}'
            f'--- events.jsonl\n{normal(files.events)}'
            f'--- run.json\n{normal(files.run_json)}'
            f'--- launch-state.json\n{state}')


@pytest.mark.parametrize('case', sorted(RUNS))
def test_run_files_are_as_golden(tmp_path, monkeypatch, case):
    monkeypatch.chdir(REPO)
    text, backend, interrupt_when = RUNS[case](tmp_path)
    spec = tmp_path / 'spec.yaml'
    spec.write_text(text.replace('{tmp}', str(tmp_path)))
    files = drive(str(spec), backend, interrupt_when)
    check_golden(GOLDEN / f'{case}.txt', golden_text(files, tmp_path))
