"""The SSH backend's warm standbys (launch/backends/ssh/standby.py) without a host: the scripts as
text, the split of a task's environment between the standby and its become, the report's parser,
and the book kept over a fake host that answers the scripts as a real one would."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
from types import SimpleNamespace

import pytest

from cluster.runtime.contract import LEASE_ENV, LEASE_SECS_ENV, RESTART_ENV
from cluster.runtime.messages import channel_env
from cluster.runtime.ports import RUN_ENV
from cluster.runtime.standby import BECOME_SECS, Become, Ready, import_key, slot_files
from cluster.spec import load_spec
from launch.backends.base import TaskRecord
from launch.backends.ssh.scripts import STARTED, Started, TaskFiles, TaskProcess, parse_started
from launch.backends.ssh.standby import (COLD, SLOT_MARK, BecomeTask, SlotSeen, SSHStandbys, become_script,
                                         cold_reason, kill_script, left_script, parse_report, report_script, spawn_script,
                                         standby_env)
from launch.backends.standby import DEAD, READY, SPAWNING, Slot, plan_key
from launch.planning.plan import plan_cluster

FILES = slot_files('/w/run/standby/h1', 'ab-1')
STANDBY = TaskProcess(123, '456', 120, '455')


def _plans(tmp_path, run: str = 'run-1'):
    spec_file = tmp_path / 'spec.yaml'
    spec_file.write_text('cluster:\n  ps: [h1:2222]\n  worker: [h1:2223, h2:2224]\n'
                         'env:\n  PYTHONPATH: /opt/lib\n  MY_SECRET: hidden\n')
    return [dataclasses.replace(p, env={**p.env, RUN_ENV: run, RESTART_ENV: '1', 'CUDA_VISIBLE_DEVICES': ''})
            for p in plan_cluster(load_spec(str(spec_file)))]


def test_a_standby_gets_what_tensorflow_reads_at_import_and_the_lease_and_nothing_of_one_task(tmp_path):
    plan = _plans(tmp_path)[1]
    env = standby_env(plan)
    assert env['PYTHONPATH'] == '/opt/lib' and env['TF_CPP_MIN_LOG_LEVEL'] == '2'
    assert env[LEASE_ENV] == plan.env[LEASE_ENV] and env[LEASE_SECS_ENV] == plan.env[LEASE_SECS_ENV]
    for name in ('TF_CONFIG', 'CUDA_VISIBLE_DEVICES', RESTART_ENV, RUN_ENV, 'MY_SECRET'):
        assert name in plan.env and name not in env, name
    # ...so its key is the plan's: what differs is applied at become.
    assert import_key(plan.argv[0], plan.cwd, env, False) == plan_key(plan, plan.env)


def test_a_spawn_starts_the_standby_as_a_task_is_started_with_the_slot_s_files():
    argv = ['/opt/py', '-m', 'cluster.standby', '--dir', '/w/run/standby/h1', '--slot', 'ab-1']
    script = spawn_script(argv, '/w', FILES, {'PYTHONPATH': "/it's"})
    tf = TaskFiles.beside(FILES.log)
    assert tf == TaskFiles('/w/run/standby/h1/ab-1.pid', '/w/run/standby/h1/ab-1.rc', '/w/run/standby/h1/ab-1.task')
    assert script.startswith('cd /w || exit 1\n')
    assert f'rm -f {tf.rcfile} {tf.pidfile} {tf.taskfile} {FILES.ready} {FILES.become} {FILES.became}' in script
    assert f"(umask 077 && cat > {tf.envfile}.tmp <<'TFCLUSTER_ENV_END'" in script     # its env: a file, never argv
    assert "export PYTHONPATH='/it'\"'\"'s'" in script
    assert 'setsid nohup sh -c' in script and f'>> {FILES.log} 2>&1' in script
    assert 'exec /opt/py -m cluster.standby --dir /w/run/standby/h1 --slot ab-1' in script
    assert f'echo $p > {tf.pidfile}' in script
    assert script.splitlines()[-1] == f'echo "{STARTED} $o $p ${{ps_:--}} $t ${{ts_:--}}"'


def _become_task(become: Become) -> BecomeTask:
    return BecomeTask('/w', '/w/run/logs/worker-1.log', '/w/run/logs/attempt-2/worker-1.log', '/w/run/logs/attempt-0',
                      '/w/run/stop/worker-1', TaskProcess(90, '91', 88, '89'), FILES, STANDBY, become)


def test_a_become_starts_as_a_cold_start_checks_the_standby_hands_it_the_task_and_answers_started():
    env = {'TF_CONFIG': '{"task": 1}', 'X': "a 'b' $HOME"}
    become = Become(('/opt/py', '-m', 'cluster.task', '--spec', '/w/run/spec.yaml'), env, '/w',
                    '/w/run/logs/attempt-2/worker-1.log', keep_env=True)
    lines = become_script(_become_task(become)).splitlines()
    assert lines[0] == 'cd /w || exit 1'
    assert 'kill -KILL -$k' in lines[1]            # the task's earlier copy ended first, as in a cold start
    assert lines[2] == 'rm -f /w/run/logs/worker-1.rc /w/run/logs/worker-1.pid /w/run/logs/worker-1.task /w/run/stop/worker-1'
    assert 'ln -sfn attempt-2/worker-1.log /w/run/logs/worker-1.log' in lines
    text = '\n'.join(lines)
    # The standby must still be the slot's process (its start time), and not stopped.
    assert "/proc/123/stat 2>/dev/null | cut -d' ' -f20)\" = 456 ] || cold" in text
    assert re.search(r'case "\$\(.*/proc/123/stat.*\)" in T\*\|t\*\|Z\*\|X\*\) cold', text)
    # The log's size before the become, then the become file: private, whole, renamed into place.
    assert text.index('o=$(wc -c < /w/run/logs/attempt-2/worker-1.log') < text.index('umask 077')
    written = re.search(r"cat > (\S+) <<'(\w+)'\n(.*)\n\2\n\) && mv (\S+) (\S+) \|\| cold", text)
    assert written and written[1] == written[4] == FILES.become + '.new' and written[5] == FILES.become
    assert Become.parse(written[3]) == become
    assert f'-lt {round(BECOME_SECS / 0.01)} ]' in text and f'[ -s {FILES.became} ] || cold' in text
    assert any(x.startswith('echo 123 > /w/run/logs/worker-1.task; echo 120 > /w/run/logs/worker-1.pid') for x in lines)
    assert not [x for x in lines if 'rm -f' in x and x.endswith(FILES.became)][1:]     # the became file stays
    assert lines[-1] == f'echo "{STARTED} $o 120 455 123 456"'
    cold = next(x for x in lines if x.startswith('cold() {'))
    assert f'rm -f {FILES.become} {FILES.become}.new' in cold and 'kill -KILL -$k' in cold and COLD in cold
    # As the host answers it.
    assert parse_started(f'{STARTED} 77 120 455 123 456') == Started(77, STANDBY)
    assert cold_reason(f'x\n{COLD} the standby (pid 123) is stopped') == 'the standby (pid 123) is stopped'
    assert cold_reason(f'{STARTED} 77 120 455 123 456') == ''


def test_a_kill_reaches_only_the_slot_s_own_wrapper_group():
    words = shlex.split(kill_script(FILES))
    assert words[:3] == ['p=$(cat', '/w/run/standby/h1/ab-1.pid', '2>/dev/null);']
    i = words.index('grep')
    assert words[i:i + 7] == ['grep', '-qF', '/w/run/standby/h1/ab-1.rc', '&&', 'kill', '-KILL', '-$p']
    assert FILES.log not in words       # the log stays


def test_a_report_measures_the_heartbeat_on_the_host_and_is_parsed_back():
    script = report_script([('ab-1', FILES, 123)])
    assert script.startswith('n=$(date +%s)') and f'stat -c %Y {FILES.ready}' in script and '/proc/123/stat' in script
    ready = Ready(123, 'k', 'run-1', 2.5, 300_000)
    out = (f'noise\n{SLOT_MARK} ab-1|1|S 456|{ready.to_json()}\n{SLOT_MARK} ab-2|-|T 9|\n'
           f'{SLOT_MARK} ab-3|-||\n{SLOT_MARK} ab-4|0|S 1|not json\n')
    assert parse_report(out) == {'ab-1': SlotSeen(1, ready, 'S', '456'), 'ab-2': SlotSeen(None, None, 'T', '9'),
                                 'ab-3': SlotSeen(None, None, '', ''), 'ab-4': SlotSeen(0, None, 'S', '1')}


# -- the book over a fake host -------------------------------------------------------------------

class FakeHost:
    """Answers the standby scripts as a host would: a spawn starts standby pid 500, 501, ... (its
    wrapper: the pid + 1000; a pid's start time: the pid and a 1); a slot reports a fresh ready file
    in state `states` (default S); a become is taken, unless `refuse`."""

    def __init__(self) -> None:
        self.scripts: list[str] = []
        self.keys: dict[str, tuple[str, str]] = {}      # slot -> (key, run)
        self.states: dict[str, str] = {}
        self.refuse = False
        self.started: list[TaskRecord] = []
        self._next = 500

    def _run(self, name: str, script: str, timeout: float = 60) -> SimpleNamespace:
        self.scripts.append(script)
        out = []
        for pid, slot in re.findall(r"/proc/(\d+)/stat.*'tfcluster-standby (\S+)'", script):
            key, run = self.keys[slot]
            out.append(f'{SLOT_MARK} {slot}|0|{self.states.get(slot, "S")} {pid}1|{Ready(int(pid), key, run, 2.0, 1).to_json()}')
        parts = re.split(r"^echo '?tfcluster-task ([^'\n]+)'?$", script, flags=re.M)
        for part_name, part in zip(parts[1::2], parts[2::2]):
            out.append(f'tfcluster-task {part_name}')
            spawn = re.search(r'--slot (\S+) --run (\S+) --key (\S+)', part)
            if spawn:
                self.keys[spawn[1]] = (spawn[3], spawn[2])
                pid, self._next = self._next, self._next + 1
                out.append(f'{STARTED} 0 {pid + 1000} {pid + 1000}1 {pid} {pid}1')
            elif self.refuse:
                out.append(f'{COLD} the standby did not take it')
            else:
                pid = int(re.search(r'echo (\d+) > \S+\.task;', part)[1])
                out.append(f'{STARTED} 42 {pid + 1000} {pid + 1000}1 {pid} {pid}1')
        return SimpleNamespace(stdout='\n'.join(out) + '\n', stderr='', exited=0)

    def _workdir(self, name: str, cwd: str) -> str:
        return '/w'

    def _earlier(self, plan) -> None:
        return None

    def _note_started(self, record: TaskRecord) -> None:
        self.started.append(record)

    def _started_record(self, plan, started: Started, workdir: str, log_file: str, files: TaskFiles) -> TaskRecord:
        t, p = plan.task, started.process
        return TaskRecord(t.name, t.job, t.index, t.host, t.port, 'ssh', p.pid, log_file, ident=p.ident,
                          log_offset=started.offset, handle=(files.pidfile, files.rcfile, p.group))


def _on(host: FakeHost, name: str) -> str:
    """The last script run on host `name` (the hosts' commands run at once, in any order)."""
    return next(s for s in reversed(host.scripts) if f'/standby/{name}/' in s)


@pytest.fixture
def kept(tmp_path):
    host = FakeHost()
    standbys = SSHStandbys(host)
    plans = _plans(tmp_path)
    standbys.tend(plans, 1)         # spawns one per host
    standbys.tend(plans, 1)         # sees them ready
    return host, standbys, plans


def test_tend_spawns_one_per_host_and_sees_them_ready_in_one_command_per_host(kept):
    host, standbys, plans = kept
    assert len(host.scripts) == 4 and sum('setsid nohup' in s for s in host.scripts) == 2
    assert sorted(standbys.views()) in ([('h1', 500, str(READY)), ('h2', 501, str(READY))],
                                        [('h1', 501, str(READY)), ('h2', 500, str(READY))])
    spawn = next(s for s in host.scripts if 'setsid nohup' in s)
    assert 'TF_CONFIG' not in spawn and 'hidden' not in spawn       # nothing of one task in a standby
    assert f'--run run-1 --key {plan_key(plans[0], plans[0].env)}' in spawn
    standbys.tend(plans, 1)
    assert 'setsid' not in host.scripts[-1]         # as many as wanted: only seen again


def test_a_restart_is_handed_to_the_host_s_standby_with_the_task_s_whole_environment(kept):
    host, standbys, plans = kept
    worker = plans[1]
    assert worker.task.host == 'h1'
    pid = next(p for h, p, _ in standbys.views() if h == 'h1')
    records, cold = standbys.become('h1', [worker])
    assert cold == [] and [r.pid for r in records] == [pid] and records[0].warm and host.started == records
    pidfile, rcfile, group = records[0].handle
    assert pidfile.startswith(f'/w/{os.path.dirname(worker.spec_path)}/standby/h1/') and pidfile.endswith('.pid') and rcfile == pidfile[:-4] + '.rc'
    assert group == pid + 1000 and records[0].log_offset == 42
    become = Become.parse(re.search(r"<<'TFCLUSTER_BECOME_END'\n(.*)\n", host.scripts[-1])[1])
    log_file = '/w/' + worker.attempt_log_path
    assert become.keep_env and become.env == {**worker.env, **channel_env(log_file)} and become.log == log_file
    assert become.cwd == '/w' and '/w/' + worker.spec_path in become.argv
    assert [h for h, _, _ in standbys.views()] == ['h2']     # taken: no longer a standby
    commands = len(host.scripts)
    again, cold = standbys.become('h1', [worker])
    assert again == [] and cold == [worker] and len(host.scripts) == commands    # none left: cold, no command


def test_a_standby_that_does_not_take_its_task_is_dropped_and_the_task_starts_cold(kept):
    host, standbys, plans = kept
    host.refuse = True
    records, cold = standbys.become('h1', [plans[0]])
    assert records == [] and cold == [plans[0]]
    assert [s.state for s in standbys._pool.slots.values() if s.host == 'h1'] == [DEAD]
    standbys.tend(plans, 1)          # forgotten, killed again in case, and replaced
    assert 'kill -KILL -$p' in _on(host, 'h1') and 'setsid nohup' in _on(host, 'h1')


def test_a_stopped_standby_is_never_handed_a_task_and_is_replaced(kept):
    host, standbys, plans = kept
    for slot in standbys._pool.slots.values():
        host.states[slot.slot] = 'T'
    standbys.tend(plans, 1)
    assert all(s.halted for s in standbys._pool.slots.values())
    assert standbys.become('h1', [plans[0]]) == ([], [plans[0]])
    standbys.tend(plans, 1)
    assert 'kill -KILL -$p' in _on(host, 'h1') and 'setsid nohup' in _on(host, 'h1')


def test_no_standby_is_wanted_once_the_count_is_zero(kept):
    host, standbys, plans = kept
    standbys.tend(plans, 0)
    assert standbys.views() == [] and all('kill -KILL -$p' in s for s in host.scripts[-2:])


def test_a_slot_seen_in_another_process_is_dead():
    slot = Slot('h', 's1', 'run-1', 'k', 0.0, pid=5, ident='77')
    SSHStandbys._saw(slot, SlotSeen(0, Ready(5, 'k', 'run-1', 1.0, 1), 'S', '78'), 100.0)
    assert slot.state == DEAD
    slot = Slot('h', 's1', 'run-1', 'k', 0.0, pid=5, ident='77')
    SSHStandbys._saw(slot, SlotSeen(None, None, 'S', '77'), 100.0)
    assert slot.state == SPAWNING                            # still importing
    SSHStandbys._saw(slot, SlotSeen(2, Ready(5, 'k', 'run-1', 1.0, 1), 'S', '77'), 100.0)
    assert slot.state == READY and slot.beat == 98.0 and not slot.halted
    SSHStandbys._saw(slot, SlotSeen(0, Ready(5, 'k', 'run-1', 1.0, 1), 't', '77'), 100.0)
    assert slot.halted


def test_close_kills_every_standby_in_one_command_per_host(kept):
    host, standbys, plans = kept
    host.scripts.clear()
    standbys.close()
    assert len(host.scripts) == 2 and all('kill -KILL -$p' in s for s in host.scripts)
    assert standbys.views() == []


def test_become_json_without_keep_env_replaces_the_environment():
    old = json.dumps({'argv': ['p', '-m', 'cluster.task'], 'env': {}, 'cwd': '/', 'log': '/l'})
    assert Become.parse(old).keep_env is False


def test_a_tend_in_flight_when_the_backend_closes_kills_what_it_spawned(tmp_path):
    host = FakeHost()
    standbys = SSHStandbys(host)
    real = host._run

    def closing(name: str, script: str, timeout: float = 60) -> SimpleNamespace:
        answer = real(name, script, timeout)
        if 'setsid nohup' in script:
            standbys.close()        # the run ended while this host's spawn ran
        return answer
    host._run = closing
    standbys.tend(_plans(tmp_path), 1)
    spawned = [s for s in host.scripts if 'setsid nohup' in s]
    kills = [s for s in host.scripts if 'kill -KILL -$p' in s and 'setsid' not in s]
    assert len(spawned) == 2 and standbys.views() == []
    for spawn in spawned:
        pidfile = re.search(r'echo \$p > (\S+)', spawn)[1]
        assert any(pidfile in k for k in kills[1:]), pidfile      # after the close's own kill too
    standbys.tend(_plans(tmp_path), 1)
    assert not [s for s in host.scripts if 'setsid nohup' in s][2:]     # closed: no more spawns


def test_standbys_left_by_an_earlier_launcher_are_killed_but_tasks_and_this_launcher_s_own():
    words = shlex.split(left_script('/w/run/standby/h1', 'cd12ef-'))
    text = left_script('/w/run/standby/h1', 'cd12ef-')
    assert words[:3] == ['for', 'f', 'in'] and words[3] == '/w/run/standby/h1/*.pid;'
    assert 'case "${b##*/}" in cd12ef-*) continue;; esac' in text          # its own slots
    assert '[ -e "$b.became" ] && continue' in text                        # a standby that is a task now
    assert text.index('grep -qF "$b.rc"') < text.index('kill -KILL -$p')  # only the slot's own wrapper
