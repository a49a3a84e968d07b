"""A Ray run's files on nodes that do not share the launcher's train_dir
(launch/backends/ray/files.py), without Ray: which paths on the node a launcher's path means, which
tasks count as private, what a RayTail writes to the mirror and gives as lines (offsets, lines
across chunks, one read outstanding, the drain at close), and the lease renewals' pace."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from cluster.spec import load_spec
from launch.backends.base import LEASE_ENV, TaskRecord
from launch.backends.ray import plan_ray
from launch.backends.ray.files import (FS_ENV, READ_SECS, RENEW_SECS, NodeDirs, NodeFiles, RayTail, dirs_of,
                                       forced_private, node_path)

HERE, ELSEWHERE = 'boot-a/net:[1]', 'boot-b/net:[1]'


@pytest.mark.parametrize('path, node', [
    ('runs/r/logs/attempt-1/worker-0.log', '/home/ray/tf/runs/r/logs/attempt-1/worker-0.log'),
    ('/work/p/runs/r/ckpt/checkpoint', '/home/ray/tf/runs/r/ckpt/checkpoint'),    # absolute, in the train_dir
    ('runs/r', '/home/ray/tf/runs/r'),
    ('data/train.csv', '/home/ray/tf/data/train.csv'),          # relative, not the train_dir's: from the cwd
    ('/datasets/cifar', '/datasets/cifar'),                     # absolute elsewhere: the same path there
    ('runs/rr/x', '/home/ray/tf/runs/rr/x'),                    # a sibling that only begins like the train_dir
])
def test_a_launchers_path_is_the_same_file_of_the_nodes_train_dir(path, node):
    assert node_path(path, '/work/p', '/home/ray/tf', '/work/p/runs/r', '/home/ray/tf/runs/r') == node


def test_only_private_forces_the_private_path():
    assert forced_private({FS_ENV: 'private'}) and forced_private({FS_ENV: ' Private\n'})
    assert not forced_private({}) and not forced_private({FS_ENV: 'shared'})


def test_the_handle_keeps_where_the_files_lie():
    dirs = NodeDirs('n1', '10.0.0.2', '/home/ray/tf', '/home/ray/tf/runs/r', '/work/p/runs/r')
    record = TaskRecord(name='worker:0', job='worker', index=0, host='h', port=1, backend='ray', pid=1, log='l',
                        handle={'actor': 'a', 'private': {**vars(dirs)}})
    assert dirs_of(record) == dirs
    assert dirs_of(TaskRecord(name='ps:0', job='ps', index=0, host='h', port=1, backend='ray', pid=1, log='l',
                              handle={'actor': 'a', 'private': {}})) is None


# -- RayTail ------------------------------------------------------------------------------------------
@dataclass
class FakeNode:
    """A node's file, read through tickets answered when the test says (`answer`)."""
    data: bytes = b''
    asked: list[tuple[int, int]] = field(default_factory=list)
    answered: set[int] = field(default_factory=set)
    failing: bool = False

    gone: bool = False

    def ask(self, offset: int, size: int) -> int:
        if self.gone:
            raise KeyError('worker:0')      # no actor left to ask (the backend closed)
        self.asked.append((offset, size))
        return len(self.asked) - 1

    def ready(self, ticket: int) -> bool:
        return ticket in self.answered

    def take(self, ticket: int) -> bytes | None:
        if self.failing:
            raise ConnectionError('its node left the Ray cluster')
        offset, size = self.asked[ticket]
        return self.data[offset:offset + min(size, 7)]      # small chunks: lines cross them

    def answer(self) -> None:
        self.answered.add(len(self.asked) - 1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _tail(tmp_path, node: FakeNode, offset: int = 0):
    clock = Clock()
    return RayTail(node, str(tmp_path / 'worker-0.log'), offset, clock=clock), clock


def _drain(tail: RayTail, node: FakeNode, clock: Clock, rounds: int = 50) -> list[str]:
    lines: list[str] = []
    for _ in range(rounds):
        node.answer()
        clock.now += READ_SECS
        lines += tail.poll()
    return lines


def test_the_tail_mirrors_the_node_file_byte_for_byte_and_gives_its_lines(tmp_path):
    node = FakeNode(b'first line\nserving at 127.0.0.2:2222\npartial')
    tail, clock = _tail(tmp_path, node)
    lines = _drain(tail, node, clock)
    assert lines == ['first line', 'serving at 127.0.0.2:2222']        # the partial line waits
    node.data += b' and done\n'
    assert _drain(tail, node, clock) == ['partial and done']
    assert (tmp_path / 'worker-0.log').read_bytes() == node.data
    assert not tail.ended


def test_one_read_is_outstanding_and_an_empty_one_waits_before_the_next(tmp_path):
    node = FakeNode()
    tail, clock = _tail(tmp_path, node)
    assert tail.poll() == [] and len(node.asked) == 1
    assert tail.poll() == [] and len(node.asked) == 1       # not answered: not asked again
    node.answer()
    assert tail.poll() == [] and len(node.asked) == 1       # answered empty: asked again only later
    clock.now += READ_SECS
    tail.poll()
    assert len(node.asked) == 2


def test_a_restart_appends_at_the_offset_it_started_at(tmp_path):
    earlier = b'the first start\n'
    (tmp_path / 'worker-0.log').write_bytes(earlier)
    node = FakeNode(earlier + b'the second start\n')
    tail, clock = _tail(tmp_path, node, offset=len(earlier))
    assert _drain(tail, node, clock) == ['the second start']
    assert node.asked[0][0] == len(earlier)
    assert (tmp_path / 'worker-0.log').read_bytes() == node.data


def test_a_closed_tail_reads_to_the_end_then_ends(tmp_path):
    node = FakeNode(b'a\nb\nthe last line has no newline')
    tail, clock = _tail(tmp_path, node)
    tail.poll()
    tail.close()
    lines = _drain(tail, node, clock)
    assert lines == ['a', 'b', 'the last line has no newline'] and tail.ended
    assert tail.poll() == []


def test_an_empty_read_asked_before_the_close_does_not_end_it(tmp_path):
    node = FakeNode()
    tail, clock = _tail(tmp_path, node)
    tail.poll()                     # asked while open
    tail.close()
    node.answered.add(0)                    # that read found nothing
    assert tail.poll() == [] and not tail.ended
    node.data = b'written meanwhile\n'     # before the close: the next read finds it
    assert _drain(tail, node, clock) == ['written meanwhile'] and tail.ended


def test_a_node_that_cannot_be_read_ends_the_tail_once_closed(tmp_path):
    node = FakeNode(b'one\n')
    tail, clock = _tail(tmp_path, node)
    assert _drain(tail, node, clock, 3) == ['one']
    node.failing = True
    assert _drain(tail, node, clock, 3) == [] and not tail.ended      # still running: asked again
    tail.close()
    _drain(tail, node, clock, 3)
    assert tail.ended


def test_a_tail_whose_actor_is_gone_ends_once_closed(tmp_path):
    node = FakeNode(b'one\n')
    tail, clock = _tail(tmp_path, node)
    assert _drain(tail, node, clock, 3) == ['one']
    node.gone = True
    assert _drain(tail, node, clock, 3) == [] and not tail.ended
    tail.close()
    assert _drain(tail, node, clock, 3) == [] and tail.ended


# -- NodeFiles ----------------------------------------------------------------------------------------
SPEC = ('cluster:\n  ps: ["127.0.0.2:2222"]\n  worker: ["127.0.0.2:2223", "127.0.0.3:2224"]\n'
        'hosts:\n  127.0.0.3: {workdir: /scratch/tf}\n'
        'train: {steps: 5, train_dir: runs/r}\n')


def _facts(machine: str, shared: bool, node: str) -> dict:
    return {'node_id': f'id-{node}', 'address': node, 'machine': machine, 'shared': shared, 'home': '/home/ray'}


@pytest.fixture
def spec(tmp_path, monkeypatch):
    (tmp_path / 'spec.yaml').write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    return load_spec(str(tmp_path / 'spec.yaml'))


def test_a_node_that_shares_the_train_dir_keeps_its_files_here(spec):
    files = NodeFiles(spec, {}, lambda: None, lambda r: None)
    facts = {'ps:0': _facts(ELSEWHERE, True, '127.0.0.2'), 'worker:0': _facts(ELSEWHERE, True, '127.0.0.2'),
             'worker:1': _facts(ELSEWHERE, False, '127.0.0.3')}
    assert files.place(facts, HERE, {}) == ['127.0.0.3']
    assert list(files.nodes) == ['worker:1']
    assert files.nodes['worker:1'] == NodeDirs('id-127.0.0.3', '127.0.0.3', '/scratch/tf', '/scratch/tf/runs/r',
                                               os.path.abspath('runs/r'))


def test_the_switch_makes_every_node_private_and_the_home_holds_the_default_workdir(spec):
    files = NodeFiles(spec, {}, lambda: None, lambda r: None)
    facts = {name: _facts(HERE, True, '127.0.0.2') for name in ('ps:0', 'worker:0', 'worker:1')}
    assert files.place(facts, HERE, {FS_ENV: 'private'}) == ['127.0.0.2']
    assert files.nodes['ps:0'].cwd == '/home/ray/tfcluster' and files.nodes['worker:1'].cwd == '/scratch/tf'


@pytest.mark.parametrize('workdir, train_dir, private', [
    ('{cwd}', 'runs/r', False),             # the node's workdir is the launcher's folder
    ('/scratch/tf', '{cwd}/runs/r', False),   # an absolute train_dir: the very folder on this machine
    ('/scratch/tf', 'runs/r', True),
])
def test_a_node_of_this_machine_whose_train_dir_is_the_launchers_is_not_private(tmp_path, monkeypatch, workdir,
                                                                                 train_dir, private):
    """The switch on one machine: a mirror of a file onto itself would copy it without end."""
    cwd = str(tmp_path)
    (tmp_path / 'spec.yaml').write_text(
        'cluster:\n  ps: ["127.0.0.3:2222"]\n  worker: ["127.0.0.3:2223"]\n'
        f'hosts:\n  127.0.0.3: {{workdir: "{workdir.format(cwd=cwd)}"}}\n'
        f'train: {{steps: 5, train_dir: "{train_dir.format(cwd=cwd)}"}}\n')
    monkeypatch.chdir(tmp_path)
    files = NodeFiles(load_spec(str(tmp_path / 'spec.yaml')), {}, lambda: None, lambda r: None)
    files.place({'ps:0': _facts(HERE, True, '127.0.0.3')}, HERE, {FS_ENV: 'private'})
    assert ('ps:0' in files.nodes) == private
    files.place({'worker:0': _facts(ELSEWHERE, False, '127.0.0.3')}, HERE, {})
    assert 'worker:0' in files.nodes        # another machine: its folder of that name is its own


class FakeRef:
    def __init__(self) -> None:
        self.done = False


class FakeMethod:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def remote(self, *args):
        ref = FakeRef()
        self.calls.append((args, ref))
        return ref


class FakeActor:
    def __init__(self) -> None:
        self.calls: list = []
        self.renew = FakeMethod(self.calls)


class FakeRay:
    @staticmethod
    def wait(refs, timeout=None):
        return [r for r in refs if r.done], [r for r in refs if not r.done]


def test_a_private_nodes_leases_are_renewed_by_one_actor_at_sshs_pace(spec, tmp_path, monkeypatch):
    actors = {name: FakeActor() for name in ('ps:0', 'worker:0', 'worker:1')}
    files = NodeFiles(spec, actors, lambda: FakeRay, lambda r: None)
    files.place({'ps:0': _facts(ELSEWHERE, False, '127.0.0.2'), 'worker:0': _facts(ELSEWHERE, False, '127.0.0.2'),
                 'worker:1': _facts(HERE, True, '127.0.0.3')}, HERE, {})
    plans = list(plan_ray(spec, str(tmp_path)))
    now = [1000.0]
    monkeypatch.setattr('launch.backends.ray.files.time.monotonic', lambda: now[0])
    files.renew(plans)
    assert [len(a.calls) for a in actors.values()] == [1, 0, 0]        # one call for the node's two tasks
    sent, ref = actors['ps:0'].calls[0]
    assert [p.cwd for p in sent[0]] == ['/home/ray/tfcluster'] * 2 and sent[1] is None
    assert os.path.exists(os.path.join(tmp_path, plans[2].env[LEASE_ENV]))     # the shared task's: here
    files.renew(plans)
    now[0] += RENEW_SECS
    files.renew(plans)
    assert len(actors['ps:0'].calls) == 1           # the last one not answered (a frozen node): not piled up
    ref.done = True
    files.renew(plans)
    assert len(actors['ps:0'].calls) == 2
    files.renew(plans, text='worker:0')             # the live workers changed: at once
    assert actors['ps:0'].calls[-1][0][1] == 'worker:0' and len(actors['ps:0'].calls) == 3


def test_a_private_task_starts_in_its_workdir_and_its_record_names_the_mirror(spec, tmp_path):
    files = NodeFiles(spec, {}, lambda: None, lambda r: None)
    files.place({'ps:0': _facts(HERE, True, '127.0.0.2'), 'worker:0': _facts(HERE, True, '127.0.0.2'),
                 'worker:1': _facts(ELSEWHERE, False, '127.0.0.3')}, HERE, {})
    ps, worker = plan_ray(spec, str(tmp_path))[0], plan_ray(spec, str(tmp_path))[2]
    assert files.to_start(ps) == ps                     # shared: as planned
    there = files.to_start(worker)
    assert there.cwd == '/scratch/tf' and there.argv[there.argv.index('--spec') + 1] == '/scratch/tf/runs/r/spec.yaml'
    on_node = TaskRecord(name='worker:1', job='worker', index=1, host='127.0.0.3', port=2224, backend='ray', pid=7,
                         log='/scratch/tf/runs/r/logs/attempt-1/worker-1.log', cwd='/scratch/tf', log_offset=0)
    kept = files.started(on_node, worker)
    assert kept.log == str(tmp_path / 'runs' / 'r' / 'logs' / 'attempt-1' / 'worker-1.log') and kept.cwd == str(tmp_path)
    assert os.path.realpath(tmp_path / 'runs' / 'r' / 'logs' / 'worker-1.log') == kept.log     # linked, as locally
    assert files.private('worker:1')['node_dir'] == '/scratch/tf/runs/r' and files.private('ps:0') == {}


class Reader:
    """An actor's read_text, answering from a dict of the node's files."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files, self.asked = files, []
        self.read_text = self

    def remote(self, path):
        self.asked.append(path)
        return self.files.get(path)


class GetRay:
    @staticmethod
    def get(ref, timeout=None):
        return ref


def test_a_private_tasks_small_files_are_read_on_its_node_by_this_launcher_and_by_another(spec, tmp_path):
    """The launcher reads through its own actor; `launch debug` (another process) through the
    actor the record's handle leads to; a shared task's file, and a record of no actor, here."""
    node_file = '/scratch/tf/runs/r/stacks/attempt-1/worker-1.txt'
    actor = Reader({node_file: 'Thread 0x1 (most recent call first)'})
    files = NodeFiles(spec, {'worker:1': actor}, lambda: GetRay, lambda r: None)
    files.place({'worker:1': _facts(ELSEWHERE, False, '127.0.0.3')}, HERE, {})
    record = TaskRecord(name='worker:1', job='worker', index=1, host='127.0.0.3', port=2224, backend='ray', pid=7,
                        log=str(tmp_path / 'runs/r/logs/attempt-1/worker-1.log'), cwd=str(tmp_path),
                        handle={'private': files.private('worker:1')})
    assert files.read_file(record, 'runs/r/stacks/attempt-1/worker-1.txt').startswith('Thread')
    elsewhere = NodeFiles(spec, {}, lambda: GetRay, lambda r: actor)     # found by its name, as `launch debug` does
    assert elsewhere.read_file(record, 'runs/r/stacks/attempt-1/worker-1.txt').startswith('Thread')
    assert actor.asked == [node_file, node_file]
    gone = NodeFiles(spec, {}, lambda: GetRay, lambda r: None)
    (tmp_path / 'runs' / 'r').mkdir(parents=True)
    (tmp_path / 'runs' / 'r' / 'checkpoint').write_text('model_checkpoint_path: "model.ckpt-20"\n')
    assert gone.read_file(record, 'runs/r/checkpoint').startswith('model_checkpoint_path')
