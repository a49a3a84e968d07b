"""The run's JSON files (events.jsonl, run.json, worker-N.json, chief.json, launch-state.json, the
lease and the control files) read within bounds, and every JSON the project writes standard JSON.

Readers take files anyone may have written: an older or newer launcher, a hand edit, a foreign
tool, a torn write, someone hostile. None of them may cost a traceback or the machine's memory:
  - a line or file is read up to MAX_BYTES; a longer one is skipped whole (never held in memory);
  - nesting deeper than MAX_DEPTH is refused as damaged (ValueError, like any bad JSON): deeper
    than ~1,000 levels CPython's parser raises RecursionError, and anything deeper than a record
    ever is would make the recursive walkers downstream (repr, json.dumps, html) raise it later;
  - a reader says what it skipped in one warning per file and command (`warn_once`).
Writers: RFC 8259 has no NaN or Infinity (JavaScript's JSON.parse, jq and most parsers reject
them), and Python writes them unless told not to. `dumps` writes a number that is not finite
(a diverged loss) as null. Readers still take the NaN an older version wrote, as Python's json does.
"""
from __future__ import annotations

import json
import logging
import math
import re
from typing import Any, BinaryIO
from collections.abc import Iterator

MAX_BYTES = 4 << 20         # a line of events.jsonl, or a whole small file (run.json: a few KiB)
MAX_DEPTH = 32              # a run file nests 4 deep (finished > result > failures > failure)
MAX_TEXT = 64 << 10         # the longest text an event keeps (a task's last error line may be any length)
OVER = f'over {MAX_BYTES >> 20} MiB'    # how a warning says a line or file was too big to read

_warned: set[str] = set()


def warn_once(logger: logging.Logger, message: str) -> None:
    """Warn with `message` unless this process already did: the same damaged file is read by
    several parts of one command (`launch report` describes the run, then renders it)."""
    if message not in _warned:
        _warned.add(message)
        logger.warning('%s', message)


def forget_warnings() -> None:
    """Warn again: for several commands run in one process (the tests)."""
    _warned.clear()


# -- reading ------------------------------------------------------------------------------------
def loads(text: str) -> Any:
    """json.loads within bounds: ValueError for more than MAX_BYTES or nesting deeper than MAX_DEPTH."""
    if len(text) > MAX_BYTES:
        raise ValueError(f'too long ({OVER})')
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f'nested more than {MAX_DEPTH} deep') from None
    # Every level opens with a bracket: a text with few of them (nearly every line) needs no walk.
    if text.count('[') + text.count('{') > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise ValueError(f'nested more than {MAX_DEPTH} deep')
    # A lone surrogate ("\ud800") is valid JSON but no text: printing it, or drawing it, raises.
    return _mended(value) if _SURROGATE.search(text) else value


_SURROGATE = re.compile(r'\\u[dD][89a-fA-F]')


def _mended(value: Any) -> Any:
    """`value` with each lone surrogate in its text (keys too) replaced by '?' (depth checked before)."""
    if isinstance(value, str):
        return value.encode('utf-8', 'replace').decode('utf-8')
    if isinstance(value, dict):
        return {_mended(k): _mended(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mended(v) for v in value]
    return value


def _deeper_than(value: Any, most: int) -> bool:
    """Whether lists and objects nest more than `most` deep in `value` (walked without recursion)."""
    todo = [(value, 1)]
    while todo:
        node, depth = todo.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > most:
            return True
        todo.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def read_bytes(f: BinaryIO) -> bytes | None:
    """A small file's bytes, or None if it holds more than MAX_BYTES (of which at most one more
    byte was read: a huge file, or a device, is never read whole)."""
    data = f.read(MAX_BYTES + 1)
    return None if len(data) > MAX_BYTES else data


def lines(f: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """(line number, the line without its newline) for each line of `f`; None for a line of more
    than MAX_BYTES, which is read past in pieces, never held whole."""
    number = 0
    while True:
        line = f.readline(MAX_BYTES + 2)        # the most a line may hold, its newline, one more
        if not line:
            return
        number += 1
        text = line[:-1] if line.endswith(b'\n') else line
        if len(text) <= MAX_BYTES:
            yield number, text
            continue
        while line and not line.endswith(b'\n'):
            line = f.readline(1 << 20)
        yield number, None


# -- writing ------------------------------------------------------------------------------------
def plain(value: Any, max_text: int | None = None) -> Any:
    """`value` as standard JSON can hold it: a number that is not finite as None, tuples as lists,
    and, given `max_text`, strings cut to that many characters (saying so)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if max_text is None or len(value) <= max_text else short(value, max_text)
    if isinstance(value, dict):
        return {k: plain(v, max_text) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, max_text) for v in value]
    return value


def dumps(value: Any, max_text: int | None = None, **options: Any) -> str:
    """json.dumps of `plain(value)`, refusing anything that is not standard JSON (allow_nan=False)."""
    return json.dumps(plain(value, max_text), allow_nan=False, **options)


def short(text: str, most: int) -> str:
    """`text` cut to `most` characters, an ellipsis saying so: how the console and the report
    keep a long error or cause to one readable line."""
    return text if len(text) <= most else text[:most - 1].rstrip() + '\u2026'
