"""`launch preempt RUN TASK` refuses in one line, exit 2, sending nothing: a task name that is no
task, a spec whose preemption_grace is 0 (the SIGTERM would be a fault), and a run with no live
launcher. In this process: no task is started."""
from __future__ import annotations

import pytest

from tests.conftest import write_spec
from tests.harness.documented import strip_prefix


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    from launch.cli import main
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize('task, overrides, words', [
    ('ps0', (), "launch preempt: 'ps0' is not a task (job:index, e.g. ps:0)"),
    ('ps:0', ('--set', 'supervise.preemption_grace=0'), 'supervise.preemption_grace is 0, so a SIGTERM from outside '
                                                        'the launcher is a fault, not a notice'),
    ('ps:0', (), 'no run of it is running (no live launcher in '),
])
def test_a_preempt_that_cannot_be_sent_is_one_line(tmp_path, capsys, task, overrides, words):
    spec = write_spec(tmp_path)
    code, out, err = _main(capsys, 'preempt', spec, task, *overrides)
    assert code == 2 and out == '' and len(err.splitlines()) == 1, (code, out, err)
    assert words in strip_prefix(err), err
