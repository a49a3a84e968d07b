"""supervise.standby: warm processes per host (0 turns them off), a whole number from the file or
`--set`; anything else is refused with the key's own line."""
from __future__ import annotations

import pytest

from cluster.spec import SpecError, load_spec

SPEC = 'cluster:\n  ps: [localhost:2222]\n  worker: [localhost:2223]\n'


def _load(tmp_path, text: str = SPEC, overrides: tuple[str, ...] = ()):
    path = tmp_path / 'spec.yaml'
    path.write_text(text)
    return load_spec(str(path), list(overrides))


def test_one_standby_per_host_by_default(tmp_path):
    assert _load(tmp_path).supervise.standby == 1


@pytest.mark.parametrize('text, overrides, expected', [
    (SPEC + 'supervise:\n  standby: 0\n', (), 0),
    (SPEC + 'supervise:\n  standby: 3\n', (), 3),
    (SPEC, ('supervise.standby=2',), 2),
    (SPEC + 'supervise:\n  standby: 3\n', ('supervise.standby=0',), 0),
])
def test_the_file_and_set_give_the_count(tmp_path, text, overrides, expected):
    assert _load(tmp_path, text, overrides).supervise.standby == expected


@pytest.mark.parametrize('value', ['-1', '1.5', 'many', 'true'])
def test_a_count_that_is_no_whole_number_is_refused_naming_the_key(tmp_path, value):
    with pytest.raises(SpecError, match=r'supervise\.standby'):
        _load(tmp_path, SPEC + f'supervise:\n  standby: {value}\n')
