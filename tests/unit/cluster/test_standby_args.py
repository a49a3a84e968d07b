"""The standby's pure parts (cluster/standby.py): its command line as the launcher builds it, the
lease rule, and the become files it refuses. No process is started (the fast tier's rule)."""
from __future__ import annotations

import json
import os

import pytest

from cluster import standby
from cluster.runtime.standby import Become, standby_argv


def test_the_command_line_standby_argv_builds_parses_back():
    argv = standby_argv('/usr/bin/python3', '/r/standby/h', '3', 'run-1', 'abc', True, '/r/lease', 10.0)
    assert argv[1:3] == ('-m', 'cluster.standby')
    args = standby.parse_args(argv[3:])
    assert args == standby.StandbyArgs('/r/standby/h', '3', 'run-1', 'abc', '/r/lease', 10.0, True)
    assert not standby.parse_args(standby_argv('p', 'd', '0', 'r', 'k', False, 'l', 2.5)[3:]).keras


@pytest.mark.parametrize('argv', [[], ['--dir', 'd', '--slot', '0', '--run', 'r', '--key', 'k', '--lease', 'l'],
                                  ['--dir', 'd', '--slot', '0', '--run', 'r', '--key', 'k', '--lease', 'l',
                                   '--lease-secs', '0']])
def test_a_command_line_without_a_setting_or_with_no_lease_time_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        standby.parse_args(argv)
    assert e.value.code == 2
    assert 'error' in capsys.readouterr().err


def test_the_lease_is_stale_once_older_than_its_seconds_and_a_missing_one_counts_from_the_start():
    assert not standby.lease_stale(touched=100.0, started=0.0, now=109.0, secs=10)
    assert standby.lease_stale(touched=100.0, started=0.0, now=111.0, secs=10)
    assert not standby.lease_stale(touched=None, started=50.0, now=59.0, secs=10)
    assert standby.lease_stale(touched=None, started=50.0, now=61.0, secs=10)


def good_become(tmp_path) -> dict:
    return {'argv': ['python', '-m', 'cluster.task', '--spec', 's.yaml', '--job', 'ps', '--index', '0'],
            'env': {'A': '1'}, 'cwd': str(tmp_path), 'log': str(tmp_path / 'ps-0.log')}


def test_a_become_file_is_read_and_unlinked(tmp_path):
    path = tmp_path / '0.become'
    path.write_text(json.dumps(good_become(tmp_path)))
    become = standby.read_become(str(path))
    assert become == Become(**{**good_become(tmp_path), 'argv': tuple(good_become(tmp_path)['argv'])})
    assert become.task_args() == ['--spec', 's.yaml', '--job', 'ps', '--index', '0']
    assert not path.exists()


@pytest.mark.parametrize('text', ['not json', '[1, 2]', json.dumps({'argv': ['python']}),
                                  'ARGV:python -m cluster.eval --spec s.yaml', 'ENV:{"A": 1}', 'CWD:7'])
def test_a_bad_become_file_is_a_value_error_that_names_it(tmp_path, text):
    path = tmp_path / '0.become'
    base = good_become(tmp_path)
    if text.startswith('ARGV:'):
        text = json.dumps({**base, 'argv': text[5:].split()})
    elif text.startswith('ENV:'):
        text = json.dumps({**base, 'env': json.loads(text[4:])})
    elif text.startswith('CWD:'):
        text = json.dumps({**base, 'cwd': int(text[4:])})
    path.write_text(text)
    with pytest.raises(ValueError, match=str(path)):
        standby.read_become(str(path))
    assert not os.path.exists(path)     # taken either way: it is never read twice
