"""A real SSH run's channels (cluster/runtime/messages.py, launch/run/supervised/channel.py), against
the real sshd of tests/harness/sshd.py: each remote task wrote its messages' records beside its log on
its host, one for each message line and in the same order; the launcher's reader, over SFTP, answers
each message line with its record; and the run's events are the ones the log's lines give.

The remote tasks run the task side of the installed checkout (sshd passes no PYTHONPATH), so this
holds wherever that checkout's `say` writes records (the launcher names the channel)."""
from __future__ import annotations

import json

import pytest

from cluster.runtime import messages
from cluster.spec import load_spec
from launch.backends.base import TaskRecord
from launch.backends.ssh import SSHBackend
from launch.planning.plan import plan_cluster
from launch.run.supervised.channel import ChannelReader
from tests.harness.ssh import assert_nothing_left, remote_spec, run, workdir

pytestmark = pytest.mark.slow     # a real sshd and a real cluster over it

FACTS = ('step', 'total', 'loss', 'images_per_sec', 'workers')      # a progress event's figures


def shown(message: messages.Message | None) -> object:
    """What a line shows of a message (a progress line's words after the loss are not read back)."""
    return message.facts() if isinstance(message, messages.Progress) else message


def test_remote_tasks_write_their_records_on_their_hosts_and_the_launcher_reads_them_over_sftp(ssh_hosts, tmp_path):
    spec_file = remote_spec(ssh_hosts, tmp_path)
    result = run(ssh_hosts, tmp_path, 'up', spec_file)
    assert result.returncode == 0, result.stdout + result.stderr
    spec = load_spec(spec_file)
    backend = SSHBackend(spec, ssh_config=str(ssh_hosts.ssh_config))
    said: dict[str, list[messages.Message]] = {}
    try:
        for plan in plan_cluster(spec):
            t = plan.task
            log = workdir(tmp_path, t.host) / 'run' / 'logs' / 'attempt-1' / f'{t.job}-{t.index}.log'
            records = (log.parent / f'{t.job}-{t.index}{messages.CHANNEL_SUFFIX}').read_text().splitlines()
            lines = log.read_text().splitlines()
            assert records and all(messages.is_record(r) for r in records), records
            assert not any(messages.is_record(line) for line in lines)
            heard = [m for m in map(messages.read, lines) if m is not None]
            assert [shown(messages.read(r)) for r in records] == [shown(m) for m in heard], t.name
            # The launcher's way: the channel and the log read over SFTP, each message line
            # answered with its record (a progress record keeps the words after the loss).
            record = TaskRecord(t.name, t.job, t.index, t.host, t.port, backend.name, 0, str(log))
            assert ChannelReader(backend, record)() == records
            reader = messages.Reader(ChannelReader(backend, record))
            said[t.name] = [m for m in map(reader.read, backend.read_log(record)) if m is not None]
            assert said[t.name] == [messages.read(r) for r in records], t.name
    finally:
        backend.close()
    events = [json.loads(line) for line in open(tmp_path / 'run' / 'events.jsonl')]
    chief = said['worker:0']
    progress = [{k: e[k] for k in FACTS if k in e} for e in events if e['event'] == 'progress']
    assert progress == [m.facts() for m in chief if isinstance(m, messages.Progress)]
    saved = [m.step for m in chief if isinstance(m, messages.Checkpoint)]
    once = [step for i, step in enumerate(saved) if i == 0 or step != saved[i - 1]]    # a stopping chief says it twice
    assert [e['step'] for e in events if e['event'] == 'checkpoint'] == once
    assert sorted(e['task'] for e in events if e['event'] == 'serving') == sorted(said)
    assert_nothing_left(ssh_hosts)
