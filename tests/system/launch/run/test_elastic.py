"""Elastic workers: `launch up --workers N` runs part of the spec's pool, `launch scale` changes
the count while the run goes on (async: live). Bad input is refused before anything changes; a
real local cluster grows and shrinks with the global step advancing throughout."""
import datetime
import json
import os
import re
import signal
import time

import pytest
import yaml

from cluster.runtime.membership import Members
from cluster.runtime.rundir import step_of
from launch.records.events import read_events
from tests.conftest import launch, launch_bg, read_until, write_spec
from tests.harness.faults import task_pid
from tests.harness.training import results

pytestmark = pytest.mark.slow      # real launchers (and, below, a real cluster)


@pytest.mark.parametrize('args, words', [
    (['up', '--workers', '0'], '--workers 0: expected 1..3'),
    (['up', '--workers', '4'], '--workers 4: expected 1..3'),
    (['up', '--workers', '1', '--set', 'train.sync=true', '--set', 'train.replicas_to_aggregate=2'],
     '--workers 1: fewer than train.replicas_to_aggregate (2)'),
    (['scale', '--workers', '2'], 'no launcher runs'),
    (['scale', '--workers', '9'], '--workers 9: expected 1..3'),
])
def test_bad_worker_counts_are_one_line_and_change_nothing(tmp_path, args, words):
    spec = write_spec(tmp_path, workers=3, sync=False)
    out = launch(args[0], spec, *args[1:], timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count('\n') == 1 and words in out.stderr, out.stderr
    assert not (tmp_path / 'run' / 'events.jsonl').exists()


# Far more than the test trains: the run is stopped with Ctrl-C once both scales took effect, so
# no machine is fast enough to reach the last step while a joiner still imports TensorFlow.
ASYNC_STEPS = 100_000


def until_chief_step(up, step: int) -> list[str]:
    """The launcher's lines up to the chief's first progress line at or past global step `step`."""
    lines = []
    while not (lines and lines[-1].startswith('[worker:0]') and (step_of(lines[-1]) or (0, 0))[0] >= step):
        lines += read_until(up, ' step ', timeout=300)
    return lines


def grow_and_shrink(tmp_path, spec: str, *backend: str, cwd: str | None = None) -> str:
    """1 ps + a pool of 3 started with one worker, scaled to 3 after step 20, then to 2: each scale
    exits 0 once it took effect, workers 1 and 2 train, worker 2 leaves having logged that it
    finished, the global step never stalls (the chief's progress lines keep coming and rising),
    no task is lost or restarted, and the run ends at its last step with exit 0. Returns the
    launcher's output."""
    kw = {'cwd': cwd} if cwd else {}
    up = launch_bg('up', spec, '--workers', '1', *backend, **kw)
    try:
        lines = until_chief_step(up, 20)
        grow = launch('scale', spec, '--workers', '3', *backend, timeout=300, **kw)
        assert grow.returncode == 0, grow.stdout + grow.stderr
        assert 'starting worker:1, worker:2' in grow.stdout and '3 worker(s) train now' in grow.stdout
        shrink = launch('scale', spec, '--workers', '2', *backend, timeout=300, **kw)
        assert shrink.returncode == 0, shrink.stdout + shrink.stderr
        assert 'worker:2 finishes its step and leaves' in shrink.stdout
        again = launch('scale', spec, '--workers', '2', *backend, timeout=60, **kw)
        assert again.returncode == 0 and '2 worker(s) train already' in again.stdout
        lines += until_chief_step(up, 0)        # the chief's next progress line: 2 workers train on
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=240) == 128 + signal.SIGINT
    finally:
        if up.poll() is None:
            up.send_signal(2)
            up.wait(timeout=240)
        rest = up.stdout.read()     # not communicate(timeout=...): it would skip what readline buffered
    out = ''.join(lines) + rest
    train_dir = os.path.join(cwd or '', yaml.safe_load(open(spec))['train']['train_dir'])
    events = read_events(os.path.join(train_dir, 'events.jsonl'))
    assert [e['event'] for e in events if e['event'] in ('scale', 'scaled', 'restart', 'task_lost')] == \
        ['scale', 'scaled', 'scale', 'scaled'], out
    progress = [(datetime.datetime.fromisoformat(e['time']).timestamp(), e['step'])
                for e in events if e['event'] == 'progress']
    assert [s for _, s in progress] == sorted(s for _, s in progress), progress
    # The chief logs every second (train.log_every_secs); 5 s of slack for two shared cores busy
    # starting two new workers: a restart would stop it for far longer.
    gaps = [b[0] - a[0] for a, b in zip(progress, progress[1:])]
    assert max(gaps) < 5, gaps
    for i in (1, 2):
        assert re.search(rf'\[worker:{i}\] .* step \d+/{ASYNC_STEPS} ', out), out
    assert re.search(r'\[worker:2\] .* worker:2 leaves at global step \d+', out), out
    assert re.search(r'\[worker:2\] .* worker:2 finished', out), out
    assert [e['result']['state'] for e in events if e['event'] == 'finished'] == ['interrupted']
    return out


def test_an_async_pool_grows_and_shrinks_while_the_global_step_goes_on(tmp_path):
    spec = write_spec(tmp_path, workers=3, sync=False, steps=ASYNC_STEPS, batch_size=8)
    grow_and_shrink(tmp_path, spec)
    assert Members.parse((tmp_path / 'run' / 'launcher.lease').read_text(), 3).indices == (0, 1)


def test_a_joiner_killed_while_it_starts_leaves_the_live_set_and_scale_agrees(tmp_path):
    """restart: never; `launch scale --workers 3` starts worker:2, which is killed (SIGKILL) while
    it imports TensorFlow: the scale fails (exit 1) saying 2 workers train, as the launcher does;
    a second scale to 3 starts it again and is done once it has trained a step (the run, far from
    its last step, is then stopped with Ctrl-C)."""
    spec = write_spec(tmp_path, workers=3, sync=False, steps=100_000, batch_size=8)
    train_dir = str(tmp_path / 'run')
    up = launch_bg('up', spec, '--workers', '2')
    lines = []
    try:
        lines += until_chief_step(up, 5)
        scale = launch_bg('scale', spec, '--workers', '3')
        deadline = time.monotonic() + 60
        while True:         # as soon as the launcher names its process: it is importing TensorFlow
            try:
                os.kill(task_pid(train_dir, 'worker:2'), signal.SIGKILL)
                break
            except (StopIteration, OSError, ValueError):
                assert time.monotonic() < deadline, 'worker:2 never started'
                time.sleep(0.02)
        said = scale.communicate(timeout=120)[0]
        assert scale.returncode == 1, said
        assert said.splitlines()[-1] == ('worker:2 ended while joining the training and is not started again; '
                                         '2 worker(s) train now (worker:0, worker:1)'), said
        assert json.load(open(os.path.join(train_dir, 'launch-state.json')))['workers']['live'] == [0, 1]
        again = launch('scale', spec, '--workers', '3', timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.splitlines()[-1] == '3 worker(s) train now (worker:0, worker:1, worker:2)', again.stdout
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=240)
        rest = up.stdout.read()
    out = ''.join(lines) + rest
    assert up.returncode == 128 + signal.SIGINT, out
    assert 'worker:2 was killed by SIGKILL; training goes on with 2 worker(s)' in out, out
    assert re.search(r'\[worker:2\] .* step \d+/100000 ', out), out          # its second start trained
    events = read_events(os.path.join(train_dir, 'events.jsonl'))
    assert [(e['state'], e['workers']) for e in events if e['event'] == 'scaled'] == \
        [('failed', [0, 1]), ('done', [0, 1, 2])], out


def test_an_async_compose_pool_grows_and_shrinks(tmp_path, compose_project):
    spec = write_spec(tmp_path, workers=3, sync=False, steps=ASYNC_STEPS, batch_size=8)
    compose_project(spec)
    grow_and_shrink(tmp_path, spec, '--backend', 'compose')


def test_a_sync_run_scales_through_a_checkpoint_to_three_replicas_per_step(tmp_path):
    """SyncReplicasOptimizer fixes the replicas in its graph: 2 -> 3 workers is a restart through
    the chief's checkpoint, after which every step aggregates one gradient of each of the 3
    workers (replicas_to_aggregate follows the count). Before that, a chief that cannot save
    (frozen) makes the scale a refusal that stops nothing."""
    steps = 200
    spec = write_spec(tmp_path, workers=3, sync=True, steps=steps, batch_size=8, supervise={'stall_secs': 16})
    train_dir = str(tmp_path / 'run')
    up = launch_bg('up', spec, '--workers', '2')
    try:
        until_chief_step(up, 2)
        chief = task_pid(train_dir, 'worker:0')
        os.kill(chief, signal.SIGSTOP)
        try:
            refused = launch('scale', spec, '--workers', '3', timeout=300)
        finally:
            os.kill(chief, signal.SIGCONT)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert 'no new checkpoint of the chief could be read back' in refused.stdout, refused.stdout
        assert 'nothing was changed' in refused.stdout
        out = launch('scale', spec, '--workers', '3', timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert 'restarts through a checkpoint' in out.stdout and '3 worker(s) train now' in out.stdout
        assert up.wait(timeout=300) == 0
    finally:
        if up.poll() is None:
            up.send_signal(2)
            up.wait(timeout=240)
    events = read_events(os.path.join(train_dir, 'events.jsonl'))
    assert [e['to'] for e in events if e['event'] == 'scale'] == [3]       # the refused one changed nothing
    [restart] = [e for e in events if e['event'] == 'restart']
    assert restart['cause'].startswith('scale 2 -> 3')
    resumed = restart['from_step']
    firsts = {e['attempt']: e['step'] for e in events if e['event'] == 'first_step'}
    assert firsts[2] == resumed + 1, (restart, firsts)
    per_step = {s: 0 for s in range(resumed, steps)}
    for r in results(train_dir, 3):         # each worker's record of the last attempt
        assert r['first_global_step'] == resumed and r['global_step'] == steps, r
        applied = [s for lo, hi in r['applied_at'] for s in range(lo, hi + 1)]
        assert applied == sorted(set(applied)), f'{r["task"]} contributed twice to a step: {r["applied_at"]}'
        for s in applied:
            per_step[s] += 1
    assert set(per_step.values()) == {3}, per_step


def test_an_async_ssh_pool_grows_and_shrinks(tmp_path, ssh_hosts):
    from tests.harness.ssh import host_settings
    spec = write_spec(tmp_path, workers=3, sync=False, steps=ASYNC_STEPS, batch_size=8, train_dir='run',
                      task_hosts=['127.0.0.2', '127.0.0.2', '127.0.0.3', '127.0.0.3'],
                      hosts=host_settings(ssh_hosts, tmp_path))
    grow_and_shrink(tmp_path, spec, '--ssh-config', str(ssh_hosts.ssh_config), cwd=str(tmp_path))


def test_a_worker_whose_host_is_lost_fails_over_to_a_spare(tmp_path, ssh_hosts, tmp_path_factory):
    """worker:1's host goes away (its sshd and everything under it killed): after the unreachable
    limit (supervise.unreachable_secs, 8 s here) the launcher starts the pool's spare worker:2 on another host in its place, and the
    run trains on."""
    from tests.harness.sshd import SSHHosts
    from tests.harness.ssh import host_settings
    with SSHHosts(tmp_path_factory.mktemp('sshd-lost'), addresses=('127.0.0.4',)) as lost:
        config = tmp_path / 'ssh_config'
        config.write_text(ssh_hosts.ssh_config.read_text() + '\n' + lost.ssh_config.read_text())
        hosts = {**host_settings(ssh_hosts, tmp_path), **host_settings(lost, tmp_path)}
        spec = write_spec(tmp_path, workers=3, sync=False, steps=100000, batch_size=8, train_dir='run',
                          task_hosts=['127.0.0.2', '127.0.0.2', '127.0.0.4', '127.0.0.3'], hosts=hosts,
                          supervise={'restart': 'on-failure', 'unreachable_secs': 8})
        up = launch_bg('up', spec, '--workers', '2', '--ssh-config', str(config), cwd=str(tmp_path))
        try:
            read_until(up, 'step 2', timeout=300)
            lost.stop()
            said = read_until(up, 'in its place (a spare of the pool)', timeout=180)[-1]
            assert 'worker:1 could not be reached' in said and 'starting worker:2 on 127.0.0.3:' in said, said
            read_until(up, '[worker:2]', timeout=180)
        finally:
            up.send_signal(2)
            up.wait(timeout=240)
    events = read_events(str(tmp_path / 'run' / 'events.jsonl'))
    moved = [e for e in events if e['event'] == 'failover']
    assert [(e['task'], e['to'], e['host']) for e in moved] == [('worker:1', 'worker:2', '127.0.0.3')]
    assert not [e for e in events if e['event'] == 'restart']
