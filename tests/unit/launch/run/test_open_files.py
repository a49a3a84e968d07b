"""`launch up` and the launcher's open files (launch/run/preflight.py check_open_files): its soft
RLIMIT_NOFILE goes up to the hard limit, and a spec that needs more than the hard limit allows is
refused in one line naming the task count and the limit, before anything starts. The limits are
a fake `resource` module's: the test process's own stay as they are."""
from __future__ import annotations

import resource as real

import pytest

from launch.cli import main
from launch.run import preflight
from tests.conftest import write_spec
from tests.harness.documented import check_documented


class Limits:
    """RLIMIT_NOFILE as the fake reports it, and what was set."""
    RLIMIT_NOFILE = real.RLIMIT_NOFILE
    RLIM_INFINITY = real.RLIM_INFINITY

    def __init__(self, soft: int, hard: int) -> None:
        self.soft, self.hard = soft, hard
        self.set: list[tuple[int, int]] = []

    def getrlimit(self, which: int) -> tuple[int, int]:
        assert which == real.RLIMIT_NOFILE
        return self.soft, self.hard

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        assert which == real.RLIMIT_NOFILE
        self.set.append(limits)
        self.soft, self.hard = limits


@pytest.mark.parametrize('command', ['up', 'check'])
def test_a_spec_over_the_hard_limit_is_refused_in_one_line(tmp_path, capsys, monkeypatch, command):
    limits = Limits(64, 100)
    monkeypatch.setattr(preflight, 'resource', limits)
    spec = write_spec(tmp_path, workers=2)
    assert main([command, spec]) == 2
    out, err = capsys.readouterr()
    assert err.count('\n') == 1 and out == '', (out, err)
    need = preflight.files_needed(3)
    assert f'3 tasks need about {need} open files' in err and 'limit is 100 (ulimit -Hn)' in err, err
    check_documented('open-files-limit', err.strip().removeprefix('launch: error: '))
    assert not (tmp_path / 'run' / 'launch-state.json').exists()


def test_up_raises_the_soft_limit_to_the_hard_one(tmp_path, monkeypatch):
    limits = Limits(1024, 1 << 20)
    monkeypatch.setattr(preflight, 'resource', limits)
    spec = preflight.ClusterSpec.__new__(preflight.ClusterSpec)
    preflight.check_open_files(spec, 1000)
    assert limits.set == [(1 << 20, 1 << 20)]


def test_check_leaves_the_soft_limit_and_an_unlimited_hard_one_passes(monkeypatch):
    limits = Limits(1024, real.RLIM_INFINITY)
    monkeypatch.setattr(preflight, 'resource', limits)
    spec = preflight.ClusterSpec.__new__(preflight.ClusterSpec)
    preflight.check_open_files(spec, 100_000, raise_soft=False)
    assert limits.set == []


def test_the_need_grows_with_the_tasks():
    assert preflight.files_needed(1000) == 4 * 1000 + 256
