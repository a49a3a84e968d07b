"""A host's start script (launch/backends/ssh/starting.py, scripts.py): each task's part in a subshell
of its own after a line naming it, env files from quoted here-documents, scripts kept under the
size a remote shell takes."""
from __future__ import annotations

from launch.backends.ssh import starting
from launch.backends.ssh.scripts import (TASK_MARK, TaskFiles, host_script, parse_host_script, parse_started,
                                         write_env_file)


def test_the_answer_is_split_task_by_task_and_a_task_without_a_turn_is_missing():
    out = (f'{TASK_MARK} ps:0\ntfcluster-started 0 10 1 11 2\n{TASK_MARK} worker:0\nsh: 1: cd: can\'t cd\n')
    answers = parse_host_script(out)
    assert set(answers) == {'ps:0', 'worker:0'}
    assert parse_started(answers['ps:0']).process.pid == 11
    assert parse_started(answers['worker:0']) is None and 'cd' in answers['worker:0']


def test_each_part_is_a_subshell_after_its_mark():
    script = host_script([('ps:0', 'exit 1'), ('worker:0', 'echo x')])
    lines = script.splitlines()
    assert lines[0] == f"echo '{TASK_MARK} ps:0'" and lines[1] == '(' and lines[3] == ') 2>&1'
    assert lines[4] == f"echo '{TASK_MARK} worker:0'"


def test_the_env_here_document_is_quoted_and_ends_on_a_line_the_text_lacks():
    text = "export X='a $HOME `id`'\nexport Y='\nTFCLUSTER_ENV_END\n'\n"
    script = write_env_file(text, '/w/run/logs/ps-0.env')
    assert "<<'TFCLUSTER_ENV_END_'" in script       # the text holds the plain marker as a line
    assert script.startswith('(umask 077 && cat > /w/run/logs/ps-0.env.tmp')
    assert text in script and script.endswith('mv /w/run/logs/ps-0.env.tmp /w/run/logs/ps-0.env || exit 1')


def _part(name: str, size: int) -> starting._Part:
    files = TaskFiles.beside(f'/w/{name}.log')
    return starting._Part(plan=None, workdir='/w', log_file=f'/w/{name}.log', files=files,    # type: ignore[arg-type]
                          env_text='x' * size, start='true')


def test_a_host_s_tasks_go_in_scripts_under_the_size_limit_in_order():
    parts = [_part(f't{i}', 30_000) for i in range(7)]
    batches = list(starting._batches(parts))
    assert [p for b in batches for p in b] == parts
    assert all(sum(len(p.text) for p in b) <= starting.SCRIPT_BYTES for b in batches)
    assert len(batches) == 3
    alone = list(starting._batches([_part('big', 200_000), _part('small', 10)]))
    assert [len(b) for b in alone] == [1, 1]        # an oversized part goes alone (its env then by SFTP)
