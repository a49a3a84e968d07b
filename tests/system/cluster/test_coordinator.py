"""Coordinator runs (TF2 ParameterServerStrategy) on real clusters: 1 chief, 1 ps, 2 workers and an
evaluator. Each example trains to its last step with its evaluator's final figures in TensorBoard,
events.jsonl and the report; kill -9 of a worker restarts exactly that worker while the chief trains
on (the same attempt), kill -9 of the ps restarts the ps and the chief, which resumes from the newest
checkpoint; a train.command gets TF_CONFIG alone; the custom-loop example runs over SSH, in compose
and under Slurm. The autouse guard fails a test that leaves a process behind."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest
import yaml

from cluster.runtime import messages
from tests.conftest import REPO, free_ports, launch, launch_bg, run_tasks, write_coordinator_spec
from tests.harness.faults import finish, task_pid, until_step

pytestmark = pytest.mark.slow     # real local clusters

PACED = {'env': {'TFCLUSTER_TEST_STEP_SECS': 0.25}}     # ~40 steps/s: a kill lands mid-run


def events(train_dir) -> list[dict]:
    with open(os.path.join(train_dir, 'events.jsonl')) as f:
        return [json.loads(line) for line in f]


def eval_scalars(train_dir) -> dict[int, dict[str, float]]:
    """step -> tag -> value of the evaluator's TensorBoard events (<train_dir>/eval)."""
    import tensorflow as tf
    out: dict[int, dict[str, float]] = {}
    for path in glob.glob(os.path.join(train_dir, 'eval', 'events.out.tfevents.*')):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                out.setdefault(event.step, {})[value.tag] = value.simple_value
    return out


def check_finished(out: str, train_dir: str, steps: int, metric: str = 'loss') -> list[dict]:
    """The run trained to `steps`, its evaluator evaluated that checkpoint (events and TensorBoard),
    and the launcher stopped the servers; returns the events."""
    log = events(train_dir)
    assert f'step {steps}/{steps}' in out and 'the chief is done; stopping ps:0, worker:0, worker:1' in out, out
    final = [e for e in log if e['event'] == 'evaluation' and e['step'] == steps]
    assert final and final[-1]['task'] == 'evaluator:0' and metric in final[-1]['metrics'], log[-5:]
    assert eval_scalars(train_dir)[steps][f'eval/{metric}'] == pytest.approx(final[-1]['metrics'][metric], rel=1e-4)
    finished = log[-1]
    assert finished['event'] == 'finished' and finished['result']['state'] == 'done', finished
    return log


@pytest.mark.parametrize('example', ['pss_loop', 'pss_keras'])
def test_each_example_trains_to_its_last_step_and_is_evaluated(tmp_path, example):
    """examples/pss_loop.py (ClusterCoordinator) and examples/pss_keras.py (model.fit, SidecarEvaluator)
    as they are, through their specs: the chief, the ps, two workers and the evaluator."""
    spec = write_coordinator_spec(tmp_path, program=f'examples.{example}:train',
                                  evaluator=f'examples.{example}:evaluate', steps=60, checkpoint_steps=30)
    result = launch('up', spec, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    log = check_finished(out, str(tmp_path / 'run'), 60, metric='accuracy')
    assert [e['event'] for e in log].count('restart') == 0
    assert {e['task'] for e in log if e['event'] == 'serving'} == {'chief:0', 'ps:0', 'worker:0', 'worker:1',
                                                                   'evaluator:0'}
    assert re.search(r'done in .*\(coordinator, 2 workers\): global step 60, \d+ images/s in all', out), out
    assert f'evaluator:0 started: the evaluator examples.{example}:evaluate' in out, out      # it serves nothing
    assert not re.search(r'(chief|evaluator):0 serving on', out), out
    report = launch('report', spec, '-o', str(tmp_path / 'report.html'))
    page = (tmp_path / 'report.html').read_text()
    assert report.returncode == 0 and '<h2>Evaluation</h2>' in page and '<th>accuracy</th>' in page, report.stderr


def test_a_coordinator_run_ends_cleanly_and_says_what_each_role_does(tmp_path):
    """examples/pss_loop.py on 2 ps tasks, a few steps and no evaluator (nothing then holds the
    servers up after the last checkpoint): the chief, which serves nothing, says "started", not
    "serving on"; the servers are stopped only once the chief has ended, so the console holds none
    of gRPC's "Failed to remove function remotely" errors of a chief freeing its functions against
    stopped servers; the report gives the step reached. And the next run of the program can be
    planned from this one (#42): the chief recorded each variable where ParameterServerStrategy put
    it (variables.json), and `launch plan --from-run` gives the ps tasks' load from it, whose bytes
    are the bytes of the run's newest checkpoint."""
    spec = write_coordinator_spec(tmp_path, program='examples.pss_loop:train', evaluator=None,
                                  steps=40, checkpoint_steps=20)
    with open(spec) as f:
        data = yaml.safe_load(f)
    data['cluster']['ps'].append(f'localhost:{free_ports(1)[0]}')
    with open(spec, 'w') as f:
        yaml.safe_dump(data, f, sort_keys=False)
    result = launch('up', spec, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert 'Failed to remove function remotely' not in out and 'remote target' not in out, out
    assert not re.search(r'(chief|evaluator):0 serving on', out), out
    assert 'chief:0 started: the program examples.pss_loop:train' in out, out
    launch('report', spec, '-o', str(tmp_path / 'report.html'))
    assert '<td>global step</td><td>40</td>' in (tmp_path / 'report.html').read_text()
    check_planned_from(tmp_path, spec, data)


def check_planned_from(tmp_path, spec: str, data: dict) -> None:
    """`launch plan --from-run` of a finished coordinator run of 2 ps tasks: its load, and on links."""
    import tensorflow as tf
    run = str(tmp_path / 'run')
    plan = launch('plan', spec, '--from-run', run, '--json')
    assert plan.returncode == 0, plan.stderr
    load = json.loads(plan.stdout)['load']
    ps = {p['task']: p['bytes'] for p in load['ps']}
    assert set(ps) == {'ps:0', 'ps:1'} and all(ps.values()), load['ps']       # round robin: both hold some
    newest = tf.train.latest_checkpoint(run)
    saved = sum(tf.as_dtype(tf.train.load_variable(newest, name).dtype).size * max(1, int(np.prod(shape)))
                for name, shape in tf.train.list_variables(newest)
                if name != '_CHECKPOINTABLE_OBJECT_GRAPH' and not name.startswith('save_counter'))
    assert sum(ps.values()) == saved, (ps, tf.train.list_variables(newest))
    text = launch('plan', spec, '--from-run', run, '--link', '1gbit')
    assert text.returncode == 0, text.stderr
    assert 'links: every task runs on localhost: nothing crosses a link' in text.stdout, text.stdout
    # The same program planned on five hosts: the run gives the variables and the compute.
    for job, addresses in data['cluster'].items():
        data['cluster'][job] = [f'{job}{i}.example:{a.rsplit(":", 1)[1]}' for i, a in enumerate(addresses)]
    (tmp_path / 'hosts').mkdir()
    spread = str(tmp_path / 'hosts' / 'spec.yaml')
    with open(spread, 'w') as f:
        yaml.safe_dump(data, f, sort_keys=False)
    text = launch('plan', spread, '--from-run', run, '--link', '1gbit')
    assert text.returncode == 0, text.stderr
    assert re.search(r"load: your program's \d+ variables on the ps tasks, as run \S+ \(variables\.json\) placed them",
                     text.stdout), text.stdout
    assert re.search(r'predicted: one update takes [\d.]+ ms \(compute [\d.]+ ms, from run \S+ [\d,]+ images/s\)',
                     text.stdout), text.stdout


def test_a_lost_worker_then_a_lost_ps(tmp_path):
    """kill -9 of a worker: exactly that worker is started again while the chief trains on (its
    progress never stops; the same attempt). Later kill -9 of the ps: the ps and the chief are
    started again, and the chief resumes from the newest checkpoint. The run ends exit 0 at its
    last step, its evaluator's figures for it in events.jsonl and TensorBoard. (One run for both,
    to keep the suite short: the worker is back and training before the ps is lost.)"""
    spec = write_coordinator_spec(tmp_path, steps=500, checkpoint_steps=50, top=PACED)
    run = str(tmp_path / 'run')
    proc = launch_bg('up', spec)
    lines = until_step(proc, 80)
    os.kill(task_pid(run, 'worker:1'), 9)
    lines += until_step(proc, 250)
    log = events(run)
    assert [e['tasks'] for e in log if e['event'] == 'restart'] == [['worker:1']], log
    lost_at = next(i for i, e in enumerate(log) if e['event'] == 'task_lost')
    after = [e['step'] for e in log[lost_at:] if e['event'] == 'progress']
    assert len(after) >= 3 and after == sorted(after), after        # the chief trained on
    assert {e['attempt'] for e in log} == {1}, 'a lost worker changes no attempt'
    assert 'restored' not in ''.join(lines), 'the chief was not restarted for a worker'
    os.kill(task_pid(run, 'ps:0'), 9)
    out = ''.join(lines) + finish(proc)
    assert proc.returncode == 0, out
    assert re.search(r'restart 1/3: worker:1 was killed by SIGKILL; starting worker:1 again', out), out
    assert re.search(r'restart 2/3: ps:0 was killed by SIGKILL.*the chief resumes from its checkpoint; '
                     r'starting ps:0, chief:0 again', out), out
    log = check_finished(out, run, 500)
    # The checkpoints the first chief saved: its log is read to its end before it starts again, but
    # a save just before the ps went may be read after the ps's loss is recorded (CI saw 250 so).
    chief_again = [i for i, e in enumerate(log) if e['event'] == 'task_started' and e['task'] == 'chief:0'][1]
    saved_before = [e['step'] for e in log[:chief_again] if e['event'] == 'checkpoint']
    resumed = re.search(r'restored \S+model\.ckpt-(\d+): training goes on from global step (\d+)', out)
    assert resumed and int(resumed.group(1)) == int(resumed.group(2)) == saved_before[-1] >= 200, (saved_before, out)
    assert [r['tasks'] for r in log if r['event'] == 'restart'] == [['worker:1'], ['ps:0', 'chief:0']]
    started = sorted(e['task'] for e in log if e['event'] == 'task_started')
    assert started == ['chief:0', 'chief:0', 'evaluator:0', 'ps:0', 'ps:0', 'worker:0', 'worker:1', 'worker:1']
    # worker:1's log keeps both its starts; its channel, emptied as it started again, the second's records alone.
    attempt = os.path.join(run, 'logs', 'attempt-1', 'worker-1')
    served = [m for m in map(messages.read, open(attempt + '.log')) if isinstance(m, messages.Serving)]
    recorded = [messages.read(r) for r in open(attempt + messages.CHANNEL_SUFFIX)]
    assert len(served) == 2 and [m for m in recorded if isinstance(m, messages.Serving)] == served[1:], recorded


def test_a_coordinator_command_runs_with_tf_config_alone(tmp_path):
    """train.command on the chief: TF_CONFIG and nothing else (no TF1 flags); it prints no progress
    line of ours and is not taken for stalled; its checkpoints give the step a new `up` resumes from."""
    train_dir = tmp_path / 'run'
    spec = write_coordinator_spec(tmp_path, program=None, evaluator=None, steps=60,
                                  command=f'python {REPO}/tests/harness/pss_command.py --train_dir {train_dir} --steps 60',
                                  supervise={'stall_secs': 3})
    result = launch('up', spec, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert 'my own line: at 60' in out and 'stall' not in out, out
    log = events(str(train_dir))
    assert [e for e in log if e['event'] == 'restart'] == [] and log[-1]['result']['state'] == 'done'
    assert re.search(r'chief:0 started: \S+python\S* \S+pss_command\.py .* \(pid \d+\)', out), out
    assert 'chief:0 serving on' not in out and 'global step 60' in out, out     # from its checkpoints
    assert log[-1]['result']['global_step'] == 60
    again = launch('up', spec, '--set', 'train.command=python --version', timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [e['resumes_from'] for e in events(str(train_dir)) if e['event'] == 'run_started'] == [None, 60]


def test_a_broken_evaluator_spends_its_own_restarts_and_never_the_runs(tmp_path):
    """Issue 37 #4: an evaluator that raises at every checkpoint is started again on restarts of
    its own (here 1), then let go; the training, which never stopped, ends done with none of the
    run's restarts spent and no "training again"; the closing line and the report say plainly that
    no checkpoint was evaluated."""
    spec = write_coordinator_spec(tmp_path, evaluator='tests.harness.pss_programs:evaluate_broken', steps=200,
                                  checkpoint_steps=20, supervise={'max_restarts': 1}, top=PACED)
    run = str(tmp_path / 'run')
    result = launch('up', spec, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert re.search(r"evaluator restart 1/1 \(its own, not the run's\): evaluator:0 exited with code 1", out), out
    assert 'training again' not in out and 'restart 1/1:' not in out, out
    closing = [line for line in out.splitlines() if ' done in ' in line][-1]
    assert closing.endswith('; no checkpoint was evaluated: evaluator:0 reported no evaluation (its log says why)'), \
        closing
    log = events(run)
    assert log[-1]['result']['state'] == 'done' and log[-1]['result']['restarts'] == 0, log[-1]
    assert not [e for e in log if e['event'] == 'evaluation']
    launch('report', spec, '-o', str(tmp_path / 'report.html'))
    page = (tmp_path / 'report.html').read_text()
    assert 'No checkpoint was evaluated: evaluator:0 reported no evaluation' in page
    assert '<tr><td>restarts</td><td>0</td></tr>' in page, page[:3000]


def test_an_evaluator_beside_a_command_that_writes_no_model_ckpt_is_told_at_the_start(tmp_path):
    """Issue 37 #5: the chief's command keeps its checkpoints in a folder of its own (as Keras'
    BackupAndRestore does), so the evaluator has nothing to evaluate: the launcher says at the
    start what the evaluator waits for and where, the evaluator's log says it too, and the run
    ends saying that no such checkpoint was written, with no "raise --finish-timeout" hint."""
    train_dir = tmp_path / 'run'
    spec = write_coordinator_spec(tmp_path, program=None, evaluator='tests.harness.pss_programs:evaluate', steps=40,
                                  command=f'python {REPO}/tests/harness/pss_command.py --train_dir {train_dir}/backup --steps 40')
    result = launch('up', spec, '--finish-timeout', '3', timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    waits = (f'evaluator:0 evaluates the checkpoints named model.ckpt-<step> in {train_dir} (TensorFlow\'s '
             '`checkpoint` file there names the newest), and waits until the chief writes one')
    start = out.index('started 5 tasks')
    assert f'[launch]   note: {waits}: train.command must save' in out[:start], out
    assert f'I {waits}' in out, out
    assert 'raise --finish-timeout' not in out, out
    assert f'stopping them (no model.ckpt-<step> checkpoint is in {train_dir} for an evaluator to evaluate' in out, out
    closing = [line for line in out.splitlines() if ' done in ' in line][-1]
    assert closing.endswith(f'; no checkpoint was evaluated: {train_dir} holds no model.ckpt-<step> checkpoint, '
                            'which evaluator:0 waits for (docs/pss.md)'), closing


def test_a_coordinator_run_by_hand_ends_by_itself(tmp_path):
    """Every task started as `python -m cluster.task --job J --index I`, with no launcher: the
    chief trains and ends, the evaluator follows it to the last checkpoint, and the servers, which
    nothing stops here, end by themselves (exit 0) once the chief's port has stayed closed."""
    spec = write_coordinator_spec(tmp_path, steps=100, checkpoint_steps=50)
    names = [('chief', 0), ('ps', 0), ('worker', 0), ('worker', 1), ('evaluator', 0)]
    codes, outs = run_tasks([([sys.executable, '-m', 'cluster.task', '--spec', spec, '--job', job, '--index', str(i)],
                              None) for job, i in names], cwd=REPO, timeout=180)
    assert codes == [0] * 5, list(zip(codes, outs))
    assert 'step 100/100' in outs[0] and 'evaluation at global step 100' in outs[4]
    assert all('chief:0 has ended' in out for out in outs[1:4]), outs[1:4]


# -- the other backends ------------------------------------------------------------------------------

def test_a_coordinator_run_over_ssh(ssh_hosts, tmp_path):
    """The chief, the ps and the evaluator on one host (the evaluator reads the chief's checkpoints
    there), a worker on each; the example lies in each host's workdir, as a user's program would."""
    from tests.harness.ssh import assert_nothing_left, host_settings, run, workdir
    for address in ssh_hosts.addresses:
        os.makedirs(workdir(tmp_path, address) / 'examples')
        for name in ('__init__.py', 'pss_loop.py'):
            shutil.copy(os.path.join(REPO, 'examples', name), workdir(tmp_path, address) / 'examples')
    spec = write_coordinator_spec(tmp_path, program='examples.pss_loop:train', evaluator='examples.pss_loop:evaluate',
                                  host='127.0.0.2', worker_hosts=('127.0.0.2', '127.0.0.3'),
                                  hosts=host_settings(ssh_hosts, tmp_path), train_dir='run', steps=60,
                                  checkpoint_steps=30)
    result = run(ssh_hosts, tmp_path, 'up', spec, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    chief_run = str(workdir(tmp_path, '127.0.0.2') / 'run')
    assert 'step 60/60' in out and 'evaluation at global step 60' in out, out
    assert 0 <= eval_scalars(chief_run)[60]['eval/accuracy'] <= 1
    log = events(str(tmp_path / 'run'))
    assert any(e['event'] == 'evaluation' and e['step'] == 60 for e in log) and log[-1]['event'] == 'finished'
    assert_nothing_left(ssh_hosts)


def test_a_coordinator_run_under_slurm(tmp_path, slurm_cluster):
    """Slurm owns the tasks: the chief's rank ends the step once the chief has ended and the
    evaluator has evaluated the last checkpoint (launch/render/sbatch.py), so the job completes
    with the chief's exit code."""
    from tests.harness.slurm_jobs import _nothing_left, _port_base
    spec = write_coordinator_spec(tmp_path, program='examples.pss_loop:train', evaluator='examples.pss_loop:evaluate',
                                  steps=60, checkpoint_steps=30)
    env = {**os.environ, **slurm_cluster.env}
    result = launch('up', spec, '--backend', 'slurm', '--port-base', str(_port_base()), env=env, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    _nothing_left(slurm_cluster, tmp_path)
    assert re.search(r'\[launch\] +job \d+ completed', out) and 'step 60/60' in out, out
    log = events(str(tmp_path / 'run'))
    assert any(e['event'] == 'evaluation' and e['step'] == 60 for e in log), log
    assert any(e['event'] == 'progress' and e['step'] == 60 for e in log), log


def test_a_coordinator_run_in_compose(tmp_path, compose_project):
    """The image holds examples/, so the custom-loop example runs in containers as it is."""
    from tests.harness.dockerd import project_leftovers
    spec = write_coordinator_spec(tmp_path, program='examples.pss_loop:train', evaluator='examples.pss_loop:evaluate',
                                  steps=60, checkpoint_steps=30)
    project = compose_project(spec)
    result = launch('up', spec, '--backend', 'compose', timeout=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    check_finished(out, str(tmp_path / 'run'), 60, metric='accuracy')     # written in the containers
    assert 'chief:0 started: the program examples.pss_loop:train' in out and not project_leftovers(project)

