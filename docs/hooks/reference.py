"""The reference pages' generated parts, made from the code so that they cannot drift.

A page under docs/reference/ holds its hand-written introduction and one generated part (see
docs/hooks/generate.py, which writes it into the page and fills it afresh at each build):
  cli     every command of the real argparse parser (launch/cli.py build_parser): its usage, what
          it does, each argument with its default and help;
  spec    every key the spec accepts (cluster/spec/keys.py spec_keys: the model's fields and the
          other sections' keys), with its type, default, allowed values and what it does;
  events  the event log's common keys and, for each EventKind, its class's docstring and fields
          (launch/records/event_types.py).
tests/unit/docs/test_docs.py imports this file (by its path) to check what it makes. Nothing here imports
TensorFlow: the build stays a few seconds.
"""
from __future__ import annotations

import argparse
import dataclasses
import html
import inspect
import re
import sys
from collections.abc import Iterable
from pathlib import Path

# The code documented is the code of this checkout, whatever else is installed. MkDocs restores
# sys.path once a hook's module has run, so the modules are imported here, while REPO is on it.
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
try:
    from cluster.spec.keys import ABSENT, REQUIRED, SECTION_DOCS, spec_keys
    from cluster.spec.validate import SECTIONS
    from launch.cli import build_parser
    from launch.records.event_types import EVENT_TYPES, HEADER_DOCS, Event, EventKind
finally:
    sys.path.remove(str(REPO))
for _module in ('cluster', 'launch'):
    if not Path(sys.modules[_module].__file__ or '').resolve().is_relative_to(REPO):
        raise ImportError(f'{_module} was imported from {sys.modules[_module].__file__}, not from {REPO}: '
                          'the reference pages would describe another copy of the code')

USAGE_WIDTH = 100


# -- Markdown ----------------------------------------------------------------------------------------
def inline(text: str) -> str:
    """Plain text (a help string, a docstring) as Markdown for a table cell or a paragraph: one
    line; outside `code` spans, <, > and * are shown as themselves, not taken as HTML or emphasis;
    a | never ends the cell."""
    text = ' '.join(text.split())
    parts = re.split(r'(`[^`]*`)', text)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            part = part.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;').replace('*', r'\*')
        out.append(part.replace('|', r'\|'))
    return ''.join(out)


def sentence(text: str) -> str:
    """A help string as a sentence of the page: a capital first letter, a full stop at the end."""
    text = ' '.join(text.split())
    if text[:1].islower():
        text = text[0].upper() + text[1:]
    return text if text.endswith(('.', ':', '!', '?')) else text + '.'


def code(text: str) -> str:
    """`text` as a code span (a | in it escaped for a table cell)."""
    return f'`{text}`'.replace('|', r'\|')


def whole(name: str) -> str:
    """A name as code that a narrow column never breaks inside (task_started, not task_starte d)."""
    return f'<code style="word-break: normal">{html.escape(name)}</code>'


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    header = list(header)
    lines = ['| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header)]
    lines += ['| ' + ' | '.join(row) + ' |' for row in rows]
    return '\n'.join(lines)


# -- the command line ----------------------------------------------------------------------------------
def _fixed_width(parser: argparse.ArgumentParser) -> None:
    """Usage lines wrapped at USAGE_WIDTH, not at the width of the terminal the site is built in."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=USAGE_WIDTH)


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        name = action.metavar if isinstance(action.metavar, str) else ' '.join(action.metavar)
    elif action.choices is not None:
        name = '{' + ','.join(map(str, action.choices)) + '}'
    else:
        name = action.dest if not action.option_strings else action.dest.upper()
    return f'[{name}]' if action.nargs == '?' else f'[{name} ...]' if action.nargs == '*' else name


def argument_name(action: argparse.Action) -> str:
    """`SPEC`, `-o, --output FILE`, `--json`: an argument as the usage line writes it."""
    if not action.option_strings:
        return code(_metavar(action))
    flags = ', '.join(action.option_strings)
    takes_value = action.nargs != 0
    return code(f'{flags} {_metavar(action)}' if takes_value else flags)


def argument_default(action: argparse.Action) -> str:
    """The default worth showing: none for a flag, an empty list, a suppressed or a None one."""
    value = action.default
    if value is None or value is False or value == [] or value == argparse.SUPPRESS or action.nargs == 0:
        return 'required' if action.required and action.option_strings else ''
    return code(f'{value:g}' if isinstance(value, float) else str(value))


def argument_help(action: argparse.Action, prog: str) -> str:
    """The help argparse prints (its %(default)s and the like expanded), and the allowed values
    where the choices are not in it already."""
    text = argparse.HelpFormatter(prog)._expand_help(action) if action.help else ''
    if action.choices is not None and not all(str(c) in text for c in action.choices):
        text += f'; one of {", ".join(map(str, action.choices))}'
    return inline(text)


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's documented arguments: every one but its subcommands (those have pages of their own)."""
    return [a for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]


def commands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, its help in the command list, its parser) of every subcommand, in the parser's order."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [(choice.dest, choice.help or '', sub.choices[choice.dest]) for choice in sub._choices_actions]


def _arguments_table(parser: argparse.ArgumentParser, actions: list[argparse.Action]) -> str:
    """Argument, default, help; no default column where none of them has one worth showing."""
    rows = [(argument_name(a), argument_default(a), argument_help(a, parser.prog)) for a in actions]
    if not any(default for _, default, _ in rows):
        return table(('Argument', 'What it does'), ((name, text) for name, _, text in rows))
    return table(('Argument', 'Default', 'What it does'), rows)


def _usage(parser: argparse.ArgumentParser) -> str:
    _fixed_width(parser)
    return '```text\n' + parser.format_usage().strip() + '\n```'


def _same(action: argparse.Action) -> tuple:
    return tuple(action.option_strings), action.help, repr(action.default), repr(action.choices)


def shared_options(parsers: list[argparse.ArgumentParser]) -> list[argparse.Action]:
    """The options every command on a spec takes alike (those of `--set`'s commands that all of
    them have, with the same help): documented once, not once per command."""
    on_spec = [p for p in parsers if any('--set' in a.option_strings for a in p._actions)]
    if not on_spec:
        return []
    kinds = [{_same(a) for a in arguments(p)} for p in on_spec]
    return [a for a in arguments(on_spec[0]) if a.option_strings and not _is_help(a)
            and all(_same(a) in k for k in kinds)]


def _is_help(action: argparse.Action) -> bool:
    return isinstance(action, argparse._HelpAction)


SHARED = 'Options of every command on a spec'


def cli_markdown() -> str:
    parser = build_parser()
    listed = commands(parser)
    shared = shared_options([command for _, _, command in listed])
    shared_keys = {_same(a) for a in shared}
    out = [_usage(parser), inline(sentence(parser.description or '')), _arguments_table(parser, arguments(parser)),
           '## Commands', table(('Command', 'What it does'), ((f'[{whole(name)}](#launch-{name})', inline(text))
                                                              for name, text, _ in listed)),
           f'## {SHARED}', 'Every command that takes a `SPEC` or a `SPEC|RUN` takes these too; each command below '
                           'lists only its own.', _arguments_table(parser, shared)]
    for name, text, command in listed:
        own = [a for a in arguments(command) if not _is_help(a) and _same(a) not in shared_keys]
        also = f' It also takes the [options of every command on a spec](#{_slug(SHARED)}).' \
            if any(_same(a) in shared_keys for a in arguments(command)) else ''
        out += [f'## launch {name}', inline(sentence(command.description or text)) + also, _usage(command)]
        out += [_arguments_table(command, own)] if own else []
    return '\n\n'.join(out) + '\n'


def _slug(heading: str) -> str:
    """The anchor MkDocs' toc gives a heading."""
    return re.sub(r'[\s]+', '-', re.sub(r'[^\w\s-]', '', heading).strip().lower())


# -- the spec ------------------------------------------------------------------------------------------
def spec_markdown() -> str:
    keys = spec_keys()
    names = [k.key for k in keys]
    out = []
    for section in SECTIONS:
        out += [f'## {section}', link_keys(inline(SECTION_DOCS[section]), names)]
        rows = []
        for key in (k for k in keys if k.section == section):
            kind = 'one of ' + ', '.join(map(code, key.allowed)) if key.allowed else inline(key.type)
            default = {REQUIRED: 'required', ABSENT: 'default: not set'}.get(key.default) or \
                f'default: {code(key.default)}'
            rows.append((f'{key_cell(key.key)}<br>{kind}<br>{default}',
                         link_keys(inline(key.doc), [n for n in names if n != key.key])))
        out.append(table(('Key, type, default', 'What it does'), rows))
    return '\n\n'.join(out) + '\n'


def anchor(key: str) -> str:
    """The id of a key's row: its dotted name, a name of yours without its brackets (hosts.host.user)."""
    return key.replace('<', '').replace('>', '')


def key_cell(key: str) -> str:
    """A key's name as code that wraps only after a dot (never inside a word), with its row's anchor."""
    name = html.escape(key).replace('.', '.<wbr>')
    return f'<code id="{anchor(key)}" style="word-break: normal">{name}</code>'


def link_keys(markdown: str, names: list[str], page: str = '') -> str:
    """Each spec key named in `markdown` (outside code spans) as a link to its row: `page` is the
    spec reference's path from the page the text goes on ('' on that page itself)."""
    if not names:
        return markdown
    pattern = re.compile(r'(?<![\w.<])(' + '|'.join(map(re.escape, sorted(names, key=len, reverse=True))) + r')(?!\w)')
    parts = re.split(r'(`[^`]*`)', markdown)
    return ''.join(part if i % 2 else pattern.sub(lambda m: f'[`{m.group(1)}`]({page}#{anchor(m.group(1))})', part)
                   for i, part in enumerate(parts))


# -- the event log ---------------------------------------------------------------------------------------
_JSON_TYPES = {'str': 'string', 'int': 'integer', 'float': 'number', 'bool': 'boolean', 'list[str]': 'list of strings',
               'list[int]': 'list of integers', 'dict[str, float]': 'object of numbers', 'RunState': 'string',
               'RunRecord': 'object (as run.json)', 'dict[str, dict[str, float | None]]': 'object of objects of numbers'}


def json_type(annotation: str, where: str) -> str:
    """'int | None' -> 'integer': a field's type as its JSON value (any may be null where unknown)."""
    whole = annotation.removesuffix(' | None')
    parts = [whole] if whole in _JSON_TYPES else [p.strip() for p in annotation.split('|') if p.strip() != 'None']
    unknown = [p for p in parts if p not in _JSON_TYPES]
    if unknown:
        raise ValueError(f'{where}: no JSON type known for {annotation!r}: add it to _JSON_TYPES in {__file__}')
    return ' or '.join(dict.fromkeys(_JSON_TYPES[p] for p in parts))


SPEC_PAGE = 'spec.md'       # the spec reference, from the event log's page beside it


def events_markdown() -> str:
    spec_names = [k.key for k in spec_keys()]
    header_types = {f.name: str(f.type) for f in dataclasses.fields(Event)} | {'event': 'str'}
    out = ['## Every event', table(('Key', 'Type', 'What it holds'), (
        (code(key), json_type(header_types[key], f'Event.{key}'), inline(doc)) for key, doc in HEADER_DOCS.items())),
        '## The events', table(('Event', 'What it tells'), (
            (f'[{whole(kind.value)}](#{kind.value})',
             link_keys(inline(_first_sentence(class_doc(EVENT_TYPES[kind.value]))), spec_names, SPEC_PAGE))
            for kind in EventKind))]
    for kind in EventKind:
        cls = EVENT_TYPES[kind.value]
        fields = [f for f in dataclasses.fields(cls) if f.name in cls.json_fields() and f.name not in HEADER_DOCS]
        rows = [(code(f.name), json_type(str(f.type), f'{cls.__name__}.{f.name}'),
                 link_keys(inline(f.metadata.get('doc', '')), spec_names, SPEC_PAGE)
                 + (' *Only when set.*' if f.name in cls.OPTIONAL else ''))
                for f in fields]
        out += [f'### {kind.value}', link_keys(inline(class_doc(cls)), spec_names, SPEC_PAGE),
                table(('Key', 'Type', 'What it holds'), rows)]
    return '\n\n'.join(out) + '\n'


def class_doc(cls: type) -> str:
    """The class's own docstring: '' where it has none (not Event's, nor the signature that
    @dataclass writes in its place)."""
    doc = inspect.cleandoc(cls.__dict__.get('__doc__') or '')
    return '' if doc.startswith(f'{cls.__name__}(') else doc


def _first_sentence(text: str) -> str:
    text = ' '.join(text.split())
    match = re.match(r'(.+?[.:])(\s|$)', text)
    return match.group(1).rstrip(':') + '.' if match and match.group(1).endswith(':') else \
        (match.group(1) if match else text)
