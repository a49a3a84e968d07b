"""Typed records over the JSON objects of a run's files (`events.jsonl`, `run.json`): dataclasses
that read a JSON object and write back the same object, keys in the same order.

The files are the interface users' scripts read, and they outlive the version that wrote them: a
record may lack a field (an older launcher, a hand-edited line), carry one this version does not
know (a newer launcher), or hold a value of the wrong type. So a record remembers which keys it
was read with and in which order (`has`, and `to_json` writes those keys back), keeps the keys it
has no field for in `extra`, and reads a value of the wrong type as None (`read_*` below): a
reader gets types it can trust, and a well-formed object makes the round trip unchanged.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar
from collections.abc import Callable, Mapping

R = TypeVar('R', bound='JsonRecord')


@dataclass(frozen=True)
class JsonRecord:
    """Base of the typed records. A subclass declares its JSON fields as dataclass fields (with
    `json_field`, which names how a JSON value is read); `NOT_JSON` names fields it holds that
    are not keys of its object."""
    keys: tuple[str, ...] | None = field(default=None, kw_only=True, compare=False, repr=False)
    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True, compare=False, repr=False)

    # Fields written only when not None, in a record built in code (one read keeps its keys).
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    NOT_JSON: ClassVar[frozenset[str]] = frozenset({'keys', 'extra'})

    @classmethod
    def json_fields(cls) -> tuple[str, ...]:
        """The record's own keys, in the order a record built in code writes them."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in cls.NOT_JSON)

    def written_keys(self) -> tuple[str, ...]:
        """The keys to_json writes: those read, in their order; for a record built in code, its
        fields (an OPTIONAL one only when set), then `extra`."""
        if self.keys is not None:
            return self.keys
        own = tuple(k for k in self.json_fields() if not (k in self.OPTIONAL and getattr(self, k) is None))
        return own + tuple(k for k in self.extra if k not in own)

    def has(self, key: str) -> bool:
        """Whether the object has `key` (a null value counts: it was written)."""
        return key in self.written_keys()

    def to_json(self) -> dict[str, Any]:
        own = set(self.json_fields())
        return {k: dump(getattr(self, k)) if k in own else self.extra[k] for k in self.written_keys()}

    @classmethod
    def from_json(cls: type[R], data: Mapping[str, Any], **given: Any) -> R:
        """The record of a JSON object; `given`: values of NOT_JSON fields (a subclass's own)."""
        values, extra = read_fields(cls, data)
        return cls(**values, **given, keys=tuple(data), extra=extra)


def read_fields(cls: type[JsonRecord], data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the values of the record's fields, each read as its field says; the other keys, as they are)."""
    readers = {f.name: f.metadata.get('read', _as_is) for f in dataclasses.fields(cls) if f.name not in cls.NOT_JSON}
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        if key in readers:
            values[key] = readers[key](value)
        else:
            extra[key] = value
    return values, extra


def json_field(read: Callable[[Any], Any], default: Any = None, doc: str = '') -> Any:
    """A field of a record: `read` turns a JSON value into the field's type (None if it cannot);
    `doc` says what the key holds, for the readers of the file (docs/reference/events.md is made
    from it)."""
    return field(default=default, metadata={'read': read, 'doc': doc})


def dump(value: Any) -> Any:
    """A field's value as JSON: records as objects, enums as their values."""
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [dump(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


# -- reading JSON values into types -------------------------------------------------------------
def _as_is(value: Any) -> Any:
    return value


def read_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# The largest whole number a record holds: a step, a pid, an exit code fits in 64 bits, and a
# 400-digit one (JSON has no limit) would overflow the first float() it meets.
MAX_WHOLE = 2 ** 63


def read_whole(value: Any) -> int | None:
    """An integer; a float that is a whole number counts (a hand-written 40.0)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -MAX_WHOLE < value < MAX_WHOLE else None
    if isinstance(value, float) and value.is_integer() and abs(value) < MAX_WHOLE:
        return int(value)
    return None


def read_real(value: Any) -> float | None:
    """A number as written (an int stays one, so it is written back the same); NaN and inf, as an
    older version wrote them, are kept: a diverged loss is a fact to show (written back, they are
    null: see cluster/runtime/runjson.py)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and not -MAX_WHOLE < value < MAX_WHOLE:
        return None
    return value


def read_flag(value: Any) -> bool | None:
    """true or false (a 1 or "yes" is no flag: None)."""
    return value if isinstance(value, bool) else None


def read_texts(value: Any) -> list[str] | None:
    """A list of names (tasks); anything that is not a string in it is dropped."""
    if not isinstance(value, list):
        return None
    return [v for v in value if isinstance(v, str)]


def read_wholes(value: Any) -> list[int] | None:
    if not isinstance(value, list):
        return None
    return [v for v in (read_whole(v) for v in value) if v is not None]


def finite(value: Any) -> float | None:
    """A number to compute with: None for anything else, NaN and inf included."""
    number = read_real(value)
    return float(number) if number is not None and math.isfinite(number) else None
