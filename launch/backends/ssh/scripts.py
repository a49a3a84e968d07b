"""The POSIX sh scripts the SSH backend runs on a host, and the parsers of their answers: pure
text, every value quoted with `shlex.quote` (Fabric's `env=` does not quote), no connection.

Remote layout, for a task whose plan says cwd W, spec S and log L (relative paths are below W,
and W itself, when relative, is below the remote user's home):

    W/S                      the effective spec, uploaded by the backend's `prepare` (SFTP, then a rename)
    W/L                      the task's stdout and stderr
    W/L minus .log + .pid    the pid of the task's session leader (the wrapper below)
    W/L minus .log + .task   the pid of the task itself, written by the wrapper as it starts it
    W/L minus .log + .rc     its exit code, written by the wrapper when the task ends
    W/L minus .log + .env    the task's environment (mode 0600, over SFTP), removed as the task starts
    W/L's dir/attempt-N/ + L's name minus .log + .records   the task's channel (cluster/runtime/messages.py),
                             beside its attempt's log, removed as each start of the task begins

A task runs as `setsid nohup sh -c 'trap : TERM; (. ENV; exec python -m cluster.task ...) & wait ...; echo $r > RC'`
in its own session, so one `kill -TERM -PID` reaches its whole process group, and the wrapper
survives the SIGTERM long enough to write the exit code. The environment comes from a file, never
the command line: a value on it could be read by every user of the host (`ps`) as long as the
wrapper runs. A pid counts as the task's only while its
start time (read on the host with sed and cut: the host may lack Python packages) is the recorded one.
"""
from __future__ import annotations

import posixpath
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from cluster.runtime.messages import channel_beside
from launch.backends.probes import HOST_PROBE

# `starttime` of a pid (field 22 of /proc/PID/stat): a pid is ours only while it matches.
STARTTIME_SH = "sed 's/.*) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f20"
SNAPSHOT_END = 'tfcluster-status-end'   # last line of a status answer: a cut-short one lacks it
STARTED = 'tfcluster-started'           # the line a start script answers with
SIGNALLED = 'tfcluster-signalled'       # a signal script's line for each task it signalled
TASK_MARK = 'tfcluster-task'            # a host script's line before each task's part of its answer


def q(value: object) -> str:
    """`value` as one word of a shell command."""
    return shlex.quote(str(value))


def remote_dir(path: str) -> str:
    """A workdir as the remote shell should see it: `~/x` is `x` (the shell starts in $HOME)."""
    if path in ('~', '~/'):
        return '.'
    if path.startswith('~/'):
        return path[2:]
    return path


def shell_path(path: str) -> str:
    """A quoted path for a remote shell command that still expands a leading `~/`."""
    return f'"$HOME"/{q(path[2:])}' if path.startswith('~/') else q(path)


def starttime(pid: int | str) -> str:
    """A command that prints the start time of `pid` (a number, or a shell word like "$p"), or
    nothing once it is gone."""
    return STARTTIME_SH.format(pid=pid)


@dataclass(frozen=True)
class TaskProcess:
    """The processes of one task on its host: the task's own pid and the process group its wrapper
    leads, each with the start time that proves the pid still names that process."""
    pid: int
    ident: str
    group: int
    group_ident: str


@dataclass(frozen=True)
class TaskFiles:
    """A task's own files beside its log: the wrapper's pid, the task's pid, its exit code."""
    pidfile: str
    rcfile: str
    taskfile: str

    @property
    def envfile(self) -> str:
        """The task's environment, for the wrapper to read (env_file_text); its owner's alone."""
        return self.rcfile[:-len('.rc')] + '.env'

    @classmethod
    def beside(cls, log: str) -> TaskFiles:
        """The files of the task whose log is `log` (its name minus `.log`, plus .pid, .rc, .task)."""
        base = log[:-len('.log')] if log.endswith('.log') else log
        return cls(base + '.pid', base + '.rc', base + '.task')


def ours(p: TaskProcess) -> str:
    """A command that prints the task's process group while the task, or its wrapper, is still the
    process recorded (a pid reused by another process is not ours)."""
    return (f'if [ "$({starttime(int(p.pid))})" = {q(p.ident or "-")} ] || '
            f'[ "$({starttime(p.group)})" = {q(p.group_ident or "-")} ]; then echo {p.group}; fi')


def end_earlier_copy(earlier: TaskProcess | None) -> str:
    """Lines that kill what is left of a task's earlier copy on this host (its process group, while
    it is still ours), and wait for it to be gone: a copy left running would hold the new one's port."""
    if earlier is None:
        return ':'
    return (f'k=$({ours(earlier)}); if [ -n "$k" ]; then kill -KILL -$k 2>/dev/null; i=0; '
            'while kill -0 -$k 2>/dev/null && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done; fi')


def task_command(argv: Sequence[str], env_file: str | None = None) -> str:
    """The task's command line (it execs: one pid, the task's). With `env_file`, a subshell
    opens that file, removes it, reads its variables (env_file_text) and execs the task: the
    values are in the task's environment, which only its user can read, and in no argv. The file
    is removed before it is read so that a PATH it sets cannot change which `rm` runs."""
    argv_text = f'{shell_path(argv[0])} {shlex.join(argv[1:])}'
    if env_file is None:
        return argv_text
    return f'(exec 4< {q(env_file)} && rm -f {q(env_file)} && . /dev/fd/4 && exec 4<&- && exec {argv_text})'


def spec_made_absolute(argv: Iterable[str], workdir: str) -> list[str]:
    """The task's argv with its --spec made absolute, so `ps` on the host shows which cluster a task is of."""
    argv = list(argv)
    if '--spec' in argv:
        i = argv.index('--spec') + 1
        argv[i] = posixpath.join(workdir, argv[i])
    return argv


def env_file_text(env: Mapping[str, str]) -> str:
    """The task's environment as lines a POSIX shell reads with `.`: `export NAME=value`, each
    value quoted (a name is a valid variable name: the spec checks it)."""
    return ''.join(f'export {k}={q(v)}\n' for k, v in env.items())


def write_env_file(env_text: str, envfile: str) -> str:
    """Lines that write a task's env file (env_file_text) from a here-document: its owner's alone
    (umask) before it holds a byte, whole (under another name, then renamed). The here-document is
    quoted, so the shell expands nothing in it, and ends at a line the text does not hold."""
    end = 'TFCLUSTER_ENV_END'
    while end in env_text.splitlines():
        end += '_'
    tmp = envfile + '.tmp'
    return f"(umask 077 && cat > {q(tmp)} <<'{end}'\n{env_text}{end}\n) && mv {q(tmp)} {q(envfile)} || exit 1"


def host_script(parts: Iterable[tuple[str, str]]) -> str:
    """One script for several tasks of a host: each (name, script) part runs in a subshell of its own
    (its `exit` ends it alone), its stdout and stderr after a TASK_MARK line that names it."""
    return '\n'.join(f'echo {q(TASK_MARK + " " + name)}\n(\n{script}\n) 2>&1' for name, script in parts)


def parse_host_script(stdout: str) -> dict[str, str]:
    """A host script's answer, task by task (host_script): a task missing had no turn."""
    out: dict[str, list[str]] = {}
    lines: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith(TASK_MARK + ' '):
            lines = out.setdefault(line[len(TASK_MARK) + 1:], [])
        elif lines is not None:
            lines.append(line)
    return {name: '\n'.join(lines) for name, lines in out.items()}


def wrapper(command: str, files: TaskFiles) -> str:
    """The session leader's script: run the task, write its pid, then its exit code.

    The wrapper outlives a SIGTERM to the group (trap) to write the code. The task runs in the
    background and is waited for, with the wrapper's own stderr going nowhere: a foreground task
    killed by a signal makes dash write "Terminated" into the log. A wait cut short by the trap is
    repeated while the task lives; one more wait fetches the status of a task that died just after
    the trap (127: it was fetched already). Before the code is written, whatever the task left in
    its session (its train.command, killed with it or not) is killed: the task and everything it
    started end together, and once the launcher sees the code the task's port is free."""
    return (f'trap : TERM; exec 3>&2 2>/dev/null; {command} 2>&3 3>&- & t=$!; '
            f'echo $t > {q(files.taskfile)}.tmp && mv {q(files.taskfile)}.tmp {q(files.taskfile)}; '
            f'while :; do wait $t; r=$?; kill -0 $t || break; done; '
            f'wait $t; s=$?; [ $s -eq 127 ] || r=$s; {END_SESSION} echo $r > {q(files.rcfile)}')


# Kill every other process of this shell's session (it leads it: setsid) and wait up to 5 s for
# them to be gone. /proc/PID/stat after the command name: state, ppid, pgrp, session, ...
END_SESSION = ('k=; for d in /proc/[0-9]*; do read -r l < "$d/stat" || continue; l=${l##*) }; set -- $l; '
               '[ "$4" = "$$" ] && [ "${d#/proc/}" != "$$" ] && kill -KILL "${d#/proc/}" && k="$k ${d#/proc/}"; '
               'done; i=0; for p in $k; do while kill -0 "$p" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); '
               'done; done;')


def start_script(command: str, workdir: str, link: str, log_file: str, legacy: str,
                 earlier: TaskProcess | None, mark: str = '') -> str:
    """Start `command` detached in `workdir`, its output appended to `log_file` and `link` leading
    there (a plain file at `link` moves into `legacy` first); answers one STARTED line: the log's
    size before, the wrapper's pid and start time, the task's pid and start time ('-': none).
    `mark`: the task's stop mark, removed (it was for an earlier copy: launch/backends/marks.py)."""
    files = TaskFiles.beside(link)
    return '\n'.join(start_preamble(workdir, link, log_file, legacy, earlier, mark)
                     + [f'o=$(wc -c < {q(log_file)} 2>/dev/null || echo 0)'] + detach(command, files, log_file))


def start_preamble(workdir: str, link: str, log_file: str, legacy: str, earlier: TaskProcess | None,
                   mark: str = '') -> list[str]:
    """What every start of a task does first, cold or by a standby: end its earlier copy, remove
    its rc, pid and task files, its stop mark and its channel, and lead `link` to `log_file`."""
    files = TaskFiles.beside(link)
    return [
        f'cd {q(workdir)} || exit 1',
        end_earlier_copy(earlier),
        f'rm -f {q(files.rcfile)} {q(files.pidfile)} {q(files.taskfile)}' + (f' {q(mark)}' if mark else ''),
        f'rm -f {q(channel_beside(log_file))}',         # its records: this start's alone (clear_channel)
        f'mkdir -p {q(posixpath.dirname(log_file))}',
        f'if [ -f {q(link)} ] && [ ! -L {q(link)} ]; then mkdir -p {q(legacy)} && '
        f'mv {q(link)} {q(legacy)}/; fi',
        f'ln -sfn {q(posixpath.relpath(log_file, posixpath.dirname(link)))} {q(link)}',
    ]


def detach(command: str, files: TaskFiles, log_file: str) -> list[str]:
    """Run `command` detached in a session of its own under the wrapper, its output appended to
    `log_file`, and answer the STARTED line (`$o`: the log's size before, set by the caller)."""
    return [
        f'setsid nohup sh -c {q(wrapper(command, files))} >> {q(log_file)} 2>&1 < /dev/null &',
        'p=$!',
        f'echo $p > {q(files.pidfile)}',
        # The task's own pid, once the wrapper has written it (a task that ended at once: its rc).
        f'i=0; while [ ! -s {q(files.taskfile)} ] && [ ! -s {q(files.rcfile)} ] && [ $i -lt 100 ]; do '
        'sleep 0.05; i=$((i + 1)); done',
        f't=$(cat {q(files.taskfile)} 2>/dev/null); t=${{t:-$p}}',
        f'ps_=$({starttime("$p")}); ts_=$({starttime("$t")})',
        f'echo "{STARTED} $o $p ${{ps_:--}} $t ${{ts_:--}}"',
    ]


@dataclass(frozen=True)
class Started:
    """What a start script answered: the log's size before the start, and the task's processes."""
    offset: int
    process: TaskProcess


def parse_started(stdout: str) -> Started | None:
    """The last STARTED line of a start script's output, or None if it has none (or a broken one)."""
    try:
        line = next(x for x in reversed(stdout.splitlines()) if x.startswith(STARTED + ' '))
        offset, group, group_ident, pid, ident = line.split()[1:6]
        process = TaskProcess(int(pid), '' if ident == '-' else ident,
                              int(group), '' if group_ident == '-' else group_ident)
        return Started(int(offset), process)
    except (ValueError, StopIteration):
        return None


def undo_start_script(files: TaskFiles, mark: str = '') -> str:
    """Stop the process group the pidfile names if its leader is this task's wrapper (its command
    line names the task's rc file); prints `stopped` if there was one. `mark`: the task's stop
    mark, written before the SIGTERM (launch/backends/marks.py)."""
    marked = f'mkdir -p {q(posixpath.dirname(mark))} 2>/dev/null; : > {q(mark)} 2>/dev/null; ' if mark else ''
    return (f'p=$(cat {q(files.pidfile)} 2>/dev/null) || exit 0; [ -n "$p" ] || exit 0; '
            f'tr "\\0" " " < /proc/$p/cmdline 2>/dev/null | grep -qF {q(files.rcfile)} || exit 0; '
            f'{marked}kill -TERM -$p 2>/dev/null || exit 0; echo stopped; i=0; '
            'while kill -0 -$p 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done; '
            'kill -KILL -$p 2>/dev/null; exit 0')


class Watched(NamedTuple):
    """A task a status snapshot asks about: its name, pid, exit code file and process group."""
    name: str
    pid: int
    rcfile: str
    group: int


class Seen(NamedTuple):
    """A snapshot's answer for one task: its rc file's text, its stat line, its wrapper's stat line."""
    rc: str
    stat: str
    wrapper: str


def snapshot_script(tasks: Iterable[Watched]) -> str:
    """One line per task: `name|rc|stat|wrapper stat`, then SNAPSHOT_END.

    The task's /proc, then its wrapper's, then the rc file, which the wrapper writes before it
    exits: a wrapper seen gone wrote the rc that is read after it. (The rc read before the wrapper
    left a window, wider on a busy host, where the wrapper wrote its rc and exited between the two
    reads: a task that ended well read as killed hard, SIGKILL.)"""
    lines = [f's=$(cat /proc/{int(t.pid)}/stat 2>/dev/null); w=$(cat /proc/{t.group}/stat 2>/dev/null); '
             f'r=$(cat {q(t.rcfile or "/dev/null")} 2>/dev/null); '
             f'printf "%s|%s|%s|%s\\n" {q(t.name)} "$r" "$s" "$w"' for t in tasks]
    return '\n'.join(lines + [f'echo {SNAPSHOT_END}'])


def parse_snapshot(stdout: str) -> dict[str, Seen] | None:
    """Task name -> what the snapshot saw; None for an answer cut short (no SNAPSHOT_END), which
    must not read as "every task gone"."""
    if not stdout.rstrip().endswith(SNAPSHOT_END):
        return None
    out = {}
    for line in stdout.splitlines():
        task, rc, stat, wrapper_stat = (line.split('|', 3) + ['', '', ''])[:4]
        out[task] = Seen(rc, stat, wrapper_stat)
    return out


def stop_script(processes: Iterable[TaskProcess], grace: float, marks: Iterable[str] = ()) -> str:
    """SIGTERM every task's process group that is still ours, wait up to `grace` for all, SIGKILL
    what is left (printing `killed` and the groups), wait for that too. The tasks' stop `marks`
    are written first, so that each reads its SIGTERM as the launcher's stop (launch/backends/marks.py)."""
    found = '\n'.join([f'g=$({ours(p)}); [ -n "$g" ] && k="$k $g"' for p in processes]
                      + [f'mkdir -p {q(posixpath.dirname(m))} 2>/dev/null; : > {q(m)} 2>/dev/null' for m in marks])
    rounds = max(1, int(grace / 0.1))
    return f'''k=''
{found}
[ -n "$k" ] || exit 0
for p in $k; do kill -TERM -$p 2>/dev/null; kill -CONT -$p 2>/dev/null; done
wait_gone() {{
  i=0
  while [ $i -lt $1 ]; do
    a=''
    for p in $k; do kill -0 -$p 2>/dev/null && a="$a $p"; done
    k=$a
    [ -n "$k" ] || return 0
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}}
wait_gone {rounds} && exit 0
for p in $k; do kill -KILL -$p 2>/dev/null; done
echo "killed $k"
wait_gone 50
'''


def signal_script(tasks: Iterable[tuple[str, TaskProcess]], signal_name: str) -> str:
    """Send a signal (its name without SIG) to each named task's own process while that pid is
    still the task's (never its group: the wrapper would die of a signal the task handles); prints
    `SIGNALLED name` for each one sent."""
    lines = [f'[ "$({starttime(int(p.pid))})" = {q(p.ident or "-")} ] && kill -s {q(signal_name)} {int(p.pid)} '
             f'2>/dev/null && echo {SIGNALLED} {q(name)}' for name, p in tasks]
    return '\n'.join(lines + ['true'])


def parse_signalled(stdout: str) -> set[str]:
    """The tasks a signal script says it signalled."""
    return {line.split(' ', 1)[1] for line in stdout.splitlines() if line.startswith(SIGNALLED + ' ')}


def lease_script(paths: Iterable[str], text: str | None = None) -> str:
    """Touch every lease file, or with `text`, write it whole under another name first and rename
    it into place (a task never reads half of it)."""
    if text is not None:
        script = '; '.join(f'mkdir -p {q(posixpath.dirname(x))} && printf %s {q(text)} > {q(x + ".new")} '
                           f'&& mv -f {q(x + ".new")} {q(x)}' for x in sorted(paths))
    else:
        script = '; '.join(f'mkdir -p {q(posixpath.dirname(x))}; touch {q(x)}' for x in sorted(paths))
    return script or 'true'


def workdir_script(cwd: str) -> str:
    """Print the absolute path of the existing workdir `cwd` (fails if there is none)."""
    return f'cd {q(remote_dir(cwd))} && pwd'


def prepare_script(cwd: str, dirs: Iterable[str]) -> str:
    """Make the workdir `cwd` and the directories below it, then print its absolute path."""
    return (f'mkdir -p {q(remote_dir(cwd))} && cd {q(remote_dir(cwd))} && '
            f'mkdir -p {" ".join(q(d) for d in dirs if d)} . && pwd')


def probe_script(cwd: str, python: str, ports: Iterable[int], imports: bool, module: str = 'cluster.task') -> str:
    """Run HOST_PROBE with the tasks' Python in their workdir: which ports are busy, and (with
    `imports`) whether tensorflow and tfcluster import; `module`, the one the tasks run, must."""
    args = ' '.join(['--import'] * imports + ['--module', q(module)] + [str(port) for port in ports])
    return f'cd {q(remote_dir(cwd))} 2>/dev/null; exec {shell_path(python)} -c {q(HOST_PROBE)} {args}'
