"""Every bad input a new user can give, through the real command lines: exit code 2 (bad input),
exactly one line on stderr naming the file and line, the key, the task or the host, and nothing
started or written (no task process, no train_dir). Each line is the one docs/errors.yaml documents
for it, with its cause and fix: the troubleshooting page is made from that file, and a case without
its entry, a changed message or an entry no test produces fails here."""
from __future__ import annotations

import os
import socket

import pytest

from tests.conftest import REPO, free_ports
from tests.harness.documented import check_documented, documented_entries, strip_prefix
from tests.harness.spec import BAD_SPECS, OVERRIDE_ERRORS
from tests.harness.bad_input import CASES, _coordinator, _spec


def test_the_table_is_long_enough():
    assert len(CASES) >= 40


# The errors checked against their entry by a test of their own in this file, beside CASES and the
# spec tables of tests/unit/cluster/spec/test_spec.py: entry id -> that test.
ALSO_DOCUMENTED = {
    'port-in-use': 'test_local_port_in_use_names_the_task',
    'port-taken-at-start': 'tests/system/cluster/runtime/test_task_group.py::test_two_runs_whose_ports_collide',
    'train-dir-held': 'test_a_held_train_dir_names_its_launcher',
    'data-file-unreadable': 'test_a_data_file_the_user_may_not_read_is_named_so_not_called_damaged',
    'run-gone': 'tests/unit/launch/records/test_run_index.py::test_a_run_whose_train_dir_is_gone_is_one_line',
    'compose-user-code': 'test_compose_plan_and_up_refuse_code_the_image_lacks_with_one_line',
    'eval-coordinator-run': 'test_eval_of_a_coordinator_run_says_what_its_checkpoints_hold',
    'open-files-limit': 'tests/unit/launch/run/test_open_files.py::test_a_spec_over_the_hard_limit_is_refused_in_one_line',
    'ray-not-installed': 'tests/unit/launch/backends/ray/test_kind.py::test_without_ray_installed_the_line_names_the_extra',
    'ray-client-address': 'tests/unit/launch/backends/ray/test_kind.py::test_a_ray_client_address_is_refused_in_one_line',
    'ray-no-cluster': 'tests/unit/launch/backends/ray/test_kind.py::test_nothing_at_the_address_is_one_line_naming_it',
    'ray-host-no-node': 'tests/system/launch/backends/test_ray.py::test_bad_input_is_one_line_and_places_nothing',
    'ray-gpus-over-cluster': 'tests/system/launch/backends/test_ray.py::test_bad_input_is_one_line_and_places_nothing',
    'host-labels-not-a-mapping': 'tests/unit/cluster/spec/test_host_labels.py::test_a_non_mapping_is_the_documented_line',
    'ray-labels-no-node': 'tests/unit/launch/backends/ray/test_labels.py::test_labels_no_node_has_are_the_documented_line',
    'labels-need-ray': 'tests/unit/launch/run/test_labels_place.py::test_another_backend_refuses_host_labels_in_one_line',
}


def _entries_produced() -> set[str]:
    return ({case[1] for case in CASES.values()} | {row[-1] for row in BAD_SPECS + OVERRIDE_ERRORS}
            | set(ALSO_DOCUMENTED))


def test_every_case_names_a_documented_error():
    """A bad input added to a table without its entry in docs/errors.yaml (line, cause, fix) fails
    here at once, in the fast tier; the slow test then checks the line itself."""
    missing = sorted(_entries_produced() - set(documented_entries()))
    assert not missing, f'not documented in docs/errors.yaml: {missing}'


def test_every_documented_error_is_produced_by_a_test():
    """The troubleshooting page lists no error that no test produces: an entry of docs/errors.yaml
    whose message went away, or that was never checked, fails here."""
    unused = sorted(set(documented_entries()) - _entries_produced())
    assert not unused, f'docs/errors.yaml documents errors no test produces: {unused}'


def test_a_line_must_match_its_entry_exactly_but_for_placeholders():
    """The check the tests rely on: placeholders stand for the variable parts, the rest is exact."""
    check_documented('port-in-use', 'specs/local2.yaml: worker:1: port 2224 on localhost is already in use')
    check_documented('not-positive-whole-number',
                     "--set train.steps=abc: train.steps: expected a positive whole number, got 'abc'")
    for wrong in ('specs/local2.yaml: worker:1: port 2224 on localhost is in use',       # changed words
                  'specs/local2.yaml: worker:1: port abc on localhost is already in use',  # a port is digits
                  'launch: error: specs/local2.yaml: worker:1: port 2224 on localhost is already in use'):
        with pytest.raises(AssertionError):
            check_documented('port-in-use', wrong)
    with pytest.raises(AssertionError, match='not documented'):
        check_documented('no-such-entry', 'anything')


def test_port_probe_survives_a_host_without_ipv6(monkeypatch):
    """A host with IPv6 disabled refuses AF_INET6 sockets; the port check falls back to IPv4."""
    from cluster import task
    real = socket.socket

    def no_ipv6(family=socket.AF_INET, *a, **kw):
        if family == socket.AF_INET6:
            raise OSError(97, 'Address family not supported by protocol')
        return real(family, *a, **kw)
    monkeypatch.setattr(socket, 'socket', no_ipv6)
    with real() as s:
        s.bind(('', 0))
        s.listen()
        assert task.port_in_use(s.getsockname()[1])
    assert not task.port_in_use(free_ports(1)[0])


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    """`launch ARGV` in this process (no process started): exit code, stdout, stderr."""
    from launch.cli import main
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize('train, missing', [
    ({'command': 'python my_train.py --steps 5'}, 'my_train.py'),
    ({'command': f'python {REPO}/examples/tf1_distributed.py'}, f'{REPO}/examples/tf1_distributed.py'),
    ({'command': 'python -m mytrain'}, 'the module mytrain'),
    ({'command': './train.sh'}, './train.sh'),
    ({'program': 'mytrain:train'}, 'the module mytrain'),
])
def test_compose_plan_and_up_refuse_code_the_image_lacks_with_one_line(tmp_path, capsys, train, missing):
    """The one decision (launch/run/registry.py check_user_code_place): `launch compose`, `plan
    --backend compose` and `up --backend compose` refuse code outside the image's examples/ with
    the same line, naming what is missing, exit 2, nothing written."""
    spec = _spec(tmp_path, train=train)
    before = set(os.listdir(tmp_path))
    said = set()
    for argv in (['compose', spec, '-o', str(tmp_path / 'compose.yaml')], ['plan', spec, '--backend', 'compose'],
                 ['up', spec, '--backend', 'compose']):
        code, out, err = _main(capsys, *argv)
        assert code == 2 and out == '' and len(err.splitlines()) == 1, (argv, code, out, err)
        said.add(err)
    line = strip_prefix(said.pop().rstrip('\n'))
    assert not said, 'the three commands said different things'
    check_documented('compose-user-code', line)
    assert f'only, not {missing}:' in line, line
    assert set(os.listdir(tmp_path)) == before


def test_compose_plan_and_up_accept_what_the_image_holds(tmp_path, capsys):
    """The image holds examples/: a command running a script there (examples/tf1-command.yaml)
    and the PSS examples are accepted by all three (`up` as far as the decision goes: it would
    start containers)."""
    from cluster.spec import load_spec
    from launch.run import launching
    (tmp_path / 'pss').mkdir()
    (tmp_path / 'inline').mkdir()
    specs = (os.path.join(REPO, 'examples', 'tf1-command.yaml'),
             _coordinator(tmp_path / 'pss', program='examples.pss_loop:train', evaluator='examples.pss_loop:evaluate'),
             _spec(tmp_path / 'inline', train={'command': 'python -c "print(1)"'}))
    for spec in specs:
        for argv in (['compose', spec, '-o', str(tmp_path / 'compose.yaml')], ['plan', spec, '--backend', 'compose']):
            code, out, err = _main(capsys, *argv)
            assert code == 0 and err == '', (argv, err)
        launching.check_user_code_place(load_spec(spec), 'up', 'compose')


def test_eval_of_a_coordinator_run_says_what_its_checkpoints_hold(tmp_path, capsys):
    """`launch eval` scores the built-in CIFAR-10 model; a coordinator run's checkpoints hold the
    user's own: one line that says so and where to evaluate them instead, before anything is read
    or written (no "trained on another data set?" guess)."""
    spec = _coordinator(tmp_path)
    before = set(os.listdir(tmp_path))
    code, out, err = _main(capsys, 'eval', spec)
    assert code == 2 and out == '' and len(err.splitlines()) == 1, (code, out, err)
    line = strip_prefix(err.rstrip('\n'))
    check_documented('eval-coordinator-run', line)
    assert 'train.program mytrain:train' in line and 'another data set' not in line, line
    assert set(os.listdir(tmp_path)) == before
