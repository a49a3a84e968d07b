"""Lines that must say something: a fault's account when a ps takes its chief with it, the report's
interrupts and manual resumes, `launch status` of a run whose launcher was killed, and warnings
once per command. Fast: real files (a real run's events.jsonl and real task logs, tests/data), the
real writers and the real command line (in this process); no process is started."""
from __future__ import annotations

import io
import json
import logging
import os
import shutil

from cluster.runtime import rundir
from cluster.spec import load_spec
from launch.backends.local import LocalBackend
from launch.cli import main
from launch.planning.plan import plan_cluster, state_path
from launch.records import report
from launch.records.events import EventLog, read_events
from launch.run.supervised import faults
from launch.run.console import Console
from launch.run.lifecycle import Lifecycle
from launch.run.policy import Policy, Progress, TaskState, TaskStatus, decide
from launch.run.state import LaunchState
from tests.conftest import REPO, write_spec

DATA = os.path.join(REPO, 'tests', 'data')
STORY = os.path.join(DATA, 'story-run')     # a real run: ps:0 killed, restarted, Ctrl-C, resumed (its README)


def _copy_story(tmp_path, until: tuple[int, str] | None = None) -> str:
    """The real run's train_dir under tmp_path: its spec.yaml, and its event log up to the first
    event `until` (attempt, kind), as a launcher killed then leaves it; all of it and its run.json
    when None."""
    train_dir = str(tmp_path / 'run')
    os.makedirs(train_dir)
    shutil.copy(os.path.join(STORY, 'spec.yaml'), train_dir)
    with open(os.path.join(STORY, 'events.jsonl'), encoding='utf-8') as f:
        lines = f.readlines()
    if until is not None:
        lines = lines[:next(i for i, line in enumerate(lines)
                            if (json.loads(line)['attempt'], json.loads(line)['event']) == until)]
    with open(rundir.events_path(train_dir), 'w', encoding='utf-8') as f:
        f.writelines(lines)
    if until is None:
        shutil.copy(os.path.join(STORY, 'run.json'), train_dir)
    return train_dir


def test_a_chief_that_ended_with_its_ps_is_part_of_the_ps_fault(tmp_path):
    """ps:0 killed with SIGKILL; the chief's session fails with it (exit code 1) and both are seen
    in one observation, as in a real run (their real logs). The event log keeps both tasks' ends,
    but the chief's names the ps it followed; run.json's failures and the report's faults count
    one fault, the chief's words and error in it."""
    spec = load_spec(write_spec(tmp_path))
    backend = LocalBackend()
    records = [backend.log_record(p) for p in plan_cluster(spec)]
    for r, log in zip(records, ('sync-ps-0.log', 'sync-worker-0.log', None)):
        os.makedirs(os.path.dirname(r.log), exist_ok=True)
        shutil.copy(os.path.join(DATA, 'ps-lost', log), r.log) if log else open(r.log, 'w').close()
    statuses = [TaskStatus('ps:0', 'ps', 0, TaskState.FAILED, exit_code=-9),
                TaskStatus('worker:0', 'worker', 0, TaskState.FAILED, exit_code=1),
                TaskStatus('worker:1', 'worker', 1, TaskState.RUNNING)]
    decision = decide(Policy.of(spec), statuses, frozenset(), 0, Progress(24, 40, 0.2))
    assert decision.tasks == ('ps:0', 'worker:0')
    life = Lifecycle(spec, Console(stream=io.StringIO()), report=False)
    life.events = EventLog(rundir.events_path(spec.train.train_dir), 'run-1', 1)

    errors, failures = faults.record_faults(life, decision, statuses, records, {'local': backend})

    lost = [e for e in read_events(rundir.events_path(spec.train.train_dir)) if e['event'] == 'task_lost']
    assert [(e['task'], e['exit_code'], e.get('after')) for e in lost] == [('ps:0', -9, None), ('worker:0', 1, 'ps:0')]
    chief_error = 'the sync aggregator failed, so this chief cannot go on: UnavailableError'
    assert lost[1]['error'] == chief_error and errors == {'ps:0': None, 'worker:0': chief_error}
    assert [(f.task, f.cause) for f in failures] == [('ps:0', 'ps:0 was killed by SIGKILL (then worker:0 exited '
                                                               'with code 1)')]
    tale = report.story(report.load(spec.train.train_dir))
    assert [(f.row, f.text, f.error) for f in tale.faults] == [
        ('ps:0', 'ps:0 was killed by SIGKILL (then worker:0 exited with code 1)', f'worker:0: {chief_error}')]
    assert [(row, kind) for row, _, kind in tale.marks if kind == 'lost'] == [('ps:0', 'lost'), ('worker:0', 'lost')]


def test_the_report_tells_an_interrupt_and_a_resume_from_faults_and_restarts(tmp_path):
    """The real run's page: one fault (the ps, its chief with it), the supervisor's restart drawn
    as one (attempt 2's tasks restarted), the user's Ctrl-C an interruption and no fault, and the
    second `launch up` a resume whose tasks start (not the automatic-restart mark)."""
    train_dir = _copy_story(tmp_path)
    run = report.load(train_dir)
    tale = report.story(run)
    [fault] = tale.faults
    assert (fault.attempt, fault.row, fault.text) == (1, 'ps:0', 'ps:0 was killed by SIGKILL (then worker:0 exited '
                                                                 'with code 1)')
    assert fault.error and fault.error.startswith('worker:0: ') and '====' not in fault.error, fault.error
    starts = {}
    for row, _, kind in tale.marks:
        if kind in ('started', 'restarted'):
            starts.setdefault(row, []).append(kind)
    assert starts == {task: ['started', 'restarted', 'started'] for task in ('ps:0', 'worker:0', 'worker:1')}
    assert [kind for row, _, kind in tale.marks if row == 'run' and kind in ('restart', 'interrupted', 'resumed')] \
        == ['restart', 'interrupted', 'resumed']
    assert [a.ended.split(':')[0] for a in report.attempts(run)] == ['restarted', 'interrupted by SIGINT', 'finished']
    page = report.render(train_dir)
    assert page.count('class="fault">F') == 1 and 'interrupted by SIGINT' in page


def test_status_after_a_killed_launcher_names_the_step_once(tmp_path, capsys):
    """A launcher killed while its restart brought the cluster up again: the real run's events up
    to attempt 2's servers, and the state file it left (its tasks, no step seen in attempt 2).
    `launch status` says the step the run reached once, and never 'none seen' beside it."""
    train_dir = _copy_story(tmp_path, until=(2, 'first_step'))
    events = read_events(rundir.events_path(train_dir))
    assert (events[-1]['attempt'], events[-1]['event']) == (2, 'serving')
    reached = [e['step'] for e in events if e['event'] in ('progress', 'first_step')][-1]    # attempt 1's last
    spec = load_spec(os.path.join(train_dir, rundir.SPEC_FILE), [f'train.train_dir={train_dir}'])
    state = LaunchState(spec=spec.path, launcher_pid=4242, launcher_ident='gone', started=0.0, restarts=1,
                        tasks=[LocalBackend().log_record(p) for p in plan_cluster(spec)])
    state.save(state_path(spec))       # as the launcher wrote it: attempt 2 had seen no step
    assert main(['status', train_dir]) == 1         # the last attempt left no result: unknown
    shown = capsys.readouterr().out
    head = shown.split('\nTASK ')[0]
    assert 'launcher pid 4242 is gone' in head and 'none seen yet' not in head, shown
    assert head.count('global step') == 1 and f'global step {reached} ' in head, shown


def test_each_warning_once_per_command(tmp_path, caplog, capsys):
    """A torn last line of a real event log: every reader of the command skips it (status reads the
    events twice, report three times), and the user is told once."""
    train_dir = _copy_story(tmp_path)
    with open(rundir.events_path(train_dir), 'a', encoding='utf-8') as f:
        f.write('{"time": "2026-11-26T23:4')     # a launcher killed mid-write
    lines = sum(1 for _ in open(rundir.events_path(train_dir), encoding='utf-8'))
    for command in (['status', train_dir], ['report', train_dir, '-o', str(tmp_path / 'r.html')]):
        caplog.clear()
        assert main(command) == 0
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [f'{rundir.events_path(train_dir)}: skipped 1 line(s) damaged (line {lines})'], \
            (command, warnings)
    capsys.readouterr()
