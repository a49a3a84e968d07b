"""The standby pool (launch/backends/standby.py), every choice as a table: which standby a restart
may take (only a READY one, heartbeat fresh, not halted, of this run and the task's key), which to
spawn (one per host at a time, up to what it wants), which to kill (dead, halted, stale, stuck,
wrong key, too many), and the key of a plan."""
from __future__ import annotations

import dataclasses

import pytest

from cluster.runtime.standby import FRESH_SECS, Ready, import_key
from cluster.spec import load_spec
from launch.backends.standby import (DEAD, READY, SPAWN_SECS, SPAWNING, TAKEN, StandbyPool, Want, counts, plan_key,
                                     wants)
from launch.planning.plan import plan_cluster

RUN, KEY, OTHER = 'run-1', 'k1', 'k2'
NOW = 1000.0


def _ready(pool: StandbyPool, host: str = 'h', key: str = KEY, pid: int = 10, beat: float = NOW,
           spawned: float = NOW - 10) -> object:
    slot = pool.new(host, key, spawned)
    pool.spawned(slot, pid, 'ident')
    pool.seen(slot, Ready(pid, key, RUN, 2.5, 300_000), beat)
    return slot


# (what is changed of a ready slot, the key asked, whether it is picked)
PICKS = [
    ({}, KEY, True),
    ({}, OTHER, False),                                 # another import key
    ({}, None, False),                                  # a task no standby can become
    ({'beat': NOW - FRESH_SECS - 0.1}, KEY, False),     # heartbeat stale: frozen or gone
    ({'beat': None}, KEY, False),
    ({'halted': True}, KEY, False),                     # SIGSTOPped
    ({'state': SPAWNING}, KEY, False),                  # still importing
    ({'state': DEAD}, KEY, False),
    ({'state': TAKEN}, KEY, False),                     # another restart has it
    ({'run': 'run-0'}, KEY, False),                     # an earlier run's
    ({'pid': 0}, KEY, False),                           # never spawned
]


@pytest.mark.parametrize('change, key, picked', PICKS)
def test_pick_takes_only_a_fresh_ready_standby_of_this_run_and_key(change, key, picked):
    pool = StandbyPool(RUN)
    slot = _ready(pool)
    for name, value in change.items():
        setattr(slot, name, value)
    got = pool.pick('h', key, NOW)
    assert (got is slot) == picked
    if picked:
        assert slot.state == TAKEN and pool.pick('h', KEY, NOW) is None    # taken once only


def test_pick_looks_only_at_the_host_asked_and_takes_the_oldest_first():
    pool = StandbyPool(RUN)
    young = _ready(pool, spawned=NOW - 1, pid=11)
    old = _ready(pool, spawned=NOW - 5, pid=12)
    _ready(pool, host='other', pid=13)
    assert pool.pick('nowhere', KEY, NOW) is None
    assert pool.pick('h', KEY, NOW) is old and pool.pick('h', KEY, NOW) is young


# (what the slot's files say: Ready fields changed, or None for no ready file), the state then
SEEN = [
    ({}, READY),
    ({'pid': 99}, DEAD),            # another process's ready file
    ({'run': 'run-0'}, DEAD),
    ({'key': OTHER}, DEAD),
]


@pytest.mark.parametrize('change, state', SEEN)
def test_a_ready_file_makes_a_slot_ready_only_if_it_is_its_own(change, state):
    pool = StandbyPool(RUN)
    slot = pool.new('h', KEY, NOW)
    pool.spawned(slot, 10, 'i')
    pool.seen(slot, None, None)
    assert slot.state == SPAWNING       # no ready file yet: still importing
    ready = dataclasses.replace(Ready(10, KEY, RUN, 2.0, 1), **change)
    pool.seen(slot, ready, NOW)
    assert slot.state == state and (slot.beat == NOW) == (state == READY)


def test_a_ready_slot_whose_file_went_is_dead_and_a_taken_one_is_left_alone():
    pool = StandbyPool(RUN)
    slot = _ready(pool)
    pool.seen(slot, None, None)
    assert slot.state == DEAD
    taken = _ready(pool, pid=11)
    assert pool.pick('h', KEY, NOW) is taken
    pool.seen(taken, None, None)
    assert taken.state == TAKEN
    pool.taken(taken)
    assert taken not in pool.slots.values()


# (what is changed of a ready slot, the state then: is it killed?)
DOOMED = [
    ({}, NOW, False),
    ({'state': DEAD}, NOW, True),
    ({'halted': True}, NOW, True),
    ({'beat': NOW - FRESH_SECS - 1}, NOW, True),
    ({'key': OTHER}, NOW, True),                                # the host wants another key now
    ({'run': 'run-0'}, NOW, True),
    ({'state': SPAWNING, 'beat': None}, NOW, False),            # importing
    ({'state': SPAWNING, 'beat': None}, NOW + SPAWN_SECS, True),   # stuck in its import
    ({'state': TAKEN}, NOW + 1000, False),                      # a task now, or being made one
]


@pytest.mark.parametrize('change, now, killed', DOOMED)
def test_doomed_names_every_standby_that_may_not_be_used(change, now, killed):
    pool = StandbyPool(RUN)
    slot = _ready(pool)
    for name, value in change.items():
        setattr(slot, name, value)
    assert (pool.doomed({'h': Want(1, KEY)}, now) == [slot]) == killed
    assert (slot in pool.slots.values()) != killed      # a doomed slot leaves the pool


def test_doomed_kills_the_standbys_of_a_host_that_wants_none_or_fewer():
    pool = StandbyPool(RUN)
    a, b, c = _ready(pool, pid=1, spawned=1), _ready(pool, pid=2, spawned=2), _ready(pool, 'gone', pid=3)
    assert pool.doomed({'h': Want(1, KEY)}, NOW) == [c, b]      # the youngest goes; 'gone' wants none
    assert list(pool.slots.values()) == [a]


# (slots on host h: states; what h wants; the spawns)
SPAWNS = [
    ((), 1, [('h', KEY)]),
    ((READY,), 1, []),
    ((READY,), 2, [('h', KEY)]),
    ((SPAWNING,), 2, []),                   # one spawning per host at a time
    ((READY, SPAWNING), 3, []),
    ((TAKEN, DEAD), 1, [('h', KEY)]),       # neither counts
    ((), 0, []),
]


@pytest.mark.parametrize('states, count, expected', SPAWNS)
def test_spawns_one_per_host_at_a_time_up_to_what_it_wants(states, count, expected):
    pool = StandbyPool(RUN)
    for i, state in enumerate(states):
        _ready(pool, pid=i + 1).state = state
    assert pool.spawns({'h': Want(count, KEY)}) == expected


def test_spawns_on_every_host_at_once_and_slot_ids_never_repeat():
    pool = StandbyPool(RUN, prefix='p7-')
    assert pool.spawns({'b': Want(1, KEY), 'a': Want(1, OTHER)}) == [('a', OTHER), ('b', KEY)]
    ids = {pool.new('a', KEY, NOW).slot for _ in range(3)}
    assert ids == {'p7-1', 'p7-2', 'p7-3'}


def test_views_and_counts_show_the_waiting_and_the_starting():
    pool = StandbyPool(RUN)
    _ready(pool, pid=5)
    pool.new('h', KEY, NOW)
    _ready(pool, pid=6).state = TAKEN
    views = pool.views()
    assert views == [('h', 5, 'ready'), ('h', 0, 'starting')]
    assert counts([{'host': h, 'pid': p, 'state': s} for h, p, s in views]) == (1, 1)


# (the (host, key) of each task; per host; what each host wants)
WANTS = [
    ([('a', KEY), ('a', KEY), ('a', OTHER)], 1, {'a': Want(1, KEY)}),     # the key most tasks need
    ([('a', OTHER), ('a', KEY)], 2, {'a': Want(2, OTHER)}),               # a tie: the first
    ([('a', None), ('b', KEY)], 1, {'b': Want(1, KEY)}),                  # no task a standby can become
    ([('a', KEY)], 0, {}),                                                # standby: 0
]


@pytest.mark.parametrize('keyed, per_host, expected', WANTS)
def test_a_host_keeps_the_key_most_of_its_tasks_need(keyed, per_host, expected):
    assert wants(keyed, per_host) == expected


def test_plan_key_is_the_import_key_and_none_for_what_no_standby_can_become(tmp_path):
    spec_file = tmp_path / 'spec.yaml'
    spec_file.write_text('cluster:\n  ps: [localhost:2222]\n  worker: [localhost:2223]\n')
    ps, worker = plan_cluster(load_spec(str(spec_file)))
    env = {'PYTHONPATH': '/x', 'TF_CONFIG': '{}'}
    assert ps.keras is False and worker.keras is False        # the built-in trainer: no Keras
    assert plan_key(worker, env) == import_key(worker.argv[0], worker.cwd, env, False)
    assert plan_key(worker, env) == plan_key(worker, {**env, 'TF_CONFIG': '{"other": 1}'})    # set at become
    assert plan_key(worker, env) != plan_key(worker, {**env, 'PYTHONPATH': '/y'})
    assert plan_key(dataclasses.replace(worker, keras=None), env) is None                    # a command
    assert plan_key(dataclasses.replace(worker, netns='tfcluster-x'), env) is None
    assert plan_key(dataclasses.replace(worker, argv=(worker.argv[0], '-m', 'cluster.rehearsal')), env) is None
