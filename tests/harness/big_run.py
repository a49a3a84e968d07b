"""A large run's files, made up (no process started): events.jsonl, run.json and spec.yaml of a
run of `tasks` tasks (`ps` of them ps, the rest workers) with a few faults, and the launch-state
file `launch status` reads. For the tests of how status, the report and the console read at
1,000 tasks (tests/unit/launch/commands/test_status_groups.py,
tests/unit/launch/records/test_report_scale.py), and to time them by hand:

    PYTHONPATH=$PWD python -m tests.harness.big_run DIR 1000 && time launch report DIR/run
"""
from __future__ import annotations

import datetime
import json
import os
import sys

from cluster.runtime import rundir

T0 = datetime.datetime(2026, 11, 23, 21, 8, 43, tzinfo=datetime.timezone.utc)
RUN_ID = 'big-20261123-210843'
PORT_BASE = 30000
LOST = 'worker:17'          # killed (SIGKILL) and restarted alone
STALLED = 'worker:402'      # named by a stall
TOLERATED = 'worker:903'    # lost, training goes on


def names(tasks: int, ps: int) -> list[str]:
    return [f'ps:{i}' for i in range(ps)] + [f'worker:{i}' for i in range(tasks - ps)]


def spec_text(train_dir: str, tasks: int, ps: int) -> str:
    """A spec of `tasks` local tasks on consecutive ports."""
    ports = [f'localhost:{PORT_BASE + i}' for i in range(tasks)]
    return (f'cluster:\n  ps: [{", ".join(ports[:ps])}]\n  worker: [{", ".join(ports[ps:])}]\n'
            f'train:\n  steps: 100\n  train_dir: {train_dir}\n')


def _event(seconds: float, event: str, attempt: int = 1, **fields: object) -> dict:
    when = (T0 + datetime.timedelta(seconds=seconds)).isoformat(timespec='milliseconds')
    return {'time': when, 'run': RUN_ID, 'attempt': attempt, 'event': event, **fields}


def events(train_dir: str, tasks: int, ps: int) -> list[dict]:
    """Every task starts and serves (0.05 s apart), the chief trains to step 100; one worker is
    killed and restarted, one is named by a stall, one is lost and tolerated."""
    everyone = names(tasks, ps)
    out = [_event(0, 'run_started', spec=os.path.join(os.path.dirname(train_dir), 'spec.yaml'), backend='local',
                  spec_hash='ab' * 32, train_dir=train_dir, launcher_pid=4242, resumes_from=None)]
    for i, task in enumerate(everyone):
        out.append(_event(0.05 * i, 'task_started', task=task, host='localhost', pid=10000 + i))
        out.append(_event(0.05 * i + 2, 'serving', task=task))
    up = 0.05 * tasks + 3
    out.append(_event(up, 'first_step', step=1))
    out += [_event(up + 2 * n, 'progress', step=n, total=100, loss=round(2.3 * 0.98 ** n, 3), images_per_sec=900.0)
            for n in range(1, 101, 5)]
    if tasks - ps > max(17, 402, 903):
        out += [_event(up + 20, 'task_lost', task=LOST, cause=f'{LOST} was killed by SIGKILL', exit_code=-9,
                       signal='SIGKILL'),
                _event(up + 20.2, 'restart', cause=f'{LOST} was killed by SIGKILL', tasks=[LOST]),
                _event(up + 21, 'task_started', task=LOST, host='localhost', pid=99999),
                _event(up + 23, 'serving', task=LOST),
                _event(up + 30, 'stall', tasks=[STALLED], cause=f'{STALLED} does not answer'),
                _event(up + 35, 'tolerated', task=TOLERATED, cause=f'{TOLERATED} exited with code 1')]
    out.append(_event(up + 45, 'checkpoint', step=100))
    out.append(_event(up + 46, 'finished', result={'id': RUN_ID, 'state': 'done', 'exit_code': 0}))
    return out


def launch_state(root: str, tasks: int = 1000, ps: int = 20, pid_base: int = 4_000_000) -> None:
    """The state file of the run's launcher, gone (its pid, as its tasks', runs no process
    here): what `launch status` reads of a run whose launcher was killed."""
    from launch.backends.base import TaskRecord
    from launch.run.state import LaunchState
    train_dir = os.path.join(root, 'run')
    records = [TaskRecord(name=name, job=name.split(':')[0], index=int(name.split(':')[1]), host='localhost',
                          port=PORT_BASE + i, backend='local', pid=pid_base + i,
                          log=os.path.join(train_dir, 'logs', f'{name.replace(":", "-")}.log'), cwd=train_dir)
               for i, name in enumerate(names(tasks, ps))]
    state = LaunchState(spec=os.path.join(root, 'spec.yaml'), launcher_pid=pid_base - 1, launcher_ident='x',
                        started=T0.timestamp(), tasks=records)
    state.save(rundir.state_path(train_dir))


def big_run(root: str, tasks: int = 1000, ps: int = 20) -> str:
    """Write the run under root/run (spec at root/spec.yaml); returns the spec's path."""
    train_dir = os.path.join(root, 'run')
    os.makedirs(train_dir, exist_ok=True)
    spec = os.path.join(root, 'spec.yaml')
    with open(spec, 'w') as f:
        f.write(spec_text(train_dir, tasks, ps))
    with open(os.path.join(train_dir, rundir.SPEC_FILE), 'w') as f:
        f.write(spec_text(train_dir, tasks, ps))
    with open(rundir.events_path(train_dir), 'w') as f:
        f.writelines(json.dumps(e) + '\n' for e in events(train_dir, tasks, ps))
    with open(rundir.run_path(train_dir), 'w') as f:
        json.dump({'id': RUN_ID, 'spec': spec, 'backend': 'local', 'train_dir': train_dir, 'state': 'done',
                   'exit_code': 0, 'global_step': 100, 'attempt': 1, 'restarts': 1}, f)
    return spec


if __name__ == '__main__':
    size, ps_count = int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 20
    print(big_run(sys.argv[1], size, ps_count))
    launch_state(sys.argv[1], size, ps_count)
