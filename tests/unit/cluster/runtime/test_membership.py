"""The live workers of a pool (cluster/runtime/membership.py): what the launcher writes into the lease,
what a task reads back, and how a ps counts "every worker is done" as the set changes. Pure."""
import os

import pytest

from cluster.runtime.membership import DoneTracker, LiveSet, Members
from launch.backends.base import touch_leases
from launch.planning.plan import plan_cluster


def test_the_live_set_goes_through_the_lease_text_and_back():
    m = Members(7, {0: 1, 2: 7})
    assert Members.parse(m.to_text(), pool=3) == m
    assert m.to_text() == '{"epoch":7,"workers":{"0":1,"2":7}}'
    assert (m.indices, m.count, m.rank(2), m.rank(1)) == ((0, 2), 2, 1, None)


@pytest.mark.parametrize('text', ['', '   ', 'not json', '[]', '{"epoch": 1}', '{"epoch": 1, "workers": {"1": 0}}',
                                  '{"epoch": 1, "workers": {"0": 0, "3": 0}}', '{"epoch": "x", "workers": {"0": 0}}',
                                  '{"epoch": 1, "workers": {"a": 0}}', '{"epoch": 1, "workers": []}'])
def test_a_lease_without_a_sound_live_set_means_every_worker(text):
    """An older launcher's empty lease, a task started by hand, or nonsense (no chief, an index
    outside the pool): the fixed cluster of before."""
    assert Members.parse(text, pool=3) is None
    live = LiveSet()
    live.set(Members.parse(text, pool=3))
    assert live.current(3) == Members.everyone(3) and not live.leaving(2, 3)


def test_a_worker_taken_out_leaves_but_never_the_chief():
    live = LiveSet()
    assert live.set(Members(2, {0: 0, 1: 2})) and live.changed.is_set()
    assert not live.set(Members(2, {0: 0, 1: 2}))
    assert live.leaving(2, 3) and not live.leaving(1, 3) and not live.leaving(0, 3)
    assert live.generation(1, 3) == 2 and live.generation(2, 3) == 0


def test_a_request_for_a_checkpoint_travels_in_the_lease_and_moves_no_worker():
    """A sync scale first asks the chief to save (Members.save): the chief sees the count grow,
    while no worker's input shard or place changes."""
    asked = Members(2, {0: 0, 1: 2}, save=3)
    assert asked.to_text() == '{"epoch":2,"workers":{"0":0,"1":2},"save":3}'
    assert Members.parse(asked.to_text(), pool=3) == asked
    live = LiveSet()
    assert live.save_requests() == 0
    live.set(Members(2, {0: 0, 1: 2}))
    live.changed.clear()
    assert not live.set(asked) and not live.changed.is_set()
    assert live.save_requests() == 3


def test_the_ps_counts_the_live_workers_from_their_current_start():
    t = DoneTracker()
    one = Members(1, {0: 0})
    three = Members(2, {0: 0, 1: 2, 2: 2})
    t.report(1, 0)                      # worker 1 of an earlier start (it left, then came back)
    assert t.waiting_for(three) == [0, 1, 2] and not t.finished(three)
    t.report(0, 0)
    assert t.finished(one)              # scaled back to the chief alone: done
    t.report(2, 2)
    t.report(1, 2)
    assert t.finished(three) and t.waiting_for(three) == []
    t.report(1, 0)                      # a late report of the old start does not undo the new one
    assert t.finished(three)


def test_leases_hold_the_live_set_and_a_change_is_written_whole(tmp_path):
    import yaml
    from cluster.spec import load_spec
    (tmp_path / 's.yaml').write_text(yaml.safe_dump({'cluster': {'ps': ['localhost:2222'], 'worker': ['localhost:2223']},
                                                     'train': {'train_dir': str(tmp_path / 'run')}}))
    plans = plan_cluster(load_spec(str(tmp_path / 's.yaml')))
    lease = tmp_path / 'run' / 'launcher.lease'
    touch_leases(plans)
    assert lease.read_text() == ''
    text = Members(1, {0: 1}).to_text()
    touch_leases(plans, text=text)
    assert lease.read_text() == text
    before = lease.stat().st_ino
    touch_leases(plans, text=text)      # unchanged: only touched
    assert lease.stat().st_ino == before and lease.read_text() == text


HOSTS = {'worker:0': 'a', 'worker:1': 'b', 'worker:2': 'b', 'worker:3': 'c', 'worker:4': 'd'}


@pytest.mark.parametrize('lost, unreachable, spares, moves', [
    (['worker:1'], {'b'}, ['worker:2', 'worker:3'], {'worker:1': 'worker:3'}),      # not onto the dead host
    (['worker:1'], {'b'}, ['worker:2'], {}),                                           # no spare elsewhere
    (['worker:1'], set(), ['worker:3'], {}),                                           # reachable: no failover
    (['worker:1', 'worker:2'], {'b'}, ['worker:3', 'worker:4'], {'worker:1': 'worker:3', 'worker:2': 'worker:4'}),
    (['worker:1', 'worker:2'], {'b'}, ['worker:3'], {'worker:1': 'worker:3'}),       # each spare once
])
def test_a_worker_on_an_unreachable_host_fails_over_to_a_spare_elsewhere(lost, unreachable, spares, moves):
    from launch.run.policy import pick_spares
    assert pick_spares(lost, HOSTS, unreachable, spares) == moves


@pytest.mark.parametrize('live, retired, want, moves', [
    ((0,), set(), 3, ([1, 2], [])),
    ((0, 1, 2), set(), 2, ([], [2])),
    ((0, 1, 2), set(), 1, ([], [2, 1])),
    ((0, 2), set(), 3, ([1], [])),            # the lowest free index first
    ((0, 2), {1}, 3, ([3], [])),              # a worker failed over is never started again
    ((0, 3), {1}, 3, ([2], [])),
    ((0, 1), set(), 2, ([], [])),
])
def test_scale_starts_the_lowest_free_workers_and_takes_out_the_highest_never_the_chief(live, retired, want, moves):
    from launch.run.policy import scale_moves
    assert scale_moves(4, live, retired, want) == moves


def _pool_spec(tmp_path):
    import yaml
    path = tmp_path / 'pool.yaml'
    path.write_text(yaml.safe_dump({'cluster': {'ps': ['localhost:2222'],
                                                'worker': ['localhost:2223', 'localhost:2224', 'localhost:2225']},
                                    'train': {'sync': False, 'train_dir': str(tmp_path / 'run')}}))
    (tmp_path / 'run').mkdir()
    return str(path)


def test_scale_asks_the_running_launcher_and_says_what_it_answered(tmp_path, capsys):
    """A stand-in launcher (it holds the run's lock and answers the request file) refuses: exit 1,
    its words printed; a second scale while one is under way: exit 2, nothing sent."""
    import threading
    from launch.run import control
    from launch.cli import main
    from launch.records.lock import TrainDirLock
    from launch.backends.procstat import process_ident
    from launch.run.state import LaunchState
    from cluster.runtime import rundir
    spec = _pool_spec(tmp_path)
    train_dir = str(tmp_path / 'run')
    launcher = TrainDirLock(train_dir)
    launcher.acquire('a test launcher')
    LaunchState.new(spec, process_ident(os.getpid())).save(rundir.state_path(train_dir))    # who it is
    stop = threading.Event()

    def answer():
        while not stop.is_set():
            request = control.take(train_dir, control.this_launcher())
            if request:
                control.answer(train_dir, request, control.REFUSED, [f'not now ({request.workers})'])
                return
            stop.wait(0.05)
    helper = threading.Thread(target=answer)
    helper.start()
    try:
        assert main(['scale', spec, '--workers', '2']) == 1
        assert capsys.readouterr().out == 'not now (2)\n'
        busy = TrainDirLock(train_dir, control.LOCK_FILE)
        busy.acquire('launch scale (pid 1) to 3 workers')
        assert main(['scale', spec, '--workers', '3']) == 2
        assert 'another scale of this run is under way (launch scale (pid 1) to 3 workers)' in capsys.readouterr().err
        assert not (tmp_path / 'run' / control.REQUEST_FILE).exists()
        busy.release()
    finally:
        stop.set()
        helper.join()
        launcher.release()


def test_the_scheduler_backends_and_user_commands_refuse_a_worker_count(tmp_path, capsys):
    from launch.cli import main
    spec = _pool_spec(tmp_path)
    assert main(['scale', spec, '--backend', 'slurm', '--workers', '2']) == 2
    assert 'the Slurm scheduler owns the size of the job' in capsys.readouterr().err
    assert main(['up', spec, '--workers', '2', '--set', 'train.command=python x.py']) == 2
    assert '--workers 2: a train.command gets every worker of the spec' in capsys.readouterr().err
    assert main(['up', spec, '--backend', 'slurm', '--workers', '2']) == 2
    assert 'the slurm scheduler runs every worker of the spec' in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / 'run')) == []


def test_a_launcher_takes_only_the_requests_sent_to_it(tmp_path):
    """scale.request names the launcher it was sent to (pid and start time). A request left by an
    earlier launcher of the run (killed before it answered), or one naming none, is answered
    "refused" and removed by the next, never carried out; a request sent meanwhile survives the
    refusal of the old one."""
    import json
    from launch.run import control
    train_dir = str(tmp_path)
    me = control.this_launcher()
    request_file, reply_file = tmp_path / control.REQUEST_FILE, tmp_path / control.REPLY_FILE
    for earlier in ({'pid': 4242, 'ident': '12345'}, {'pid': me['pid'], 'ident': 'a reused pid'}, None):
        sent = {'id': 'old', 'workers': 3, 'pid': 1}
        request_file.write_text(json.dumps(sent if earlier is None else {**sent, 'launcher': earlier}))
        assert control.take(train_dir, me) is None
        assert not request_file.exists()
        reply = json.loads(reply_file.read_text())
        assert (reply['id'], reply['state']) == ('old', 'refused'), reply
        assert f'launcher pid {me["pid"]} runs it now and changed nothing' in reply['lines'][0], reply
    ident = control.send(train_dir, 2, me)
    assert not reply_file.exists()
    taken = control.take(train_dir, me)
    assert taken is not None and (taken.id, taken.workers, taken.launcher) == (ident, 2, me)
    assert request_file.exists()            # until it is answered
    control.answer(train_dir, control.ScaleRequest('old', 3), control.REFUSED, ['an earlier request'])
    assert request_file.exists()            # not the request the file holds now
    control.answer(train_dir, taken, control.DONE, ['2 worker(s) train already'])
    assert not request_file.exists()


def test_workers_let_go_leave_the_live_set_in_a_new_epoch_never_the_chief():
    now = Members(4, {0: 1, 1: 1, 2: 4}, save=2)
    assert now.without([2]) == Members(5, {0: 1, 1: 1}, save=2)      # the others keep their generation
    assert now.without([0, 3]) is now                                 # the chief stays; 3 was not live
