"""Helpers of the tests of docs, used by tests/unit/docs/test_docs.py,
tests/unit/test_install.py: here, since no test module imports another."""
from __future__ import annotations

import re




# -- every command the docs show parses ---------------------------------------------------------------------
SHELL_BLOCKS = ('', 'sh', 'bash', 'shell', 'console', 'shell-session', 'zsh')
FENCE = re.compile(r'^\s*(`{3,}|~{3,})\s*([\w+-]*)')


def _shell_lines(text: str) -> list[tuple[int, str]]:
    """(line number, the line) of every shell command line in the fenced code blocks of a Markdown
    text: sh/bash/console/untagged blocks (a console block's commands are its `$ ` lines), with
    continued lines (a trailing backslash) joined."""
    out: list[tuple[int, str]] = []
    fence, lang, pending = None, '', None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None:
            if opened:
                fence, lang = opened.group(1), opened.group(2).lower()
            continue
        if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
            fence = None
            continue
        if lang not in SHELL_BLOCKS:
            continue
        if pending is not None:
            start, before = pending
            line, number = before + ' ' + line.strip(), start
        elif lang in ('console', 'shell-session'):
            if not line.lstrip().startswith('$ '):
                continue
        if line.rstrip().endswith('\\'):
            pending = (number, line.rstrip()[:-1])
            continue
        pending = None
        out.append((number, line.strip()))
    return out

