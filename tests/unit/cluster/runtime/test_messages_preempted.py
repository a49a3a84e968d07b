"""The Preempted message (issue #41) both ways a launcher hears it: its record in the channel, and
its human line alone (compose, Slurm: no channel), with and without the step it came at."""
from __future__ import annotations

import pytest

from cluster.runtime import messages
from cluster.runtime.messages import Preempted, Reader

STAMP = '2026-11-28T20:00:00.000+00:00 I '


@pytest.mark.parametrize('message', [Preempted('worker:1', 30.0, 812), Preempted('ps:0', 2.5),
                                     Preempted('chief:0', 120.0, 0)])
def test_a_notice_reads_back_from_its_record_and_from_its_line(message):
    assert messages.read(messages.to_record(message)) == message
    assert messages.read(STAMP + message.human()) == message
    assert messages.as_shown(message) == message


def test_its_line_says_who_how_long_and_from_which_step():
    assert Preempted('ps:0', 30.0, 812).human() == \
        'ps:0: preemption notice (SIGTERM from outside the launcher) at global step 812: 30s to save and go'
    assert Preempted('ps:0', 30.0).human() == 'ps:0: preemption notice (SIGTERM from outside the launcher): ' \
                                              '30s to save and go'


def test_a_reader_with_a_channel_takes_the_record_at_the_line():
    message = Preempted('worker:1', 30.0, 40)
    reader = Reader(lambda: [messages.to_record(message)])
    assert reader.read(STAMP + message.human()) == message
    assert Reader().read(STAMP + message.human()) == message       # no channel: the line alone
