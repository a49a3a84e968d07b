"""The user's own training code: `train.program` (a function called in every worker with a typed
context) and `train.command` (a TF1 script run unchanged with TF_CONFIG and the classic flags).

The checks and the supervisor's rules are plain functions, tested here in milliseconds; three real
clusters run the two examples and a command whose worker fails."""
from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from cluster.runtime import rundir
from tests.conftest import launch, run_by_hand, write_spec
from tests.harness.parts import GRPC_STANDIN
from tests.harness.training import summaries_in


# ---------------------------------------------------------------------------------------------
# Real clusters

def _checkpoint_values(train_dir) -> dict:
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(train_dir))
    return {name: float(reader.get_tensor(name)) for name in ('w', 'b', 'global_step')}


@pytest.mark.slow
def test_a_program_trains_and_the_launcher_keeps_its_part(tmp_path):
    """The example program learns y = 3x + 2; the launcher ends the ps tasks (done protocol),
    the chief checkpoints, and a second run resumes from that checkpoint."""
    spec = write_spec(tmp_path, program='examples.linear_program:train', sync=False, steps=150, batch_size=32,
                      learning_rate=0.1)
    result = launch('up', spec)          # from REPO: the tasks find `examples` there
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert 'ps:0 finished' in out and 'step ' in out and 'learned w=' in out
    values = _checkpoint_values(tmp_path / 'run')
    assert abs(values['w'] - 3) < 0.2 and abs(values['b'] - 2) < 0.2 and values['global_step'] >= 150, values
    # Every worker's figures are written (worker 1 may have had no step left: the model is tiny).
    assert json.loads((tmp_path / 'run' / 'worker-1.json').read_text())['global_step'] >= 150

    # Resumed as the launcher restarts a cluster: the chief notes the cause for TensorBoard.
    cause = 'restart 1/3: ps:0 was killed by SIGKILL'
    more = launch('up', spec, '--set', 'train.steps=250', env={**os.environ, rundir.RESTART_ENV: cause})
    assert more.returncode == 0, more.stdout + more.stderr
    assert f'session ready at global step {int(values["global_step"])}' in more.stdout, more.stdout
    assert _checkpoint_values(tmp_path / 'run')['global_step'] >= 250
    # The chief notes it at the global step it saw once ready (async: worker 1 may have stepped on).
    ready = re.search(r'^\[worker:0\].*session ready at global step (\d+)', more.stdout, re.M)
    assert ready and int(ready.group(1)) >= int(values['global_step']), more.stdout
    assert summaries_in(str(tmp_path / 'run'))['restarts'] == [(int(ready.group(1)), cause)]


@pytest.mark.slow
def test_a_tf1_script_runs_unchanged_and_its_ps_is_stopped(tmp_path):
    train_dir = tmp_path / 'ckpt'
    spec = write_spec(tmp_path, command=f'python examples/tf1_distributed.py --steps 150 --train_dir {train_dir}')
    result = launch('up', spec)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert '--job_name ps --task_index 0' in out and 'every worker is done; stopping ps:0' in out
    values = _checkpoint_values(train_dir)
    assert abs(values['w'] - 3) < 0.2 and abs(values['b'] - 2) < 0.2, values


FAILING = GRPC_STANDIN + '''\
time.sleep(2)
print('worker', a.task_index, 'giving up', flush=True)
sys.exit(3 if a.task_index == '1' else 0)
'''


@pytest.mark.slow
def test_a_failing_worker_command_is_the_runs_exit_code(tmp_path):
    """A user command's worker that exits 3 ends the run with 3, and nothing is left running
    (the ps, which would serve for ever, included)."""
    (tmp_path / 'job.py').write_text(FAILING)
    spec = write_spec(tmp_path, command=['python', str(tmp_path / 'job.py')])
    result = launch('up', spec, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 3, out
    assert 'worker:1' in out and 'exited with code 3' in out, out
    assert yaml.safe_load(open(spec))['train']['command'][0] == 'python'
    assert not os.path.exists(tmp_path / 'run' / 'launch-state.json')


@pytest.mark.slow
def test_a_tf1_script_run_by_hand_ends_its_ps_by_itself(tmp_path):
    """No launcher to stop the script's ps (three shells, Slurm, TFJob): the ps task stops the
    command once every worker it saw has gone, and all three exit 0."""
    spec = write_spec(tmp_path, command='python examples/tf1_distributed.py --steps 60')
    env = {k: v for k, v in os.environ.items() if not k.startswith('TFCLUSTER_')}
    codes, outs = run_by_hand(spec, env)
    assert codes == [0, 0, 0], outs
    assert 'every worker has finished; stopping' in outs[0], outs[0]

