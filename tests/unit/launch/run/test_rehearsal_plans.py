"""`launch up --rehearse` on the launcher's side (launch/run/rehearsal.py): the plans, the
backends it refuses, and the stand-ins' findings gathered from their channels."""
from __future__ import annotations

import dataclasses
import os

import pytest

from cluster.rehearsal.messages import Link, Links
from cluster.runtime import messages
from cluster.spec import load_spec
from launch.backends.base import planned_record
from launch.backends.local import LocalBackend
from launch.cli import FLAGS, parse_args
from launch.errors import UsageError
from launch.planning.plan import plan_cluster
from launch.run import rehearsal
from tests.conftest import write_spec


def test_every_plan_runs_its_stand_in_and_nothing_else_changes(tmp_path):
    spec = load_spec(write_spec(tmp_path, workers=3, ps=2))
    plans = plan_cluster(spec)
    for real, stand_in in zip(plans, rehearsal.stand_ins(plans)):
        assert stand_in.argv[1:3] == ('-m', 'cluster.rehearsal')
        assert dataclasses.replace(stand_in, argv=real.argv) == real


def test_the_flag_reaches_up_and_is_off_by_default(tmp_path):
    spec = write_spec(tmp_path)
    assert FLAGS['up'](parse_args(['up', spec, '--rehearse'])).rehearse is True
    assert FLAGS['up'](parse_args(['up', spec])).rehearse is False


class Blind:
    records_channel = False


def test_a_backend_that_reads_no_channel_is_refused():
    with pytest.raises(UsageError, match='--rehearse: the compose backend'):
        rehearsal.check_backends({'local': LocalBackend(), 'compose': Blind()})
    rehearsal.check_backends({'local': LocalBackend()})


def test_the_findings_come_from_each_stand_ins_channel(tmp_path):
    spec = load_spec(write_spec(tmp_path, workers=2, ps=1))
    backend = LocalBackend()
    records = []
    for plan in plan_cluster(spec):
        record = planned_record(plan, plan.attempt_log_path, os.getcwd(), 'local')
        records.append(record)
        os.makedirs(os.path.dirname(record.log), exist_ok=True)
        if plan.name == 'worker:0':
            said = Links('worker:0', (Link('ps:0', plan.endpoint, 0.3, 150.0),))
            with open(messages.channel_beside(record.log), 'w') as f:
                f.write(messages.to_record(messages.Checkpoint(2)) + '\n' + said.to_record() + '\n')
    found = rehearsal.collect(spec, records, {'local': backend})
    assert found.tasks == 3 and found.unreported == ['worker:1']
    assert [(x.source, x.target, x.rtt_ms, x.mb_per_s, x.error) for x in found.links or ()] == \
        [('worker:0', 'ps:0', 0.3, 150.0, '')]
