"""The documentation stays true to the code: every command, option, spec key and event kind carries
its text (so one added without it fails here), the reference pages made from them say what the
code says, the site builds with `mkdocs build --strict` (no broken link, no missing page), and
every `launch ...` command the README and the site show parses with the real parser.

All fast: the parser, the spec loader and the event types are asked in this process; the one
process started is `mkdocs build`, a static tool like ruff (conftest's STATIC_CHECKERS).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.spec import JOBS, SpecError, load_spec
from cluster.spec.keys import HOST, JOB, spec_keys
from launch.cli import build_parser, parse_args
from launch.records.event_types import EVENT_TYPES, HEADER, HEADER_DOCS, EventKind
from tests.harness.parts import REPO, unavailable
from tests.harness.docs import _shell_lines


def _docs_hook(name: str):
    """docs/hooks/NAME.py as a module: `reference` makes the reference pages, `generate` writes
    the committed parts of the pages made from the code."""
    spec = importlib.util.spec_from_file_location(f'docs_{name}_hook', Path(REPO) / 'docs' / 'hooks' / f'{name}.py')
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hook():
    return _docs_hook('reference')


def _generate():
    return _docs_hook('generate')


# -- what is generated is committed, and current -------------------------------------------------------
def test_the_committed_parts_made_from_the_code_are_what_the_code_makes_now():
    """GitHub shows docs/ as committed: the reference pages, the error list, the diagram and the
    plots are in the files, and they must say what the code says today (the site makes them afresh)."""
    generate = _generate()
    assert {'reference/cli.md', 'reference/spec.md', 'reference/events.md', 'troubleshooting.md',
            'architecture.md', 'performance.md', 'runs.md'} <= set(generate.pages())
    stale = generate.stale()
    assert not stale, f'stale in docs/: {", ".join(sorted(stale))}; `{generate.COMMAND}` rewrites them'


def test_a_part_that_differs_from_the_code_is_stale_and_a_lone_opening_line_is_filled(tmp_path):
    generate = _generate()
    page = tmp_path / 'reference' / 'cli.md'
    page.parent.mkdir()
    current = (Path(REPO) / 'docs' / 'reference' / 'cli.md').read_text(encoding='utf-8')
    page.write_text(current.replace('show program\'s version number and exit', 'an old help'), encoding='utf-8')
    assert set(generate.stale(str(tmp_path))) == {'reference/cli.md', 'images/architecture.svg'}
    assert generate.stale(str(tmp_path))['reference/cli.md'] == current
    made = generate.filled('# Commands\n\n<!-- generated: cli -->\n\nAfter.\n', 'reference/cli.md')
    assert 'usage: launch up' in made and made.endswith('<!-- end of generated: cli -->\n\nAfter.\n'), made
    assert '<!--' not in generate.filled(made, 'reference/cli.md', committed=False)       # the site's page
    with pytest.raises(ValueError, match="a.md: no generated part 'zz'"):
        generate.filled('<!-- generated: zz -->\n', 'a.md')


# -- the command line ----------------------------------------------------------------------------------
def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str | None, argparse.ArgumentParser]]:
    """name -> (its help in the command list, its parser)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {c.dest: (c.help, sub.choices[c.dest]) for c in sub._choices_actions}


def _undocumented(parser: argparse.ArgumentParser, where: str) -> list[str]:
    return [f'{where} {"/".join(a.option_strings) or a.metavar or a.dest}: no help'
            for a in parser._actions if not isinstance(a, argparse._SubParsersAction)
            and (not a.help or not a.help.strip() or a.help == argparse.SUPPRESS)]


def test_every_command_and_every_argument_has_help():
    """A command or an option added without help would be a blank line of `launch -h` and of the
    command-line reference."""
    parser = build_parser()
    missing = _undocumented(parser, 'launch')
    commands = _subcommands(parser)
    assert len(commands) >= 10, sorted(commands)
    for name, (text, command) in commands.items():
        if not text or not text.strip():
            missing.append(f'launch {name}: no help in the command list')
        missing += _undocumented(command, f'launch {name}')
    assert not missing, '\n'.join(missing)


def test_the_cli_reference_has_every_command_and_every_option():
    parser = build_parser()
    page = _hook().cli_markdown()
    for name, (_, command) in _subcommands(parser).items():
        assert f'\n## launch {name}\n' in page, name
        assert f'usage: launch {name} ' in page, name
        for action in command._actions:
            for option in action.option_strings:
                assert f'`{option}' in page or f', {option}' in page, f'launch {name} {option}'
    assert 'Options of every command on a spec' in page and '`--set KEY=VALUE`' in page


def test_the_finish_timeout_help_names_every_task_it_waits_for():
    """The launcher gives the ps tasks --finish-timeout after the workers and an evaluator as long
    after the chief (launch/run/supervised/loop.py _check_tail): a PSS user must find the evaluator there."""
    up = _subcommands(build_parser())['up'][1]
    text = next(a.help for a in up._actions if '--finish-timeout' in a.option_strings) or ''
    assert all(word in text for word in ('ps', 'workers', 'evaluator', 'chief')), text


def test_the_help_a_command_opens_with_is_its_line_in_the_command_list():
    commands = _subcommands(build_parser())
    assert all(command.description == text for text, command in commands.values())


# -- the spec ------------------------------------------------------------------------------------------
PROBE = 'zz_probe'          # a key no section has
NAME = 'zzname'             # a name of the user's: a host, an environment variable


def _named_by_validator(spec: str, dotted: str) -> tuple[str, ...] | None:
    """The keys the validator says it expects where `dotted` is a key it does not know; None when it
    says something else (a leaf's value, or a mapping of the user's own names)."""
    try:
        load_spec(spec, [f'{dotted}=1'], environ={})
    except SpecError as e:
        found = re.search(rf': {re.escape(dotted)}: unknown key; expected one of (.+)$', str(e))
        return tuple(found.group(1).split(', ')) if found else None
    return None


def accepted_keys(spec: str) -> set[str]:
    """Every key the spec loader accepts, found by asking it (with `--set`) about a key it does not
    know at each level: where it names the keys it expects, each is walked in turn; a level of the
    user's own names (hosts.<host>) is walked through NAME. A level whose keys are those of the level
    above is no new level: there the dots were read as part of a name (a host's, 10.0.0.5)."""
    def walk(prefix: list[str], above: tuple[str, ...] | None) -> set[str]:
        for path in (prefix, prefix + [NAME]) if prefix else (prefix,):
            expected = _named_by_validator(spec, '.'.join(path + [PROBE]))
            if expected is not None and expected != above and len(path) < 6:
                return {key for child in expected for key in walk(path + [child], expected)}
        return {'.'.join(prefix)}
    return walk([], None)


def _minimal_spec(tmp_path) -> str:
    path = tmp_path / 'spec.yaml'
    path.write_text('cluster:\n  ps: [localhost:2222]\n  worker: [localhost:2223]\n')
    return str(path)


def documented_keys() -> set[str]:
    """The keys the spec reference lists, each <job> as every job and each <host> as NAME."""
    out = set()
    for key in (k.key for k in spec_keys()):
        for job in (JOBS if JOB in key else ('',)):
            out.add(key.replace(JOB, job).replace(HOST, NAME))
    return out


def test_the_spec_reference_lists_exactly_the_keys_the_spec_accepts(tmp_path):
    """The keys are found by asking the validator, not from a list: a key it accepts that has no
    text (a TrainConfig field without `setting(..., doc)`, a section without its entry in
    cluster/spec/keys.py) fails here, and so does a documented key it no longer accepts."""
    accepted = accepted_keys(_minimal_spec(tmp_path))
    assert {'train.steps', 'supervise.restart', f'hosts.{NAME}.user', 'tasks.worker.env', 'cluster.ps',
            'isolation', 'env', 'gpus'} <= accepted, sorted(accepted)
    documented = documented_keys()
    assert not accepted - documented, f'accepted but not documented: {sorted(accepted - documented)}'
    assert not documented - accepted, f'documented but not accepted: {sorted(documented - accepted)}'


def test_every_spec_key_has_a_type_and_says_what_it_does():
    keys = spec_keys()
    assert len({k.key for k in keys}) == len(keys)
    for key in keys:
        assert key.doc.strip() and key.type.strip(), key
        assert key.doc.strip()[-1] in '.)', f'{key.key}: end its text with a full stop'


def test_the_values_a_spec_key_allows_are_the_values_the_loader_takes(tmp_path):
    """`allowed` is the validator's own tuple: each value loads, and a value not among them is refused."""
    spec = _minimal_spec(tmp_path)
    keys = [k for k in spec_keys() if k.allowed]
    assert {'supervise.restart', 'train.transfer_dtype', 'isolation'} <= {k.key for k in keys}
    for key in keys:
        for value in key.allowed:
            load_spec(spec, [f'{key.key}={value}'], environ={})
        with pytest.raises(SpecError, match='expected one of'):
            load_spec(spec, [f'{key.key}=zz-not-a-value'], environ={})


def test_the_spec_reference_page_has_every_key_and_section():
    from cluster.spec import SECTIONS
    hook = _hook()
    page = hook.spec_markdown()
    for section in SECTIONS:
        assert f'\n## {section}\n' in page or page.startswith(f'## {section}\n'), section
    for key in spec_keys():
        assert f'id="{hook.anchor(key.key)}"' in page, key.key


# -- the event log ---------------------------------------------------------------------------------------
def test_every_event_kind_has_a_class_that_says_what_it_tells_and_what_each_field_holds():
    class_doc = _hook().class_doc
    missing = []
    for kind in EventKind:
        cls = EVENT_TYPES.get(kind.value)
        if cls is None:
            missing.append(f'{kind.value}: no class in EVENT_TYPES')
            continue
        if not class_doc(cls):
            missing.append(f'{kind.value}: {cls.__name__} has no docstring of its own')
        for field in dataclasses.fields(cls):
            if field.name in cls.json_fields() and field.name not in HEADER and not field.metadata.get('doc'):
                missing.append(f'{kind.value}.{field.name}: json_field(..., doc=...) missing')
    assert not missing, '\n'.join(missing)
    assert tuple(HEADER_DOCS) == ('time', 'run', 'attempt', 'event') and all(HEADER_DOCS.values())


def test_the_event_reference_page_has_every_kind_and_field():
    hook = _hook()
    page = hook.events_markdown()
    keys = [k.key for k in spec_keys()]
    for kind in EventKind:
        told = hook.link_keys(hook.inline(hook.class_doc(EVENT_TYPES[kind.value])), keys, hook.SPEC_PAGE)
        assert f'\n{told}\n' in page, kind.value
        assert f'\n### {kind.value}\n' in page, kind.value
        for name in EVENT_TYPES[kind.value].json_fields():
            assert f'| `{name}` |' in page, f'{kind.value}.{name}'


# -- the site builds ---------------------------------------------------------------------------------------
def mkdocs_build(site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the repository into `site`: a static tool, as ruff (conftest's
    STATIC_CHECKERS), run as a user and CI run it."""
    exe = Path(sys.executable).with_name('mkdocs')
    if not exe.exists():
        unavailable('mkdocs is not installed: pip install -e ".[docs]"', 'the test extra installs mkdocs')
    return subprocess.run([str(exe), 'build', '--strict', '--site-dir', str(site)], cwd=REPO, capture_output=True,
                          text=True, timeout=180, env={**os.environ, 'NO_MKDOCS_2_WARNING': '1'})


def test_the_site_builds_strict_with_the_reference_pages_made_from_the_code(tmp_path):
    done = mkdocs_build(tmp_path / 'site')
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    reference = tmp_path / 'site' / 'reference'
    cli = (reference / 'cli.html').read_text()
    spec = (reference / 'spec.html').read_text()
    events = (reference / 'events.html').read_text()
    assert 'id="launch-up"' in cli and 'usage: launch render' in cli
    assert 'id="train.steps"' in spec and 'id="hosts.host.user"' in spec
    assert 'id="run_started"' in events and 'id="finished"' in events
    assert '<!-- generated:' not in cli + spec + events
    # The 404 page links relative to the site's top, like every page: root-absolute links (MkDocs'
    # default for an error page) lead nowhere from the file system or below a server's path.
    missing = (tmp_path / 'site' / '404.html').read_text()
    assert 'href="./index.html"' in missing and 'stylesheets/extra.css' in missing
    assert not re.findall(r'(?:href|src)="/[^/][^"]*"', missing), re.findall(r'(?:href|src)="/[^"]*"', missing)
OPERATORS = {'&&', '||', ';', '|', '&', ';;'}
REDIRECTS = {'>', '>>', '<', '2>', '&>', '2>&1'}


def launch_commands(line: str) -> list[list[str]]:
    """The argv (after `launch`) of each `launch` command of a shell line: `$ ` prompts, `VAR=value`
    prefixes, `&&`/`;`/`|` chains, redirections and `# comments` understood as a shell would."""
    lexer = shlex.shlex(line.removeprefix('$ '), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:          # an unbalanced quote: not a command line
        return []
    commands, current = [], []
    for token in tokens + [';']:
        if token in OPERATORS:
            commands.append(current)
            current = []
        else:
            current.append(token)
    out = []
    for words in commands:
        words = [w for i, w in enumerate(words) if w not in REDIRECTS and (i == 0 or words[i - 1] not in REDIRECTS)]
        while words and re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*=.*', words[0]):
            words = words[1:]
        if words[:1] == ['launch']:
            out.append(words[1:])
        elif words[:3] in (['python', '-m', 'launch'], ['python3', '-m', 'launch']):
            out.append(words[3:])
    return out


def is_synopsis(line: str) -> bool:
    """`launch logs RUN [TASK] [--attempt N]`, `launch scale SPEC|RUN --workers M`: a command's form,
    not a command to run (optional parts in brackets, alternatives joined by a bar)."""
    command = re.sub(r'\s+#.*$', '', line)
    return bool(re.search(r'\[\s*[-A-Z]|\w\|\w', command))


def synopsis_problems(line: str, parser: argparse.ArgumentParser) -> list[str]:
    """What in a synopsis the parser does not know: its command, or any option it names."""
    words = re.sub(r'\s+#.*$', '', line).removeprefix('$ ').split()
    if 'launch' not in words:
        return []
    words = words[words.index('launch') + 1:]
    commands = _subcommands(parser)
    if not words or words[0] not in commands:
        return [f'no command {words[:1]}']
    options = {o for a in commands[words[0]][1]._actions for o in a.option_strings}
    named = {part.split('=')[0] for w in words[1:] for part in w.strip('[]').split('|') if part.startswith('-')}
    return [f'launch {words[0]} has no option {o}' for o in sorted(named - options)]


def _doc_files() -> list[Path]:
    root = Path(REPO)
    return [root / 'README.md'] + sorted((root / 'docs').rglob('*.md'))


def _parse_problem(argv: list[str]) -> str | None:
    """argparse's complaint about `launch ARGV`, or None if it parses (-h and --version count)."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parse_args(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            return said.getvalue().strip().splitlines()[-1] if said.getvalue().strip() else f'exit {e.code}'
    return None


def test_every_launch_command_in_the_readme_and_the_site_parses_with_the_real_parser():
    """Each command shown is run through launch/cli.py's parse_args (nothing is started); a form
    with [optional] parts is held to the parser's commands and options instead."""
    parser = build_parser()
    problems, checked = [], 0
    for path in _doc_files():
        where = path.relative_to(REPO)
        for number, line in _shell_lines(path.read_text(encoding='utf-8')):
            if is_synopsis(line):
                problems += [f'{where}:{number}: {line}\n    {p}' for p in synopsis_problems(line, parser)]
                checked += 1
                continue
            for argv in launch_commands(line):
                checked += 1
                problem = _parse_problem(argv)
                if problem:
                    problems.append(f'{where}:{number}: launch {shlex.join(argv)}\n    {problem}')
    assert checked >= 5, f'only {checked} launch commands found in the README and docs/: is the finder broken?'
    assert not problems, f'{len(problems)} command(s) the parser refuses:\n' + '\n'.join(problems)


def test_the_command_finder_reads_blocks_chains_continuations_and_comments():
    text = '\n'.join([
        'launch up not-in-a-block.yaml', '```sh', 'launch up a.yaml   # a comment --bogus',
        'pip install -e . && launch plan b.yaml --json | head', 'CI=true launch list runs \\', '    --json',
        'launch report RUN -o out.html > /dev/null; launch down RUN', '```', '```yaml', 'command: launch up y',
        '```', '```console', '$ launch status c.yaml', 'launch: error: not a command', '```', '```text',
        'launch up in-a-text-block --bogus', '```'])
    found = [argv for _, line in _shell_lines(text) for argv in launch_commands(line)]
    assert found == [['up', 'a.yaml'], ['plan', 'b.yaml', '--json'], ['list', 'runs', '--json'],
                     ['report', 'RUN', '-o', 'out.html'], ['down', 'RUN'], ['status', 'c.yaml']]
    assert [number for number, _ in _shell_lines(text)][2] == 5         # a continued line: where it starts
    assert _parse_problem(['up', 'a.yaml', '--bogus']) == 'launch: error: unrecognized arguments: --bogus'
    assert _parse_problem(['up', '-h']) is None


def test_a_synopsis_is_held_to_the_parser_s_commands_and_options():
    parser = build_parser()
    assert is_synopsis('launch logs RUN [TASK] [--attempt N] [-f]  # a comment')
    assert is_synopsis('launch scale SPEC|RUN --workers M')
    assert not is_synopsis('launch up specs/a.yaml | tee log  # a [comment]')
    assert synopsis_problems('launch logs RUN [TASK] [--attempt N] [-f]', parser) == []
    assert synopsis_problems('launch logs RUN [--atempt N]', parser) == ['launch logs has no option --atempt']
    assert synopsis_problems('launch lgs RUN [-f]', parser) == ["no command ['lgs']"]


# -- the README --------------------------------------------------------------------------------------
def _readme_commands() -> list[str]:
    """The README's sh blocks before its first section: the two set-up commands."""
    text = (Path(REPO) / 'README.md').read_text(encoding='utf-8')
    head = text.split('\n## ', 1)[0]
    return [block.strip() for block in re.findall(r'```sh\n(.*?)```', head, re.S)]


def test_the_readme_is_short_and_opens_with_the_two_set_up_commands():
    """At most ~150 lines, linking into the site; its first command runs the embedded default, its
    second is exactly the one .ci/run runs (CI runs the README's test command, nothing else): the fast
    tier first, as its own step, so a broken import fails in a minute, then the slow tier."""
    text = (Path(REPO) / 'README.md').read_text(encoding='utf-8')
    assert len(text.splitlines()) <= 150
    first, second = _readme_commands()
    assert first == 'pip install -e . && launch up specs/local2.yaml'
    ci = (Path(REPO) / '.ci' / 'run').read_text(encoding='utf-8').rstrip().splitlines()[-1]
    assert second == ci and second.endswith('python -m pytest -m "not slow" -n 2 && python -m pytest -m slow')
    for page in re.findall(r'\]\((docs/[^)#]+\.md)', text):
        assert (Path(REPO) / page).is_file(), page
