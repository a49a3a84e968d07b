"""Inputs that cannot work are refused up front, in one line (issue 19): a spec file too big to be
one (or a device that never ends), YAML aliases that expand without bound, bytes that are not
UTF-8, a batch no memory here can hold, and a `train.program` that is not a function of a context.
The fast tests call the pure parts; the slow ones run the real `launch up` (memory-capped, so the
old behaviour fails the test instead of eating the machine) and a worker started by hand."""
from __future__ import annotations

import os
import sys
import textwrap
import threading
import time

import pytest

from cluster.checks import memory
from cluster.training import model
from cluster.spec import reader as spec_module      # its limits, patched lower here
from cluster.checks.code import ProgramError, check_program
from cluster.program import load_program, signature_problem
from cluster.spec import MAX_SPEC_BYTES, SpecError, load_spec, parse_override
from tests.harness.spec_bounds import _laughs, _valid, _write


def _one_line(e) -> str:
    text = str(e.value if hasattr(e, 'value') else e)
    assert '\n' not in text, text
    return text


# ---------------------------------------------------------------------------------------------
# The spec file: size, aliases, encoding

def test_a_spec_file_over_1_mib_is_refused_without_reading_it(tmp_path):
    path = _write(tmp_path, '#' * (MAX_SPEC_BYTES + 1))
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert _one_line(e).startswith(f'{path}: spec file is 1,048,577 bytes, over the limit of 1,048,576')


def test_a_pipe_is_read_no_further_than_the_limit(tmp_path):
    """A FIFO (or a device: /dev/zero, in the slow test below) has no size to ask: it is read up
    to the limit and no further. The writer here stops after the limit, so the old reader (to
    the end, however far) fails this test without eating the machine's memory."""
    fifo = str(tmp_path / 'spec.fifo')
    os.mkfifo(fifo)

    def write():
        with open(fifo, 'wb') as f:
            try:
                f.write(b'#' * (MAX_SPEC_BYTES + 4096))
            except BrokenPipeError:     # the reader stopped at the limit and closed its end
                pass
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with pytest.raises(SpecError) as e:
        load_spec(fifo)
    writer.join(10)
    assert _one_line(e) == f'{fifo}: more than 1,048,576 bytes (1 MiB) to read, the limit for a spec: a spec is ' \
                           'a short YAML file'


def test_a_fifo_without_a_writer_does_not_hang(tmp_path, monkeypatch):
    """Opening a FIFO for reading waits for a writer; the spec reader waits SPEC_READ_SECS at most."""
    monkeypatch.setattr(spec_module, 'SPEC_READ_SECS', 0.5)
    fifo = str(tmp_path / 'spec.fifo')
    os.mkfifo(fifo)
    out = []
    reader = threading.Thread(target=lambda: out.append(pytest.raises(SpecError, load_spec, fifo)), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():       # let the stuck open() go, then fail
        with open(fifo, 'w'):
            pass
        pytest.fail('load_spec waited for a writer of the FIFO')
    assert _one_line(out[0]) == f'{fifo}: nothing more to read after 0.5s (0 bytes read): a spec is a file, or a ' \
                                'pipe whose writer ends'


def test_a_fifo_whose_writer_comes_later_is_read(tmp_path):
    fifo = str(tmp_path / 'spec.fifo')
    os.mkfifo(fifo)

    def write():
        time.sleep(0.3)
        with open(fifo, 'w') as f:
            f.write('cluster: {ps: [localhost:3001], worker: [localhost:3002]}\n')
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert load_spec(fifo).num_workers == 1
    writer.join(10)


def test_billion_laughs_is_refused_at_the_line_and_key_where_it_multiplies(tmp_path):
    """Six levels of nine: 597,871 values once expanded. Walking them (as the origins of every
    key did) took seconds and hundreds of MB; nine levels took all the memory there was."""
    path = _write(tmp_path, _laughs(6))
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert _one_line(e) == (f'{path}:6: f: holds 597,871 values once its YAML aliases (*name) are expanded; '
                            'a spec holds at most 100,000')


def test_billion_laughs_in_a_key_the_spec_knows(tmp_path):
    text = _laughs(5) + 'cluster:\n  ps: [*e, *e]\n'
    path = _write(tmp_path, text)
    with pytest.raises(SpecError, match=rf'^{path}:7: cluster\.ps: holds 132,861 values') as e:
        load_spec(path)
    _one_line(e)


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    path = _write(tmp_path, 'cluster: &c\n  ps: [*c]\n')
    with pytest.raises(SpecError, match='a spec cannot be a cycle') as e:
        load_spec(path)
    assert _one_line(e).startswith(f'{path}:1: ')


def test_too_many_values_stop_the_reading_early(tmp_path, monkeypatch):
    """A flat list of half a million items fits in 1 MiB; composing it took PyYAML 44 s. Reading
    stops at the limit (lowered here to keep the test fast)."""
    monkeypatch.setattr(spec_module, 'MAX_SPEC_VALUES', 1000)
    path = _write(tmp_path, 'cluster:\n  ps:\n' + ''.join(f'    - localhost:{i}\n' for i in range(1, 2000)))
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert _one_line(e) == f'{path}:998: more than 1,000 values by this line; a spec holds at most 1,000'


def test_nesting_too_deep_to_read_is_one_line(tmp_path):
    path = _write(tmp_path, 'cluster: ' + '[' * 3000 + ']' * 3000 + '\n')
    with pytest.raises(SpecError, match='YAML nested too deeply to read') as e:
        load_spec(path)
    assert _one_line(e).startswith(f'{path}:1: ')


def test_a_set_value_has_the_same_limits(monkeypatch):
    monkeypatch.setattr(spec_module, 'MAX_SPEC_VALUES', 50)
    with pytest.raises(SpecError, match=r'^--set train.steps=\[&a .*: holds 122 values once its YAML aliases') as e:
        parse_override('train.steps=[&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], ' + ', '.join(['*a'] * 10) + ']')
    _one_line(e)
    with pytest.raises(SpecError, match='a spec cannot be a cycle'):
        parse_override('train.steps=&a [*a]')
    with pytest.raises(SpecError, match=r'^--set train.steps=\[1: the value is not valid YAML$'):
        parse_override('train.steps=[1')


def test_bytes_that_are_not_utf8_name_their_line_and_column(tmp_path):
    path = _write(tmp_path, b'cluster:\n  ps: [a:1]\n  worker: [\xff]\n')
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert _one_line(e) == f'{path}:3: not a YAML spec: byte 32 (line 3, column 12) is not UTF-8 text'


def test_a_control_character_names_its_line(tmp_path):
    path = _write(tmp_path, b'cluster:\n  ps: [a:1]\n  worker: [\x01]\n')
    with pytest.raises(SpecError) as e:
        load_spec(path)
    assert _one_line(e).startswith(f'{path}:3: YAML syntax error: unacceptable character #x0001')


def test_an_ordinary_spec_with_anchors_still_loads(tmp_path):
    path = _write(tmp_path, 'cluster:\n  ps: &hosts [localhost:3001]\n  worker: [localhost:3002, localhost:3003]\n'
                            'train: &t {steps: 7}\n')
    spec = load_spec(path)
    assert spec.num_workers == 2 and spec.train.steps == 7
    assert spec.error('train.steps', 'x').args[0].startswith(f'{path}:4: ')


# ---------------------------------------------------------------------------------------------
# A batch that no memory here can hold

@pytest.fixture(scope='module')
def tf():
    """TensorFlow, imported before the test (its import runs `uname -p`, a process)."""
    import tensorflow
    return tensorflow


def test_the_estimate_counts_the_layers_of_the_model(tf):
    """The activations counted are the outputs of the graph's own layers (built, not run)."""
    with tf.Graph().as_default() as graph:
        images = tf.zeros([1, 24, 24, 3])
        logits, _ = model.inference(images)
        kept = [images, logits] + [op.outputs[0] for op in graph.get_operations()
                                   if op.type in ('Relu', 'MaxPool', 'LRN')]
        floats = sum(t.shape.num_elements() for t in kept)
    assert len(kept) == 2 + 4 + 2 + 2
    assert floats == memory.activation_floats_per_example() == 78_346
    assert memory.BYTES_PER_EXAMPLE == 313_384


@pytest.mark.parametrize('batch, towers, host, refused', [
    (128, 1, 4 << 30, False),
    (10_000_000, 1, 24 << 30, True),
    (70_000, 1, 24 << 30, False),
    (70_000, 2, 24 << 30, True),            # both towers hold their activations at once
    (10_000_000, 0, 24 << 30, False),       # GPU towers: not host memory
    (10_000_000, 1, None, False),           # unknown memory: no refusal on a guess
    (1, 1, 256 << 20, True),                # not even TensorFlow fits
])
def test_batch_memory_refusal(batch, towers, host, refused):
    why = memory.batch_memory_refusal(batch, towers, host)
    assert (why is not None) == refused, why
    if why:
        assert '\n' not in why and f'a batch of {batch:,}' in why and 'at most about' in why


def test_the_refusal_says_what_would_fit():
    why = memory.batch_memory_refusal(10_000_000, 1, 24 << 30)
    most = int(why.split('at most about ')[1].split()[0].replace(',', ''))
    assert memory.worker_bytes(most, 1) <= 24 << 30 < memory.worker_bytes(most + 1, 1)
    assert 'needs at least 2919.1 GiB' in why and 'this machine has 24.0 GiB' in why


def test_host_memory_is_read_from_meminfo(tmp_path):
    path = _write(tmp_path, 'MemTotal:       24684096 kB\nMemFree:         1000 kB\n', 'meminfo')
    assert memory.host_memory_bytes(path) == 24684096 * 1024
    assert memory.host_memory_bytes(str(tmp_path / 'none')) is None
    assert memory.host_memory_bytes() is None or memory.host_memory_bytes() > 0


@pytest.mark.parametrize('devices, gpus, towers', [
    ('auto', 0, 1), ('auto', 2, 0), (3, 0, 3), (('gpu:0', 'gpu:1'), 2, 0), (('cpu:0', 'gpu:0', 'cpu:1'), 1, 2)])
def test_host_towers(devices, gpus, towers):
    assert memory.host_towers(devices, gpus) == towers


def test_check_batch_memory_names_the_line_or_the_set(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, 'host_memory_bytes', lambda meminfo=None: 8 << 30)
    monkeypatch.setattr(memory, 'gpus_here', lambda: 0)
    path = _valid(tmp_path, batch_size=10_000_000)
    spec = load_spec(path)
    line = next(i for i, text in enumerate(open(path), 1) if 'batch_size' in text)
    with pytest.raises(SpecError) as e:
        memory.check_batch_memory(spec, spec.tasks)
    assert _one_line(e).startswith(f'{path}:{line}: train.batch_size: a batch of 10,000,000 needs at least')
    spec = load_spec(_valid(tmp_path), ['train.batch_size=10000000'])
    with pytest.raises(SpecError, match=r'^--set train.batch_size=10000000: train.batch_size: a batch of'):
        memory.check_batch_memory(spec, spec.tasks)
    memory.check_batch_memory(spec, spec.job_tasks('ps'))          # no worker on this machine
    memory.check_batch_memory(load_spec(_valid(tmp_path), ['train.batch_size=128']), spec.tasks)
    program = load_spec(_valid(tmp_path, batch_size=10_000_000, program='examples.linear_program:train'))
    memory.check_batch_memory(program, program.tasks)               # the user's memory is the user's


# ---------------------------------------------------------------------------------------------
# train.program: a function of the context, checked without running it

@pytest.fixture
def programs(tmp_path, monkeypatch):
    (tmp_path / 'progs.py').write_text(textwrap.dedent('''\
        open(__file__ + '.ran', 'w').close()      # would show that checking imported it
        import functools
        from os import system as imported
        assigned = len
        def train(ctx):
            pass
        def defaults(ctx, steps=3, *args, flag=True, **kw):
            pass
        def star(*args):
            pass
        def nothing():
            pass
        def two(ctx, other):
            pass
        def keyword(ctx, *, must):
            pass
        async def coroutine(ctx):
            pass
        class Trainer:
            def __init__(self, ctx):
                pass
        @functools.lru_cache
        def decorated(a, b):
            pass
        if True:
            def guarded():
                pass
        else:
            def guarded(ctx):
                pass
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop('progs', None)


@pytest.mark.parametrize('name', ['train', 'defaults', 'star', 'imported', 'assigned', 'decorated', 'guarded'])
def test_a_program_that_may_be_a_function_of_ctx_is_accepted_by_the_check(programs, name):
    check_program(f'progs:{name}', [str(programs)])
    assert not (programs / 'progs.py.ran').exists()


@pytest.mark.parametrize('name, why', [
    ('nothing', 'progs.nothing ({}:11) takes (), not one argument'),
    ('two', 'progs.two ({}:13) takes (ctx, other), not one argument'),
    ('keyword', 'progs.keyword ({}:15) takes (ctx, *, must), not one argument'),
    ('coroutine', 'progs.coroutine ({}:17) is an async def'),
    ('Trainer', 'progs.Trainer ({}:19) is a class'),
])
def test_a_def_of_the_wrong_shape_is_refused_naming_it(programs, name, why):
    with pytest.raises(ProgramError) as e:
        check_program(f'progs:{name}', [str(programs)])
    assert _one_line(e).startswith(why.format(programs / 'progs.py'))
    assert 'def train(ctx)' in str(e.value)
    assert not (programs / 'progs.py.ran').exists()


@pytest.mark.parametrize('ref, kind', [('os:system', 'frozen'), ('sys:exit', 'built-in'), ('math:sqrt', 'compiled')])
def test_a_function_without_python_source_cannot_be_checked_so_it_is_refused(ref, kind):
    module, function = ref.split(':')
    with pytest.raises(ProgramError) as e:
        check_program(ref)
    assert _one_line(e) == (f"module {module!r} has no Python source ({kind}), so {function!r} cannot be checked "
                            'without running it: a program is a Python function `def train(ctx)` in a .py module '
                            '(docs/own-code.md)')


@pytest.mark.parametrize('name, why', [
    ('imported', 'progs.imported is a built-in function, not a Python def'),
    ('assigned', 'progs.assigned is a built-in function, not a Python def'),
    ('decorated', 'progs.decorated takes (a, b), not one argument'),
    ('guarded', 'progs.guarded takes (), not one argument'),
])
def test_what_the_check_could_not_tell_the_worker_refuses_before_calling_it(programs, name, why):
    with pytest.raises(ProgramError) as e:
        load_program(f'progs:{name}')
    assert _one_line(e).startswith(why) and 'def train(ctx)' in str(e.value)
    assert load_program('progs:train').__name__ == 'train'


@pytest.mark.parametrize('fn, ok', [
    (lambda ctx: None, True), (lambda ctx, n=1: None, True), (lambda *a: None, True), (lambda: None, False),
    (lambda a, b: None, False), (os.system, False), (print, False), (dict, False), (str.upper, False),
])
def test_signature_problem(fn, ok):
    assert (signature_problem(fn) is None) == ok
