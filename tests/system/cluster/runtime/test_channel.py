"""A real local run's channels (cluster/runtime/messages.py): each task wrote its messages' records
beside its log, one for each message line of its log and in the same order, and the log itself holds
no record."""
from __future__ import annotations

import os

import pytest

from cluster.runtime import messages
from tests.conftest import launch, write_spec

pytestmark = pytest.mark.slow     # a real local cluster


def key(message: messages.Message | None) -> object:
    """What a line shows of a message (a progress line's words after the loss are not read back)."""
    return message.facts() if isinstance(message, messages.Progress) else message


def test_every_message_line_of_a_local_run_has_its_record_beside_it(tmp_path):
    spec = write_spec(tmp_path, steps=20)
    result = launch('up', spec)
    assert result.returncode == 0, result.stdout + result.stderr
    attempt = tmp_path / 'run' / 'logs' / 'attempt-1'
    for name in ('ps-0', 'worker-0', 'worker-1'):
        lines = (attempt / f'{name}.log').read_text().splitlines()
        records = (attempt / f'{name}.records').read_text().splitlines()
        assert records and all(messages.is_record(r) for r in records), records
        assert not any(messages.is_record(line) for line in lines)
        heard = [m for m in map(messages.read, lines) if m is not None]
        assert [key(messages.read(r)) for r in records] == [key(m) for m in heard]
    assert not [n for n in os.listdir(tmp_path / 'run' / 'logs') if n.endswith(messages.CHANNEL_SUFFIX)]
