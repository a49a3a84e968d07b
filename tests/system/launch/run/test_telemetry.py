"""Telemetry on a real local cluster (#42): async, 3 ps tasks, 3 workers, one worker stopped half
of the time (SIGSTOP/SIGCONT). It is named a straggler in the console, the event log, `launch
status` and the report, and no other worker is; the bytes each ps task receives, as the kernel
counts them, agree within 20% with what `launch plan` predicts for the steps the run made (the
plan's uneven split of the weights over 3 ps tasks included). The autouse guard fails a test that
leaves a process behind."""
from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from cluster.runtime import rundir
from launch.records import telemetry_report
from launch.records.events import typed_events
from tests.conftest import launch, launch_bg, read_until, write_spec
from tests.harness.faults import finish, half_duty, task_pid

pytestmark = pytest.mark.slow     # a real local cluster

SAMPLES = 4     # sample events (2 s apart) of every ps task, once the straggler is named


def sample_events(run: str) -> list[dict]:
    try:
        with open(rundir.events_path(run)) as f:
            return [json.loads(line) for line in f if '"sample"' in line]
    except FileNotFoundError:
        return []


def wait_for_samples(run: str, count: int, timeout: float = 60) -> None:
    """Until the run's event log holds `count` more sample events with every ps task in them."""
    def full() -> int:
        return sum(1 for e in sample_events(run) if all(f'ps:{i}' in e['tasks'] for i in range(3)))
    want, deadline = full() + count, time.monotonic() + timeout
    while full() < want:
        assert time.monotonic() < deadline, f'fewer than {count} more sample events in {timeout:g}s'
        time.sleep(0.5)


def test_a_worker_stopped_half_the_time_is_named_and_the_ps_bytes_are_as_planned(tmp_path):
    spec = write_spec(tmp_path, ps=3, workers=3, sync=False, steps=1_000_000, batch_size=16,
                      supervise={'sample_secs': 2})
    run = str(tmp_path / 'run')
    plan = json.loads(launch('plan', spec, '--json').stdout)['load']
    assert plan['imbalance'] == pytest.approx(1.1157, abs=1e-3)      # the busiest ps task holds 1.12x the mean
    proc = launch_bg('up', spec)
    lines = read_until(proc, 'servers are up')
    stop = threading.Event()
    slowing = threading.Thread(target=half_duty, args=(task_pid(run, 'worker:2'), stop))
    slowing.start()
    try:
        lines += read_until(proc, 'straggler: ', timeout=120)
        status = launch('status', spec, '--json')
        text = launch('status', spec)
        wait_for_samples(run, SAMPLES)
    finally:
        stop.set()
        slowing.join()
        proc.send_signal(signal.SIGINT)
        out = ''.join(lines) + finish(proc)
    # Named, once, with its likely cause; in status (--json and the table), the events, the report.
    assert lines[-1].startswith('[launch]   straggler: worker:2 trains '), lines[-1]
    assert "of the other workers' median" in lines[-1] and 'stopped part of the time' in lines[-1], lines[-1]
    assert [line for line in out.splitlines() if 'straggler: ' in line] == [lines[-1].rstrip('\n')], out
    data = json.loads(status.stdout)
    assert [s['task'] for s in data['stragglers']] == ['worker:2'], data['stragglers']
    tasks = {t['task']: t for t in data['tasks']}
    assert 'straggler (named ' in tasks['worker:2']['note'], tasks['worker:2']      # (and stopped, at times)
    assert all(tasks[w]['sample']['steps_per_sec'] > 0 for w in ('worker:0', 'worker:1')), tasks
    assert tasks['ps:0']['sample']['in_per_sec'] > 0 and tasks['ps:0']['sample']['steps'] is None, tasks['ps:0']
    assert 'STEPS/S' in text.stdout and 'straggler (named ' in text.stdout, text.stdout
    with open(rundir.events_path(run)) as f:
        events = [json.loads(line) for line in f]
    assert [e['task'] for e in events if e['event'] == 'straggler'] == ['worker:2'], out
    page = tmp_path / 'report.html'
    assert launch('report', spec, '-o', str(page)).returncode == 0
    html = page.read_text()
    assert '<h2>Telemetry</h2>' in html and '<td>worker:2</td>' in html
    # Each ps task's bytes in, measured, against the plan's bytes per step x the steps per second.
    rows = telemetry_report.ps_rows(typed_events(rundir.events_path(run)), run)
    assert [r[0] for r in rows] == ['ps:0', 'ps:1', 'ps:2'], (rows, out[-2000:])
    print('ps task, MB/s in measured, MB/s planned, ratio:', rows)
    print([line for line in out.splitlines() if 'straggler: ' in line][0])
    for task, measured, predicted, ratio in rows:
        assert 0.8 <= float(ratio) <= 1.2, (task, measured, predicted, rows)
