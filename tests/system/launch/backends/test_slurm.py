"""The Slurm backend: the layout rules and the batch script as pure functions (tables, no Slurm),
then a few runs against a real single-node Slurm (tests/harness/slurm.py): a job that trains to the end,
one cancelled with scancel, one stopped with Ctrl-C; and `--backend slurm` where no Slurm is."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from cluster.spec import load_spec
from launch.render import sbatch as slurm
from launch.records.events import read_events
from tests.conftest import REPO, TASK_ENV, environment_words, launch, launch_bg, read_until, write_spec
from tests.harness.slurm_jobs import _nothing_left, _port_base, _render, _sbatch_options


@pytest.mark.slow
def test_task_outside_srun_exits_2_with_one_line(tmp_path):
    spec = write_spec(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith('SLURM')}
    out = subprocess.run([sys.executable, '-m', 'cluster.task', '--spec', spec, '--slurm'], cwd=REPO,
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2, out
    assert out.stderr.count('\n') == 1 and 'not inside an srun job step' in out.stderr
    bad = subprocess.run([sys.executable, '-m', 'cluster.task', '--spec', spec, '--slurm', '--job', 'ps',
                          '--index', '0'], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and 'drop --job and --index' in bad.stderr


@pytest.mark.slow
def test_script_asks_for_every_task_and_runs_them_with_one_srun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(tmp_path, ps=2, workers=3, train_dir='relative/run')
    script = _render(spec, partition='gpu', time_limit='1:30:00', port_base=7000)
    assert script.startswith('#!/bin/bash\n')
    assert _sbatch_options(script) == ['--job-name=spec', '--ntasks=5', '--output=/dev/null', f'--chdir={tmp_path}',
                                       '--partition=gpu', '--time=1:30:00']
    train_dir = str(tmp_path / 'relative' / 'run')
    assert f'train_dir={train_dir}\n' in script
    assert 'exec >>"$train_dir/logs/slurm-$SLURM_JOB_ID.out" 2>&1' in script
    srun = script[script.index('\nsrun '):].replace('\\\n', ' ')
    assert '--ntasks=5' in srun and '--kill-on-bad-exit=1' in srun and '--distribution=block' in srun
    assert 'tfcluster-task 2 "$train_dir/logs/attempt-$attempt"' in srun      # logs/<task>.log leads there
    assert re.search(r' -m cluster\.task --spec "\$train_dir/spec\.yaml" --slurm --port-base 7000\s*$', srun)
    assert subprocess.run(['bash', '-n'], input=script, text=True).returncode == 0


@pytest.mark.parametrize('rank, log, term', [(0, 'ps-0.log', 'SIG_IGN'), (1, 'worker-0.log', 'SIG_DFL'),
                                             (2, 'worker-1.log', 'SIG_DFL')])
@pytest.mark.slow
def test_each_rank_logs_under_its_task_name_and_only_ps_ignores_sigterm(tmp_path, rank, log, term):
    """The wrapper srun runs on every rank: the ps tasks outlive scancel's SIGTERM, so the chief
    can still save its checkpoint."""
    probe = 'import signal, sys; print(signal.Handlers(signal.getsignal(signal.SIGTERM)).name, sys.argv[1:])'
    subprocess.run(['bash', '-c', slurm.RANK_WRAPPER, 'tfcluster-task', '1', str(tmp_path),
                    sys.executable, '-c', probe, 'an arg'], env={**os.environ, 'SLURM_PROCID': str(rank)}, check=True)
    assert os.listdir(tmp_path) == [log]
    assert (tmp_path / log).read_text() == f"{term} ['an arg']\n"


@pytest.mark.parametrize('argv, words', [
    (['render', '--format', 'sbatch', '--partition', 'a b'], "--partition 'a b': expected letters"),
    (['render', '--format', 'sbatch', '--time-limit', '1:00\n#SBATCH --x'], '--time-limit'),
    (['render', '--format', 'sbatch', '--port-base', '65534'], '--port-base 65534'),
    (['status', '--backend', 'slurm'], 'launch status --backend slurm is not supported'),
    (['plan', '--backend', 'slurm'], '--format sbatch` shows what the job runs'),
    (['up', '--partition', 'gpu'], '--partition is for Slurm jobs: add --backend slurm'),
    (['down', '--backend', 'slurm'], '`scancel --name spec` stops it'),
])
@pytest.mark.slow
def test_bad_slurm_options_are_one_line(tmp_path, argv, words):
    out = launch(argv[0], write_spec(tmp_path), *argv[1:])
    assert out.returncode == 2 and out.stderr.count('\n') == 1 and words in out.stderr, out
    assert not os.path.exists(tmp_path / 'run')


@pytest.mark.slow
def test_no_slurm_on_the_machine_is_one_line_and_nothing_written(tmp_path):
    empty = tmp_path / 'bin'
    empty.mkdir()
    out = launch('up', write_spec(tmp_path), '--backend', 'slurm', env={**os.environ, 'PATH': str(empty)})
    assert out.returncode == 2, out
    assert out.stderr.count('\n') == 1 and '`sbatch` not found on PATH' in out.stderr and 'slurm-client' in out.stderr
    assert out.stdout == '' and not os.path.exists(tmp_path / 'run')


def _up(tmp_path, slurm_cluster, steps: int, top: dict | None = None):
    spec = write_spec(tmp_path, ps=1, workers=2, steps=steps, batch_size=16, top=top)
    env = {**os.environ, **slurm_cluster.env}
    args = ('up', spec, '--backend', 'slurm', '--port-base', str(_port_base()))
    return spec, args, env


def _job_of(lines: list[str]) -> str:
    return next(re.search(r'submitted job (\d+)', line).group(1) for line in lines if 'submitted job' in line)


@pytest.mark.slow
def test_job_trains_to_the_end(tmp_path, slurm_cluster):
    """... with the spec's env: in every task, as the batch script exports it."""
    spec, args, env = _up(tmp_path, slurm_cluster, steps=30, top=TASK_ENV)
    out = launch(*args, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    _nothing_left(slurm_cluster, tmp_path)
    lines = out.stdout.splitlines()
    for task, job in (('ps:0', 'ps'), ('worker:1', 'worker')):
        said = next(x for x in lines if f'{task}: environment:' in x)
        assert all(w in said.split(' environment: ')[1] for w in environment_words(job)), said
    assert any(line.startswith('[worker:0] ') and ' step 30/30 ' in line for line in lines), out.stdout
    assert any(line.startswith('[ps:0]     ') and 'ps:0 finished' in line for line in lines), out.stdout
    assert re.search(r'\[launch\] +job \d+ completed in [\d.]+s: global step 30,', out.stdout), out.stdout
    run = tmp_path / 'run'
    assert (run / 'model.ckpt-30.index').exists()
    assert sorted(os.listdir(run / 'logs')) == sorted(['attempt-1', 'ps-0.log', 'worker-0.log', 'worker-1.log',
                                                      f'slurm-{_job_of(lines)}.out'])
    assert os.path.realpath(run / 'logs' / 'worker-0.log') == str(run / 'logs' / 'attempt-1' / 'worker-0.log')
    # The same events as any backend, from what the job's logs say.
    events = read_events(str(run / 'events.jsonl'))
    kinds = [e['event'] for e in events]
    assert kinds[0] == 'run_started' and kinds[-1] == 'finished', kinds
    assert {e['task'] for e in events if e['event'] == 'task_started'} == {'ps:0', 'worker:0', 'worker:1'}
    assert {e['task'] for e in events if e['event'] == 'serving'} == {'ps:0', 'worker:0', 'worker:1'}
    assert 'first_step' in kinds and 'progress' in kinds
    assert events[-1]['result']['state'] == 'done' and events[-1]['result']['global_step'] == 30
    again = launch(*args, '--set', 'train.steps=40', env=env, timeout=300)     # a resume: attempt 2
    assert again.returncode == 0, again.stdout + again.stderr
    assert (run / 'logs' / 'attempt-1' / 'worker-0.log').read_text().count(' step 30/30 ') >= 1
    assert ' step 40/40 ' in (run / 'logs' / 'worker-0.log').read_text()
    placed = load_spec(str(run / 'spec.yaml'))      # what the tasks read: the same counts, absolute paths
    assert (placed.num_ps, placed.num_workers, placed.train.train_dir) == (1, 2, str(run))


@pytest.mark.slow
def test_a_failing_task_ends_the_job(tmp_path, slurm_cluster):
    """ps:0 cannot serve (its port is taken): srun ends the whole step, so the workers, which
    would wait for it for ever, go too, and the launcher says which task failed."""
    spec, args, env = _up(tmp_path, slurm_cluster, steps=30)
    with socket.socket() as holder:
        holder.bind(('', int(args[-1])))
        holder.listen()
        out = launch(*args, env=env, timeout=300)
    assert out.returncode not in (0, 2), out.stdout + out.stderr     # srun's: the highest of its tasks'
    assert re.search(r'\[ps:0\] +cluster\.task: error: ps:0: port \d+ is already in use', out.stdout), out.stdout
    assert re.search(r'\[slurm\] +srun: error: \S+: task 0 \(ps:0\): Exited with exit code 2', out.stdout), out.stdout
    assert re.search(r'error: job \d+ ended FAILED, exit code \d+:0; the first task to fail: ps:0 \(Exited with exit '
                     r'code 2\); no checkpoint was written', out.stdout), out.stdout
    _nothing_left(slurm_cluster, tmp_path)


def _mid_run(tmp_path, slurm_cluster, act):
    """Start a long job, call act(proc, job) once the chief's first progress line is out (it has
    trained a step, so a stop makes it save), and read the rest; (the launcher, the lines up to
    that step, the rest of its output, the job id)."""
    spec, args, env = _up(tmp_path, slurm_cluster, steps=100000)
    proc = launch_bg(*args, env=env)
    try:
        lines = read_until(proc, '  loss ', timeout=180)    # not ' step ': "session ready at global step 0"
        job = _job_of(lines)
        act(proc, job)
        rest, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc, lines, rest, job


@pytest.mark.slow
def test_scancel_mid_run_leaves_nothing(tmp_path, slurm_cluster):
    def scancel(proc, job):
        assert slurm_cluster.run('scancel', job).returncode == 0
    proc, lines, rest, job = _mid_run(tmp_path, slurm_cluster, scancel)
    assert proc.returncode not in (0, None), ''.join(lines) + rest
    assert f'job {job} ended CANCELLED' in rest and 'cancelled outside this launcher' in rest, rest
    _nothing_left(slurm_cluster, tmp_path)


@pytest.mark.slow
def test_ctrl_c_cancels_the_job_and_leaves_nothing(tmp_path, slurm_cluster):
    proc, lines, rest, job = _mid_run(tmp_path, slurm_cluster, lambda proc, job: proc.send_signal(signal.SIGINT))
    assert proc.returncode == 128 + signal.SIGINT, ''.join(lines) + rest
    assert f'SIGINT received: cancelling job {job}' in rest, rest
    assert f'job {job} cancelled; it has left the queue' in rest, rest
    assert 'SIGTERM received: saved a checkpoint' in rest, rest       # the chief saved on the way out
    _nothing_left(slurm_cluster, tmp_path)


@pytest.mark.slow
def test_ctrl_c_while_the_job_waits_in_the_queue(tmp_path, slurm_cluster):
    """A job that never started (its partition is down) is cancelled as plainly."""
    assert slurm_cluster.run('scontrol', 'update', 'PartitionName=test', 'State=DOWN').returncode == 0
    try:
        spec, args, env = _up(tmp_path, slurm_cluster, steps=30)
        proc = launch_bg(*args, env=env)
        try:
            lines = read_until(proc, 'is pending (PartitionDown)', timeout=60)
            proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
    finally:
        slurm_cluster.run('scontrol', 'update', 'PartitionName=test', 'State=UP')
    job = _job_of(lines)
    assert proc.returncode == 128 + signal.SIGINT, ''.join(lines) + rest
    assert f'cancelling job {job}, which has not started' in rest and f'job {job} cancelled' in rest, rest
    _nothing_left(slurm_cluster, tmp_path)


@pytest.mark.slow
def test_a_tf1_command_job_ends_once_its_workers_have(tmp_path, slurm_cluster):
    """A `train.command` job: the script's ps would `server.join()` for ever; each ps task stops
    it once the workers are gone, so the job completes, exit 0, and nothing is left."""
    spec = write_spec(tmp_path, ps=1, workers=2, command='python examples/tf1_distributed.py --steps 60')
    env = {**os.environ, **slurm_cluster.env}
    out = launch('up', spec, '--backend', 'slurm', '--port-base', str(_port_base()), env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    _nothing_left(slurm_cluster, tmp_path)
    assert 'every worker has finished; stopping' in out.stdout and re.search(r'step 6\d/60', out.stdout), out.stdout
