"""The Ray backend on a real Ray cluster of three nodes on this machine (127.0.0.1 the head, .2 and
.3 standing in for two more hosts: tests/harness/raycluster.py), and on the Ray instance a run
starts for itself. A TF1 sync run and a PSS coordinator run with an evaluator train to the end
with tasks on the nodes their hosts name; kill -9 of a PSS worker's process starts that worker
alone again (same attempt, same node); a node stopped while it runs a task is named, and the run
goes on as its policy says (its tasks moved to another node); a launcher killed -9 leaves no actor and no task; every bad input is
one line, exit 2, with nothing placed. The autouse guard fails a test that leaves a task behind."""
from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import yaml

from tests.conftest import launch, launch_bg, project_processes, read_until, write_coordinator_spec, write_spec
from tests.harness.documented import check_documented
from tests.harness.faults import finish, task_pid, until_step

pytestmark = pytest.mark.slow     # real Ray clusters and TensorFlow tasks

PACED = {'env': {'TFCLUSTER_TEST_STEP_SECS': 0.25}}     # a PSS chief's pace: a kill lands mid-run


def events(train_dir) -> list[dict]:
    with open(os.path.join(train_dir, 'events.jsonl')) as f:
        return [json.loads(line) for line in f]


def started_on(log: list[dict]) -> dict[str, str]:
    """task -> the node its last start ran on."""
    return {e['task']: e['node'] for e in log if e['event'] == 'task_started'}


def faults_told(log: list[dict]) -> str:
    """Each restart (its tasks, None: the whole cluster, and its cause), each task lost (its cause
    and its own last error) and each move, one a line, in order: what a failed assertion on the
    restarts shows, so that the cause of an unexpected one is read from the CI log."""
    lines = []
    for e in log:
        at = f"{e['time']} attempt {e['attempt']}"
        if e['event'] == 'restart':
            lines.append(f"{at} restart {e.get('tasks') or 'of the whole cluster'}: {e.get('cause')}")
        elif e['event'] == 'task_lost':
            lines.append(f"{at} lost {e['task']}: {e.get('cause')} (exit {e.get('exit_code')}, "
                         f"error {e.get('error')!r})")
        elif e['event'] == 'moved':
            lines.append(f"{at} moved {e['task']} from {e['before']} to {e['address']}: {e.get('cause')}")
    return '\n'.join(lines)


def up_on(cluster, spec: str, *more: str, **kw):
    return launch('up', spec, '--backend', 'ray', '--ray-address', cluster.address, *more, env=cluster.env, **kw)


def up_bg(cluster, spec: str, *more: str):
    return launch_bg('up', spec, '--backend', 'ray', '--ray-address', cluster.address, *more, env=cluster.env)


def no_actor_left(cluster, timeout: float = 30.0) -> list[dict]:
    """The run's actors alive after `timeout` at most (the GCS ends a dead driver's in seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = cluster.alive_actors()
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(1)


def test_tf1_sync_trains_to_the_end_with_workers_on_the_nodes_their_hosts_name(ray_cluster, tmp_path):
    """The ps on the node named `head` (`ray start --node-name`), the workers on the nodes at
    127.0.0.2 and .3: each runs there, and the spec the tasks read names those nodes."""
    spec = write_spec(tmp_path, steps=20, task_hosts=['head', '127.0.0.2', '127.0.0.3'])
    result = up_on(ray_cluster, spec)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert 'step 20/20' in out and 'done in' in out, out
    log = events(tmp_path / 'run')
    where = started_on(log)
    assert where['worker:0'] == '127.0.0.2' and where['worker:1'] == '127.0.0.3', where
    assert where['ps:0'] == ray_cluster.nodes['head'], where
    placed = open(tmp_path / 'run' / 'spec.yaml').read()
    assert '127.0.0.2:' in placed and '127.0.0.3:' in placed and 'head:' not in placed, placed
    for name in ('ps-0', 'worker-0', 'worker-1'):
        assert os.path.getsize(tmp_path / 'run' / 'logs' / f'{name}.log') > 0
    assert json.load(open(tmp_path / 'run' / 'run.json'))['state'] == 'done'
    assert not no_actor_left(ray_cluster)


def test_pss_with_an_evaluator_on_named_nodes_restarts_a_killed_worker_alone(ray_cluster, tmp_path):
    """PSS (chief, ps, 2 workers, evaluator), worker:0 pinned to .2 by its address and worker:1
    placed by a node label (its host `third` is no node's name: only the label tfcluster.io/host=n3
    puts it on .3): kill -9 of worker:1's process starts worker:1 alone again, on its node, in the
    same attempt, while the chief trains on; the run ends at its last step, evaluated."""
    spec = write_coordinator_spec(tmp_path, steps=300, checkpoint_steps=100, worker_hosts=('127.0.0.2', 'third'),
                                  hosts={'third': {'labels': {'tfcluster.io/host': 'n3'}}}, top=PACED)
    run = str(tmp_path / 'run')
    proc = up_bg(ray_cluster, spec)
    lines = until_step(proc, 60)
    os.kill(task_pid(run, 'worker:1'), signal.SIGKILL)
    out = ''.join(lines) + finish(proc)
    assert proc.returncode == 0, out
    assert re.search(r'restart 1/3: worker:1 was killed by SIGKILL; starting worker:1 again', out), out
    log = events(run)
    assert [e['tasks'] for e in log if e['event'] == 'restart'] == [['worker:1']], log
    assert {e['attempt'] for e in log} == {1}
    starts = [e['node'] for e in log if e['event'] == 'task_started' and e['task'] == 'worker:1']
    assert starts == ['127.0.0.3', '127.0.0.3'], starts        # the labelled node, both times
    assert started_on(log)['worker:0'] == '127.0.0.2', log
    final = [e for e in log if e['event'] == 'evaluation' and e['step'] == 300]
    assert final and final[-1]['task'] == 'evaluator:0', log[-5:]
    assert log[-1]['event'] == 'finished' and log[-1]['result']['state'] == 'done'
    assert not no_actor_left(ray_cluster)


def on_head(spec: str, job: str) -> None:
    """The spec file with `job`'s first task on the node named head."""
    with open(spec) as f:
        data = yaml.safe_load(f)
    data['cluster'][job][0] = 'head:' + data['cluster'][job][0].rsplit(':', 1)[1]
    with open(spec, 'w') as f:
        yaml.safe_dump(data, f, sort_keys=False)


def test_a_node_stopped_under_the_ps_is_named_and_the_ps_moves_to_another_node(ray_cluster, tmp_path):
    """The ps of a PSS run goes to a node labelled `pool=spare`: two such nodes join (127.0.0.4 and
    .5, of their own, so the shared cluster stays whole), and the one the ps runs on is killed
    mid-run (SIGKILL to its `ray start`, raylet and actors). The run names the node the ps lost; a lost ps would start again with the chief, but
    it must move, so the whole cluster starts again, the ps on the other spare node at an address
    every task is told, and the run trains to its last step from the chief's checkpoint."""
    spare = {'tfcluster.io/pool': 'spare'}
    nodes = {ip: ray_cluster.add_node(ip, label, labels=spare) for ip, label in (('127.0.0.4', 'n4'),
                                                                              ('127.0.0.5', 'n5'))}
    try:
        spec = write_coordinator_spec(tmp_path, evaluator=None, steps=300, checkpoint_steps=50, host='spare',
                                      worker_hosts=('127.0.0.2', '127.0.0.3'), hosts={'spare': {'labels': spare}},
                                      supervise={'unreachable_secs': 2, 'max_restarts': 3}, top=PACED)
        on_head(spec, 'chief')
        run = str(tmp_path / 'run')
        proc = up_bg(ray_cluster, spec)
        lines = until_step(proc, 100)
        lost = started_on(events(run))['ps:0']
        other = next(ip for ip in nodes if ip != lost)
        ray_cluster.stop_node(nodes[lost], signal.SIGKILL)      # a host lost: its raylet and actors at once
        out = ''.join(lines) + finish(proc)
    finally:
        for node in nodes.values():
            if node.proc.poll() is None:
                ray_cluster.stop_node(node)
    assert proc.returncode == 0, out
    assert f'its node {lost} left the Ray cluster' in out, out
    assert re.search(rf'ps:0 moves from {re.escape(lost)}:\d+ to {re.escape(other)}:\d+: its node '
                     rf'{re.escape(lost)} left the Ray cluster', out), out
    log = events(run)
    assert [(e['task'], e['before'].split(':')[0], e['address'].split(':')[0]) for e in log
            if e['event'] == 'moved'] == [('ps:0', lost, other)], log
    assert started_on(log)['ps:0'] == other
    # The chief may first be started again alone: its "connection refused" to the ps can come before
    # the cluster knows the node is gone (Ray's health checks); the move is the whole cluster's.
    restarts = [e.get('tasks') for e in log if e['event'] == 'restart']
    assert restarts in ([None], [['chief:0'], None]), faults_told(log) + '\n' + out[-4000:]
    assert log[-1]['event'] == 'finished' and log[-1]['result']['state'] == 'done', log[-1]
    assert not no_actor_left(ray_cluster)


def test_a_launcher_killed_hard_leaves_no_actor_and_no_task(ray_cluster, tmp_path):
    spec = write_spec(tmp_path, steps=100000, sync=False, task_hosts=['127.0.0.2', '127.0.0.2', '127.0.0.3'])
    proc = up_bg(ray_cluster, spec)
    read_until(proc, 'servers are up')
    assert len(ray_cluster.alive_actors()) == 3
    t0 = time.monotonic()
    proc.kill()
    proc.wait()
    assert not no_actor_left(ray_cluster)
    deadline = time.monotonic() + 30
    while project_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not project_processes(), project_processes()
    print(f'actors and tasks gone {time.monotonic() - t0:.1f}s after the launcher was killed')


@pytest.mark.parametrize('case', ['no-node', 'gpus', 'no-cluster', 'client'])
def test_bad_input_is_one_line_and_places_nothing(ray_cluster, tmp_path, case):
    hosts = ['localhost', '127.0.0.9' if case == 'no-node' else '127.0.0.2', '127.0.0.3']
    spec = write_spec(tmp_path, task_hosts=hosts, **({'devices': ['gpu:0']} if case == 'gpus' else {}))
    address = {'no-cluster': '127.0.0.1:1', 'client': 'ray://127.0.0.1:10001'}.get(case, ray_cluster.address)
    result = launch('up', spec, '--backend', 'ray', '--ray-address', address, env=ray_cluster.env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stdout + result.stderr
    expected = {'no-node': 'host 127.0.0.9 is no node of the Ray cluster at', 'gpus': 'GPU',
                'no-cluster': 'no Ray cluster answers at 127.0.0.1:1 (--ray-address)',
                'client': 'Ray Client addresses are not supported'}[case]
    assert expected in lines[0], lines
    entry = {'no-node': 'ray-host-no-node', 'gpus': 'ray-gpus-over-cluster', 'no-cluster': 'ray-no-cluster',
             'client': 'ray-client-address'}[case]
    check_documented(entry, lines[0].removeprefix('launch: error: '))
    assert not ray_cluster.alive_actors()
    assert not os.path.exists(tmp_path / 'run' / 'events.jsonl')


def test_the_run_starts_its_own_ray_when_given_no_address_and_leaves_none(tmp_path, monkeypatch):
    """No --ray-address nor RAY_ADDRESS: a Ray instance of the run's own, stopped at the end."""
    monkeypatch.delenv('RAY_ADDRESS', raising=False)
    from tests.harness.raycluster import ray_missing
    missing = ray_missing()
    if missing:
        pytest.skip(missing)
    spec = write_spec(tmp_path, steps=10)
    before = ray_processes()
    result = launch('up', spec, '--backend', 'ray')
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'step 10/10' in result.stdout
    deadline = time.monotonic() + 20
    while ray_processes() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ray_processes() - before


def ray_processes() -> set[int]:
    from tests.harness.parts import processes_naming
    return {pid for pid, cmd in processes_naming('/tmp/ray/session_').items()}


def test_status_logs_debug_scale_and_down_reach_the_tasks_on_their_nodes(ray_cluster, tmp_path):
    """A rehearsal (stand-ins, no TensorFlow) spread over the three nodes, driven from other
    processes: status names every task with its node, logs prints one's log, debug gets every
    stand-in's stacks through its actor, an async scale takes a worker out live and brings it
    back, and down stops the run: no actor is left."""
    spec = write_spec(tmp_path, workers=3, ps=1, steps=1_000_000, sync=False,
                      task_hosts=['localhost', '127.0.0.2', '127.0.0.3', 'localhost'])
    run = str(tmp_path / 'run' / 'rehearsal')
    proc = up_bg(ray_cluster, spec, '--rehearse')
    lines: list[str] = []
    try:
        lines = read_until(proc, 'servers are up')
        status = launch('status', run, timeout=120, env=ray_cluster.env)
        assert status.returncode == 0 and all(t in status.stdout for t in ('ps:0', 'worker:0', 'worker:2')), status.stdout
        assert '127.0.0.2' in status.stdout and '127.0.0.3' in status.stdout, status.stdout
        logs = launch('logs', run, 'worker:1', timeout=60, env=ray_cluster.env)
        assert logs.returncode == 0 and 'worker:1: a rehearsal stand-in (no TensorFlow)' in logs.stdout, logs.stdout
        debug = launch('debug', run, timeout=120, env=ray_cluster.env)
        assert debug.returncode == 0, debug.stdout + debug.stderr
        dumped = sorted(os.listdir(os.path.join(run, 'stacks', 'attempt-1')))
        assert len(dumped) == 4, dumped
        shrink = launch('scale', run, '--workers', '2', timeout=120, env=ray_cluster.env)
        assert shrink.returncode == 0 and 'worker:2 finishes its step and leaves' in shrink.stdout, shrink.stdout
        grow = launch('scale', run, '--workers', '3', timeout=120, env=ray_cluster.env)
        assert grow.returncode == 0 and '3 worker(s) train now' in grow.stdout, grow.stdout + grow.stderr
        down = launch('down', run, timeout=120, env=ray_cluster.env)
        assert down.returncode == 0, down.stdout + down.stderr
    finally:
        out = ''.join(lines) + finish(proc)
    assert proc.returncode == 128 + signal.SIGTERM, out       # stopped by `down`
    assert not no_actor_left(ray_cluster)


def test_nodes_that_do_not_share_the_train_dir_run_in_their_workdirs_and_their_logs_stream_here(ray_cluster,
                                                                                                 tmp_path):
    """TFCLUSTER_RAY_FS=private: every node counts as not sharing the launcher's train_dir (one
    machine stands in for three). The tasks run in their hosts' workdirs, where their logs and
    the chief's checkpoints are; every log is mirrored into the launcher's run directory as it is
    written, byte for byte: the supervisor sees each task serve, the run trains to the end, and
    `launch logs` shows them afterwards."""
    hosts = {'127.0.0.2': {'workdir': str(tmp_path / 'n2')}, '127.0.0.3': {'workdir': str(tmp_path / 'n3')}}
    spec = write_spec(tmp_path, steps=20, sync=False, train_dir='run', hosts=hosts,
                      task_hosts=['127.0.0.2', '127.0.0.2', '127.0.0.3'])
    env = {**ray_cluster.env, 'TFCLUSTER_RAY_FS': 'private'}
    result = launch('up', spec, '--backend', 'ray', '--ray-address', ray_cluster.address, cwd=tmp_path, env=env)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and 'done in' in out, out
    assert {e['task'] for e in events(tmp_path / 'run') if e['event'] == 'serving'} == {'ps:0', 'worker:0', 'worker:1'}
    for name, node in (('ps-0', 'n2'), ('worker-0', 'n2'), ('worker-1', 'n3')):
        here = (tmp_path / 'run' / 'logs' / f'{name}.log').read_bytes()
        assert here == (tmp_path / node / 'run' / 'logs' / f'{name}.log').read_bytes()
        assert b'serving on 127.0.0.' in here, here[-2000:]
    assert os.path.exists(tmp_path / 'n2' / 'run' / 'checkpoint') and not os.path.exists(tmp_path / 'run' / 'checkpoint')
    logs = launch('logs', str(tmp_path / 'run'), cwd=tmp_path, timeout=60, env=env)
    assert logs.returncode == 0 and all(f'{t}' in logs.stdout for t in ('ps:0', 'worker:0', 'worker:1')), logs.stdout
    assert 'serving on' in logs.stdout, logs.stdout
    assert not no_actor_left(ray_cluster)
