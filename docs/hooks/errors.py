"""The troubleshooting page's list of one-line errors (its generated part `errors`), from docs/errors.yaml.

docs/errors.yaml holds every one-line error the bad-input tests produce (tests/unit/launch/test_bad_input.py
and the spec tables of tests/unit/cluster/spec/test_spec.py), each as the user sees it, with its cause and its fix;
those tests check every line they get against its entry, so the page cannot drift from the code.
This module only renders: one section per group and one heading per error, which
docs/hooks/generate.py writes into troubleshooting.md (and fills afresh at each build); a malformed
file fails both. It reads YAML only and imports nothing of the project, so the build stays fast
and TensorFlow-free; the tests load it for `load` and `pattern`.
"""
from __future__ import annotations

import re

import yaml

FIELDS = ('id', 'title', 'error', 'cause', 'fix')
PLACEHOLDER = re.compile(r'<([a-z_]+)>')


def load(path: str) -> dict:
    """The errors file, checked: every placeholder a meaning and a regular expression, every group
    a title and errors, every error the five fields (strings, the error one line), ids unique, and
    every `<name>` in an error line a declared placeholder. Raises ValueError naming what is wrong."""
    with open(path, encoding='utf-8') as f:
        data = yaml.safe_load(f)
    placeholders = data.get('placeholders') or {}
    for name, p in placeholders.items():
        if not PLACEHOLDER.fullmatch(f'<{name}>') or not isinstance(p, dict) or set(p) != {'means', 'matches'}:
            raise ValueError(f'{path}: placeholder {name!r}: a lower-case name with exactly `means` and `matches`')
        try:
            re.compile(p['matches'])
        except re.error as e:
            raise ValueError(f'{path}: placeholder {name!r}: `matches` is no regular expression: {e}') from None
    seen: set[str] = set()
    for group in data.get('groups') or []:
        if not group.get('title') or not group.get('errors'):
            raise ValueError(f'{path}: a group without a title or errors: {group!r:.80}')
        for entry in group['errors']:
            missing = [k for k in FIELDS if not isinstance(entry.get(k), str) or not entry[k].strip()]
            if missing or set(entry) - set(FIELDS):
                raise ValueError(f'{path}: error {entry.get("id")!r}: needs exactly the fields {", ".join(FIELDS)}')
            if entry['id'] in seen:
                raise ValueError(f'{path}: error id {entry["id"]!r} given twice')
            seen.add(entry['id'])
            if '\n' in entry['error'].strip():
                raise ValueError(f'{path}: error {entry["id"]!r}: the error is one line')
            unknown = set(PLACEHOLDER.findall(entry['error'])) - set(placeholders)
            if unknown:
                raise ValueError(f'{path}: error {entry["id"]!r}: undeclared placeholder(s) {sorted(unknown)}')
    if not seen:
        raise ValueError(f'{path}: no errors')
    return data


def render(data: dict) -> str:
    """Markdown: what the placeholders stand for, then per group an h2 and per error an h3 (its
    id the anchor), the line as the terminal shows it after the program's prefix, its cause and its fix."""
    out = ['Each line below is what follows `launch: error: ` (or `cluster.task: error: `). A word in angle',
           'brackets stands for a part that differs from case to case:', '']
    out += [f'- `<{name}>`: {p["means"]}' for name, p in data['placeholders'].items()]
    for group in data['groups']:
        out += ['', f'## {group["title"]}', '']
        if group.get('intro'):
            out += [group['intro'].strip(), '']
        for entry in group['errors']:
            out += [f'### {entry["title"].strip()} {{#{entry["id"]}}}', '',
                    '```text', entry['error'].strip(), '```', '',
                    f'**Cause.** {entry["cause"].strip()}', '',
                    f'**Fix.** {entry["fix"].strip()}', '']
    return '\n'.join(out)


def pattern(error: str, placeholders: dict) -> re.Pattern:
    """The regular expression an error line must match in full: the text as is, each placeholder
    what its `matches` allows."""
    parts = PLACEHOLDER.split(error.strip())       # text, name, text, name, ..., text
    return re.compile(''.join(re.escape(part) if i % 2 == 0 else f'(?:{placeholders[part]["matches"]})'
                              for i, part in enumerate(parts)))
