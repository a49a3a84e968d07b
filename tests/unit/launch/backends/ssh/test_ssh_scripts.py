"""The SSH backend's remote scripts as text (launch/backends/ssh/scripts.py) and the /proc stat
parser both backends share: no host, no process, each script read back with shlex as a POSIX
shell would split it."""
from __future__ import annotations

import shlex

import pytest

from launch.backends.procstat import start_time, stat_fields
from launch.backends.ssh import RemoteState
from launch.backends.ssh.scripts import (SNAPSHOT_END, Started, TaskFiles, TaskProcess, Watched, end_earlier_copy,
                                         lease_script, ours, parse_snapshot, parse_started, prepare_script,
                                         remote_dir, shell_path, snapshot_script, start_script, stop_script,
                                         task_command, undo_start_script, workdir_script,
                                         env_file_text)

# Every character a shell treats specially, and a line break.
HOSTILE = 'a b  "double" \'single\' $HOME ${PATH} `id` $(id) \\ ; & | * ? ~ \t tab\nnewline é'
HOSTILE_DIR = "/srv/it's a dir; rm -rf ~/$(id)"


def test_a_task_command_reads_its_environment_from_a_file_and_keeps_every_argument_one_word():
    """No value of the environment is on the command line (`ps` shows it to every user of the
    host): the subshell opens the file, removes it, reads it and execs the task."""
    env_file = HOSTILE_DIR + '/run/logs/ps-0.env'
    command = task_command(['/opt/py', '-m', 'cluster.task', '--spec', HOSTILE_DIR + '/spec.yaml'], env_file)
    assert shlex.split(command) == ['(exec', '4<', env_file, '&&', 'rm', '-f', env_file, '&&', '.', '/dev/fd/4', '&&',
                                    'exec', '4<&-', '&&', 'exec', '/opt/py', '-m', 'cluster.task', '--spec',
                                    HOSTILE_DIR + '/spec.yaml)']
    assert task_command(['python3', 'x y']) == "python3 'x y'"      # no file without an environment


def test_an_env_file_keeps_every_value_one_word():
    text = env_file_text({'X': HOSTILE, 'EMPTY': '', 'N': '4'})
    assert shlex.split(text) == ['export', f'X={HOSTILE}', 'export', 'EMPTY=', 'export', 'N=4']
    assert HOSTILE not in text.replace(shlex.quote(HOSTILE), '')       # never unquoted
    assert TaskFiles.beside('/w/run/logs/worker-1.log').envfile == '/w/run/logs/worker-1.env'


def test_a_home_relative_path_still_expands_home_and_nothing_else():
    assert shell_path('~/venv/bin/python') == '"$HOME"/venv/bin/python'
    assert shell_path("~/it's $(id)") == '"$HOME"/\'it\'"\'"\'s $(id)\''
    assert shell_path(HOSTILE_DIR) == shlex.quote(HOSTILE_DIR)
    assert [remote_dir(p) for p in ('~', '~/', '~/w', '/abs', 'rel')] == ['.', '.', 'w', '/abs', 'rel']
    assert shlex.split(workdir_script('~/w d')) == ['cd', 'w d', '&&', 'pwd']


def test_a_task_s_files_are_beside_its_log():
    assert TaskFiles.beside('/w/run/logs/worker-1.log') == TaskFiles(
        '/w/run/logs/worker-1.pid', '/w/run/logs/worker-1.rc', '/w/run/logs/worker-1.task')
    assert TaskFiles.beside('/w/out').pidfile == '/w/out.pid'


def test_a_start_script_quotes_the_hostile_workdir_everywhere():
    link = HOSTILE_DIR + '/run/logs/ps-0.log'
    log_file = HOSTILE_DIR + '/run/logs/attempt-1/ps-0.log'
    script = start_script('sleep 300', HOSTILE_DIR, link, log_file, HOSTILE_DIR + '/run/logs/attempt-0', None)
    lines = script.splitlines()
    files = TaskFiles.beside(link)
    assert lines[0] == f'cd {shlex.quote(HOSTILE_DIR)} || exit 1'
    assert lines[1] == ':'                                   # no earlier copy to end
    assert f'echo $p > {shlex.quote(files.pidfile)}' in lines
    assert f'rm -f {shlex.quote(files.rcfile)} {shlex.quote(files.pidfile)} {shlex.quote(files.taskfile)}' in lines
    assert f'ln -sfn attempt-1/ps-0.log {shlex.quote(link)}' in lines
    for line in lines:
        shlex.split(line)                                    # every quote closed on its own line
    assert HOSTILE_DIR not in script.replace(shlex.quote(HOSTILE_DIR), '')    # never unquoted
    setsid = next(x for x in lines if x.startswith('setsid nohup sh -c '))
    words = shlex.split(setsid)
    assert words[:4] == ['setsid', 'nohup', 'sh', '-c'] and words[5:8] == ['>>', log_file, '2>&1']
    assert 'sleep 300 2>&3' in words[4] and f'echo $r > {shlex.quote(files.rcfile)}' in words[4]   # one word
    assert lines[-1] == 'echo "tfcluster-started $o $p ${ps_:--} $t ${ts_:--}"'


def test_a_restart_first_ends_the_earlier_copy_while_it_is_still_ours():
    earlier = TaskProcess(pid=101, ident='', group=100, group_ident='55')
    assert ours(earlier) == ('if [ "$(sed \'s/.*) //\' /proc/101/stat 2>/dev/null | cut -d\' \' -f20)" = - ] || '
                             '[ "$(sed \'s/.*) //\' /proc/100/stat 2>/dev/null | cut -d\' \' -f20)" = 55 ]; '
                             'then echo 100; fi')
    assert end_earlier_copy(earlier).startswith(f'k=$({ours(earlier)}); if [ -n "$k" ]; then kill -KILL -$k')
    assert start_script('x', '/w', '/w/a.log', '/w/b/a.log', '/w/old', earlier).splitlines()[1] == \
        end_earlier_copy(earlier)
    assert end_earlier_copy(None) == ':'


def test_a_start_s_answer_is_read_from_its_last_started_line():
    out = 'noise\ntfcluster-started 1 2 3 4 5\nmore\ntfcluster-started 10 100 - 101 66\n'
    assert parse_started(out) == Started(10, TaskProcess(pid=101, ident='66', group=100, group_ident=''))
    assert parse_started('tfcluster-started 0 100 - 100 -') == Started(0, TaskProcess(100, '', 100, ''))
    assert parse_started('') is None
    assert parse_started('tfcluster-started 1 x 2 3 4') is None
    assert parse_started('tfcluster-started 1 2') is None


def test_undo_stops_only_a_group_led_by_this_task_s_wrapper():
    script = undo_start_script(TaskFiles.beside(HOSTILE_DIR + '/ps-0.log'))
    assert script.startswith(f'p=$(cat {shlex.quote(HOSTILE_DIR + "/ps-0.pid")} 2>/dev/null) || exit 0; ')
    assert f'grep -qF {shlex.quote(HOSTILE_DIR + "/ps-0.rc")} || exit 0' in script
    assert script.index('kill -TERM -$p') < script.index('echo stopped') < script.index('kill -KILL -$p')


def test_a_snapshot_asks_for_every_task_and_a_cut_short_answer_is_none():
    script = snapshot_script([Watched("ps:0 'x'", 12, HOSTILE_DIR + '/ps-0.rc', 11), Watched('worker:0', 20, '', 20)])
    lines = script.splitlines()
    assert len(lines) == 3 and lines[-1] == f'echo {SNAPSHOT_END}'
    assert f'r=$(cat {shlex.quote(HOSTILE_DIR + "/ps-0.rc")} 2>/dev/null)' in lines[0]
    assert lines[0].startswith('s=$(cat /proc/12/stat 2>/dev/null); w=$(cat /proc/11/stat 2>/dev/null); r=$(cat ')
    # the rc file last: a wrapper seen gone wrote it before it went
    assert shlex.split(lines[0])[-4:] == ["ps:0 'x'", '$r', '$s', '$w']
    assert 'r=$(cat /dev/null 2>/dev/null)' in lines[1]          # a record without an rc file
    stat = '12 (a | b) S 1 2'
    answer = f'ps:0|143||\nworker:0||{stat}|w\n{SNAPSHOT_END}\n'
    seen = parse_snapshot(answer)
    assert seen['ps:0'] == ('143', '', '') and seen['worker:0'].rc == ''
    assert seen['worker:0'].stat + '|' + seen['worker:0'].wrapper == f'{stat}|w'
    assert parse_snapshot(answer.replace(SNAPSHOT_END, '')) is None
    assert parse_snapshot('') is None


@pytest.mark.parametrize('grace, rounds', [(5.0, 50), (0.01, 1), (0.25, 2)])
def test_a_stop_terms_every_group_then_kills_after_the_grace(grace, rounds):
    script = stop_script([TaskProcess(5, '7', 4, '6'), TaskProcess(9, '', 9, '8')], grace)
    lines = script.splitlines()
    assert lines[0] == "k=''"
    assert lines[1] == f'g=$({ours(TaskProcess(5, "7", 4, "6"))}); [ -n "$g" ] && k="$k $g"'
    assert f'wait_gone {rounds} && exit 0' in lines
    assert lines.index('for p in $k; do kill -TERM -$p 2>/dev/null; kill -CONT -$p 2>/dev/null; done') < \
        lines.index('for p in $k; do kill -KILL -$p 2>/dev/null; done')


def test_leases_are_touched_or_written_whole_with_their_text_quoted():
    paths = {HOSTILE_DIR + '/b.lease', '/a/a.lease'}
    assert lease_script(set()) == 'true' and lease_script(set(), 'x') == 'true'
    touch = lease_script(paths)
    assert touch.split('; ')[:2] == ['mkdir -p /a', 'touch /a/a.lease']            # sorted
    assert f'touch {shlex.quote(HOSTILE_DIR + "/b.lease")}' in touch
    write = lease_script(['/w/a.lease'], HOSTILE)
    assert shlex.split(write) == ['mkdir', '-p', '/w', '&&', 'printf', '%s', HOSTILE, '>', '/w/a.lease.new',
                                  '&&', 'mv', '-f', '/w/a.lease.new', '/w/a.lease']


def test_prepare_makes_the_workdir_and_its_folders():
    assert shlex.split(prepare_script('~/w d', ['run/logs', '', 'it s'])) == [
        'mkdir', '-p', 'w d', '&&', 'cd', 'w d', '&&', 'mkdir', '-p', 'run/logs', 'it s', '.', '&&', 'pwd']


def test_a_stat_line_is_parsed_once_whatever_the_command_name():
    line = '4242 (tf (x) ) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 4 0 987654 1000 10\n'
    fields = stat_fields(line)
    assert fields[0] == 'S' and fields[11:13] == ['7', '3'] and start_time(fields) == '987654'
    assert start_time(stat_fields(line.replace(') S ', ') Z '))) is None        # a zombie is no process
    assert stat_fields('') == [] and start_time([]) is None and start_time(['R', '1']) is None


def test_remote_states_keep_their_words():
    assert [s.value for s in RemoteState] == ['running', 'ended', 'gone']
    assert RemoteState.ENDED == 'ended' and isinstance(RemoteState.GONE, str)
