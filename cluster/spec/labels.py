"""`hosts.<host>.labels`: the Ray node labels a host's tasks are placed by (--backend ray).

Checked here, once, as Ray checks a node's labels (a key is an optional DNS prefix and `/`, then
a name; a value is a plain word), so that a bad one is the spec's one line rather than Ray's
error at placement, and so that no value reads as one of Ray's selector operators (`!b`,
`in(a,b)`): a spec's labels are matched exactly.
"""
from __future__ import annotations

import re
from typing import Any

from cluster.spec.errors import Origins

_WORD = r'[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?'
_NAME = re.compile(_WORD)
_PREFIX = re.compile(r'[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*')
WORDS = ('up to 63 letters, digits, -, _ and ., beginning and ending with a letter or digit')


def parse_labels(value: Any, key: str, origins: Origins) -> tuple[tuple[str, str], ...]:
    """A host's labels as (label, value) pairs in the order given; () for null. SpecError, naming
    the key, for anything but a non-empty mapping of label to string value (or null, which drops
    that label)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise origins.error(key, f'expected a mapping of Ray node label to value, e.g. {{zone: b}}, got {value!r}')
    if not value:
        raise origins.error(key, 'an empty mapping would match every node: give at least one label, or null for none')
    # null drops a label (--set hosts.HOST.labels.NAME=null undoes the file's)
    return tuple(_pair(name, v, key, origins) for name, v in value.items() if v is not None)


def _pair(name: Any, value: Any, key: str, origins: Origins) -> tuple[str, str]:
    if not isinstance(name, str):
        raise origins.error(key, f'a label is a string, got {name!r} (quote it)')
    why = label_refusal(name)
    if why:
        raise origins.error(f'{key}.{name}', why)
    if not isinstance(value, str):
        raise origins.error(f'{key}.{name}', f'a label\'s value is a string, got {value!r} (quote it: "{value}")')
    if not _NAME.fullmatch(value):
        raise origins.error(f'{key}.{name}', f'invalid value {value!r}: a label value is {WORDS}')
    return name, value


def label_refusal(name: str) -> str | None:
    """Why `name` is no Ray label key (its words), else None."""
    prefix, slash, rest = name.rpartition('/')
    if slash and (len(prefix) > 253 or not _PREFIX.fullmatch(prefix)):
        return f'invalid label {name!r}: its prefix {prefix!r} must be a DNS name (example.com/zone)'
    if not _NAME.fullmatch(rest):
        return f'invalid label {name!r}: a label name is {WORDS}, after an optional DNS prefix and /'
    return None
