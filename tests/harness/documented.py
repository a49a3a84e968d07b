"""The documented one-line errors: docs/errors.yaml, which the troubleshooting page is made from.

A bad-input test names the entry its error is documented as and checks the line it got with
`check_documented`: the placeholders of the entry's line (`<spec>`, `<port>`, ...) match loosely, the rest
exactly. The file is read and checked by the MkDocs hook that renders it (docs/hooks/errors.py),
so the tests and the site read it one way."""
from __future__ import annotations

import functools
import importlib.util
import os

from tests.harness.parts import REPO

ERRORS_FILE = os.path.join(REPO, 'docs', 'errors.yaml')
HOOK_FILE = os.path.join(REPO, 'docs', 'hooks', 'errors.py')
# How each program starts its one error line; the documented line is what follows.
PREFIXES = ('launch: error: ', 'cluster.task: error: ', 'python -m cluster.task: error: ')


@functools.cache
def hook():
    """docs/hooks/errors.py as a module (it is no package: MkDocs loads it by path, so do we)."""
    spec = importlib.util.spec_from_file_location('docs_hooks_errors', HOOK_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _data() -> dict:
    return hook().load(ERRORS_FILE)


def documented_entries() -> dict[str, dict]:
    """Entry id -> its entry (id, title, error, cause, fix), every group's."""
    return {e['id']: e for group in _data()['groups'] for e in group['errors']}


def strip_prefix(line: str) -> str:
    """The line without its program's `... error: ` prefix; fails when it has none of them."""
    prefix = next((p for p in PREFIXES if line.startswith(p)), None)
    assert prefix is not None, f'not an error line of launch or cluster.task: {line!r}'
    return line[len(prefix):]


def check_documented(entry_id: str, message: str) -> None:
    """Assert that `message` (an error line without its prefix) is the one documented as `entry_id`."""
    entry = documented_entries().get(entry_id)
    assert entry is not None, f'{entry_id!r} is not documented: add it to docs/errors.yaml (its line, cause and fix)'
    assert hook().pattern(entry['error'], _data()['placeholders']).fullmatch(message), (
        f'the error is not the line docs/errors.yaml documents as {entry_id!r} (change one of them):\n'
        f'  got:        {message}\n  documented: {entry["error"].strip()}')
