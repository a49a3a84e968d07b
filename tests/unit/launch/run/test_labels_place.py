"""Host labels with a backend that cannot place by them (launch/run/launching.py
check_labels_place): `launch plan`, `up` and `compose` refuse them in one line, exit 2, rather than
run the host's tasks on the host by its name; `--backend ray` takes them, and a host with labels
that no task runs on is no one's business."""
from __future__ import annotations

import pytest

from tests.harness.documented import check_documented, strip_prefix

SPEC = """\
cluster:
  ps: [localhost:2222]
  worker: [localhost:2223, gpu:2224]
hosts:
  gpu:
    labels: {zone: b}
train: {steps: 5, train_dir: %s}
"""


def _spec(tmp_path) -> str:
    path = tmp_path / 'spec.yaml'
    path.write_text(SPEC % (tmp_path / 'run'))
    return str(path)


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    from launch.cli import main
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize('argv, given', [
    (['plan'], 'without --backend'),
    (['plan', '--backend', 'ssh'], 'with --backend ssh'),
    (['up', '--backend', 'slurm'], 'with --backend slurm'),
    (['plan', '--backend', 'compose'], 'with --backend compose'),
    (['up', '--backend', 'ssh'], 'with --backend ssh'),
    (['up'], 'without --backend'),
    (['compose', '-o', 'compose.yaml'], 'in a compose file'),
])
def test_another_backend_refuses_host_labels_in_one_line(tmp_path, capsys, argv, given):
    spec = _spec(tmp_path)
    code, out, err = _main(capsys, argv[0], spec, *argv[1:])
    assert code == 2 and out == '' and len(err.splitlines()) == 1, (code, out, err)
    line = strip_prefix(err.rstrip('\n'))
    assert line == (f'{spec}:6: hosts.gpu.labels: node labels place tasks with --backend ray only; {given}, '
                    'worker:1 would run on gpu itself: use --backend ray, or drop them '
                    '(--set hosts.gpu.labels=null)'), line
    check_documented('labels-need-ray', line)
    assert not (tmp_path / 'run').exists() and not (tmp_path / 'compose.yaml').exists()


def test_the_ray_plan_takes_them_and_says_where(tmp_path, capsys):
    code, out, err = _main(capsys, 'plan', _spec(tmp_path), '--backend', 'ray')
    assert code == 0, err
    assert 'ray actor on a node labelled zone=b' in out, out


def test_labels_dropped_with_set_plan_as_before(tmp_path, capsys):
    code, out, err = _main(capsys, 'plan', _spec(tmp_path), '--set', 'hosts.gpu.labels=null')
    assert code == 0, err


def test_labels_on_a_host_no_task_runs_on_are_not_refused(tmp_path, capsys):
    spec = _spec(tmp_path)
    code, out, err = _main(capsys, 'plan', spec, '--set', 'cluster.worker=[localhost:2223, localhost:2224]')
    assert code == 0, err
